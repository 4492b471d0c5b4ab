"""Context reuse (runtime/cache/reuse.py, context_cache.py): a request restores the longest cached
prefix of its prompt, whoever computed it, and its tokens are the ones it computes without it:
greedy and seeded, with logprobs, stop strings, logit bias and adapters, static and continuous,
across processes, under a budget that evicts. It never matches across adapters."""

import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import PROMPTS, make_adapter
from trt_llm.runtime.cache.context_cache import ContextCache
from trt_llm.runtime.cache.reuse import ContextPlan
from trt_llm.runtime.engine.engine_core import EngineRequest
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.sampling.sampler import SamplingParams
from trt_llm.schemas.input_file import parse_input_dict

SYSTEM = ("You are the help desk of a small railway museum. You answer questions about opening hours, "
          "tickets, the steam engines on show and the workshop tours, briefly and kindly.")
FIRST = "Which engines can I see on Sunday?"
ANSWER = "On Sunday the museum shows its two tank engines and the small shunter in the yard."


@pytest.fixture(scope="module")
def setup(tiny_model, build_engine_for, tmp_path_factory):
    base = tiny_model("qwen3")
    engine = build_engine_for(base, lora={"max_rank": 8})  # test_continuous's engine: built once a session
    folder = tmp_path_factory.mktemp("reuse-adapters")
    adapters = {"a": make_adapter(base, folder / "a", seed=1), "b": make_adapter(base, folder / "b", seed=2, rank=2,
                                                                                targets=["q_proj", "down_proj"])}
    return engine, adapters


def conversations(count: int) -> list[dict]:
    """Requests that share a long system prompt and, most of them, a first turn, with the features
    a row's sampling depends on: logprobs, stop strings, logit bias, adapters."""
    requests = []
    for i in range(count):
        messages = [{"role": "system", "content": SYSTEM}]
        if i % 3:
            messages += [{"role": "user", "content": FIRST}, {"role": "assistant", "content": ANSWER}]
        messages.append({"role": "user", "content": PROMPTS[i % len(PROMPTS)] + " please" * (i % 4)})
        request = {"messages": messages}
        if i % 4 == 1:
            request["num_logprobs"] = 3
        if i % 5 == 2:
            request["stop"] = ["a", "e"]
        if i % 6 == 3:
            request["logit_bias"] = {"0": -100.0, "2": -100.0, "100": 4.0}
        if i % 7 == 5:
            request["lora_name"] = "a"
        requests.append(request)
    return requests


def run(engine, data, scheduling="static", reuse=True, cache=None):
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    assert not loaded.errors, loaded.errors
    runner = Runner(EngineDir.open(engine), threads=1, scheduling=scheduling, context_reuse=reuse, prefix_cache=cache)
    return runner.run(loaded, loaded.settings).responses, runner


def comparable(response) -> dict:
    """Everything but the timing and the reuse count, log-probabilities to 1e-4: a restored prefix's
    keys and values were computed in another pass (their last bits move with its shape); tokens do not."""
    data = response.model_dump(exclude={"time_to_first_token_ms", "reused_tokens"})
    for candidates in [*(data["logprobs"] or []), data["sampled_tokens"] or []]:
        for candidate in candidates:
            candidate["logprob"] = pytest.approx(candidate["logprob"], abs=1e-4)
    return data


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 5}])
def test_reuse_gives_the_tokens_of_bypass(setup, scheduling, sampling):
    engine, adapters = setup
    data = {"batch_size": 2, "max_generate_length": 12, "available_lora_weights": adapters, **sampling,
            "requests": conversations(12)}
    reused, runner = run(engine, data, scheduling)
    bypassed, _ = run(engine, {**data, "context_cache_lookup_policy": "bypass"}, scheduling)
    assert all(r.finish_reason != "error" for r in reused), [r.error for r in reused if r.error]
    for a, b in zip(reused, bypassed, strict=True):
        assert comparable(a) == comparable(b), a.request_idx
    assert all(r.reused_tokens == 0 for r in bypassed)
    # The first batch computes the system prompt and the first turn; later requests restore them.
    size = runner.prefix_cache.block_tokens
    assert [r.reused_tokens for r in reused[:2]] == [0, 0]
    assert all(r.reused_tokens % size == 0 and r.reused_tokens < r.prompt_tokens for r in reused)
    later = [(i, r.reused_tokens) for i, r in enumerate(reused) if i >= 2 and i % 7 != 5]  # no adapter
    with_turn, system_only = [n for i, n in later if i % 3], [n for i, n in later if not i % 3]
    assert min(system_only) > 30 and min(with_turn) > max(system_only)


def test_adapters_share_nothing(setup):
    """The same conversation under adapter a, adapter b and the base: each restores only its own."""
    engine, adapters = setup
    request = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]}
    names = ["a", "b", None, "a", None, "b"]
    data = {"temperature": 0.0, "max_generate_length": 6, "available_lora_weights": adapters,
            "requests": [{**request, **({"lora_name": n} if n else {})} for n in names]}
    responses, _ = run(engine, data)
    assert [r.reused_tokens > 0 for r in responses] == [False, False, False, True, True, True]
    alone, _ = run(engine, {**data, "requests": data["requests"][1:2]}, reuse=False)
    assert responses[1].output_token_ids == alone[0].output_token_ids


