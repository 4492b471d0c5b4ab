"""The step-level engine (runtime/engine/engine_core.py) and `--scheduling continuous`: a request admitted
while others are mid-decode gives exactly the tokens it gives alone, and a file run continuously
gives the static run's results, request by request."""

import json

import pytest

from helpers import PROMPTS, chat_request, make_adapter
from trt_llm.runtime.engine.engine_core import EngineCore, EngineRequest
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in full sentences."}


@pytest.fixture(scope="module")
def setup(tiny_model, build_engine_for, tmp_path_factory):
    base = tiny_model("qwen3")
    engine = build_engine_for(base, lora={"max_rank": 8})
    folder = tmp_path_factory.mktemp("adapters")
    adapters = {"a": make_adapter(base, folder / "a", seed=1), "b": make_adapter(base, folder / "b", seed=2, rank=2,
                                                                                targets=["q_proj", "down_proj"])}
    return engine, adapters


def mixed_requests(count: int) -> list[dict]:
    """Requests of very different lengths and features: EOS boosted or banned, stop strings,
    logprobs, adapters, a shared system prompt saved and reused."""
    requests = []
    for i in range(count):
        request = chat_request(PROMPTS[i % len(PROMPTS)] + " " + "more " * (i % 7))
        if i % 5 == 0:
            request["logit_bias"] = {"0": 9.0, "2": 9.0}  # an early end-of-sequence
        elif i % 5 == 1:
            request["logit_bias"] = {"0": -100.0, "2": -100.0}  # never
        if i % 4 == 2:
            request["stop"] = ["a", "e"]
        if i % 6 == 3:
            request["num_logprobs"] = 3
        if i % 3 == 1:
            request["lora_name"] = "a" if i % 2 else "b"
        if i % 8 in (4, 5):
            request["messages"].insert(0, SYSTEM)
            request["save_system_prompt_kv_cache"] = i % 8 == 4
        requests.append(request)
    return requests


def run(engine, data, scheduling):
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    assert not loaded.errors, loaded.errors
    runner = Runner(EngineDir.open(engine), threads=1, scheduling=scheduling)
    return runner.run(loaded, loaded.settings).responses, runner


def comparable(response) -> dict:
    """Everything but the timing and the reuse count, log-probabilities to 1e-4: a row's logits move
    in their last bits with the batch it shares (matmul blocking), static or not; tokens do not."""
    data = response.model_dump(exclude={"time_to_first_token_ms", "reused_tokens"})
    for candidates in [*(data["logprobs"] or []), data["sampled_tokens"] or []]:
        for candidate in candidates:
            candidate["logprob"] = pytest.approx(candidate["logprob"], abs=1e-4)
    return data


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_k": 20, "top_p": 0.95,
                                                              "seed": 77}])
def test_continuous_equals_static_request_by_request(setup, sampling):
    engine, adapters = setup
    data = {"batch_size": 4, "max_generate_length": 24, "available_lora_weights": adapters, **sampling,
            "requests": mixed_requests(32)}
    static, _ = run(engine, data, "static")
    continuous, runner = run(engine, data, "continuous")
    assert [r.request_idx for r in continuous] == list(range(32))
    assert all(r.finish_reason != "error" for r in continuous), [r.error for r in continuous if r.error]
    lengths = {r.generated_tokens for r in continuous}
    assert min(lengths) <= 2 and max(lengths) == 24  # the lengths really differ
    for s, c in zip(static, continuous):
        assert comparable(c) == comparable(s), s.request_idx
    assert runner.prefix_stats["hits"] > 0  # the saved system prompt was reused


def _engine_request(runner, index, request, settings):
    formatter = PromptFormatter(runner.tokenizer, True, True, False)
    p = runner.prepare(index, request, settings, formatter)
    p.num_logprobs = request.resolved_num_logprobs(settings)
    return EngineRequest(index, p.sequence, p.params, p.seed, p.num_logprobs, p.adapter)


