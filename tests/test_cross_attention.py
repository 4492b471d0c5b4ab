"""The cross-attention op (plugins/cross_attention.py): the reference against a hand computation and
torch's own attention; the ONNX function body and the ONNX Runtime lowering (the body inlined)
against the reference, for any batch, query length and key length through one graph; the TensorRT
kernel; and a TensorRT-RTX plan built ahead of time from the body."""

import copy
import importlib.util
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from test_attention_plugin import session  # an ONNX Runtime CPU session of a model proto, one thread
from torch.export import Dim
from trt_llm.build.export import export_graph
from trt_llm.plugins import cross_attention

from trt_llm import plugins

HEADS, HEAD_DIM = 4, 16
SCALE = HEAD_DIM ** -0.5
NAMES = ["q", "key", "value"]
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


class OneCrossAttention(torch.nn.Module):
    def forward(self, q, key, value):
        return torch.ops.trt_llm.cross_attention(q, key, value, HEADS, SCALE)


class TwoLayers(torch.nn.Module):
    """Two calls over two sets of keys, the second reading the first's output: names must not meet."""

    def forward(self, q, key_0, value_0, key_1, value_1):
        x = torch.ops.trt_llm.cross_attention(q, key_0, value_0, HEADS, SCALE)
        return torch.ops.trt_llm.cross_attention(x, key_1, value_1, HEADS, SCALE)


def make_inputs(batch, seq, frames, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, seq, HEADS * HEAD_DIM, generator=generator).to(dtype),
            torch.randn(batch, HEADS, frames, HEAD_DIM, generator=generator).to(dtype),
            torch.randn(batch, HEADS, frames, HEAD_DIM, generator=generator).to(dtype))


def sdpa_oracle(q, key, value, scale=SCALE):
    """torch's scaled_dot_product_attention in float32."""
    batch, seq, width = q.shape
    heads = q.float().view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(heads, key.float(), value.float(), scale=scale)
    return out.transpose(1, 2).reshape(batch, seq, width).to(q.dtype)


def export(module, example, names, dynamic_shapes, path) -> onnx.ModelProto:
    export_graph(module, example, names, ["output"], dynamic_shapes, path)
    return onnx.load(path)


def export_one(dtype, path) -> onnx.ModelProto:
    # Distinct example sizes (batch 2, 3 queries, 7 keys), so the tracer keeps the dimensions apart.
    batch, seq, frames = Dim("batch"), Dim("seq"), Dim("frames")
    return export(OneCrossAttention(), make_inputs(2, 3, 7, dtype), NAMES,
                  ({0: batch, 1: seq}, {0: batch, 2: frames}, {0: batch, 2: frames}), path)


def lowered(model):
    model = cross_attention.lower_for_onnxruntime(copy.deepcopy(model))
    assert not any(n.domain == cross_attention.DOMAIN for n in model.graph.node)
    assert not model.functions
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross-attention")
    return {dtype: export_one(dtype, folder / f"{name}.onnx")
            for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16"))}


@pytest.fixture(scope="module")
def sessions(exported):
    """(facet, dtype) -> one ONNX Runtime session, reused for every case: B, S and L vary through it."""
    return {(facet, dtype): session(lowered(model) if facet == "onnxruntime lowering" else model)
            for dtype, model in exported.items() for facet in ("function body", "onnxruntime lowering")}


# ---------------------------------------------------------------------------------------------------
# Facet 1: the reference.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_equals_sdpa(dtype):
    inputs = make_inputs(3, 5, 40, dtype, seed=1)
    got = OneCrossAttention()(*inputs)
    assert got.dtype == dtype and got.shape == inputs[0].shape
    tolerance = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, sdpa_oracle(*inputs), atol=tolerance, rtol=tolerance)


def test_reference_by_hand():
    """One query over two keys, two heads: each head weighs its own values by its own scores."""
    q = torch.tensor([[[1.0, 0.0, 0.0, 2.0]]])  # [B=1, S=1, H=2 * D=2]
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]]])  # [1, H, L=2, D]
    value = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]])
    out = torch.ops.trt_llm.cross_attention(q, key, value, 2, 0.5)
    p0 = math.exp(0.5) / (math.exp(0.5) + 1)  # head 0: scores (0.5, 0)
    p1 = 0.5  # head 1: scores (1, 1)
    expected = torch.tensor([[[p0 * 1 + (1 - p0) * 3, p0 * 2 + (1 - p0) * 4, p1 * 5 + (1 - p1) * 7,
                               p1 * 6 + (1 - p1) * 8]]])
    torch.testing.assert_close(out, expected)


def test_reference_refuses_heads_that_do_not_match():
    q, key, value = make_inputs(1, 2, 3)
    with pytest.raises(ValueError, match="do not make 2 heads"):
        torch.ops.trt_llm.cross_attention(q, key, value, 2, SCALE)


# ---------------------------------------------------------------------------------------------------
# Facets 2 and 3: the function body and the ONNX Runtime lowering.


