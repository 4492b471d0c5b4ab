"""The MoE op (plugins/moe.py) and SparseMoe (build/models/moe.py) at tiny widths (hidden 64, 8
experts, top 2, expert width 32).

Oracles: transformers' Qwen3MoeSparseMoeBlock (its eager experts loop) for the float op, both
values of norm_topk_prob; for quantized experts, the float op on the dequantized weights, and the
blocks within half a step (a step for int4's -8 end) of the float weights; the exported graph's
function body run by plain ONNX Runtime, and its lowering (MoE / QMoE), against the torch op; the
sync-free TensorRT kernel against the reference on both of its paths.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.build.export import export_graph
from trt_llm.build.models.moe import SparseMoe, interleaved
from trt_llm.build.quantize import QuantSpec
from trt_llm.plugins import moe as op

HIDDEN, EXPERTS, TOP_K, WIDTH = 64, 8, 2, 32
SPECS = {"fp32": None, "int8": QuantSpec(8, 32), "int4": QuantSpec(4, 32), "int8-per-row": QuantSpec(8, 0)}


def block(normalize: bool, seed: int = 0) -> Qwen3MoeSparseMoeBlock:
    config = Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                            moe_intermediate_size=WIDTH, norm_topk_prob=normalize)
    config._experts_implementation = "eager"  # transformers' own loop, the ground truth
    torch.manual_seed(seed)
    module = Qwen3MoeSparseMoeBlock(config).eval()
    for parameter in module.parameters():  # the router starts at zeros: every token would tie
        torch.nn.init.normal_(parameter, std=0.2)
    return module


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, HIDDEN, generator=torch.Generator().manual_seed(seed))


def dequantized(moe: SparseMoe) -> SparseMoe:
    """The same block with its quantized experts as float weights."""
    gate_up = op.dequantize(moe.gate_up, moe.gate_up_scales, moe.bits)  # rows gate_i, up_i, ...
    down = op.dequantize(moe.down, moe.down_scales, moe.bits)
    return SparseMoe(moe.router, zip(gate_up, down), len(down), moe.top_k, bool(moe.normalize), 0, torch.float32)


@pytest.mark.parametrize("normalize", [False, True])
def test_the_op_is_transformers_block(normalize):
    hf = block(normalize)
    moe = SparseMoe.from_hf(hf, None, torch.float32)
    with torch.no_grad():
        for x in (tokens(1, 1), tokens(2, 7), tokens(3, 5)[0]):  # decode, prefill, [T, H]
            torch.testing.assert_close(moe(x), hf(x.reshape(-1, x.shape[-1]).unsqueeze(0)).view(x.shape),
                                       rtol=1e-5, atol=1e-6)


def test_routing_changes_with_the_token():
    # Token i's hidden state is the router row of expert i (scaled): it goes to expert i first, so
    # the batch spreads over every expert, and each row equals that token run alone.
    hf = block(normalize=True)
    moe = SparseMoe.from_hf(hf, None, torch.float32)
    x = 4 * hf.gate.weight.detach()[None] / hf.gate.weight.detach().norm(dim=-1, keepdim=True)  # [1, E, H]
    _, experts = op.route(torch.nn.functional.linear(x[0], moe.router), TOP_K, 1)
    assert experts[:, 0].tolist() == list(range(EXPERTS))
    with torch.no_grad():
        together = moe(x)
        torch.testing.assert_close(together, hf(x), rtol=1e-5, atol=1e-6)
        for i in range(EXPERTS):
            torch.testing.assert_close(together[:, i], moe(x[:, i:i + 1])[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["int8", "int4", "int8-per-row"])
def test_quantized_experts_are_their_dequantized_weights(name):
    spec = SPECS[name]
    hf = block(normalize=True)
    moe = SparseMoe.from_hf(hf, spec, torch.float32)
    assert moe.gate_up.dtype == torch.uint8 and moe.gate_up.shape[-1] == HIDDEN * spec.bits // 8
    float_moe = dequantized(moe)
    x = tokens(2, 5)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), float_moe(x), rtol=1e-5, atol=1e-6)
    # The blocks are the float weights to round-to-nearest's step.
    for weight, scales, original in ((float_moe.gate_up, moe.gate_up_scales, torch.stack([interleaved(*g.chunk(2)) for g in hf.experts.gate_up_proj])),
                                     (float_moe.down, moe.down_scales, hf.experts.down_proj)):
        step = scales.repeat_interleave(original.shape[-1] // scales.shape[-1], dim=-1).abs()
        assert bool(((weight - original.detach()).abs() <= step * (1.0 if spec.bits == 4 else 0.5) + 1e-6).all())


@pytest.mark.parametrize("quantized", [False, True])
def test_the_tensorrt_kernel_is_the_reference(quantized):
    hf = block(normalize=True)
    moe = SparseMoe.from_hf(hf, SPECS["int4"] if quantized else None, torch.float32)
    operands = (moe.gate_up, moe.down, moe.gate_up_scales, moe.down_scales, TOP_K, 1, moe.bits)
    for x in (tokens(1, 1), tokens(2, 2), tokens(1, 9)):  # 2 and 8 token-expert pairs gather, 18 go dense
        logits = torch.nn.functional.linear(x, moe.router)
        expected = torch.ops.trt_llm.moe(x, logits, *operands)
        out = torch.full_like(x, float("nan"))
        assert op.moe_kernel(x, logits, *operands, out=out) is out
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def int8_activations_reference(moe: SparseMoe, x: torch.Tensor) -> torch.Tensor:
    """The op with each expert's inputs (x, then silu(gate) * up) rounded to int8 in the weights' blocks
    (symmetric, largest magnitude / 127), as ONNX Runtime's QMoE computes at accuracy level 4."""
    def rounded(v, blocks):
        b = v.view(*v.shape[:-1], blocks, -1)
        scale = b.abs().amax(-1, keepdim=True) / 127
        return (torch.round(b / scale) * scale).view_as(v)

    gate_up, down = (op.dequantize(w, s, moe.bits) for w, s in ((moe.gate_up, moe.gate_up_scales), (moe.down, moe.down_scales)))
    rows = x.reshape(-1, HIDDEN)
    weights, experts = op.route(torch.nn.functional.linear(rows, moe.router), moe.top_k, moe.normalize)
    out = torch.zeros_like(rows)
    for t in range(rows.shape[0]):
        for weight, e in zip(weights[t], experts[t]):
            h = gate_up[e] @ rounded(rows[t], moe.gate_up_scales.shape[-1])
            act = torch.nn.functional.silu(h[0::2]) * h[1::2]
            out[t] += weight * (down[e] @ rounded(act, moe.down_scales.shape[-1]))
    return out.view(x.shape)


