"""Quantized builds (`quantization:` in the build config) end to end on tiny models.

Oracle: transformers running the same checkpoint with each quantized linear's weight replaced by
its dequantized blocks (and the embedding rounded as the engine stores it): greedy tokens identical.
The engine runs its weight-only matmuls at ONNX Runtime's fp32 accuracy level here; the int8
activations of the default level are measured by trt-llm-eval (README: the quality table).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import PROMPTS
from test_greedy_parity import assert_batch_matches_transformers
from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.rtn import quantize_rtn
from trt_llm.runtime.backends import ort_engine
from trt_llm.runtime.engine_dir import EngineDir

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def dequantized_copy(model_dir: Path, out: Path, spec: QuantSpec, lm_head: bool = True,
                     embedding=torch.float16, only: tuple[str, ...] | None = None) -> Path:
    """The checkpoint with every linear (or those named in `only`) as its RTN blocks dequantized, the
    embedding rounded through `embedding` and the LM head untied (the engine stores the two apart)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = model.lm_head.weight.detach().clone()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    with torch.no_grad():
        for name, module in model.named_modules():
            chosen = name in only if only is not None else name.rsplit(".", 1)[-1] in LINEARS or name == "lm_head"
            if chosen and (name != "lm_head" or lm_head):
                module.weight.copy_(quantize_rtn(module.weight, spec, torch.float32).dequantize())
        table = model.get_input_embeddings().weight
        table.copy_(table.to(embedding).float())
    model.save_pretrained(out)
    for file in model_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / file.name).write_bytes(file.read_bytes())
    return out


@pytest.fixture
def exact_matmuls(monkeypatch):
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", 1)


CASES = [  # family, quantization, spec of the oracle
    ("llama", {"weights": "int4", "group_size": 32}, QuantSpec(4, 32)),
    ("qwen2", {"weights": "int4", "group_size": 64, "zero_point": True}, QuantSpec(4, 64, symmetric=False)),
    ("qwen3", {"weights": "int4"}, QuantSpec(4, 128)),  # K = 64 < 128: one partial block
    ("llama", {"weights": "int8", "group_size": 32, "lm_head": False}, QuantSpec(8, 32)),
    ("qwen2", {"weights": "int4", "group_size": 32, "lm_head": "int8"}, QuantSpec(4, 32)),
]


@pytest.mark.parametrize("family,quantization,spec", CASES, ids=lambda c: str(c))
def test_quantized_engine_matches_transformers_on_dequantized_weights(
        family, quantization, spec, tiny_model, build_engine_for, tmp_path, exact_matmuls):
    model_dir = tiny_model(family)
    engine = build_engine_for(model_dir, quantization=quantization)
    graph = onnx.load(EngineDir.open(engine).component_path("llm", "engine"), load_external_data=False)
    quantized = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    lm_head = quantization.get("lm_head", True)
    assert len(quantized) == 2 * 4 + bool(lm_head)  # per layer qkv, o, gate_up, down
    oracle = dequantized_copy(model_dir, tmp_path / "dequantized", spec, lm_head=lm_head is True)
    if lm_head == "int8":
        oracle = dequantized_copy(oracle, tmp_path / "head", QuantSpec(8, 32), only=("lm_head",), embedding=torch.float32)
    lengths = assert_batch_matches_transformers(engine, oracle, PROMPTS, max_new=24)
    assert max(lengths) >= 16


def test_quantized_engine_is_smaller_and_holds_each_weight_once(tiny_model, build_engine_for):
    model_dir = tiny_model("llama", hidden_size=256, intermediate_size=512, num_attention_heads=8, head_dim=32)
    full = build_engine_for(model_dir)
    small = build_engine_for(model_dir, quantization="int4")
    # The engine is the graph ONNX Runtime optimised at build time (tests/test_cold_start.py), with every
    # weight it reads in its own file; the bundle's graphs it was made from are not in the engine.
    engine = EngineDir.open(small).component_path("llm", "engine")
    assert sorted(f.name for f in engine.parent.iterdir()) == sorted(
        ["config.json", "embedding.safetensors", engine.name, engine.name + ".data", "model.cpu.opt.json"])
    graph = onnx.load(engine, load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {engine.name + ".data"}
    size = {e: sum(f.stat().st_size for f in (e / "llm").iterdir()) for e in (full, small)}
    assert size[small] <= 0.3 * size[full], size


@pytest.mark.parametrize("settings,message", [
    ({"quantization": "fp8"}, "fp8 is for the TensorRT backends"),
    ({"quantization": "fp8", "backend": "tensorrt-rtx", "rtx_compute_capability": "SM86"}, "SM89 and later"),
    ({"quantization": {"weights": "fp8", "zero_point": True}, "backend": "tensorrt"}, "symmetric weights only"),
    ({"quantization": {"weights": "int4", "zero_point": True}, "backend": "tensorrt-rtx"}, "symmetric weights only"),
    ({"quantization": {"weights": "int8", "group_size": 32}, "backend": "tensorrt-rtx"}, "one scale per output column"),
    ({"quantization": "int4", "dtype": "fp16"}, "use dtype fp32"),
])
def test_a_quantization_the_backend_cannot_run_is_refused_before_any_work(settings, message):
    from trt_llm.build.compile import BuildError, check_backend
    from trt_llm.schemas.build_config import BuildConfig

    with pytest.raises(BuildError, match=message):
        check_backend(BuildConfig(model="m", output_dir="o", **settings))


def test_int8_defaults_to_blocks_of_32_on_cpu_and_columns_on_tensorrt():
    from trt_llm.schemas.build_config import QuantizationConfig

    int8 = QuantizationConfig(weights="int8")
    assert int8.effective_group_size("cpu") == 32 and int8.effective_group_size("tensorrt") == 0
    assert QuantizationConfig(weights="int4").effective_group_size("tensorrt-rtx") == 128
    assert int8.effective_embedding("fp32") == "fp16" and QuantizationConfig(weights="none").effective_embedding("fp32") == "fp32"
    from trt_llm.build.quantize.factory import head_spec_of

    int8_head = QuantizationConfig(weights="int4", lm_head="int8")  # llama.cpp's blocks; TensorRT's columns
    assert head_spec_of(int8_head, "cpu") == QuantSpec(8, 32) and head_spec_of(int8_head, "tensorrt") == QuantSpec(8, 0)
    assert head_spec_of(QuantizationConfig(weights="fp8"), "tensorrt") == QuantSpec(8, 0, fp8=True)
    assert head_spec_of(QuantizationConfig(weights="int4", lm_head=False)) is None


def test_an_int8_embedding_table_is_q8_0_blocks_and_reads_back_within_half_a_step():
    import numpy as np

    from trt_llm.build.quantize.embedding import embedding_tensors
    from trt_llm.runtime.backends.embedding import EmbeddingTable

    table = torch.randn(10, 64) * torch.linspace(0.1, 3, 64)  # channels of different sizes
    stored = embedding_tensors(table, "int8")
    assert stored["embedding"].dtype == torch.int8 and list(stored["scales"].shape) == [10, 2]
    lookup = EmbeddingTable(stored["embedding"].numpy(), np.float32, stored["scales"].numpy())
    ids = np.array([[3, 0, 9]])
    got = lookup[ids]
    assert got.shape == (1, 3, 64) and got.dtype == np.float32
    step = np.repeat(stored["scales"].numpy()[ids], 32, axis=-1)
    assert np.all(np.abs(got - table.numpy()[ids]) <= step / 2 + 1e-7)
