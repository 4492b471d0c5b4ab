"""Chunked prefill (EngineCore's prefill_chunk / step_tokens): a prompt computed in chunks gives the
tokens it gives whole, static and continuous, under EAGLE, with context reuse; a long prompt that
arrives while others decode is prefilled between their decode steps instead of stalling them."""

import json

import pytest

from helpers import PROMPTS, chat_request
from test_continuous import comparable
from trt_llm.runtime.engine.engine_core import EngineRequest
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.sampling.sampler import SamplingParams
from trt_llm.schemas.input_file import parse_input_dict

LONG = " ".join(["The tide came in over the flat sands while the gulls waited."] * 4)


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def requests(count: int) -> list[dict]:
    out = []
    for i in range(count):
        text = (LONG if i % 3 == 0 else "") + PROMPTS[i % len(PROMPTS)] + " again" * (i % 5)
        request = chat_request(text)
        if i % 4 == 1:
            request["num_logprobs"] = 3
        if i % 5 == 2:
            request["stop"] = ["e"]
        out.append(request)
    return out


def run(engine, data, **runner):
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    return Runner(EngineDir.open(engine), threads=1, **runner).run(loaded, loaded.settings).responses


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
@pytest.mark.parametrize("reuse", [False, True])
def test_chunks_give_the_tokens_of_whole_prompts(engine, scheduling, reuse):
    data = {"temperature": 0.0, "batch_size": 3, "max_generate_length": 10, "requests": requests(9)}
    whole = run(engine, data, scheduling=scheduling)
    chunked = run(engine, data, scheduling=scheduling, prefill_chunk=7, context_reuse=reuse)
    assert max(r.prompt_tokens for r in whole) > 60  # several chunks of 7
    for a, b in zip(chunked, whole, strict=True):
        assert a.finish_reason != "error", a.error
        assert comparable(a) == comparable(b), a.request_idx


@pytest.mark.parametrize("mixed", [False, True])
def test_a_long_prompt_is_prefilled_between_or_in_the_decode_steps_of_running_rows(engine, mixed):
    """Rows decoding when a long prompt arrives keep getting tokens while its prompt goes in, chunk
    by chunk: a decode step in every two passes, or, with mixed steps, a token every pass, the chunk
    in the same pass; every row's tokens are its tokens alone."""
    runner = Runner(EngineDir.open(engine), threads=1, prefill_chunk=8)
    core = runner.engine_core(3, "continuous")
    core.mixed_steps = mixed
    greedy = SamplingParams(0.0, 0, 1.0, None)
    short = [Sequence(list(range(5 + i, 25 + i)), 40) for i in range(2)]
    for i, s in enumerate(short):
        core.add_request(EngineRequest(i, s, greedy))
    for _ in range(3):  # the two short prompts, 8 tokens a pass each (nobody decodes yet: no budget but the chunk)
        core.step()
    assert all(len(s.generated) == 1 for s in short)
    long = Sequence(list(range(3, 83)), 5)
    core.add_request(EngineRequest(2, long, greedy))
    passes, per_token = 0, 1 if mixed else 2
    while long.prefilled is None or long.prefilled < len(long.prompt_ids):
        before = [len(s.generated) for s in short]
        for _ in range(per_token):
            core.step()
        passes += per_token
        assert all(len(s.generated) == n + 1 for s, n in zip(short, before))
    assert passes == per_token * 80 // 8  # chunks of 8
    core.run_to_completion()
    for s in [*short, long]:
        alone = Sequence(list(s.prompt_ids), s.max_new_tokens)
        solo = Runner(EngineDir.open(engine), threads=1).engine_core(1, "static")
        solo.add_request(EngineRequest(0, alone, greedy))
        solo.run_to_completion()
        assert s.generated == alone.generated


def test_a_latency_target_sizes_the_chunks_and_keeps_the_tokens(engine):
    """With a latency target the budget follows the measured passes (never above the chunk, never
    below a token) and the tokens are those of whole prompts."""
    data = {"temperature": 0.0, "batch_size": 3, "max_generate_length": 10, "requests": requests(9)}
    whole = run(engine, data, scheduling="continuous")
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous", prefill_chunk=32, latency_target=1.5)
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    for a, b in zip(runner.run(loaded, loaded.settings).responses, whole, strict=True):
        assert comparable(a) == comparable(b), a.request_idx


def test_the_budget_settles_where_a_pass_costs_what_the_target_allows():
    from trt_llm.runtime.engine.budget import PrefillBudget

    budget = PrefillBudget(512, target=2.0)
    assert budget.tokens == 16
    budget.prefilled(1.0, 16, mixed=True)  # nothing measured of a decode step yet: unchanged
    budget.decoded(0.030)
    for _ in range(20):  # a pass costs the decode step and 2 ms a prompt token
        budget.prefilled(0.030 + 0.002 * budget.tokens, budget.tokens, mixed=True)
    assert budget.tokens == 15  # 30 ms more: 15 tokens at 2 ms
    for _ in range(20):  # between two decode steps it also pays its own fixed cost
        budget.prefilled(0.020 + 0.002 * budget.tokens, budget.tokens, mixed=False)
    assert budget.tokens == 5  # 20 ms of its own + 5 tokens at 2 ms = the 30 ms it may take
    budget.prefilled(5.0, budget.tokens, mixed=False)
    assert budget.tokens == 1  # never below a token
    assert PrefillBudget(8).tokens == 8 and PrefillBudget(None).tokens is None


def test_an_abort_in_the_middle_of_a_prefill_frees_its_row(engine):
    runner = Runner(EngineDir.open(engine), threads=1, prefill_chunk=8)
    core = runner.engine_core(2, "continuous")
    greedy = SamplingParams(0.0, 0, 1.0, None)
    decoding = Sequence(list(range(5, 20)), 30)
    core.add_request(EngineRequest("a", decoding, greedy))
    core.step()
    core.add_request(EngineRequest("b", Sequence(list(range(3, 63)), 5), greedy))
    core.step()  # its first chunk
    assert core.abort("b") is not None and len(core.scheduler.running) == 1
    core.add_request(EngineRequest("c", Sequence(list(range(7, 30)), 4), greedy))
    core.run_to_completion()
    alone = Sequence(list(range(5, 20)), 30)
    solo = runner.engine_core(1, "static")
    solo.add_request(EngineRequest(0, alone, greedy))
    solo.run_to_completion()
    assert decoding.generated == alone.generated
