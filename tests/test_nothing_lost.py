"""Issue 21: bad paths, flags and engine directories get one line and exit 2, and nothing is lost:
the build replaces only what it wrote, a request that cannot be echoed still leaves the output file
whole, output paths are checked before any work, and an interrupted run keeps what it finished."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PROMPTS, chat_request
from trt_llm.build.cli import main as build_main
from trt_llm.runtime.app.run_cli import main as run_main

RUN = [sys.executable, "-c", "import sys; from trt_llm.runtime.app.run_cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def write_json(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def good_input(tmp_path: Path, count: int = 2, **settings) -> Path:
    data = {"temperature": 0.0, "max_generate_length": 4, **settings,
            "requests": [chat_request(PROMPTS[i % len(PROMPTS)]) for i in range(count)]}
    return write_json(tmp_path / "in.json", data)


def copy_engine(engine: Path, to: Path) -> Path:
    """A private copy of the engine directory to damage (weights hard-linked, never written)."""
    shutil.copytree(engine, to, copy_function=os.link)
    manifest = to / "manifest.json"
    manifest.unlink()
    shutil.copy(engine / "manifest.json", manifest)
    return to


def error_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


# --- 1. the build replaces only what it wrote --------------------------------------------------

@pytest.mark.parametrize("where", [".", "folder-with-files"])
def test_build_refuses_a_folder_it_did_not_write(tmp_path, tiny_model, capsys, where):
    out = tmp_path if where == "." else tmp_path / where
    out.mkdir(exist_ok=True)
    (out / "notes.txt").write_text("mine")
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tiny_model('llama')}\noutput_dir: {where}\n")
    capsys.readouterr()  # the fixture's own output
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"output_dir: {str(out)!r} holds files that are not an engine or bundle written by trt-llm" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # the config and the notes are still there
    assert (out / "notes.txt").read_text() == "mine"


def test_build_checks_output_dir_before_any_work(tmp_path, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "data.bin").write_bytes(b"x")
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tmp_path / 'absent.gguf'}\noutput_dir: busy\n")
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "absent.gguf" not in err  # refused before the model was even looked at


def test_build_output_dir_under_a_file(tmp_path, tiny_model, capsys):
    (tmp_path / "a-file").write_text("x")
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tiny_model('llama')}\noutput_dir: a-file/engine\n")
    capsys.readouterr()
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"trt-llm-build: error: output_dir: {str(tmp_path / 'a-file' / 'engine')!r} cannot be made: "
                   f"{str(tmp_path / 'a-file')!r} is a file")


def test_rebuild_replaces_its_own_engine_and_nothing_beside_it(tmp_path, tiny_model, capsys):
    (tmp_path / "engine.building").mkdir()  # a user's folder that an older version would have deleted
    (tmp_path / "engine.building" / "keep.txt").write_text("keep")
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tiny_model('llama')}\noutput_dir: engine\nmax_input_len: 64\n"
                      "max_kv_cache_capacity: 128\n")
    assert build_main([str(config), "--quiet"]) == 0
    (tmp_path / "engine" / "stale.txt").write_text("from the first build")
    assert build_main([str(config), "--quiet"]) == 0  # an engine it wrote: replaced
    assert not (tmp_path / "engine" / "stale.txt").exists()
    assert (tmp_path / "engine.building" / "keep.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "engine", "engine.building"]
    mode = (tmp_path / "engine").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask  # the user's umask, not mkdtemp's 0700


def test_truncated_gguf_is_one_line(tmp_path, capsys):
    from assets import smollm2_gguf_path

    try:
        source = smollm2_gguf_path()
    except Exception as exc:  # the package that ships it is missing
        pytest.skip(f"SmolLM2 GGUF unavailable: {exc}")
    truncated = tmp_path / "model.gguf"
    with open(source, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {truncated}\noutput_dir: engine\n")
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"trt-llm-build: error: model: {str(truncated)!r} is damaged "
                                                         "or truncated")
    assert not (tmp_path / "engine").exists()


def test_quiet_build_shows_no_progress_bars(tmp_path, tiny_model, capfd):
    config = tmp_path / "config.yaml"
    config.write_text(f"model: {tiny_model('qwen2')}\noutput_dir: engine\nmax_input_len: 64\n"
                      "max_kv_cache_capacity: 128\n")
    capfd.readouterr()
    assert build_main([str(config), "--quiet"]) == 0
    captured = capfd.readouterr()
    assert "%|" not in captured.err + captured.out and "Loading" not in captured.err
    manifest = json.loads((tmp_path / "engine" / "manifest.json").read_text())
    assert manifest["model"]["architecture"] == "Qwen2ForCausalLM"


# --- 2. a request that cannot be echoed ---------------------------------------------------------

def test_lone_surrogate_request_fails_alone_and_the_file_is_written(engine, tmp_path):
    data = {"temperature": 0.0, "max_generate_length": 4, "requests": [
        chat_request(PROMPTS[0]), chat_request("bad \ud800 text"), chat_request(PROMPTS[1])]}
    source = tmp_path / "in.json"
    source.write_text(json.dumps(data), encoding="ascii")  # "\ud800" as the JSON escape a user wrote
    out = tmp_path / "out.json"
    assert run_main([str(source), "--engine-dir", str(engine), "-o", str(out), "--threads", "1"]) == 1
    text = out.read_text(encoding="utf-8")
    responses = json.loads(text)["responses"]
    assert [r["finish_reason"] == "error" for r in responses] == [False, True, False]
    assert "requests[1].messages[0].content: not valid Unicode text (unpaired surrogate" in responses[1]["error"]
    assert responses[1]["messages"] == data["requests"][1]["messages"]  # echoed exactly, as its escape
    assert "\\ud800" in text
    assert all(r["generated_tokens"] > 0 for r in (responses[0], responses[2]))


# --- 3. output paths, before any work -----------------------------------------------------------

def test_output_into_a_missing_folder_is_made(engine, tmp_path):
    out = tmp_path / "new" / "deeper" / "out.json"
    assert run_main([str(good_input(tmp_path)), "--engine-dir", str(engine), "-o", str(out), "--threads", "1"]) == 0
    assert len(json.loads(out.read_text())["responses"]) == 2
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # the user's umask, not mkstemp's 0600


@pytest.mark.parametrize("flag, target, message", [
    ("-o", "a-dir", "-o {path!r}: is a directory; give a file name"),
    ("-o", "a-file/out.json", "-o {path!r}: cannot write there"),
    ("-o", "in.json", "-o {path!r}: is the input file"),
    ("--profile-output", "a-dir", "--profile-output {path!r}: is a directory"),
    ("--profile-output", "a-file/p.json", "--profile-output {path!r}: cannot write there"),
    ("--kv-cache-dir", "a-file", "--kv-cache-dir {path!r}: is a file, not a folder"),
    ("--kv-cache-dir", "a-file/kv", "--kv-cache-dir {path!r}: cannot make or write this folder"),
])
def test_bad_output_paths_exit_2_before_any_request(engine, tmp_path, caplog, monkeypatch, flag, target, message):
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    source = good_input(tmp_path)
    ran = []
    monkeypatch.setattr("trt_llm.runtime.requests.runner.Runner.run", lambda *a, **k: ran.append(1))
    path = tmp_path / target
    assert run_main([str(source), "--engine-dir", str(engine), flag, str(path)]) == 2
    errors = error_lines(caplog)
    assert len(errors) == 1 and errors[0].startswith(message.format(path=str(path))), errors
    assert not ran
    assert json.loads(source.read_text())["requests"]  # the input is untouched


# --- 4. a corrupt engine directory --------------------------------------------------------------

def _manifest_edit(edit):
    def apply(directory: Path):
        path = directory / "manifest.json"
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps(edit(manifest)))
    return apply


def _truncate(relative: str, keep: int = 4096):
    def apply(directory: Path):
        path = directory / relative
        data = path.read_bytes()[:keep]
        path.unlink()  # hard-linked: replace, never write through to the shared copy
        path.write_bytes(data)
    return apply


def _without(section, key):
    def edit(manifest):
        del manifest[section][key]
        return manifest
    return edit


@pytest.mark.parametrize("damage, message", [
    (_manifest_edit(lambda m: [m]), "not a manifest: expected a JSON object, got an array"),
    (_manifest_edit(lambda m: "engine"), "not a manifest: expected a JSON object, got a string"),
    (_manifest_edit(_without("limits", "max_input_len")), "corrupt manifest: limits.max_input_len: required field missing"),
    (_manifest_edit(lambda m: {**m, "limits": {**m["limits"], "max_batch_size": "4"}}),
     "corrupt manifest: limits.max_batch_size: expected an integer, got '4'"),
    (_manifest_edit(lambda m: {**m, "model": None}), "corrupt manifest: model: expected an object, got null"),
    (_manifest_edit(lambda m: {**m, "components": {**m["components"], "llm": {
        **m["components"]["llm"], "engine": "../../etc/passwd"}}}),
     "corrupt manifest: components.llm.engine: '../../etc/passwd' is not a path inside the engine directory"),
    (_manifest_edit(lambda m: {**m, "model": {**m["model"], "dims": {**m["model"]["dims"], "vocab_size": 7}}}),
     "cannot load the embedding (shape"),
    (_truncate("llm/model.cpu.onnx"), "cannot load the engine"),
    (_truncate("llm/model.onnx.data", 1000), "cannot load the engine"),
    (_truncate("llm/embedding.safetensors", 100), "cannot load the embedding"),
    (_truncate("tokenizer/tokenizer.json", 50), "cannot load the tokenizer"),
])
def test_corrupt_engine_directory_is_one_line_and_exit_2(engine, tmp_path, caplog, damage, message):
    damaged = copy_engine(engine, tmp_path / "engine")
    damage(damaged)
    out = tmp_path / "out.json"
    assert run_main([str(good_input(tmp_path)), "--engine-dir", str(damaged), "-o", str(out), "--threads", "1"]) == 2
    errors = error_lines(caplog)
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0], errors
    assert not out.exists()


# --- 5. flags -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--threads", "0"], "trt-llm-run: error: argument --threads: 0 is below 1"),
    (["--threads", "two"], "trt-llm-run: error: argument --threads: 'two' is not an integer"),
    (["--batch-size", "-3"], "trt-llm-run: error: argument --batch-size: -3 is below 1"),
    (["--seed", "x"], "trt-llm-run: error: argument --seed: invalid int value: 'x'"),
])
def test_bad_flags_are_one_line(engine, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        run_main([str(good_input(tmp_path)), "--engine-dir", str(engine), *flags])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("flags, message", [
    (["--seed", "-1"], "--seed: -1 is less than the minimum 0"),
    (["--seed", str(2**64)], f"--seed: {2**64} is greater than the maximum {2**64 - 1}"),
    (["--batch-size", "17"], "--batch-size: 17 is outside [1, 16]"),
])
def test_bad_overrides_name_the_flag(engine, tmp_path, caplog, flags, message):
    assert run_main([str(good_input(tmp_path)), "--engine-dir", str(engine), *flags]) == 2
    assert error_lines(caplog) == [message]


def test_threads_above_the_cores_are_capped(engine, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("trt_llm.common.cli_args.available_cores", lambda: 2)
    out = tmp_path / "out.json"
    assert run_main([str(good_input(tmp_path)), "--engine-dir", str(engine), "-o", str(out), "--threads", "64"]) == 0
    assert "--threads 64 is more than the 2 cores this process can use; using 2" in caplog.text


# --- 6. interrupted is not lost -----------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_keeps_what_it_finished(engine, tmp_path, signum):
    count = 40
    data = {"temperature": 0.0, "max_generate_length": 400, "logit_bias": {"0": -100, "2": -100},  # no EOS
            "requests": [chat_request(PROMPTS[i % len(PROMPTS)]) for i in range(count)]}
    source = write_json(tmp_path / "in.json", data)
    out = tmp_path / "out.json"
    process = subprocess.Popen([*RUN, str(source), "--engine-dir", str(engine), "-o", str(out), "--threads", "1",
                                "-v"], stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:  # wait until two batches are done, then interrupt
        lines.append(line)
        if "batch 2 of" in line:
            process.send_signal(signum)
            break
    rest = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signum
    responses = json.loads(out.read_text())["responses"]
    assert [r["request_idx"] for r in responses] == list(range(count))
    finished = [r for r in responses if r["finish_reason"] != "error"]
    assert 2 <= len(finished) < count and all(r["generated_tokens"] == 400 for r in finished)
    assert [r["request_idx"] for r in finished] == list(range(len(finished)))
    name = signal.Signals(signum).name
    for r in responses[len(finished):]:
        assert r["error"] == f"requests[{r['request_idx']}]: interrupted ({name}) before this request finished"
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == (f"trt-llm-run: ERROR: interrupted ({name}): wrote {len(finished)} "
                                             f"finished responses to {out}, {count - len(finished)} marked interrupted")


# --- 8. the small things ------------------------------------------------------------------------

def test_verbose_logs_the_run(engine, tmp_path):
    result = subprocess.run([*RUN, str(good_input(tmp_path, count=3, batch_size=2)), "--engine-dir", str(engine),
                             "-o", str(tmp_path / "out.json"), "--threads", "1", "-v"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "cpu backend, 1 threads, 3 requests in batches of 2 (static scheduling)" in result.stderr
    assert "batch 1 of 2: requests 0-1" in result.stderr and "batch 2 of 2: requests 2-2" in result.stderr
    assert "3 requests, 0 failed" in result.stderr


def test_duplicate_keys_warn(engine, tmp_path, caplog):
    text = ('{"temperature": 0.5, "max_generate_length": 2, "temperature": 0.0, "requests": '
            '[{"messages": [{"role": "user", "content": "a", "content": "hi"}]}]}')
    out = tmp_path / "out.json"
    assert run_main([str(write_json(tmp_path / "in.json", text)), "--engine-dir", str(engine), "-o", str(out),
                     "--threads", "1"]) == 0
    assert "top level: duplicate key 'temperature'; the last value is used" in caplog.text
    assert "requests[0].messages[0]: duplicate key 'content'; the last value is used" in caplog.text
    response = json.loads(out.read_text())["responses"][0]
    assert response["messages"] == [{"role": "user", "content": "hi"}]
