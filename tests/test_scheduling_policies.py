"""Scheduling policies of the continuous engine core (runtime/engine/preemption.py, engine_core.py):
priority admission, preemption by pause, deadlines, and the server's bounded queue and /metrics.

The oracle of every paused request is the same request run alone on the same engine: a paused row
must end with exactly the tokens (and log-probabilities) of an uninterrupted run, greedy and seeded."""

import asyncio
import json
import time

import httpx
import numpy as np

import pytest

from helpers import PROMPTS, chat_request
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.schemas.input_file import parse_input_dict

NO_EOS = {"0": -100.0, "2": -100.0}  # the tiny model's end-of-sequence ids never win: long answers
THREE_TOKENS = {"100": 40.0, "200": 40.0, "300": 40.0}


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


@pytest.mark.parametrize("reuse, speculation", [(False, None), (True, None), (True, "prompt-lookup")],
                         ids=["recompute", "context-reuse", "prompt-lookup"])
def test_a_paused_row_resumes_with_the_tokens_it_has_alone(engine, reuse, speculation):
    """Two low-priority rows fill a pool of 2; a priority-5 request arrives mid-decode and pauses the
    later of them (the latest arrival among the lowest); it resumes when a row frees, its cache
    recomputed by prefill (no context reuse) or restored from the blocks it committed as it left. Under
    prompt lookup the resumed row's n-gram index is rebuilt; each request still gets vanilla's tokens
    alone (prompt lookup's own tests: vanilla's tokens are its tokens)."""
    data = FILE
    if speculation:  # a random model copies nothing: three tokens it orders by its own logits recur
        data = {**FILE, "requests": [{**r, "logit_bias": {**r["logit_bias"], **THREE_TOKENS}} for r in FILE["requests"]]}
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=reuse, speculation=speculation)
    low_greedy, low_seeded, urgent = requests_of(runner, data)
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
    if speculation:  # (the resumed row is the strategy's again: a row it lost would be out of step)
        assert runner.lookup_stats.rounds > 0
    if reuse:  # the resumed row restored its committed blocks
        assert runner.prefix_cache.stats["hits"] > hits
    for index, request in ((0, low_greedy), (1, low_seeded), (2, urgent)):
        want = alone(engine, data, index)
        assert request.sequence.generated == want.generated, index
        assert request.sequence.finish_reason == want.finish_reason
        assert [ids for ids, _ in request.sequence.top_logprobs] == [ids for ids, _ in want.top_logprobs]
        for (_, got), (_, expected) in zip(request.sequence.top_logprobs, want.top_logprobs):
            assert got == pytest.approx(expected, abs=1e-4)


def test_a_row_paused_mid_prompt_starts_it_again(engine):
    """Prompts in chunks of 8: a long low-priority prompt still prefilling (the latest arrival) is the
    one paused for an urgent request; it starts its prompt again later and ends with its answer alone
    (seeded)."""
    data = {"max_generate_length": 12, "seed": 3, "requests": [
        chat_request(PROMPTS[1], logit_bias=NO_EOS, temperature=0.0),
        chat_request(PROMPTS[2] + " more" * 30, logit_bias=NO_EOS, temperature=0.8),
        chat_request(PROMPTS[0], logit_bias=NO_EOS, temperature=0.0, priority=1)]}
    runner = Runner(EngineDir.open(engine), threads=1, prefill_chunk=8)
    first, long_one, urgent = requests_of(runner, data)
    core = runner.engine_core(2, "continuous")
    core.add_request(first)
    core.step()
    core.add_request(long_one)
    core.step()
    core.step()
    assert 0 < long_one.sequence.prefilled < len(long_one.sequence.prompt_ids) and not long_one.sequence.generated
    core.add_request(urgent)
    core.step()
    assert long_one.paused and long_one.sequence.prefilled is None and first in core.scheduler.running
    core.run_to_completion()
    for index, request in enumerate((first, long_one, urgent)):
        assert request.sequence.generated == alone(engine, data, index, prefill_chunk=8).generated, index


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


# -- through the server ---------------------------------------------------------------------------

def served(engine, **overrides):
    from test_server import LiveServer  # uvicorn on loopback, as test_server runs it

    from trt_llm.server.app import ServerConfig, create_app

    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    return LiveServer(create_app(runner, ServerConfig(model_name="tiny", **overrides)))


