"""`trt-llm-run` end to end on a tiny model: output file, schema, exit codes, nothing lost."""

import json
from pathlib import Path

import jsonschema
import pytest

from helpers import PROMPTS, chat_request, run_input
from trt_llm.runtime.app.run_cli import main as run_main

SCHEMA = json.loads((Path(__file__).parent.parent / "schemas/json/output_file.schema.json").read_text())


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_cli_writes_output_that_validates(engine, tmp_path):
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 12,
            "requests": [chat_request(p) for p in PROMPTS[:3]]}
    out = tmp_path / "out.json"
    assert run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(engine), "-o", str(out),
                     "--threads", "1"]) == 0
    result = json.loads(out.read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["input_file"] == str(tmp_path / "in.json")
    responses = result["responses"]
    assert [r["request_idx"] for r in responses] == [0, 1, 2]
    assert [r["batch_idx"] for r in responses] == [0, 1, 0]
    for r in responses:
        assert r["finish_reason"] in ("end-of-sequence", "max-length")
        assert 0 < r["generated_tokens"] <= 12 and r["prompt_tokens"] > 0
        assert r["formatted_complete_request"].startswith(r["formatted_system_prompt"])
        assert "You are a tiny test model." in r["formatted_system_prompt"]  # the template's default
        assert r["messages"] == data["requests"][r["request_idx"]]["messages"]
        assert "logprobs" not in r and "error" not in r


def test_cli_overrides_and_stdout(engine, tmp_path, capsys):
    data = {"max_generate_length": 100, "temperature": 0.0, "requests": [chat_request(PROMPTS[0])]}
    code = run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(engine),
                     "--max-generate-length", "3", "--threads", "1"])
    assert code == 0
    response = json.loads(capsys.readouterr().out)["responses"][0]
    assert response["generated_tokens"] <= 3


def test_bad_requests_fail_alone_and_exit_1(engine, tmp_path):
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 8, "requests": [
        chat_request(PROMPTS[0]),
        {"messages": [{"role": "robot", "content": "beep"}]},                                 # bad role
        chat_request("x " * 400),                                                           # too long
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]},  # no encoder
        chat_request(PROMPTS[1], logit_bias={"999999": 1.0}),                               # outside vocab
        chat_request(PROMPTS[3]),
    ]}
    out = tmp_path / "out.json"
    assert run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(engine), "-o", str(out),
                     "--threads", "1"]) == 1
    responses = json.loads(out.read_text())["responses"]
    jsonschema.validate({"input_file": "x", "responses": responses}, SCHEMA)
    reasons = [r["finish_reason"] for r in responses]
    assert reasons[0] != "error" and reasons[5] != "error"
    assert reasons[1:5] == ["error"] * 4
    assert "requests[1].messages[0].role" in responses[1]["error"]
    assert "requests[2]" in responses[2]["error"] and "max_input_len 256" in responses[2]["error"]
    assert "no image encoder" in responses[3]["error"]
    assert "requests[4].logit_bias" in responses[4]["error"] and "999999" in responses[4]["error"]
    # Each good request got exactly what it gets when run alone.
    for index in (0, 5):
        alone = run_input(engine, {"temperature": 0.0, "max_generate_length": 8,
                                   "requests": [data["requests"][index]]}).responses[0]
        assert responses[index]["output_token_ids"] == alone.output_token_ids


@pytest.mark.parametrize("content, message", [
    ("{not json", "in.json"),
    ('{"requests": []}', "requests"),
    ('{"batch_size": 0, "requests": [{"messages": [{"role": "user", "content": "hi"}]}]}', "batch_size"),
])
def test_unusable_input_file_exits_2(engine, tmp_path, caplog, content, message):
    out = tmp_path / "out.json"
    assert run_main([str(write(tmp_path / "in.json", content)), "--engine-dir", str(engine),
                     "-o", str(out)]) == 2
    assert message in caplog.text
    assert not out.exists()


def test_unusable_engine_dir_exits_2(tmp_path, caplog):
    data = {"requests": [chat_request("hi")]}
    assert run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(tmp_path)]) == 2
    assert "manifest.json" in caplog.text


def test_batch_size_above_engine_limit_exits_2(engine, tmp_path, caplog):
    data = {"batch_size": 8, "requests": [chat_request("hi")]}
    assert run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(engine)]) == 2
    assert "batch_size 8 exceeds the engine's max_batch_size 4" in caplog.text


def test_kv_capacity_clamps_generation(tiny_model, build_engine_for, caplog):
    engine = build_engine_for(tiny_model("qwen3"), max_input_len=96, max_kv_cache_capacity=96)
    data = {"temperature": 0.0, "max_generate_length": 500,
            "requests": [chat_request(PROMPTS[0], logit_bias={"2": -100.0, "0": -100.0})]}
    response = run_input(engine, data).responses[0]
    assert response.finish_reason == "max-length"
    assert response.prompt_tokens + response.generated_tokens == 96
    assert "clamped" in caplog.text