def _session(path, **options) -> ort.InferenceSession:
    settings = ort.SessionOptions()
    settings.log_severity_level = 3
    settings.intra_op_num_threads = 1
    for name, value in options.items():
        setattr(settings, name, value)
    return ort.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("normalize", [False, True])
def test_exported_body_and_cpu_lowering_equal_the_op(tmp_path, name, normalize):
    moe = SparseMoe.from_hf(block(normalize), SPECS[name], torch.float32)
    path = export_graph(moe, (tokens(2, 3),), ["x"], ["y"], ({0: Dim("batch"), 1: Dim("seq")},), tmp_path / "moe.onnx")
    exported = onnx.load(path, load_external_data=False)
    (node,) = [n for n in exported.graph.node if n.domain == op.DOMAIN]
    assert node.op_type == (op.OP_NAME if SPECS[name] is None else op.QUANTIZED_OP_NAME)
    onnx.checker.check_model(onnx.load(path))
    # The body as written (no fusion) and as ONNX Runtime optimizes it.
    bodies = [_session(path, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL), _session(path)]
    engine = compile_cpu(path)
    lowered = _session(engine, optimized_model_filepath=str(tmp_path / "optimized.onnx"))
    kernels = {n.op_type for n in onnx.load(tmp_path / "optimized.onnx", load_external_data=False).graph.node}
    assert ("MoE" if SPECS[name] is None else "QMoE") in kernels and node.op_type not in kernels, kernels
    for x in (tokens(1, 1, seed=2), tokens(3, 5, seed=3), tokens(2, 1, seed=4)):
        with torch.no_grad():
            expected = moe(x).numpy()
        for body in bodies:
            np.testing.assert_allclose(body.run(None, {"x": x.numpy()})[0], expected, rtol=1e-5, atol=1e-5)
        got = lowered.run(None, {"x": x.numpy()})[0]
        if name in ("int8", "int4"):  # QMoE at accuracy level 4 rounds the activations to int8 in the blocks too
            expected = int8_activations_reference(moe, x).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_float16_nodes_keep_their_body(tmp_path):
    moe = SparseMoe.from_hf(block(True), None, torch.float16)
    path = export_graph(moe, (tokens(2, 3).half(),), ["x"], ["y"], ({0: Dim("batch"), 1: Dim("seq")},),
                        tmp_path / "moe.onnx")
    model = onnx.load(path, load_external_data=False)
    op.lower_for_onnxruntime(model)
    assert [n.op_type for n in model.graph.node if n.domain == op.DOMAIN] == [op.OP_NAME]
    x = tokens(2, 4)
    with torch.no_grad():
        expected = moe(x.half()).float().numpy()
    got = _session(path).run(None, {"x": x.half().numpy()})[0].astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-3)