def body(prompt, **extra):
    return {"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0.0, "logit_bias": NO_EOS, **extra}


def test_the_server_pauses_a_low_priority_row_and_it_ends_with_its_answer_alone(engine):
    """Two rows busy with low-priority streams (greedy; seeded at temperature 0.9); a priority-3
    request pauses one of them. Every answer is the one each request gets alone on an idle server."""
    live = served(engine, max_rows=2)
    # long enough to be still decoding when the urgent one comes, on a loaded machine too
    low = [body(PROMPTS[0], max_tokens=160), body(PROMPTS[2], temperature=0.9, seed=11, top_p=0.95, max_tokens=160)]
    urgent = body(PROMPTS[2] + " Then name their moons, one by one.", priority=3, max_tokens=8)

    async def stream(client, payload, seen):
        text = ""
        async with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
                    seen.append(1)
        return text

    async def scenario():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            seen = [[], []]
            tasks = [asyncio.create_task(stream(client, payload, s)) for payload, s in zip(low, seen)]
            while min(len(s) for s in seen) < 4:  # both decoding
                await asyncio.sleep(0.005)
            first = (await client.post("/v1/completions", json=urgent)).json()
            return [*(await asyncio.gather(*tasks)), first["choices"][0]["text"]]

    try:
        texts = asyncio.run(scenario())
        assert live.app.state.engine.core.pauses >= 1
        with httpx.Client(base_url=live.url, timeout=60) as client:
            for payload, text in zip([*low, urgent], texts):
                assert client.post("/v1/completions", json=payload).json()["choices"][0]["text"] == text
    finally:
        live.close()


def test_a_body_timeout_ends_the_answer_with_its_partial_text(engine):
    """A completion whose `timeout` passes mid-answer: finish_reason "timeout", usage's tokens fewer
    than asked, and its text the answer's first tokens (the same request asked for that many)."""
    live = served(engine, max_rows=2)
    try:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            started = time.perf_counter()
            full = client.post("/v1/completions", json=body(PROMPTS[0], max_tokens=450)).json()
            took = time.perf_counter() - started
            assert full["usage"]["completion_tokens"] == 450
            cut = client.post("/v1/completions", json=body(PROMPTS[0], max_tokens=450, timeout=took / 3)).json()
            assert cut["choices"][0]["finish_reason"] == "timeout"
            n = cut["usage"]["completion_tokens"]
            assert 0 < n < 450
            same = client.post("/v1/completions", json=body(PROMPTS[0], max_tokens=n)).json()
            assert cut["choices"][0]["text"] == same["choices"][0]["text"]
            anthropic = client.post("/v1/messages", json={
                "model": "tiny", "max_tokens": 450, "temperature": 0.0, "timeout": took / 3,
                "messages": [{"role": "user", "content": PROMPTS[0]}]}).json()
            assert anthropic["stop_reason"] in ("timeout", "end_turn")  # (the chat template may let it end)
            metrics = client.get("/metrics").text
            assert 'trt_llm_request_rejections_total{reason="timeout"}' in metrics
    finally:
        live.close()


def test_64_clients_against_a_queue_of_8(engine):
    """64 clients at once (half OpenAI completions, half Anthropic messages) against 2 rows and a queue
    of 8: each is answered 200 or 429; a 429 carries Retry-After (whole seconds, >= 1) and the API's
    error shape; every accepted request is answered whole; those with a 20 ms timeout are answered
    within it (plus the noisy machine's slack), finish_reason timeout (200 tokens take longer on any
    machine); /metrics' rejections equal the 429s the
    clients saw, and the queue is empty after."""
    live = served(engine, max_rows=2, max_waiting=8)

    async def one(client, i):
        extra = {"timeout": 0.02} if i % 4 == 0 else {}
        started = time.perf_counter()
        if i % 2:
            answer = await client.post("/v1/messages", json={
                "model": "tiny", "max_tokens": 200, "temperature": 0.0, **extra,
                "messages": [{"role": "user", "content": PROMPTS[i % 4]}]})
        else:
            answer = await client.post("/v1/completions", json=body(PROMPTS[i % 4], max_tokens=200, **extra))
        return i, answer, time.perf_counter() - started, extra

    async def all_at_once():
        async with httpx.AsyncClient(base_url=live.url, timeout=120,
                                     limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    try:
        results = asyncio.run(all_at_once())
        refused = [(i, a) for i, a, _, _ in results if a.status_code == 429]
        assert {a.status_code for _, a, _, _ in results} <= {200, 429} and refused
        for i, answer in refused:
            assert int(answer.headers["Retry-After"]) >= 1
            error = answer.json()
            if i % 2:
                assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
            else:
                assert error["error"]["type"] == "rate_limit_error" and error["error"]["code"] == "queue_full"
        timeouts = 0
        for i, answer, took, extra in results:
            if answer.status_code != 200:
                continue
            data = answer.json()
            reason = data["stop_reason"] if i % 2 else data["choices"][0]["finish_reason"]
            assert reason in (("timeout", "end_turn", "max_tokens") if i % 2 else ("timeout", "stop", "length"))
            timeouts += reason == "timeout"
            if reason != "timeout":
                assert (data["usage"]["output_tokens"] if i % 2 else data["usage"]["completion_tokens"]) > 0
            if extra:
                assert took < extra["timeout"] + 3.0, (i, took)
        # A request with a timeout runs out of it: quiet, the tiny engine makes 2 rows of 200 tokens in about
        # 0.1 s, and one that waits waits longer (the accepted are the first to arrive: 2 of every 8 timed)
        timed = [i for i, answer, _, extra in results if answer.status_code == 200 and extra]
        assert timeouts == len(timed) and timed, timed
        metrics = httpx.get(f"{live.url}/metrics").text
        assert f'trt_llm_request_rejections_total{{reason="queue_full"}} {float(len(refused))}' in metrics
        assert f'trt_llm_request_rejections_total{{reason="timeout"}} {float(timeouts)}' in metrics
        assert "trt_llm_queue_depth 0.0" in metrics and "trt_llm_num_requests_paused 0.0" in metrics
        assert 'trt_llm_num_requests_waiting{priority="0"} 0.0' in metrics
    finally:
        live.close()


def test_a_token_budget_caps_every_pass_and_keeps_the_tokens(engine):
    """max_batched_tokens 12 with mixed steps on 3 rows (prompts of 60-90 tokens arriving while others
    decode): no engine pass takes more than 12 tokens (prompt chunks and decode rows together, counted
    at the engine), and every request's tokens are those of the run without a budget."""
    from trt_llm.runtime.engine.engine_core import EngineCore

    data = {"temperature": 0.0, "max_generate_length": 10,
            "requests": [chat_request(PROMPTS[i % 4] + " more" * (i * 7), logit_bias=NO_EOS) for i in range(5)]}
    outputs = []
    for budget in (None, 12):
        runner = Runner(EngineDir.open(engine), threads=1)
        core = EngineCore(runner.model, 3, step_tokens=64, mixed_steps=True, max_batched_tokens=budget)
        passes, run = [], runner.model.engine.run

        def counted(step, cache, lora):
            passes.append(int(step.query_lengths.sum()))
            return run(step, cache, lora)

        runner.model.engine.run = counted
        requests = requests_of(runner, data)
        core.add_request(requests[0])
        core.step()
        for r in requests[1:]:  # each arrives while the others decode
            core.add_request(r)
            core.step()
        core.run_to_completion()
        runner.model.engine.run = run
        outputs.append([r.sequence.generated for r in requests])
        if budget:
            assert max(passes) <= budget and max(passes) == budget  # cut, and used to the full
        else:
            assert max(passes) > 12
    assert outputs[0] == outputs[1]


def test_fair_share_admits_round_robin_between_clients(engine):
    """One row; client a queues 4 requests, then client b 2, all of priority 0: a's and b's take turns
    (b's first comes second, not fifth); requests without a client (the file runner's) keep arrival
    order; a higher priority still goes first whatever its client."""
    data = {"temperature": 0.0, "max_generate_length": 2, "requests": [chat_request(PROMPTS[i % 4]) for i in range(7)]}
    runner = Runner(EngineDir.open(engine), threads=1)
    requests = requests_of(runner, data)
    for r, client in zip(requests, "aaaabbc"):
        r.client = client
    requests[6].priority = 1
    core = runner.engine_core(1, "continuous")
    for r in requests:
        core.add_request(r)
    order = []
    while core.has_unfinished():
        order += [r.id for r in core.step()]
    assert order == [6, 0, 4, 1, 5, 2, 3]  # c (priority 1), then a, b, a, b, a, a
    plain = requests_of(Runner(EngineDir.open(engine), threads=1), data)[:5]
    core = runner.engine_core(1, "continuous")
    for r in plain:
        core.add_request(r)
    order = []
    while core.has_unfinished():
        order += [r.id for r in core.step()]
    assert order == [0, 1, 2, 3, 4]


def test_the_server_shares_rows_between_api_keys(engine):
    """Two API keys, one row: key a sends 4 requests, then key b one; b's is answered second."""
    live = served(engine, max_rows=1, api_keys=("key-a", "key-b"))

    async def one(client, key, tag, done, tokens=60):
        answer = await client.post("/v1/completions", json=body(PROMPTS[0], max_tokens=tokens),
                                   headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200
        done.append(tag)

    async def burst():
        done = []
        async with httpx.AsyncClient(base_url=live.url, timeout=120) as client:
            # a's answers long enough that b's request arrives while a0 still runs: with 60 tokens a
            # loaded CI machine once finished a0 first, and a2 took the row before b was queued
            tasks = [asyncio.create_task(one(client, "key-a", f"a{i}", done, tokens=240)) for i in range(4)]
            give_up = time.perf_counter() + 30
            while live.app.state.engine.waiting().get(0, 0) < 3:  # a's first runs, three wait
                assert time.perf_counter() < give_up, "a's requests never queued"
                await asyncio.sleep(0.002)
            tasks.append(asyncio.create_task(one(client, "key-b", "b", done)))
            await asyncio.gather(*tasks)
        return done

    try:
        done = asyncio.run(burst())
        assert done.index("b") == 1, done
    finally:
        live.close()


def test_the_token_budget_flag(engine):
    from trt_llm.server.cli import parse_args, server_config

    config = server_config(parse_args(["--engine-dir", str(engine), "--max-num-batched-tokens", "64"]),
                           EngineDir.open(engine))
    assert config.max_num_batched_tokens == 64
    with pytest.raises(ValueError, match=r"^--max-num-batched-tokens 3: a decode step of 4 rows takes 4"):
        server_config(parse_args(["--engine-dir", str(engine), "--max-num-batched-tokens", "3"]), EngineDir.open(engine))


def test_trt_llm_run_takes_the_token_budget(engine, tmp_path, monkeypatch):
    """trt-llm-run --max-num-batched-tokens: the core under it passes at most that many tokens (counted at the
    engine) and answers the tokens of the run without it; below the batch size it is refused in one line."""
    from trt_llm.runtime.app.run_cli import main
    from trt_llm.runtime.engine.engine_core import EngineCore

    data = {"batch_size": 3, "temperature": 0.0, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": f"Tell me about {t} in some detail."}]}
                         for t in ("rivers", "mountains", "deserts", "forests")]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    widest = []
    original = EngineCore.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        run = self.model.engine.run

        def counted(step, cache, *rest):
            widest.append(int(np.asarray(step.query_lengths).sum()))
            return run(step, cache, *rest)

        self.model.engine.run = counted

    monkeypatch.setattr(EngineCore, "__init__", recording)
    outputs = {}
    for budget in (None, "8"):
        flags = ["--max-num-batched-tokens", budget] if budget else []
        out = tmp_path / f"out-{budget}.json"
        widest.clear()
        assert main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(out), "--threads", "1",
                     "--scheduling", "continuous", *flags]) == 0
        outputs[budget] = [r["output_token_ids"] for r in json.loads(out.read_text())["responses"]]
        if budget:
            assert max(widest) <= 8
    assert outputs["8"] == outputs[None]
    assert main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(tmp_path / "x.json"),
                 "--max-num-batched-tokens", "2"]) != 0


