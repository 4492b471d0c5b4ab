"""The cpu runtime imports neither torch nor transformers: trt-llm-run (sampled, with logprobs, a
seed and a grammar), trt-llm-eval and trt-llm-serve run on a cpu engine in a Python where neither
can be imported (tests/without_transformers.py), and a seeded run gives there the tokens it gives in
this process, where torch is loaded."""

import importlib.util
import json
import signal
import subprocess

import httpx

import without_transformers
from helpers import PROMPTS, Announced, chat_request, run_input

BLOCKED = ("transformers", "torch")
HAS_LLGUIDANCE = importlib.util.find_spec("llguidance") is not None
SCHEMA = {"type": "object", "properties": {"k": {"enum": ["x", "y"]}}, "required": ["k"],
          "additionalProperties": False}


def _engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def test_run_and_eval_without_torch(tiny_model, build_engine_for, tmp_path):
    engine = _engine(tiny_model, build_engine_for)
    requests = [chat_request(PROMPTS[0]), chat_request(PROMPTS[1], logit_bias={"5": 2.0}, num_logprobs=3)]
    if HAS_LLGUIDANCE:
        requests.append(chat_request("Answer in JSON.", response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}))
    data = {"batch_size": 3, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 11, "num_logprobs": 2,
            "max_generate_length": 12, "requests": requests}
    source, target = tmp_path / "in.json", tmp_path / "out.json"
    source.write_text(json.dumps(data))
    result, loaded = without_transformers.run("trt_llm.runtime.app.run_cli", source, "--engine-dir", engine,
                                              "-o", target, "--threads", "1", forbidden=BLOCKED, timeout=120)
    assert result.returncode == 0, result.stderr
    assert loaded == [], loaded
    got = json.loads(target.read_text())["responses"]
    assert len(got) == len(requests) and all(r.get("output_token_ids") for r in got), got
    assert all(len(r["logprobs"]) == len(r["output_token_ids"]) for r in got)
    if HAS_LLGUIDANCE:
        assert json.loads(got[2]["output_text"])["k"] in ("x", "y"), got[2]
    # The same seeded run in this process (torch loaded) gives the same tokens and log-probabilities.
    want = run_input(engine, data).responses
    assert [r["output_token_ids"] for r in got] == [r.output_token_ids for r in want]
    for mine, theirs in zip(got, want):
        for step, candidates in zip(mine["logprobs"], theirs.logprobs):
            assert [c["token_id"] for c in step] == [c.token_id for c in candidates]
            assert [c["logprob"] for c in step] == [c.logprob for c in candidates]

    text = tmp_path / "text.txt"
    text.write_text(" ".join(PROMPTS * 4))
    report = tmp_path / "report.json"
    result, loaded = without_transformers.run("trt_llm.runtime.app.eval_cli", text, "--engine-dir", engine,
                                              "--context", "32", "--threads", "1", "-o", report,
                                              forbidden=BLOCKED, timeout=120)
    assert result.returncode == 0, result.stderr
    assert loaded == [], loaded
    assert json.loads(report.read_text())["perplexity"] > 1


def test_serve_without_torch(tiny_model, build_engine_for):
    engine = _engine(tiny_model, build_engine_for)
    # --port 0: the server takes a free port and says which (a probed one another test worker could take)
    command = without_transformers.command("trt_llm.server.cli", "--engine-dir", engine, "--port", 0,
                                           "--model-name", "tiny", "--threads", "1", forbidden=BLOCKED)
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    announced = Announced(server)
    try:
        url = announced.url()
        assert httpx.get(f"{url}/health").status_code == 200
        body = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": 6, "temperature": 0.7, "top_p": 0.9,
                "seed": 5, "logprobs": 2}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert answer.json()["usage"]["completion_tokens"] >= 1
        assert len(choice["logprobs"]["token_logprobs"]) == answer.json()["usage"]["completion_tokens"]
    finally:
        server.send_signal(signal.SIGTERM)
        stderr = announced.wait(timeout=30)
    assert server.returncode in (0, 128 + signal.SIGTERM), stderr
    assert without_transformers.loaded(stderr, server.returncode) == []
