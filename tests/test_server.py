"""trt-llm-serve against the official `openai` client on loopback: answers equal trt-llm-run's on the
same request (greedy and seeded, logprobs, stop, logit_bias, a LoRA adapter as a model name),
streamed deltas join to the same text, many concurrent clients each get their alone-result, and bad
requests get 4xx (never 500) without costing anyone else."""

import asyncio
import json
import time

import httpx
import pytest

import helpers
from helpers import PROMPTS, make_adapter
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from trt_llm.server.app import ServerConfig, create_app  # noqa: E402

KEY = "test-key-123"


@pytest.fixture(scope="module")
def engine_and_adapter(tiny_model, build_engine_for, tmp_path_factory):
    base = tiny_model("qwen3")
    engine = build_engine_for(base, lora={"max_rank": 8})
    adapter = make_adapter(base, tmp_path_factory.mktemp("adapter") / "a", seed=1)
    return engine, adapter


class LiveServer(helpers.LiveServer):
    """uvicorn on a free loopback port (tests/helpers.py), with the official client."""

    def client(self, key=KEY):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)


def make_server(engine, adapter, **overrides):
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    config = ServerConfig(model_name="tiny", lora={"ada": str(adapter)}, api_keys=(KEY,), max_rows=4,
                          **overrides)
    return LiveServer(create_app(runner, config))


@pytest.fixture(scope="module")
def server(engine_and_adapter):
    live = make_server(*engine_and_adapter)
    yield live
    live.close()


def run_file(engine, adapter, request: dict, **settings) -> dict:
    """The same request through trt-llm-run's runner, alone: its response."""
    data = {"batch_size": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_generate_length": 16,
            "available_lora_weights": {"ada": str(adapter)}, **settings, "requests": [request]}
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    assert not loaded.errors, loaded.errors
    return Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses[0]


def chat(client, text, **kwargs):
    return client.chat.completions.create(model=kwargs.pop("model", "tiny"),
                                          messages=[{"role": "user", "content": text}], **kwargs)


@pytest.mark.parametrize("settings, extra", [
    ({"temperature": 0.0}, {}),
    ({"temperature": 0.9, "top_p": 0.95, "seed": 7}, {}),
    ({"temperature": 0.0}, {"stop": ["e"]}),
    ({"temperature": 0.0}, {"logit_bias": {"100": 5.0, "7": -100.0}}),
    ({"temperature": 0.0, "num_logprobs": 3}, {}),
])
def test_chat_equals_trt_llm_run(server, engine_and_adapter, settings, extra):
    engine, adapter = engine_and_adapter
    want = run_file(engine, adapter, {"messages": [{"role": "user", "content": PROMPTS[1]}], **extra}, **settings)
    kwargs = {"temperature": settings["temperature"], "max_tokens": 16, **extra}
    if "top_p" in settings:
        kwargs["top_p"] = settings["top_p"]
    if "seed" in settings:
        kwargs["seed"] = settings["seed"]
    if "num_logprobs" in settings:
        kwargs.update(logprobs=True, top_logprobs=settings["num_logprobs"])
    got = chat(server.client(), PROMPTS[1], **kwargs)
    choice = got.choices[0]
    assert choice.message.content == want.output_text
    assert choice.finish_reason == ("length" if want.finish_reason == "max-length" else "stop")
    assert got.usage.completion_tokens == want.generated_tokens and got.usage.prompt_tokens == want.prompt_tokens
    if "num_logprobs" in settings:
        entries = choice.logprobs.content
        assert [e.logprob for e in entries] == pytest.approx([t.logprob for t in want.sampled_tokens], abs=1e-4)
        for entry, candidates in zip(entries, want.logprobs):
            assert [c.token for c in entry.top_logprobs] == [c.token for c in candidates]
            assert [c.logprob for c in entry.top_logprobs] == pytest.approx([c.logprob for c in candidates], abs=1e-4)