def test_reserved_rows_stay_free_for_their_class(engine):
    """--reserve-rows 1:1 5:1 on 3 rows: priority-0 requests take one row (two held); a priority-1 one
    takes a second at once (the row held for 1 and above), the next priority-1 one waits (the last row is
    5's), a priority-5 one takes it; as rows free, the waiting ones go in by priority."""
    data = {"temperature": 0.0, "max_generate_length": 20, "requests": [chat_request(PROMPTS[i % 4]) for i in range(6)]}
    runner = Runner(EngineDir.open(engine), threads=1)
    requests = requests_of(runner, data)
    core = runner.engine_core(3, "continuous")
    core.scheduler.reserved = {1: 1, 5: 1}
    order = []

    def step_with(*added):
        for r in added:
            core.add_request(r)
        order.extend(r.id for r in core.step())
        return sorted(r.id for r in core.scheduler.running)

    assert step_with(*requests[:3]) == [0]  # priority 0: two of three rows are held
    requests[3].priority = requests[4].priority = 1
    requests[5].priority = 5
    assert step_with(*requests[3:5]) == [0, 3]  # one priority-1 request; the last row is priority 5's
    assert step_with(requests[5]) == [0, 3, 5]
    while core.has_unfinished():
        order += [r.id for r in core.step()]
    assert sorted(order) == list(range(6)) and order.index(4) < order.index(1)


def test_the_reserve_rows_flag(engine):
    from trt_llm.server.cli import parse_args, server_config

    def config(*flags):
        return server_config(parse_args(["--engine-dir", str(engine), *flags]), EngineDir.open(engine))

    assert config("--reserve-rows", "1:1", "--reserve-rows", "5:2").reserved_rows == ((1, 1), (5, 2))
    with pytest.raises(ValueError, match=r"^--reserve-rows: 4 rows reserved of 4 \(--max-batch-size\)"):
        config("--reserve-rows", "1:4")
    with pytest.raises(ValueError, match=r"^--reserve-rows 'x:1': expected PRIORITY:ROWS"):
        config("--reserve-rows", "x:1")
