"""Issue 33, item 6 ("what the probe found"): each finding reproduced, its message asserted, and
nothing else lost. One tiny engine (tests/test_server.py's, built once per session) serves them all;
the server runs in-process on loopback, its engine steps slowed only where a test needs a client to
leave mid-answer."""

import json
import logging
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from test_server import LiveServer  # noqa: E402
from trt_llm.server.app import ServerConfig, create_app  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ROUTE = "/v1/chat/completions"
GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
NO_EOS = {"0": -100, "1": -100, "2": -100}  # the tiny tokenizer's special tokens: generation runs to its length


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"), lora={"max_rank": 8})  # the engine tests/test_server.py uses


@pytest.fixture(scope="module")
def live(engine, tmp_path_factory):
    """The server, with `live.step_delay` seconds added to every engine step (0: full speed)."""
    media = tmp_path_factory.mktemp("media")
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    server = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=4, media_root=media)))
    server.step_delay = 0.0
    serving = server.app.state.engine
    make_core = serving.runner.engine_core

    def slowed(*args, **kwargs):
        core = make_core(*args, **kwargs)
        step = core.step

        def slow():
            if server.step_delay:
                time.sleep(server.step_delay)
            return step()

        core.step = slow
        return core

    serving.close()
    serving.runner.engine_core = slowed
    serving.start()
    yield server
    server.close()


def metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(f"{server.url}/metrics").text
    prefix = f"{name}{{{labels}}}" if labels else name
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix + " "))


def refusal(server, body, route=ROUTE) -> tuple[int, dict]:
    answer = httpx.post(f"{server.url}{route}", json=body, timeout=30)
    return answer.status_code, answer.json().get("error", {})


# a. A request the install cannot serve fails alone --------------------------------------------------

_WITHOUT_LLGUIDANCE = """
import importlib, sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "llguidance":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
sys.exit(importlib.import_module("trt_llm.runtime.app.run_cli").main(sys.argv[1:]))
"""


def test_a_response_format_without_llguidance_fails_alone(engine, tmp_path):
    requests = [{"messages": [{"role": "user", "content": "one"}]},
                {"messages": [{"role": "user", "content": "two"}], "response_format": {"type": "json_object"}},
                {"messages": [{"role": "user", "content": "three"}]}]
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 4, "requests": requests}
    (tmp_path / "in.json").write_text(json.dumps(data))
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-c", _WITHOUT_LLGUIDANCE, str(tmp_path / "in.json"), "--engine-dir",
                          str(engine), "-o", str(out), "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    responses = json.loads(out.read_text())["responses"]
    assert [r["request_idx"] for r in responses] == [0, 1, 2]
    assert [r["finish_reason"] for r in responses] == ["max-length", "error", "max-length"]
    assert responses[0]["output_text"] and responses[2]["generated_tokens"] == 4
    assert responses[1]["error"] == ("requests[1].response_format: structured output needs llguidance, which is not "
                                     "installed (it is a dependency of trt-llm: pip install llguidance)")
    # llguidance is a base dependency now (a 3 MB wheel), not only the server's.
    assert '"llguidance>=' in (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
def test_a_whatever_fails_in_preparation_fails_that_request_alone(engine, monkeypatch, scheduling):
    from trt_llm.runtime.sampling.grammar import Grammars

    def broken(self, response_format):
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(Grammars, "constraint", broken)
    loaded = parse_input_dict({"batch_size": 2, "temperature": 0.0, "max_generate_length": 3, "requests": [
        {"messages": [{"role": "user", "content": "one"}]},
        {"messages": [{"role": "user", "content": "two"}], "response_format": {"type": "json_object"}},
        {"messages": [{"role": "user", "content": "three"}]}]})
    output = Runner(EngineDir.open(engine), threads=1, scheduling=scheduling).run(loaded, loaded.settings)
    assert [r.finish_reason for r in output.responses] == ["max-length", "error", "max-length"]
    assert output.responses[1].error == "requests[1]: could not be prepared: RuntimeError: something unforeseen"


# b. A client that leaves: one line in the log ------------------------------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_b_a_client_leaving_a_whole_answer_is_one_log_line(live, caplog):
    uvicorn_log, seen = logging.getLogger("uvicorn.error"), _Records()
    uvicorn_log.addHandler(seen)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a long answer"}], "max_tokens": 200,
            "temperature": 0, "logit_bias": NO_EOS}
    aborted, gone = metric(live, "trt_llm_aborted_requests_total"), metric(
        live, "trt_llm_requests_total", f'route="{ROUTE}",status="499"')
    live.step_delay = 0.05  # 200 tokens take 10 s: the client gives up after 1
    try:
        with caplog.at_level(logging.INFO):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{live.url}{ROUTE}", json=body, timeout=1.0)
            deadline = time.time() + 20
            while (metric(live, "trt_llm_aborted_requests_total") == aborted
                   or metric(live, "trt_llm_requests_total", f'route="{ROUTE}",status="499"') == gone):
                assert time.time() < deadline, "the request was not aborted"
                time.sleep(0.1)
    finally:
        live.step_delay = 0.0
        uvicorn_log.removeHandler(seen)
    assert not seen.records, [r.getMessage() for r in seen.records]  # no "Exception in ASGI application"
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert "\n" not in message and message.startswith(f"{ROUTE}: the client disconnected before its answer"), message
    assert refusal(live, GOOD)[0] == 200  # and the server still serves


