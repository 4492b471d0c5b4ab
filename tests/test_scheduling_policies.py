"""Scheduling policies of the continuous engine core (runtime/engine/preemption.py, engine_core.py):
priority admission, preemption by pause, deadlines, and the server's bounded queue and /metrics.

The oracle of every paused request is the same request run alone on the same engine: a paused row
must end with exactly the tokens (and log-probabilities) of an uninterrupted run, greedy and seeded."""

import json
import time

import pytest

from helpers import PROMPTS, chat_request
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.schemas.input_file import parse_input_dict

NO_EOS = {"0": -100.0, "2": -100.0}  # the tiny model's end-of-sequence ids never win: long answers


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def requests_of(runner, data):
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    assert not loaded.errors, loaded.errors
    formatter = PromptFormatter(runner.tokenizer, True, True, False)
    out = []
    for index, request in enumerate(loaded.requests):
        p = runner.prepare(index, request, loaded.settings, formatter)
        p.num_logprobs = request.resolved_num_logprobs(loaded.settings)
        r = runner.engine_request(p)
        r.priority = request.priority
        out.append(r)
    return out


def alone(engine, data, index, **runner_options):
    runner = Runner(EngineDir.open(engine), threads=1, **runner_options)
    request = requests_of(runner, data)[index]
    core = runner.engine_core(1, "continuous")
    core.add_request(request)
    core.run_to_completion()
    return request.sequence


FILE = {"max_generate_length": 24, "seed": 7, "requests": [
    chat_request(PROMPTS[0], logit_bias=NO_EOS, temperature=0.0, num_logprobs=2),  # greedy, low
    chat_request(PROMPTS[2], logit_bias=NO_EOS, temperature=0.9, top_p=0.95, presence_penalty=0.5, num_logprobs=2,
                 stop=["zz"]),  # seeded sample with a penalty and a stop string, low
    # the urgent one: a longer prompt, so it overwrites every slot the paused row held in the pool
    chat_request(PROMPTS[2] + " Then name their moons, one by one, with the year each was found.",
                 logit_bias=NO_EOS, temperature=0.0, priority=5),
]}


@pytest.mark.parametrize("reuse", [False, True], ids=["recompute", "context-reuse"])
def test_a_paused_row_resumes_with_the_tokens_it_has_alone(engine, reuse):
    """Two low-priority rows fill a pool of 2; a priority-5 request arrives mid-decode and pauses the
    later of them (the latest arrival among the lowest); it resumes when a row frees, its cache
    recomputed by prefill (no context reuse) or restored from the blocks it committed as it left."""
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=reuse)
    low_greedy, low_seeded, urgent = requests_of(runner, FILE)
    core = runner.engine_core(2, "continuous")
    core.add_request(low_greedy)
    core.add_request(low_seeded)
    for _ in range(6):
        core.step()
    assert len(low_seeded.sequence.generated) >= 4
    core.add_request(urgent)
    core.step()
    assert core.pauses == 1 and low_seeded.paused and low_seeded in core.scheduler.waiting
    assert urgent in core.scheduler.running and urgent.sequence.generated  # admitted at once, first token out
    hits = runner.prefix_cache.stats["hits"]
    core.run_to_completion()
    assert urgent.sequence.finish_reason == "max-length"
    if reuse:  # the resumed row restored its committed blocks
        assert runner.prefix_cache.stats["hits"] > hits
    for index, request in ((0, low_greedy), (1, low_seeded), (2, urgent)):
        want = alone(engine, FILE, index)
        assert request.sequence.generated == want.generated, index
        assert request.sequence.finish_reason == want.finish_reason
        assert [ids for ids, _ in request.sequence.top_logprobs] == [ids for ids, _ in want.top_logprobs]
        for (_, got), (_, expected) in zip(request.sequence.top_logprobs, want.top_logprobs):
            assert got == pytest.approx(expected, abs=1e-4)


def test_the_continuous_runner_admits_by_priority_and_keeps_each_requests_tokens(engine):
    """trt-llm-run --scheduling continuous on a file with priorities, one row: the requests start in
    priority order (file order within one), each with the tokens it has alone."""
    data = {"batch_size": 1, "temperature": 0.0, "max_generate_length": 6, "requests": [
        chat_request(PROMPTS[0], logit_bias=NO_EOS), chat_request(PROMPTS[1], logit_bias=NO_EOS, priority=2),
        chat_request(PROMPTS[2], logit_bias=NO_EOS, priority=-1), chat_request(PROMPTS[3], logit_bias=NO_EOS, priority=2)]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    finished = []
    Runner(EngineDir.open(engine), threads=1, scheduling="continuous").run(loaded, loaded.settings, finished)
    assert [r.request_idx for r in finished] == [1, 3, 0, 2]  # one row: finishing order is admission order
    static = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    assert [r.output_token_ids for r in sorted(finished, key=lambda r: r.request_idx)] == \
        [r.output_token_ids for r in static]


def test_deadlines_end_running_and_waiting_requests_with_timeout(engine):
    """One row: A decodes, B waits behind it; both deadlines pass after A's 5th token. The next step
    ends A with its 5 tokens (its answer alone's first 5) and B with none, never admitted."""
    data = {"temperature": 0.0, "max_generate_length": 40,
            "requests": [chat_request(PROMPTS[0], logit_bias=NO_EOS), chat_request(PROMPTS[1])]}
    runner = Runner(EngineDir.open(engine), threads=1)
    a, b = requests_of(runner, data)
    core = runner.engine_core(1, "continuous")
    core.add_request(a)
    core.add_request(b)
    while len(a.sequence.generated) < 5:
        core.step()
    a.deadline = b.deadline = time.perf_counter()
    assert core.step() == [b, a]
    assert a.sequence.finish_reason == b.sequence.finish_reason == "timeout" and not core.has_unfinished()
    assert a.sequence.generated == alone(engine, data, 0).generated[:5] and b.sequence.generated == []
    assert b.sequence.prefilled is None and core.timeouts == 2  # B never took a row


def test_a_file_request_past_its_timeout_while_waiting_answers_timeout(engine):
    """trt-llm-run --scheduling continuous: a request whose timeout passes while it waits behind a
    longer one ends with no tokens and finish_reason "timeout", valid in the output file's schema;
    the other is unaffected."""
    data = {"batch_size": 1, "temperature": 0.0, "max_generate_length": 12, "requests": [
        chat_request(PROMPTS[0], logit_bias=NO_EOS), chat_request(PROMPTS[1], timeout=0.001)]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    out = Runner(EngineDir.open(engine), threads=1, scheduling="continuous").run(loaded, loaded.settings)
    first, second = out.responses
    assert second.finish_reason == "timeout" and second.generated_tokens == 0 and second.output_text == ""
    assert first.finish_reason == "max-length"
    assert first.output_token_ids == alone(engine, data, 0).generated
    type(out).model_validate(json.loads(out.model_dump_json()))  # "timeout" is an output file's finish reason
