"""The weight-only matmul op (plugins/weight_only_matmul.py): its ONNX body and its ONNX Runtime
lowering against its torch reference, and the reference against a hand dequantization.

Oracles: the reference is x @ W with W dequantized by hand from the integers; the body (ONNX's
DequantizeLinear + MatMul, run by ONNX Runtime) and the lowering at fp32 compute must equal it to
float rounding; the int8 lowering (DynamicQuantizeMatMul) equals the same matmul on activations
quantized as ONNX Runtime's dynamic quantization does (uint8, per tensor).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.export import Dim

from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.build.export import export_graph
from trt_llm.build.quantize import QuantizedWeight, QuantSpec
from trt_llm.build.quantize.rtn import quantize_rtn
from trt_llm.plugins import weight_only_matmul as op
from trt_llm.runtime.backends import ort_engine

N = 48
CASES = [  # bits, group_size (0 = one scale per column), form, K
    (4, 32, "symmetric", 96),
    (4, 32, "zero_point", 96),
    (4, 32, "offset", 96),       # llama.cpp's Q4_1
    (4, 64, "symmetric", 160),
    (4, 64, "zero_point", 160),
    (4, 128, "symmetric", 576),  # K = 4.5 groups of 128 (SmolLM2's hidden size)
    (4, 128, "zero_point", 200),  # K = 1.56 groups
    (4, 128, "offset", 256),
    (8, 32, "symmetric", 96),
    (8, 32, "zero_point", 96),
    (8, 0, "symmetric", 200),    # per column: the DynamicQuantizeMatMul lowering
    (8, 0, "fp8", 200),          # E4M3 per column (the TensorRT backends)
]


class OneMatMul(nn.Module):
    def __init__(self, w: QuantizedWeight):
        super().__init__()
        self.register_buffer("qweight", w.qweight)
        self.register_buffer("scales", w.scales)
        self.register_buffer("zero_points", w.zero_points)
        self.register_buffer("offsets", w.offsets)
        self.bits, self.group_size = w.bits, w.group_size

    def forward(self, x):
        return torch.ops.trt_llm.weight_only_matmul(x, self.qweight, self.scales, self.zero_points, self.offsets,
                                                    self.bits, self.group_size)


def _weight(bits, group, form, k, seed=0) -> tuple[torch.Tensor, QuantizedWeight]:
    """A float weight [N, K] and its blocks: round-to-nearest, or for "offset" Q4_1's form made by
    hand (q in [0, 15], w = q * d + m, stored as q - 8 and m + 8d)."""
    generator = torch.Generator().manual_seed(seed)
    if form == "offset":
        q = torch.randint(0, 16, (k, N), generator=generator)
        d = torch.rand(k // group, N, generator=generator) * 0.01
        m = -torch.rand(k // group, N, generator=generator) * 0.08
        rows = torch.arange(k) // group
        weight = (q * d[rows] + m[rows]).t()
        return weight, QuantizedWeight.from_values(q - 8, d, None, 4, group, offsets=m + 8 * d)
    weight = torch.randn(N, k, generator=generator) * 0.05
    spec = QuantSpec(bits, group, form != "zero_point", fp8=form == "fp8")
    return weight, quantize_rtn(weight, spec, torch.float32)


def _session(path, accuracy_level: int | None = None, optimized=None, fuse=True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fuse:  # the nodes as written (ONNX Runtime fuses DequantizeLinear + MatMul otherwise)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if accuracy_level is not None:
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(accuracy_level))
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _engine_session(engine, accuracy_level: int, monkeypatch) -> ort.InferenceSession:
    """A session on compile_cpu's engine graph with its matmuls at `accuracy_level`, as the runtime opens it."""
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", accuracy_level)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(accuracy_level))
    return ort_engine.open_session(engine, options)[0]


def _inputs(k: int):
    # Batches of several shapes through one graph: rows are independent, so a ragged (padded)
    # batch is each of its rows.
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(shape + (k,), generator=generator) for shape in ((1, 1), (3, 5), (2, 7))]


def test_reference_is_the_hand_dequantized_matmul():
    for bits, group, form, k in CASES:
        weight, w = _weight(bits, group, form, k)
        q, zero = w.values()
        g = group or k
        rows = torch.arange(k) // g
        by_hand = (q.float() - (zero.float()[rows] if zero is not None else 0)) * w.scales[rows]
        if w.offsets is not None:
            by_hand = by_hand + w.offsets[rows]
        x = torch.randn(2, 3, k)
        got = torch.ops.trt_llm.weight_only_matmul(x, w.qweight, w.scales, w.zero_points, w.offsets, bits, g)
        torch.testing.assert_close(got, x @ by_hand, rtol=1e-5, atol=1e-6)
        # and the blocks are close to the float weight they came from: half a step per value for
        # round-to-nearest (symmetric int4 maps the largest magnitude to -8, so a value at the other
        # end may clip by one); Q4_1's blocks are the weight
        step = w.scales.abs().float()[rows] * (1.0 if bits == 4 and form == "symmetric" else 0.5)
        if form == "offset":
            step = torch.zeros_like(step)
        if form == "fp8":  # E4M3: 3 mantissa bits, so half a step is 1/16 of the value (subnormals: 2^-10)
            step = weight.t().abs() / 16 + w.scales.float()[rows] * 2 ** -10
        assert bool(((by_hand - weight.t()).abs() <= step + 1e-6).all()), (bits, group, form)


