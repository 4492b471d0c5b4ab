"""Two-stage deployment: `trt-llm-build --export-only` writes a portable bundle, `trt-llm-compile`
turns it into an engine directory where transformers cannot be imported, and `trt-llm-run` runs it
there; engine and output equal those of the one-go `trt-llm-build`."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import without_transformers
from helpers import PROMPTS, chat_request
from trt_llm.build.cli import build_engine
from trt_llm.build.cli import main as build_main
from trt_llm.build.compile_cli import main as compile_main
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.runtime.engine_dir import EngineDir, EngineDirError
from trt_llm.schemas.build_config import BuildConfig

SETTINGS = {"max_batch_size": 4, "max_input_len": 256, "max_kv_cache_capacity": 512}  # as build_engine_for's
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model("qwen3")


@pytest.fixture(scope="module")
def bundle(model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    config = folder / "config.yaml"
    # The backend is the compile's choice: an export-only build neither uses nor needs it (TensorRT
    # is not installed here).
    config.write_text(f"model: {model_dir}\noutput_dir: bundle\nbackend: tensorrt\n"
                      + "".join(f"{key}: {value}\n" for key, value in SETTINGS.items()))
    assert build_main([str(config), "--export-only", "--quiet"]) == 0
    return folder / "bundle"


@pytest.fixture(scope="module")
def one_go(model_dir, build_engine_for):
    return build_engine_for(model_dir)


@pytest.fixture(scope="module")
def compiled(bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled") / "engine"
    result, loaded = without_transformers.run("trt_llm.build.compile_cli", bundle, "--backend", "cpu", "-o", out,
                                              "--quiet")
    assert result.returncode == 0, result.stderr
    assert loaded == [], f"the compile imported {loaded}"
    return out


def test_bundle_holds_graphs_and_assets_but_no_engine(bundle):
    assert files(bundle) == {"manifest.json", "llm/model.onnx", "llm/model.onnx.data", "llm/embedding.safetensors",
                             "llm/config.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
                             "tokenizer/chat_template.jinja", "tokenizer/generation_config.json"}
    m = manifest(bundle)
    assert m["kind"] == "bundle" and m["backend"] is None and m["build_config"]["backend"] is None
    assert m["limits"] == SETTINGS and m["model"]["dtype"] == "fp32" and m["model"]["family"] == "qwen3"
    assert "engine" not in m["components"]["llm"]
    with pytest.raises(EngineDirError, match="a portable bundle, not an engine directory; compile it first"):
        EngineDir.open(bundle)


def test_compiled_engine_equals_the_one_go_build(compiled, one_go):
    assert files(compiled) == files(one_go)
    ours, theirs = manifest(compiled), manifest(one_go)
    assert ours["build_config"].pop("output_dir") == str(compiled)
    theirs["build_config"].pop("output_dir")
    assert ours == theirs
    assert ours["kind"] == "engine" and ours["components"]["llm"]["engine"] == "llm/model.cpu.onnx"


def test_run_without_transformers_equals_the_one_go_build(compiled, one_go, tmp_path):
    requests = [chat_request(p) for p in PROMPTS]
    requests.append({"messages": [{"role": "system", "content": "Answer briefly."},
                                  {"role": "user", "content": "Name a planet, 中文 🤖"}], "stop": ["the", "e"]})
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 10, "num_logprobs": 2,
            "enable_thinking": False, "requests": requests}
    source = tmp_path / "in.json"
    source.write_text(json.dumps(data))
    result, loaded = without_transformers.run("trt_llm.runtime.app.run_cli", source, "--engine-dir", compiled,
                                              "-o", tmp_path / "device.json", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert loaded == [], f"the run imported {loaded}"
    assert run_main([str(source), "--engine-dir", str(one_go), "-o", str(tmp_path / "one_go.json"),
                     "--threads", "1"]) == 0
    device, reference = (json.loads((tmp_path / name).read_text())["responses"] for name in ("device.json", "one_go.json"))
    for response in device + reference:
        response.pop("time_to_first_token_ms")
    assert device == reference
    assert all(r["generated_tokens"] > 0 and r["finish_reason"] != "error" for r in device)
    assert "<think>\n\n</think>" in device[0]["formatted_complete_request"]  # enable_thinking reached the template


def test_the_runtime_refuses_a_bundle_in_one_line(bundle, tmp_path, caplog):
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"requests": [chat_request("hi")]}))
    assert run_main([str(source), "--engine-dir", str(bundle)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "compile it first: trt-llm-compile" in errors[0], errors


def _copy(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle-copy"
    shutil.copytree(bundle, copy)
    return copy


def _forge(bundle, tmp_path, edit):
    copy = _copy(bundle, tmp_path)
    data = manifest(copy)
    edit(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def _bf16(data):
    data["model"]["dtype"] = data["build_config"]["dtype"] = "bf16"


ERRORS = {
    "no such folder": (lambda b, t: [t / "nothing"], "no such directory"),
    "no manifest": (lambda b, t: [t], "no manifest.json (write one with trt-llm-build CONFIG --export-only)"),
    "corrupt manifest": (lambda b, t: [_copy(b, t)], None),
    "engine directory": (None, "an engine directory already compiled for 'cpu', not a bundle"),
    "missing weights": (lambda b, t: [_copy(b, t)], "missing llm/model.onnx.data"),
    "unknown backend": (lambda b, t: [b, "--backend", "cuda"],
                        "backend: 'cuda' is not a backend; choose one of cpu, tensorrt, tensorrt-rtx"),
    "input longer than the cache": (lambda b, t: [b, "--max-input-len", "1000"], "max_input_len: 1000 is outside [1, 512]"),
    "batch too large": (lambda b, t: [b, "--max-batch-size", "65"], "max_batch_size: 65 is outside [1, 64]"),
    "not a number": (lambda b, t: [b, "--max-batch-size", "two"], "argument --max-batch-size: invalid int value"),
    "rtx option on cpu": (lambda b, t: [b, "--rtx-compute-capability", "SM86"],
                          "rtx_compute_capability: only the tensorrt-rtx backend"),
    "dtype the backend cannot run": (lambda b, t: [_forge(b, t, _bf16)],
                                     "dtype: 'bf16' is not supported by the cpu backend; choose one of fp32, fp16 "
                                     "(the bundle was exported in bf16"),
    "output inside the bundle": (lambda b, t: [b, "-o", b / "engine"], "overlaps the bundle"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_compile_errors_are_one_clear_line(case, bundle, one_go, tmp_path, capsys):
    make_args, expected = ERRORS[case]
    args = [one_go] if make_args is None else make_args(bundle, tmp_path)
    if case == "corrupt manifest":
        (args[0] / "manifest.json").write_text("{")
        expected = f"{args[0] / 'manifest.json'}: unreadable manifest"
    if case == "missing weights":
        (args[0] / "llm" / "model.onnx.data").unlink()
    out = tmp_path / "engine"
    if "-o" not in args:
        args += ["-o", out]
    assert _exit_code(compile_main, [str(a) for a in args] + ["--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("trt-llm-compile: error: ") and expected in err, err
    assert not out.exists() and not list(tmp_path.glob(".engine.building-*"))  # no staging folder left


def _exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exit:  # argparse's errors
        return exit.code


def test_tensorrt_missing_is_one_line(bundle, tmp_path, capsys):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here")
    except Exception:  # noqa: BLE001 - the PyPI stub raises on import without NVIDIA's libraries
        pass
    assert compile_main([str(bundle), "--backend", "tensorrt", "-o", str(tmp_path / "e"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'trt-llm[tensorrt]'" in err, err


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_bundle_to_tensorrt_rtx_without_transformers(bundle, tmp_path, capsys):
    import tensorrt_rtx as trt

    assert compile_main([str(bundle), "--backend", "tensorrt-rtx", "--rtx-compute-capability", "SM90", "-o",
                         str(tmp_path / "bad"), "--quiet"]) == 2
    assert "rtx_compute_capability: 'SM90' is not one TensorRT-RTX builds for" in capsys.readouterr().err

    out = tmp_path / "rtx"
    result, loaded = without_transformers.run("trt_llm.build.compile_cli", bundle, "--backend", "tensorrt-rtx",
                                              "--max-batch-size", "2", "--max-input-len", "64",
                                              "--rtx-compute-capability", "SM86", "-o", out, "--quiet")
    assert result.returncode == 0, result.stderr
    assert loaded == [], f"the compile imported {loaded}"
    m = manifest(out)
    assert m["backend"] == "tensorrt-rtx" and m["kind"] == "engine"
    assert m["limits"] == {"max_batch_size": 2, "max_input_len": 64, "max_kv_cache_capacity": 512}
    assert m["build_config"]["rtx_compute_capability"] == "SM86"
    assert m["components"]["llm"]["engine"] == "llm/model.plan"
    assert m["components"]["llm"]["tensorrt_version"] == trt.__version__
    assert (out / "llm" / "model.plan").stat().st_size > 100_000 and not (out / "llm" / "model.cpu.onnx").exists()
    assert files(out) == files(bundle) - {"manifest.json"} | {"manifest.json", "llm/model.plan"}


@pytest.fixture(scope="module")
def draft_bundle(tiny_model, tmp_path_factory):
    """A bundle of a tiny Llama with LoRA inputs and a random EAGLE3 draft."""
    import torch
    from transformers import AutoConfig

    from trt_llm.build.eagle.formats import save_draft_eagle_format
    from trt_llm.build.eagle.model import Eagle3Draft

    base = tiny_model("llama", num_hidden_layers=4)
    config = AutoConfig.from_pretrained(base)
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Draft.config_for_base(config, draft_vocab_size=200))
    draft.set_vocab_map(torch.randperm(config.vocab_size)[:200].sort().values)
    folder = tmp_path_factory.mktemp("draft")
    save_draft_eagle_format(draft, folder)
    out = tmp_path_factory.mktemp("draft-bundle") / "bundle"
    return build_engine(BuildConfig(model=str(base), output_dir=str(out), lora={"max_rank": 4},
                                    draft={"model": str(folder), "max_draft_tree_size": 24, "max_verify_tree_size": 16},
                                    **SETTINGS), progress=False, export_only=True)


def test_draft_and_lora_bundle_compiles_and_runs_without_transformers(draft_bundle, tmp_path, capsys):
    assert {"draft/model.onnx", "draft/model.onnx.data", "draft/tensors.safetensors"} <= files(draft_bundle)
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        # Drafts compile for the TensorRT backends too: a plan of their own, unquantized, and the
        # spec's tree as the default (shrunk to this bundle's limits: 24 drafted, 16 verified).
        rtx = tmp_path / "rtx"
        assert compile_main([str(draft_bundle), "--backend", "tensorrt-rtx", "-o", str(rtx), "--quiet"]) == 0
        draft = manifest(rtx)["components"]["draft"]
        assert draft["engine"] == "draft/model.plan" and (rtx / "draft" / "model.plan").stat().st_size > 10_000
        assert draft["quantization"] == "none"
        assert draft["tree_defaults"] == {"draft_top_k": 4, "draft_steps": 6, "verify_tree_size": 16}

    out = tmp_path / "engine"
    result, loaded = without_transformers.run("trt_llm.build.compile_cli", draft_bundle, "-o", out, "--quiet")
    assert result.returncode == 0 and loaded == [], (result.stderr, loaded)
    m, exported = manifest(out), manifest(draft_bundle)
    assert m["components"]["draft"]["engine"] == "draft/model.cpu.onnx" and (out / "draft/model.cpu.onnx").is_file()
    assert m["lora"] == exported["lora"] and m["model"]["eagle"] == exported["model"]["eagle"]

    source = tmp_path / "in.json"
    source.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 8,
                                  "requests": [chat_request(p) for p in PROMPTS[:2]]}))
    outputs = []
    for flags in ([], ["--no-spec-decode"]):
        target = tmp_path / f"out{len(outputs)}.json"
        result, loaded = without_transformers.run("trt_llm.runtime.app.run_cli", source, "--engine-dir", out, "-o", target,
                                                  "--threads", "1", "--draft-top-k", "4", "--draft-steps", "3",
                                                  "--verify-tree-size", "10", *flags)
        assert result.returncode == 0 and loaded == [], (result.stderr, loaded)
        outputs.append([r["output_token_ids"] for r in json.loads(target.read_text())["responses"]])
    assert outputs[0] == outputs[1] and all(outputs[0])