def test_export_emits_one_plugin_node_with_namespace_and_function(exported):
    model = exported[torch.float32]
    nodes = [n for n in model.graph.node if n.domain == cross_attention.DOMAIN]
    assert [n.op_type for n in nodes] == [cross_attention.OP_NAME]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes == {"num_heads": HEADS, "scale": pytest.approx(SCALE),
                          "plugin_namespace": cross_attention.PLUGIN_NAMESPACE.encode()}
    assert [f.name for f in model.functions] == [cross_attention.OP_NAME]
    onnx.checker.check_model(model)


def test_the_registry_finds_the_op():
    assert cross_attention in plugins.ops()
    assert plugins.translation_table()[torch.ops.trt_llm.cross_attention.default] is cross_attention.onnx_translation
    assert cross_attention.OP_NAME in [f.name for f in plugins.function_protos()]


CASES = {
    "decode, one row": (1, 1, 50),
    "decode, a batch": (5, 1, 64),
    "prefill": (3, 4, 33),
    "one key": (2, 3, 1),
    "encoder self-attention": (1, 48, 48),
}


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
@pytest.mark.parametrize("case", list(CASES))
def test_facet_equals_reference_fp32(sessions, facet, case):
    inputs = make_inputs(*CASES[case], seed=len(case))
    expected = OneCrossAttention()(*inputs).numpy()
    got = sessions[(facet, torch.float32)].run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
def test_facet_equals_reference_fp16(sessions, facet):
    """ONNX Runtime's CPU kernels take fp16 for every op of both: the result is within fp16 rounding."""
    for case in ("decode, a batch", "prefill"):
        inputs = make_inputs(*CASES[case], torch.float16, seed=3)
        expected = OneCrossAttention()(*inputs).float().numpy()
        got = sessions[(facet, torch.float16)].run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})[0]
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), expected, atol=3e-3, rtol=3e-3)


def test_lowering_inlines_every_node_under_its_own_names(tmp_path):
    """Two nodes become two copies of the body, each under its node's name; the result is the
    reference's, and the model passes the checker without the function."""
    batch, seq, frames = Dim("batch"), Dim("seq"), Dim("frames")
    q, key_0, value_0 = make_inputs(2, 3, 7)
    _, key_1, value_1 = make_inputs(2, 3, 7, seed=1)
    names = ["q", "key_0", "value_0", "key_1", "value_1"]
    shapes = ({0: batch, 1: seq}, *[{0: batch, 2: frames}] * 4)
    model = export(TwoLayers(), (q, key_0, value_0, key_1, value_1), names, shapes, tmp_path / "two.onnx")
    low = lowered(model)
    op_types = [n.op_type for n in low.graph.node]
    assert op_types.count("Softmax") == 2 and op_types.count("MatMul") == 4
    produced = [o for n in low.graph.node for o in n.output]
    assert len(produced) == len(set(produced))
    onnx.checker.check_model(low, full_check=True)
    inputs = (*make_inputs(3, 2, 20, seed=4), *make_inputs(3, 2, 20, seed=5)[1:])
    expected = TwoLayers()(*inputs).numpy()
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    for graph in (model, low):
        np.testing.assert_allclose(session(graph).run(None, feeds)[0], expected, atol=1e-5, rtol=1e-4)


def test_lowering_leaves_a_model_without_the_op_alone(exported):
    model = onnx.ModelProto()
    model.CopyFrom(exported[torch.float32])
    for node in model.graph.node:
        node.op_type = "SomethingElse" if node.op_type == cross_attention.OP_NAME else node.op_type
    before = model.SerializeToString()
    assert cross_attention.lower_for_onnxruntime(model).SerializeToString() == before


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT kernel (plain torch: checked here on the CPU) and TensorRT-RTX's build.


def test_tensorrt_kernel_equals_reference():
    for case in CASES.values():
        inputs = make_inputs(*case, seed=7)
        expected = OneCrossAttention()(*inputs)
        torch.testing.assert_close(cross_attention.cross_attention_kernel(*inputs, HEADS, SCALE), expected,
                                   atol=1e-5, rtol=1e-4)
        out = torch.full_like(expected, float("nan"))
        assert cross_attention.cross_attention_kernel(*inputs, HEADS, SCALE, out=out) is out
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_tensorrt_rtx_builds_a_plan_ahead_of_time(tmp_path):
    """The fp16 op, batch, queries and keys dynamic, parsed and built for SM80 without a GPU:
    TensorRT-RTX has no plugins and inlines the body."""
    import tensorrt_rtx as trt
    from trt_llm.build.tensorrt_backend import DEFAULT_COMPUTE_CAPABILITY, compute_capability
    from trt_llm.common.trt_import import make_logger

    path = tmp_path / "cross.onnx"
    export_one(torch.float16, path)
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path)), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    output = network.get_output(0)
    assert tuple(output.shape) == (-1, -1, HEADS * HEAD_DIM) and output.dtype == trt.DataType.HALF

    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(compute_capability(trt, DEFAULT_COMPUTE_CAPABILITY), 0)
    profile = builder.create_optimization_profile()
    profile.set_shape("q", (1, 1, HEADS * HEAD_DIM), (4, 1, HEADS * HEAD_DIM), (8, 8, HEADS * HEAD_DIM))
    for name in ("key", "value"):
        profile.set_shape(name, (1, HEADS, 1, HEAD_DIM), (4, HEADS, 1500, HEAD_DIM), (8, HEADS, 1500, HEAD_DIM))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 0