def test_zero_points_and_fp8_are_refused():
    for spec in (QuantSpec(4, 32, symmetric=False), QuantSpec(8, 0, fp8=True)):
        with pytest.raises(ValueError, match="symmetric int4 / int8"):
            SparseMoe.from_hf(block(True), spec)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                    reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
@pytest.mark.parametrize("name", ["fp32", "int4"])
def test_tensorrt_rtx_builds_a_plan_ahead_of_time(tmp_path, name):
    """TensorRT-RTX has no plugins: its parser inlines the body (tokens dynamic), and the plan builds
    for SM80 without a GPU."""
    import tensorrt_rtx as trt
    from trt_llm.build.tensorrt_backend import DEFAULT_COMPUTE_CAPABILITY, compute_capability
    from trt_llm.common.trt_import import make_logger

    moe = SparseMoe.from_hf(block(True), SPECS[name], torch.float16)
    path = export_graph(moe, (tokens(2, 3).half(),), ["x"], ["y"], ({0: Dim("batch"), 1: Dim("seq")},),
                        tmp_path / "moe.onnx")
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path)), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    assert network.get_output(0).dtype == trt.DataType.HALF
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(compute_capability(trt, DEFAULT_COMPUTE_CAPABILITY), 0)
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, HIDDEN), (4, 1, HIDDEN), (8, 64, HIDDEN))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 0


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 0), (8, 32)])
def test_experts_quantize_by_the_linears_rule(bits, group):
    """quantize_expert (the op's layout, computed directly) gives round-to-nearest's blocks of
    build/quantize/rtn.py bit for bit, a block of zeros included."""
    from trt_llm.build.models.moe import op_blocks, quantize_expert
    from trt_llm.build.quantize.rtn import quantize_rtn

    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(3)) * 0.05
    weight[2, :32] = 0
    for scale_dtype in (torch.float32, torch.float16):
        got = quantize_expert(weight, QuantSpec(bits, group), scale_dtype)
        want = op_blocks(quantize_rtn(weight, QuantSpec(bits, group), scale_dtype))
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_gelu_experts_are_gemma4s(tmp_path):
    """activation 1 (Gemma 4's experts, GELU-tanh gates) against transformers' Gemma4TextExperts loop on
    the op's own routing; exported, ONNX Runtime keeps the node's body (its kernels gate by SwiGLU only),
    which equals the op."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    config = Gemma4TextConfig(hidden_size=HIDDEN, num_experts=EXPERTS, moe_intermediate_size=WIDTH,
                              top_k_experts=TOP_K, enable_moe_block=True)
    torch.manual_seed(0)
    experts = Gemma4TextExperts(config).eval()
    for parameter in experts.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    router = torch.randn(EXPERTS, HIDDEN) * 0.2
    gates = [interleaved(*experts.gate_up_proj[e].detach().chunk(2, dim=0)) for e in range(EXPERTS)]
    moe = SparseMoe(router, zip(gates, experts.down_proj.detach()), EXPERTS, TOP_K, True, 0, torch.float32,
                    activation=op.GELU_TANH)
    x = tokens(2, 5)
    rows = x.reshape(-1, HIDDEN)
    weights, chosen = op.route(torch.nn.functional.linear(rows, router), TOP_K, 1)
    with torch.no_grad():
        expected = experts(rows, chosen, weights).view(x.shape)
        torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-6)
        silu = SparseMoe(router, zip(gates, experts.down_proj.detach()), EXPERTS, TOP_K, True, 0, torch.float32)
        assert (silu(x) - expected).abs().max() > 1e-3  # the gate is what the test tells apart
    path = export_graph(moe, (tokens(2, 3),), ["x"], ["y"], ({0: Dim("batch"), 1: Dim("seq")},), tmp_path / "moe.onnx")
    engine = compile_cpu(path)
    lowered = _session(engine, optimized_model_filepath=str(tmp_path / "optimized.onnx"))
    kernels = {n.op_type for n in onnx.load(tmp_path / "optimized.onnx", load_external_data=False).graph.node}
    assert "MoE" not in kernels, kernels
    np.testing.assert_allclose(lowered.run(None, {"x": x.numpy()})[0], expected.numpy(), rtol=1e-5, atol=1e-5)