@pytest.mark.parametrize("late", [
    chat_request("Hi there, how are you today?"),
    chat_request("Write a poem", num_logprobs=4, stop=["o"]),
    chat_request("Write a poem about ships", lora_name="a", logit_bias={"0": -100.0, "2": -100.0}),
])
def test_a_request_admitted_mid_decode_gives_its_tokens_alone(setup, late):
    engine, adapters = setup
    data = {"temperature": 0.8, "top_k": 30, "seed": 5, "max_generate_length": 20,
            "available_lora_weights": adapters,
            "requests": [chat_request(PROMPTS[0], lora_name="b"), chat_request(PROMPTS[2]), late]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1)
    settings = loaded.settings

    core = EngineCore(runner.model, 4, lora_layout=runner.lora_layout)
    first = [_engine_request(runner, i, loaded.requests[i], settings) for i in (0, 1)]
    for request in first:
        core.add_request(request)
    for _ in range(6):  # the first two prefill and decode a few tokens
        core.step()
    assert all(0 < len(r.sequence.generated) < 20 for r in first)
    joined = _engine_request(runner, 2, loaded.requests[2], settings)
    core.add_request(joined)
    while core.has_unfinished():
        core.step()
    reference = _engine_request(runner, 2, loaded.requests[2], settings)
    solo = EngineCore(runner.model, 1, lora_layout=runner.lora_layout)
    solo.add_request(reference)
    while solo.has_unfinished():
        solo.step()
    assert joined.sequence.generated == reference.sequence.generated
    assert joined.sequence.finish_reason == reference.sequence.finish_reason
    assert [ids for ids, _ in joined.sequence.top_logprobs] == [ids for ids, _ in reference.sequence.top_logprobs]
    for (_, got), (_, want) in zip(joined.sequence.top_logprobs, reference.sequence.top_logprobs):
        assert got == pytest.approx(want, abs=1e-4)


def test_abort_frees_the_row_for_the_next(setup):
    engine, _ = setup
    data = {"temperature": 0.0, "max_generate_length": 30,
            "requests": [chat_request(PROMPTS[0], logit_bias={"0": -100.0, "2": -100.0}), chat_request(PROMPTS[1])]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1)
    core = EngineCore(runner.model, 1, lora_layout=runner.lora_layout)
    a, b = (_engine_request(runner, i, loaded.requests[i], loaded.settings) for i in (0, 1))
    core.add_request(a)
    core.add_request(b)
    core.step()
    core.step()
    assert core.scheduler.running == [a] and list(core.scheduler.waiting) == [b]
    assert core.abort(0) is a and a.sequence.finish_reason == "aborted"
    while core.has_unfinished():
        core.step()
    alone = _engine_request(runner, 1, loaded.requests[1], loaded.settings)
    solo = EngineCore(runner.model, 1, lora_layout=runner.lora_layout)
    solo.add_request(alone)
    while solo.has_unfinished():
        solo.step()
    assert b.sequence.generated == alone.sequence.generated


def test_the_static_policy_runs_the_references_batches(setup):
    """EngineCore with the static policy: groups admitted together once the pool is empty, as the
    static runner's batches (same tokens, and never a row of the next group beside this one's)."""
    engine, adapters = setup
    data = {"batch_size": 3, "temperature": 0.0, "max_generate_length": 10, "available_lora_weights": adapters,
            "requests": mixed_requests(7)}
    static, runner = run(engine, data, "static")
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    core = EngineCore(runner.model, 3, "static", lora_layout=runner.lora_layout)
    requests = []
    for index, request in enumerate(loaded.requests):
        engine_request = _engine_request(runner, index, request, loaded.settings)
        engine_request.group = index // 3
        requests.append(engine_request)
        core.add_request(engine_request)
    while core.has_unfinished():
        assert len({r.group for r in core.scheduler.running}) <= 1
        core.step()
    assert [r.sequence.generated for r in requests] == [s.output_token_ids for s in static]


def test_a_long_running_core_reuses_sampler_rows(setup):
    """A server's core sees requests without end: the rows of those that left are reused, so its
    sampler stays as large as the most requests it held at once."""
    engine, _ = setup
    data = {"temperature": 0.7, "seed": 3, "max_generate_length": 4,
            "requests": [chat_request(PROMPTS[i % 4]) for i in range(6)]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1)
    core = EngineCore(runner.model, 2, lora_layout=runner.lora_layout)
    for wave in range(3):
        requests = [_engine_request(runner, i, loaded.requests[i], loaded.settings) for i in range(2 * wave, 2 * wave + 2)]
        for request in requests:
            core.add_request(request)
        core.run_to_completion()
        assert len(core.sampler.params) == 2
    alone = _engine_request(runner, 5, loaded.requests[5], loaded.settings)
    solo = EngineCore(runner.model, 1, lora_layout=runner.lora_layout)
    solo.add_request(alone)
    solo.run_to_completion()
    assert requests[1].sequence.generated == alone.sequence.generated  # a reused row samples as a new one