@pytest.mark.parametrize("bits,group,form,k", CASES)
def test_onnx_body_and_cpu_lowering_equal_the_reference(tmp_path, monkeypatch, bits, group, form, k):
    _, w = _weight(bits, group, form, k)
    module = OneMatMul(w)
    path = export_graph(module, (torch.zeros(2, 3, k),), ["x"], ["y"], ({0: Dim("batch"), 1: Dim("seq")},),
                        tmp_path / "model.onnx")
    exported = onnx.load(path, load_external_data=False)
    onnx.checker.check_model(onnx.load(path))
    (node,) = [n for n in exported.graph.node if n.op_type in op.OP_NAMES]
    assert node.op_type == {"symmetric": op.OP_NAME, "zero_point": op.ZERO_POINT_OP_NAME,
                            "offset": op.OFFSET_OP_NAME, "fp8": op.OP_NAME}[form]
    weight_type = {t.name: t.data_type for t in exported.graph.initializer}[node.input[1]]
    expected = {(4, True): onnx.TensorProto.INT4, (4, False): onnx.TensorProto.UINT4,
                (8, True): onnx.TensorProto.INT8, (8, False): onnx.TensorProto.UINT8}.get(
                    (bits, form != "zero_point"))
    assert weight_type == (onnx.TensorProto.FLOAT8E4M3FN if form == "fp8" else expected)

    body = _session(path, fuse=False)
    if form == "fp8":  # for the TensorRT backends only: the body is what their parser reads
        for x in _inputs(k):
            got = body.run(None, {"x": x.numpy()})[0]
            np.testing.assert_allclose(got, module(x).numpy(), rtol=1e-5, atol=1e-5)
        return
    engine = compile_cpu(path)
    # The kernels ONNX Runtime runs: the graph it optimised at build time (the engine, where the matmuls
    # are blocked: tests/test_cold_start.py), else the lowered graph as a session optimises it.
    optimized = engine if engine.name.endswith(ort_engine.OPTIMISED_SUFFIX) else tmp_path / "optimized.onnx"
    _session(engine, optimized=None if optimized == engine else optimized)
    kernels = [n.op_type for n in onnx.load(optimized, load_external_data=False).graph.node]
    # fp32 compute (accuracy level 1): the lowering's arithmetic is the reference's (int8 compute is checked below).
    lowered = _engine_session(engine, 1, monkeypatch)
    per_column_int8 = bits == 8 and group == 0
    if form == "offset":  # and the block sums' small matmul
        assert "MatMulNBits" in kernels and "DequantizeLinear" not in kernels, kernels
    else:
        assert kernels == ["DynamicQuantizeMatMul" if per_column_int8 else "MatMulNBits"], kernels
    fast = _engine_session(engine, 4, monkeypatch)
    for x in _inputs(k):
        reference = module(x).numpy().astype(np.float32)
        got = body.run(None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
        got = lowered.run(None, {"x": x.numpy()})[0]
        if per_column_int8:
            reference = _dynamic_int8_reference(x.numpy(), w)
        np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)
        # int8 activations (the runtime's accuracy level): within their rounding of the reference
        got = fast.run(None, {"x": x.numpy()})[0]
        scale = np.abs(x.numpy()).max() / 127 * np.abs(w.dequantize().numpy()).sum(axis=1).max()
        assert np.abs(got - module(x).numpy()).max() <= scale


def _dynamic_int8_reference(x: np.ndarray, w: QuantizedWeight) -> np.ndarray:
    """ONNX Runtime's DynamicQuantizeMatMul: x as uint8 over [min(x, 0), max(x, 0)], per tensor."""
    low, high = min(x.min(), 0.0), max(x.max(), 0.0)
    scale = np.float32((high - low) / 255)
    zero = np.clip(np.round(-low / scale), 0, 255)
    xq = np.clip(np.round(x / scale) + zero, 0, 255)
    return ((xq - zero) * scale).astype(np.float32) @ w.dequantize().numpy().T


def test_symmetric_zero_points_become_signed_weights():
    _, w = _weight(4, 32, "symmetric", 96)
    q, _ = w.values()
    unsigned = QuantizedWeight.from_values(q + 8, w.scales, torch.full((3, N), 8, dtype=torch.int16), 4, 32)
    signed = unsigned.to_signed()
    assert signed.zero_points is None
    torch.testing.assert_close(signed.qweight, w.qweight)
    torch.testing.assert_close(unsigned.dequantize(), w.dequantize())