def test_sampling_is_reproducible_and_independent_of_batching(engine):
    requests = [chat_request(p) for p in PROMPTS]
    settings = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "max_generate_length": 16, "seed": 1234}
    one = run_input(engine, {**settings, "batch_size": 4, "requests": requests})
    two = run_input(engine, {**settings, "batch_size": 4, "requests": requests})
    alone = run_input(engine, {**settings, "batch_size": 1, "requests": requests})
    other_seed = run_input(engine, {**settings, "batch_size": 4, "seed": 99, "requests": requests})
    ids = lambda output: [r.output_token_ids for r in output.responses]  # noqa: E731
    assert ids(one) == ids(two) == ids(alone)
    assert ids(one) != ids(other_seed)


def test_logit_bias_forces_and_bans(engine):
    base = {"temperature": 0.0, "max_generate_length": 6}
    greedy = run_input(engine, {**base, "requests": [chat_request(PROMPTS[0])]}).responses[0]
    first = greedy.output_token_ids[0]
    banned = run_input(engine, {**base, "requests": [chat_request(PROMPTS[0], logit_bias={str(first): -100.0})]})
    assert first not in banned.responses[0].output_token_ids[:1]
    forced = run_input(engine, {**base, "logit_bias": {"77": 100.0}, "requests": [chat_request(PROMPTS[0])]})
    assert forced.responses[0].output_token_ids == [77] * 6


def test_profile_validates_and_agrees_with_output(engine, tmp_path, capsys):
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 10,
            "requests": [chat_request(p) for p in PROMPTS[:3]]}
    out, profile_path = tmp_path / "out.json", tmp_path / "profile.json"
    assert run_main([str(write(tmp_path / "in.json", data)), "--engine-dir", str(engine), "-o", str(out),
                     "--threads", "1", "--no-context-reuse", "--profile-output", str(profile_path), "--dump-profile"]) == 0
    profile = json.loads(profile_path.read_text())
    schema = json.loads((Path(__file__).parent.parent / "schemas/json/profile.schema.json").read_text())
    jsonschema.validate(profile, schema)
    responses = json.loads(out.read_text())["responses"]
    assert profile["prefill"]["runs"] == 2  # one prefill per batch
    assert profile["prefill"]["computed_tokens"] == sum(r["prompt_tokens"] for r in responses)
    # Each request's first token comes from prefill; the rest from decode steps.
    assert profile["generation"]["generated_tokens"] == sum(r["generated_tokens"] - 1 for r in responses)
    assert profile["time_to_first_token"]["per_request_ms"] == {
        str(r["request_idx"]): r["time_to_first_token_ms"] for r in responses}
    assert {"prefill", "decode_step", "sample", "prepare"} <= set(profile["stages"])
    assert profile["peak_memory_mb"] > 0
    assert "time to first token" in capsys.readouterr().err


def test_an_engine_failure_costs_only_its_batch(engine, monkeypatch):
    """A batch whose engine call fails gets error responses; the batches around it still run."""
    from trt_llm.runtime.requests import runner as runner_module

    real = runner_module._run_to_completion
    calls = []

    def flaky(core):
        calls.append(len(core.scheduler.waiting))
        if len(calls) == 2:
            raise RuntimeError("simulated engine failure")
        return real(core)

    monkeypatch.setattr(runner_module, "_run_to_completion", flaky)
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 4,
            "requests": [chat_request(p) for p in PROMPTS]}
    responses = run_input(engine, data).responses
    assert [r.finish_reason == "error" for r in responses] == [False, False, True, True]
    assert "simulated engine failure" in responses[2].error and responses[3].batch_idx == 1


def test_cpu_run_never_imports_tensorrt_or_cuda(engine, tmp_path):
    """Nothing of ours pulls TensorRT or cuda-python into a cpu run. (torch itself imports
    cuda-python's bindings when that package is installed: those are the baseline.)"""
    import subprocess
    import sys

    data = {"temperature": 0.0, "max_generate_length": 3, "requests": [chat_request("hi")]}
    script = ("import sys\nimport torch\n"
              "baseline = set(sys.modules)\nfrom trt_llm.runtime.app.run_cli import main\n"
              f"code = main([{str(write(tmp_path / 'in.json', data))!r}, '--engine-dir', {str(engine)!r}, '-o', "
              f"{str(tmp_path / 'out.json')!r}, '--threads', '1'])\n"
              "ours = ('tensorrt', 'tensorrt_rtx', 'cuda', 'trt_llm.runtime.backends.trt_engine', 'trt_llm.common.trt_import')\n"
              "loaded = [m for m in set(sys.modules) - baseline if m.split('.')[0] in ours or m in ours]\n"
              "print('LOADED', loaded)\nsys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout
