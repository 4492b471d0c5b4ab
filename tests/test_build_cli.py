"""`trt-llm-build`: config errors, unsupported architectures, the engine directory it writes."""

import json
from pathlib import Path

import onnx
import pytest
from transformers import AutoConfig

from trt_llm.build.cli import main as build_main
from trt_llm.runtime.engine_dir import EngineDir, EngineDirError


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_bad_backend_names_key_and_allowed_values(tmp_path, capsys):
    config = write_config(tmp_path, "model: x\noutput_dir: out\nbackend: cuda\n")
    assert build_main([str(config), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "backend" in err and "cpu, tensorrt, tensorrt-rtx" in err


def test_unknown_key_is_named(tmp_path, capsys):
    config = write_config(tmp_path, "model: x\noutput_dir: out\nmax_batch: 3\n")
    assert build_main([str(config), "--quiet"]) == 2
    assert "max_batch" in capsys.readouterr().err


def test_dtype_the_backend_cannot_run(tmp_path, tiny_model, capsys):
    config = write_config(tmp_path, f"model: {tiny_model('llama')}\noutput_dir: {tmp_path/'e'}\ndtype: bf16\n")
    assert build_main([str(config), "--quiet"]) == 2
    assert "dtype: 'bf16' is not supported by the cpu backend; choose one of fp32, fp16" in capsys.readouterr().err


def test_unsupported_architecture_lists_supported(tmp_path, tiny_model, capsys):
    model_dir = tmp_path / "gpt2"
    model_dir.mkdir()
    config = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2)
    config.architectures = ["GPT2LMHeadModel"]
    config.save_pretrained(model_dir)
    path = write_config(tmp_path, f"model: {model_dir}\noutput_dir: {tmp_path/'e'}\n")
    assert build_main([str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel" in err
    from trt_llm.families.registry import families

    assert f"supported: {', '.join(sorted(families()))}" in err
    assert "Gemma3ForCausalLM" in err and "Qwen3MoeForCausalLM" in err and "WhisperForConditionalGeneration" in err
    assert not (tmp_path / "e").exists()


def test_missing_model_dir(tmp_path, capsys):
    path = write_config(tmp_path, f"model: {tmp_path/'nothing.gguf'}\noutput_dir: {tmp_path/'e'}\n")
    assert build_main([str(path), "--quiet"]) == 2
    assert "nothing.gguf" in capsys.readouterr().err


def test_engine_directory_layout(tiny_model, build_engine_for):
    engine = build_engine_for(tiny_model("qwen2"))
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["backend"] == "cpu"
    assert manifest["model"]["family"] == "qwen2" and manifest["model"]["eos_token_ids"] == [0, 2]
    assert manifest["limits"] == {"max_batch_size": 4, "max_input_len": 256, "max_kv_cache_capacity": 512}
    assert {"torch", "transformers", "onnxruntime"} <= set(manifest["tool_versions"])
    for relative in ("llm/model.onnx", "llm/model.onnx.data", "llm/model.cpu.onnx", "llm/embedding.safetensors",
                     "llm/config.json", "tokenizer/tokenizer.json", "tokenizer/generation_config.json"):
        assert (engine / relative).is_file(), relative
    # The portable graph keeps the plugin node and its function body; the cpu engine is lowered.
    portable = onnx.load(engine / "llm/model.onnx", load_external_data=False)
    assert sum(n.op_type == "AttentionPlugin" for n in portable.graph.node) == 2
    assert [f.name for f in portable.functions] == ["AttentionPlugin"]  # the bodies of the node types it has
    lowered = onnx.load(engine / "llm/model.cpu.onnx", load_external_data=False)
    assert sum(n.op_type == "GroupQueryAttention" for n in lowered.graph.node) == 2
    assert not any(n.domain == "trt" for n in lowered.graph.node)


def test_runtime_refuses_other_format_version(tiny_model, build_engine_for, tmp_path):
    engine = build_engine_for(tiny_model("qwen2"))
    manifest = json.loads((engine / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(EngineDirError, match="format version 99"):
        EngineDir.open(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "backend": "tensorrt"}))
    with pytest.raises(EngineDirError, match="backend 'tensorrt' cannot run here"):
        EngineDir.open(tmp_path)