def test_a_conversation_reuses_its_earlier_turns(engine_and_adapter):
    """A chat client resends the conversation each turn: the server restores the turns before
    (usage.prompt_tokens_details.cached_tokens, /metrics), and each answer is trt-llm-run's on the
    whole conversation. --no-prefix-cache (save_prefixes off) computes every prompt whole."""
    engine, adapter = engine_and_adapter
    system = {"role": "system", "content": "You are a patient tutor who explains the tides to children."}
    for save in (True, False):
        live = make_server(engine, adapter, save_prefixes=save)
        try:
            messages, cached = [system], []
            for question in ("Why does the sea go out?", "And why twice a day?", "Is it the same everywhere?"):
                messages.append({"role": "user", "content": question})
                got = live.client().chat.completions.create(model="tiny", messages=messages, temperature=0.0,
                                                            max_tokens=12)
                want = run_file(engine, adapter, {"messages": list(messages)}, temperature=0.0, max_generate_length=12)
                assert got.choices[0].message.content == want.output_text
                cached.append(got.usage.prompt_tokens_details.cached_tokens)
                messages.append({"role": "assistant", "content": got.choices[0].message.content})
            metrics = httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        finally:
            live.close()
        if save:
            assert cached[0] == 0 and all(n >= 16 for n in cached[1:]) and cached[2] > cached[1]
            assert "trt_llm_context_cache_hits_total 2.0" in metrics
            assert "trt_llm_context_cache_bytes " in metrics and "trt_llm_context_cache_bytes 0.0" not in metrics
        else:
            assert cached == [0, 0, 0]


def test_lora_model_name_selects_the_adapter(server, engine_and_adapter):
    engine, adapter = engine_and_adapter
    want = run_file(engine, adapter, {"messages": [{"role": "user", "content": PROMPTS[0]}], "lora_name": "ada"},
                    temperature=0.0)
    base = chat(server.client(), PROMPTS[0], temperature=0, max_tokens=16).choices[0].message.content
    tuned = chat(server.client(), PROMPTS[0], model="ada", temperature=0, max_tokens=16).choices[0].message.content
    assert tuned == want.output_text and tuned != base
    assert {m.id for m in server.client().models.list().data} == {"tiny", "ada"}