def engine_run(runner, prompts: list[list[int]], commit: str, max_new: int = 8) -> list[Sequence]:
    """Each prompt on the runner's engine core in turn, greedy, with context reuse by `commit`."""
    done = []
    for ids in prompts:
        core = runner.engine_core(1, "static")
        s = Sequence(list(ids), max_new)
        s.context = ContextPlan(runner.prefix_cache.root(None), lookup=commit != "none", commit=commit)
        core.add_request(EngineRequest(len(done), s, SamplingParams(0.0, 0, 1.0, None)))
        core.run_to_completion()
        done.append(s)
    return done


@pytest.mark.parametrize("commit", ["generated", "prefill"])
def test_a_next_turn_restores_the_turn_before_it(setup, commit):
    """Turn 2's prompt is turn 1's prompt and answer and more: it restores the whole of turn 1 when
    the generated tokens are committed (all but the last, which was never fed), only turn 1's
    prompt under prefill_state_only; its tokens are the ones it computes alone."""
    engine, _ = setup
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=True)
    size = runner.prefix_cache.block_tokens
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 200, size=45).tolist()
    (first,) = engine_run(runner, [prompt], commit)
    follow = prompt + first.generated + rng.integers(3, 200, size=7).tolist()
    (second,) = engine_run(runner, [follow], commit)
    computed = len(prompt) + len(first.generated) - 1 if commit == "generated" else len(prompt)
    assert second.reused_tokens == computed - computed % size
    (cold,) = engine_run(Runner(EngineDir.open(engine), threads=1), [follow], "none")
    assert cold.reused_tokens == 0 and second.generated == cold.generated


def test_eviction_under_a_small_budget_keeps_results_exact(setup):
    engine, adapters = setup
    data = {"temperature": 0.0, "max_generate_length": 8, "available_lora_weights": adapters,
            "requests": conversations(8)}
    identity = EngineDir.open(engine).identity
    probe = ContextCache(identity)
    run(engine, {**data, "requests": data["requests"][:1]}, cache=probe)
    block_bytes = probe.size_bytes // max(1, probe.blocks)
    small = ContextCache(identity, budget_bytes=3 * block_bytes)
    tight, _ = run(engine, data, cache=small)
    bypassed, _ = run(engine, {**data, "context_cache_lookup_policy": "bypass"})
    assert small.evictions > 0 and small.size_bytes <= 3 * block_bytes
    assert [r.output_token_ids for r in tight] == [r.output_token_ids for r in bypassed]
    assert any(r.reused_tokens for r in tight)


def test_reuse_across_processes(setup, tmp_path, caplog):
    """--context-reuse --kv-cache-dir: a second process restores what the first computed; a corrupt
    block on disk is skipped with a warning and costs only its prefix."""
    engine, _ = setup
    data = {"temperature": 0.0, "max_generate_length": 8, "requests": conversations(3)}
    (tmp_path / "in.json").write_text(json.dumps(data))
    outputs = []
    for run_index in range(2):
        out = tmp_path / f"out{run_index}.json"
        subprocess.run([sys.executable, "-m", "trt_llm.runtime.app.run_cli", str(tmp_path / "in.json"),
                        "--engine-dir", str(engine), "-o", str(out), "--threads", "1", "--context-reuse",
                        "--kv-cache-dir", str(tmp_path / "kv")], check=True, capture_output=True)
        outputs.append(json.loads(out.read_text())["responses"])
    first, second = outputs
    assert first[0]["reused_tokens"] == 0 and second[0]["reused_tokens"] > 0  # warm from the first process's disk
    assert [r["output_token_ids"] for r in first] == [r["output_token_ids"] for r in second]
    blocks = sorted((tmp_path / "kv" / "blocks").glob("*.safetensors"))
    assert blocks
    for path in blocks:
        path.write_bytes(path.read_bytes()[:50])
    cache = ContextCache(EngineDir.open(engine).identity, directory=tmp_path / "kv")
    third, _ = run(engine, data, cache=cache)
    assert [r.output_token_ids for r in third] == [r["output_token_ids"] for r in first]
    warned = [path.name for path in blocks if path.name in caplog.text]
    assert warned and "unreadable" in caplog.text
    assert all(caplog.text.count(name) == 1 for name in warned)  # one warning a file


def test_an_idle_row_beside_a_row_by_row_prefill(setup):
    """A restored prefix beside a fresh prompt wider than the pool: the pass runs row by row, and a row
    whose one remaining token waits for the incomplete row before it has nothing to compute in it (it
    made a pass of no tokens, 'GatherElements: Out of range' for the whole batch: the server soak and the
    Ray benchmark found it). Every row then decodes the tokens it decodes alone."""
    engine, _ = setup
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=True, prefill_chunk=60)
    rng = np.random.default_rng(0)
    cached = rng.integers(3, 200, size=65).tolist()  # blocks of 16: restoring it leaves one token
    engine_run(runner, [cached], "prefill")
    prompts = [rng.integers(3, 200, size=100).tolist(), cached, rng.integers(3, 200, size=10).tolist()]
    core = runner.engine_core(3, "continuous")
    rows = []
    for i, ids in enumerate(prompts):  # counts of the first pass: 60, 0 (waits for row 0), 9
        s = Sequence(list(ids), 4)
        s.context = ContextPlan(runner.prefix_cache.root(None), lookup=True, commit="prefill")
        core.add_request(EngineRequest(i, s, SamplingParams(0.0, 0, 1.0, None)))
        rows.append(s)
    core.run_to_completion()
    assert rows[1].reused_tokens == 64
    alone = engine_run(Runner(EngineDir.open(engine), threads=1), prompts, "none", max_new=4)
    assert [s.generated for s in rows] == [s.generated for s in alone]