# c. Mistakes inside a message part name the part and what is wrong -------------------------------

def _audio(data="UklGRg==", fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def _messages(*parts):
    return {**GOOD, "messages": [{"role": "user", "content": list(parts)}]}


PART_MISTAKES = {
    "audio format": (_messages({"type": "text", "text": "hi"}, _audio(fmt="ogg")),
                     "messages.0.content.1.input_audio.format",
                     "messages.0.content.1.input_audio.format: 'ogg' is not supported; use wav, mp3 or flac"),
    "empty audio": (_messages(_audio(data="")), "messages.0.content.0.input_audio.data",
                    "messages.0.content.0.input_audio.data: empty string not allowed"),
    "unknown part": (_messages({"type": "input_video", "input_video": {"url": "data:video/mp4;base64,AAAA"}}),
                     "messages.0.content.0.type",
                     "messages.0.content.0.type: 'input_video' is not supported; "
                     "use text, image_url, input_audio or video_url"),
    "part without a type": (_messages({"text": "hi"}), "messages.0.content.0.type",
                            "messages.0.content.0.type: required field missing (text, image_url, input_audio or "
                            "video_url)"),
    "null content": ({**GOOD, "messages": [{"role": "user", "content": None}]}, "messages.0",
                     "messages.0: content is required (only an assistant turn with tool_calls may leave it out)"),
    "typo in a part": (_messages({"type": "text", "txt": "hi"}), "messages.0.content.0.txt",
                       "messages.0.content.0.txt: unknown or unsupported parameter (did you mean 'text'?); "
                       "messages.0.content.0.text: required field missing"),
    "image url of a number": (_messages({"type": "image_url", "image_url": {"url": 5}}),
                              "messages.0.content.0.image_url.url",
                              "messages.0.content.0.image_url.url: expected a string, got 5"),
    "stop of a number": ({**GOOD, "stop": 3}, "stop", "stop: expected a string or an array of strings, got 3"),
    "prompt list": ({"model": "tiny", "prompt": ["a", "b"]}, "prompt",
                    "prompt: a list of 2 prompts; this server completes one prompt per request (send each as a "
                    "request of its own)"),
    "prompt of token ids": ({"model": "tiny", "prompt": [1, 2, 3]}, "prompt",
                            "prompt: token ids are not supported; send the prompt as a string"),
}


@pytest.mark.parametrize("case", list(PART_MISTAKES))
def test_c_a_mistake_inside_a_part_names_it(live, case):
    body, param, message = PART_MISTAKES[case]
    status, error = refusal(live, body, "/v1/completions" if "prompt" in body else ROUTE)
    assert (status, error["param"], error["message"]) == (400, param, message)


def test_c_input_audio_takes_base64_or_a_data_url(live):
    # The README promises data URLs and local files; OpenAI's clients send the bare base64. All reach the preparer
    # (this text-only engine then refuses the clip by name), a data URL that is not base64 does not.
    clip = live.app.state.config.media_root / "clip.wav"
    clip.write_bytes(b"RIFF")
    for data in ("UklGRg==", "data:audio/wav;base64,UklGRg==", f"file://{clip}"):
        status, error = refusal(live, _messages(_audio(data=data)))
        assert status == 400 and "this engine has no audio encoder" in error["message"], (data, error)
    status, error = refusal(live, _messages(_audio(data="data:audio/wav,raw")))
    assert status == 400 and error["message"].startswith("messages[0].content[0].input_audio.data: a data URL must "
                                                         "be base64"), error
    status, error = refusal(live, _messages(_audio(data="@@not base64@@")))
    assert status == 400 and error["param"] == "messages[0].content[0].input_audio.data", error


# d. trt-llm-eval and trt-llm-compile: one line, exit status 2 -------------------------------------

def _exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exit:  # argparse's errors
        return exit.code


def test_d_eval_context_too_short_is_a_flag_error(engine, tmp_path, capsys):
    from trt_llm.runtime.app.eval_cli import main as eval_main

    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    for context in ("1", "2"):
        assert _exit_code(eval_main, [str(text), "--engine-dir", str(engine), "--context", context]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"trt-llm-eval: error: argument --context: {context} is below 3 (the second half of each "
                       f"chunk is scored: a chunk of {context} has no token to score)"), err
    # The shortest context scores; on this LoRA engine too (the base model's LoRA inputs are bound).
    out = tmp_path / "report.json"
    assert _exit_code(eval_main, [str(text), "--engine-dir", str(engine), "--context", "3", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["tokens_scored"] > 0


@pytest.fixture(scope="module")
def bundle(tiny_model, tmp_path_factory):
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = tmp_path_factory.mktemp("bundle") / "bundle"
    return build_engine(BuildConfig(model=str(tiny_model("qwen3")), output_dir=str(out), max_batch_size=4,
                                    max_input_len=256, max_kv_cache_capacity=512), progress=False, export_only=True)


@pytest.mark.parametrize("cut", ["llm/model.onnx", "llm/model.onnx.data"])
def test_d_compile_of_a_truncated_graph_is_one_line(bundle, cut, tmp_path, capsys):
    from trt_llm.build.compile_cli import main as compile_main

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    data = (copy / cut).read_bytes()
    (copy / cut).write_bytes(data[: len(data) // 2])
    out = tmp_path / "engine"
    assert _exit_code(compile_main, [str(copy), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"trt-llm-compile: error: {copy}: {cut} "), err
    assert "is damaged" in err and err.endswith("export the bundle again"), err
    if cut.endswith(".data"):
        assert f"the file has {len(data) // 2:,}" in err, err
    assert not out.exists() and not list(tmp_path.glob(".engine.building-*"))


# e. The server's flags, limits, counters and messages -----------------------------------------------

@pytest.mark.parametrize("flag, value, message", [
    ("--port", "70000", "argument --port: 70000 is outside [0, 65535]"),
    ("--port", "-1", "argument --port: -1 is outside [0, 65535]"),
    ("--request-timeout", "-5", "argument --request-timeout: -5 is not a positive number"),
    ("--request-timeout", "0", "argument --request-timeout: 0 is not a positive number"),
])
def test_e_serve_refuses_a_port_or_timeout_out_of_range(flag, value, message, capsys):
    from trt_llm.server.cli import parse_args

    assert _exit_code(parse_args, ["--engine-dir", "x", flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"trt-llm-serve: error: {message}"


def test_e_serve_says_where_it_listens(engine):
    command = [sys.executable, "-m", "trt_llm.server.cli", "--engine-dir", str(engine), "--port", "0",
               "--model-name", "tiny", "--threads", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stderr], daemon=True).start()
    try:
        line = lines.get(timeout=60)
        assert line.startswith("trt-llm-serve: listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        assert int(url.rsplit(":", 1)[1]) > 0  # port 0: the one it took
        assert httpx.get(f"{url}/health").status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_e_a_chunked_body_over_the_limit_is_413(engine):
    live = LiveServer(create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                                 ServerConfig(model_name="tiny", max_body_bytes=1 << 16)))
    try:
        def chunks():  # no Content-Length: the limit is found as the body arrives
            for _ in range(4):
                yield b" " * 65536

        answer = httpx.post(f"{live.url}{ROUTE}", content=chunks(), headers={"Content-Type": "application/json"})
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["code"] == "body_too_large"
        assert metric(live, "trt_llm_requests_total", f'route="{ROUTE}",status="413"') == 1
        assert httpx.post(f"{live.url}{ROUTE}", json=GOOD).status_code == 200
    finally:
        live.close()


def test_e_metrics_count_refused_bodies(live):
    def count(status):
        return metric(live, "trt_llm_requests_total", f'route="{ROUTE}",status="{status}"')

    before = {status: count(status) for status in ("200", "400")}
    assert refusal(live, {**GOOD, "temperature": 3})[0] == 400  # refused by the body's validation
    assert refusal(live, {**GOOD, "frobnicate": 1})[0] == 400
    assert refusal(live, GOOD)[0] == 200
    assert count("400") == before["400"] + 2 and count("200") == before["200"] + 1
    completions = 'route="/v1/completions",status="400"'
    was = metric(live, "trt_llm_requests_total", completions)
    assert refusal(live, {"model": "tiny", "prompt": 5}, "/v1/completions")[0] == 400
    assert metric(live, "trt_llm_requests_total", completions) == was + 1


def test_e_a_grammar_error_is_one_line_naming_the_field(live):
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}
    status, error = refusal(live, {**GOOD, "response_format": {"type": "json_schema",
                                                               "json_schema": {"name": "x", "schema": schema}}})
    assert status == 400 and error["param"] == "response_format.json_schema.schema", error
    assert error["message"] == ("response_format.json_schema.schema: cannot be enforced: regex parse error: (( "
                                "error: unclosed group"), error


def test_e_a_nul_in_a_path_is_shown_escaped(live, engine, tmp_path, caplog):
    status, error = refusal(live, _messages({"type": "image_url", "image_url": {"url": "cat\x00.png"}}))
    assert status == 400 and error["param"] == "messages[0].content[0].image_url.url", error
    assert error["message"] == ("messages[0].content[0].image_url.url: 'cat\\x00.png' is not a valid path (it holds "
                                "a NUL character)"), error
    from trt_llm.runtime.app.run_cli import main as run_main

    data = {"max_generate_length": 2, "available_lora_weights": {"ada": "adapter\x00dir"},
            "requests": [{"messages": [{"role": "user", "content": "hi"}], "lora_name": "ada"},
                         {"messages": [{"role": "user", "content": "hi"}]}]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    with caplog.at_level(logging.ERROR):
        assert run_main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "-o", str(tmp_path / "out.json"),
                         "--threads", "1"]) == 1
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert responses[0]["error"] == "requests[0].lora_name: LoRA adapter 'ada': 'adapter\\x00dir' not found"
    assert responses[1]["finish_reason"] == "max-length"
    assert all("\x00" not in r.getMessage() for r in caplog.records)


# f. The input format's page says what engines take ------------------------------------------------

def test_f_the_input_format_page_says_audio_engines_take_audio():
    page = " ".join((REPO / "docs" / "input-format.md").read_text().split())
    assert "have no audio encoder" not in page
    assert "a Qwen2-Audio engine (one with an `audio/` component) reads it" in page
    assert "a Whisper engine transcribes it" in page