def test_stream_deltas_join_to_the_whole_answer(server):
    client = server.client()
    whole = chat(client, PROMPTS[2], temperature=0, max_tokens=16, stop=["a"])
    chunks = list(chat(client, PROMPTS[2], temperature=0, max_tokens=16, stop=["a"], stream=True,
                       stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_take_a_raw_prompt(server, engine_and_adapter):
    engine, adapter = engine_and_adapter
    want = run_file(engine, adapter, {"messages": [{"role": "user", "content": PROMPTS[3]}]}, temperature=0.0,
                    apply_chat_template=False, num_logprobs=2)
    got = server.client().completions.create(model="tiny", prompt=PROMPTS[3], temperature=0, max_tokens=16,
                                             logprobs=2)
    assert got.choices[0].text == want.output_text
    assert got.choices[0].logprobs.token_logprobs == pytest.approx([t.logprob for t in want.sampled_tokens], abs=1e-4)


def test_concurrent_clients_each_get_their_alone_result(server, engine_and_adapter):
    """16 clients x 8 requests of mixed lengths at once: none lost, each greedy answer its alone one."""
    engine, adapter = engine_and_adapter
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {'and more ' * (i % 5)}({i})" for i in range(16 * 8)]
    lengths = [4 + (i * 7) % 13 for i in range(len(prompts))]

    async def one_client(client, mine):
        out = []
        for i in mine:
            answer = await client.chat.completions.create(model="tiny", temperature=0, max_tokens=lengths[i],
                                                          messages=[{"role": "user", "content": prompts[i]}])
            out.append((i, answer.choices[0].message.content))
        return out

    async def everyone():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
        results = await asyncio.gather(*(one_client(client, range(c, len(prompts), 16)) for c in range(16)))
        await client.close()
        return dict(item for result in results for item in result)

    got = asyncio.run(everyone())
    assert sorted(got) == list(range(len(prompts)))
    data = {"batch_size": 1, "temperature": 0.0, "requests": []}
    runner = Runner(EngineDir.open(engine), threads=1)
    for i in range(0, len(prompts), 9):  # a sample of the alone-results (each is a run of its own)
        loaded = parse_input_dict({**data, "max_generate_length": lengths[i],
                                   "requests": [{"messages": [{"role": "user", "content": prompts[i]}]}]})
        assert got[i] == runner.run(loaded, loaded.settings).responses[0].output_text, i
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'trt_llm_requests_total{route="/v1/chat/completions",status="200"}' in metrics


def test_bad_requests_are_4xx_and_name_the_field(server):
    url = f"{server.url}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {KEY}"}
    good = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        ({**good, "n": 2}, 400, "n"),
        ({**good, "temperature": 3}, 400, "temperature"),
        ({**good, "frobnicate": 1}, 400, "frobnicate"),
        ({**good, "logit_bias": {"abc": 1.0}}, 400, "logit_bias"),
        ({**good, "model": "nope"}, 404, "model"),
        ({**good, "messages": []}, 400, "messages"),
        ({**good, "top_logprobs": 3}, 400, None),
        ({**good, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "dependentRequired": {"a": ["b"]}}}}}, 400, "response_format.json_schema.schema"),
        ({**good, "response_format": {"type": "json_schema"}}, 400, "response_format"),
        ({**good, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}, 400, None),
        ({**good, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "/etc/passwd"}}]}]}, 403, None),
        ({**good, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, 400, None),
    ]
    for body, status, param in cases:
        answer = httpx.post(url, json=body, headers=auth)
        assert answer.status_code == status, (body, answer.text)
        error = answer.json()["error"]
        assert error["message"] and (param is None or error["param"].startswith(param)), (body, error)
    assert httpx.post(url, content=b"{not json", headers={**auth, "Content-Type": "application/json"}).status_code == 400
    assert httpx.post(url, json=good).status_code == 401
    assert httpx.post(url, json=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed
    big = {**good, "messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    assert httpx.post(url, json=big, headers=auth).status_code == 413
    assert httpx.post(url, json=good, headers=auth).status_code == 200  # and the server still serves


def test_a_full_queue_answers_429(engine_and_adapter):
    live = make_server(*engine_and_adapter, max_waiting=0)
    try:
        answer = httpx.post(f"{live.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
    finally:
        live.close()


def test_a_client_leaving_mid_stream_frees_its_row(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 400,
            "temperature": 0, "logit_bias": {"0": -100, "1": -100, "2": -100}, "stream": True}

    def gauge(name):
        text = httpx.get(f"{server.url}/metrics", headers=auth).text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

    aborted = gauge("trt_llm_aborted_requests_total")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=auth) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and '"content"' in line and '""' not in line:
                break  # one real delta, then hang up
    deadline = time.time() + 20
    while gauge("trt_llm_aborted_requests_total") == aborted or gauge("trt_llm_rows_in_flight") != 0:
        assert time.time() < deadline, "the row was not freed"
        time.sleep(0.1)


def test_structured_output_through_the_client(server):
    import jsonschema

    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"k": {"enum": ["x", "y"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["k", "n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "kn", "schema": schema, "strict": True}}
    for stream in (False, True):
        kwargs = dict(temperature=0.8, seed=1, max_tokens=64, response_format=fmt)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in chat(server.client(), "Go.", stream=True, **kwargs))
        else:
            text = chat(server.client(), "Go.", **kwargs).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


def test_local_media_stays_inside_the_allowed_folder(tmp_path):
    from trt_llm.server.convert import BadRequest, media_source

    root = tmp_path / "media"
    root.mkdir()
    (root / "cat.png").write_bytes(b"png")
    (tmp_path / "secret.png").write_bytes(b"no")
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    assert media_source("cat.png", root, "p") == str((root / "cat.png").resolve())
    assert media_source(f"file://{root}/cat.png", root, "p") == str((root / "cat.png").resolve())
    for url, status in [("../secret.png", 403), (f"{root}/../secret.png", 403), ("link.png", 403),
                        ("/etc/passwd", 403), ("missing.png", 400), ("http://example.com/a.png", 400),
                        ("data:image/png,notbase64", 400), ("data:image/png;base64,@@@", 400)]:
        with pytest.raises(BadRequest) as refused:
            media_source(url, root, "p")
        assert refused.value.status == status, url
    with pytest.raises(BadRequest) as off:
        media_source("cat.png", None, "p")
    assert off.value.status == 403 and "--allowed-local-media-path" in str(off.value)


def test_a_request_past_its_timeout_is_504_and_frees_its_row(engine_and_adapter):
    live = make_server(*engine_and_adapter, request_timeout_s=0.3)
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                "logit_bias": {"0": -100, "1": -100, "2": -100}}
        # A slow engine: every step takes 50 ms, so the request cannot finish its tokens in 0.3 s.
        engine = live.app.state.engine
        real_step = engine.runner.engine_core

        def slow_core(*args, **kwargs):
            core = real_step(*args, **kwargs)
            step = core.step

            def slow():
                time.sleep(0.05)
                return step()

            core.step = slow
            return core

        engine.close()
        engine.runner.engine_core = slow_core
        engine.start()
        answer = httpx.post(f"{live.url}/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert answer.status_code == 504 and answer.json()["error"]["code"] == "timeout"
        deadline = time.time() + 10
        while engine._jobs:
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        live.close()


def test_serve_flags(tmp_path, engine_and_adapter):
    from trt_llm.runtime.engine_dir import EngineDir as Dir
    from trt_llm.server.cli import parse_args, server_config

    engine, adapter = engine_and_adapter
    keys = tmp_path / "keys"
    keys.write_text("k1\n\nk2\n")
    args = parse_args(["--engine-dir", str(engine), "--api-key", "k0", "--api-key-file", str(keys),
                       "--lora", f"ada={adapter}", "--max-batch-size", "2"])
    config = server_config(args, Dir.open(engine))
    assert args.host == "127.0.0.1"  # loopback unless told otherwise
    assert config.api_keys == ("k0", "k1", "k2") and config.lora == {"ada": str(adapter)} and config.max_rows == 2
    assert config.cors_origins == () and config.media_root is None
    for bad in (["--lora", "nameonly"], ["--max-batch-size", "999"], ["--api-key-file", str(tmp_path / "none")]):
        with pytest.raises(ValueError):
            server_config(parse_args(["--engine-dir", str(engine), *bad]), Dir.open(engine))
    with pytest.raises(ValueError, match=r"^--kv-cache-budget: 102400000.0 GiB is more than this machine's memory"):
        server_config(parse_args(["--engine-dir", str(engine), "--kv-cache-budget", "100000T"]), Dir.open(engine))


def test_eagle_under_in_flight_batching(tiny_model, build_engine_for, tmp_path):
    """An EAGLE engine behind the server: concurrent requests speculate in one batch, one of them
    with speculation off (it verifies its root alone), and every answer is vanilla decoding's."""
    from assets import make_random_draft

    base = tiny_model("llama", num_hidden_layers=4)
    draft = make_random_draft(base, tmp_path / "draft")
    engine = build_engine_for(base, draft={"model": str(draft), "max_draft_tree_size": 24, "max_verify_tree_size": 16})
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=4)))
    try:
        async def everyone():
            client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
            answers = await asyncio.gather(*(
                client.chat.completions.create(model="tiny", temperature=0, max_tokens=12,
                                               messages=[{"role": "user", "content": f"{PROMPTS[i % 4]} ({i})"}],
                                               extra_body={"disable_spec_decode": i == 3})
                for i in range(8)))
            await client.close()
            return [a.choices[0].message.content for a in answers]

        got = asyncio.run(everyone())
    finally:
        live.close()
    assert runner.spec_stats.rounds > 0  # speculation really ran
    vanilla = Runner(EngineDir.open(engine), threads=1, spec_decode=False)
    for i, text in enumerate(got):
        loaded = parse_input_dict({"temperature": 0.0, "max_generate_length": 12,
                                   "requests": [{"messages": [{"role": "user", "content": f"{PROMPTS[i % 4]} ({i})"}]}]})
        assert text == vanilla.run(loaded, loaded.settings).responses[0].output_text, i


def test_trt_llm_serve_end_to_end(engine_and_adapter, tmp_path):
    """The console entry point: flags, loopback, a request, a clean stop on SIGTERM; an unusable
    engine directory is one line and exit status 2."""
    import signal
    import subprocess
    import sys

    engine, _ = engine_and_adapter
    # --port 0: the server takes a free port and says which (a probed one another test worker could take)
    command = [sys.executable, "-m", "trt_llm.server.cli", "--engine-dir", str(engine), "--port", "0",
               "--model-name", "tiny", "--threads", "1"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = helpers.Announced(server).url()
        assert httpx.get(f"{url}/health").status_code == 200
        answer = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) \
            .chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert answer.usage.completion_tokens >= 1
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(timeout=30)
    assert status in (0, -signal.SIGTERM)
    bad = subprocess.run([sys.executable, "-m", "trt_llm.server.cli", "--engine-dir", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
