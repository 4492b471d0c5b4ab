"""The vision attention op (plugins/vision_attention.py): the reference against torch's own attention
and a hand computation; the ONNX function body and the ONNX Runtime lowering against the reference,
for any number and size of segments through one graph; their memory (never an [H, N, N] tensor);
the TensorRT kernel; and a TensorRT-RTX plan built ahead of time from the body."""

import copy
import importlib.util
import itertools
import math
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.export import Dim

from test_attention_plugin import session  # an ONNX Runtime CPU session of a model proto, one thread
from trt_llm import plugins
from trt_llm.build.export import export_graph
from trt_llm.plugins import vision_attention

HEADS, HEAD_DIM = 4, 16
SCALE = HEAD_DIM ** -0.5
NAMES = ["q", "k", "v", "cu_seqlens"]
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


class OneVisionAttention(torch.nn.Module):
    def forward(self, q, k, v, cu_seqlens):
        return torch.ops.trt_llm.vision_attention(q, k, v, cu_seqlens, SCALE)


class Tower(torch.nn.Module):
    """Three layers as Qwen2.5-VL interleaves them: windows, whole images, windows again."""

    def forward(self, q, k, v, cu_windows, cu_images):
        x = torch.ops.trt_llm.vision_attention(q, k, v, cu_windows, SCALE)
        x = torch.ops.trt_llm.vision_attention(x, k, v, cu_images, SCALE)
        return torch.ops.trt_llm.vision_attention(x, k, v, cu_windows, SCALE)


def cu_of(lengths) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)


def make_inputs(lengths, dtype=torch.float32, seed=0, heads=HEADS, head_dim=HEAD_DIM):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, generator=generator).to(dtype) for _ in range(3))
    return q, k, v, cu_of(lengths)


def sdpa_oracle(q, k, v, cu_seqlens, scale=SCALE):
    """torch's scaled_dot_product_attention on each segment alone, in float32."""
    bounds = cu_seqlens.tolist()
    parts = []
    for start, end in itertools.pairwise(bounds):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        parts.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, scale=scale).transpose(0, 1))
    return torch.cat(parts).to(q.dtype)


def export(module, example, names, dynamic_shapes, path) -> onnx.ModelProto:
    export_graph(module, example, names, ["output"], dynamic_shapes, path)
    return onnx.load(path)


def export_one(dtype, path) -> onnx.ModelProto:
    # Distinct example sizes (10 patches, 3 bounds), so the tracer keeps N and S apart.
    patches, bounds = Dim("patches"), Dim("segment_bounds")
    return export(OneVisionAttention(), make_inputs([3, 7], dtype), NAMES,
                  ({0: patches}, {0: patches}, {0: patches}, {0: bounds}), path)


def lowered(model):
    model = vision_attention.lower_for_onnxruntime(copy.deepcopy(model))
    assert not any(n.domain == vision_attention.DOMAIN for n in model.graph.node)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-attention")
    return {dtype: export_one(dtype, folder / f"{name}.onnx")
            for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16"))}


@pytest.fixture(scope="module")
def sessions(exported):
    """(facet, dtype) -> one ONNX Runtime session, reused for every case: N and S vary through it."""
    return {(facet, dtype): session(lowered(model) if facet == "onnxruntime lowering" else model)
            for dtype, model in exported.items() for facet in ("function body", "onnxruntime lowering")}


# ---------------------------------------------------------------------------------------------------
# Facet 1: the reference.


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_equals_sdpa_per_segment(dtype):
    inputs = make_inputs([1, 7, 64, 33], dtype, seed=1)
    got = OneVisionAttention()(*inputs)
    assert got.dtype == dtype and got.shape == inputs[0].shape
    tolerance = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, sdpa_oracle(*inputs), atol=tolerance, rtol=tolerance)


def test_reference_by_hand():
    """Two patches of one image see each other and nothing else; the third, alone, sees itself."""
    q = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]], [[5.0, 5.0]]])  # [N=3, H=1, D=2]
    k = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[9.0, 9.0]]])
    v = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]], [[7.0, 8.0]]])
    out = torch.ops.trt_llm.vision_attention(q, k, v, cu_of([2, 1]), 0.5)
    # Patch 0: scores (0.5, 0); patch 1: scores (0, 1).
    p0 = math.exp(0.5) / (math.exp(0.5) + 1)
    p1 = 1 / (1 + math.e)
    expected = torch.tensor([[[p0 * 1 + (1 - p0) * 3, p0 * 2 + (1 - p0) * 4]],
                             [[p1 * 1 + (1 - p1) * 3, p1 * 2 + (1 - p1) * 4]],
                             [[7.0, 8.0]]])
    torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------------------------------------
# Facets 2 and 3: the function body and the ONNX Runtime lowering.


def test_export_emits_one_plugin_node_with_namespace_and_function(exported):
    model = exported[torch.float32]
    nodes = [n for n in model.graph.node if n.domain == vision_attention.DOMAIN]
    assert [n.op_type for n in nodes] == [vision_attention.OP_NAME]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes == {"scale": pytest.approx(SCALE), "plugin_namespace": vision_attention.PLUGIN_NAMESPACE.encode()}
    assert [f.name for f in model.functions] == [vision_attention.OP_NAME]
    assert {n.op_type for n in model.functions[0].node}.isdisjoint({"NonZero", "Loop", "If"})
    onnx.checker.check_model(model)


def test_the_registry_finds_the_op():
    assert vision_attention in plugins.ops()
    assert plugins.translation_table()[torch.ops.trt_llm.vision_attention.default] is vision_attention.onnx_translation
    assert vision_attention.OP_NAME in [f.name for f in plugins.function_protos()]


CASES = {
    "one segment": [50],
    "ragged segments": [1, 7, 64, 33],
    "many small windows": [16] * 24 + [5, 16],
    "one patch": [1],
    "an empty segment": [6, 0, 9],
}


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
@pytest.mark.parametrize("case", list(CASES))
def test_facet_equals_reference_fp32(sessions, facet, case):
    inputs = make_inputs(CASES[case], seed=len(case))
    expected = OneVisionAttention()(*inputs).numpy()
    got = sessions[(facet, torch.float32)].run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
def test_facet_equals_reference_fp16(sessions, facet):
    """ONNX Runtime's CPU kernels take fp16 for every op of both: the result is within fp16 rounding."""
    for lengths in (CASES["ragged segments"], CASES["many small windows"]):
        inputs = make_inputs(lengths, torch.float16, seed=3)
        expected = OneVisionAttention()(*inputs).float().numpy()
        got = sessions[(facet, torch.float16)].run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})[0]
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), expected, atol=3e-3, rtol=3e-3)


def test_lowering_shares_the_padding_of_each_cu_seqlens(tmp_path):
    """A tower's layers read two cu_seqlens (windows, images): the padding is computed once for each,
    every layer becomes one Attention node, the model opset 23; the result is the reference's."""
    patches, windows, images = Dim("patches"), Dim("window_bounds"), Dim("image_bounds")
    example = (*make_inputs([3, 4, 5])[:3], cu_of([3, 4, 5]), cu_of([7, 5]))
    model = export(Tower(), example, ["q", "k", "v", "cu_windows", "cu_images"],
                   ({0: patches}, {0: patches}, {0: patches}, {0: windows}, {0: images}), tmp_path / "tower.onnx")
    assert [n.op_type for n in model.graph.node if n.domain == vision_attention.DOMAIN] == [vision_attention.OP_NAME] * 3
    low = lowered(model)
    op_types = [n.op_type for n in low.graph.node]
    assert op_types.count("Attention") == 3 and op_types.count("NonZero") == 2
    assert {o.domain: o.version for o in low.opset_import}[""] == vision_attention.ONNXRUNTIME_OPSET
    onnx.checker.check_model(low)
    q, k, v, _ = make_inputs([64] * 6, seed=5)
    cu_windows, cu_images = cu_of([16] * 24), cu_of([128, 256])
    expected = Tower()(q, k, v, cu_windows, cu_images).numpy()
    feeds = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "cu_windows": cu_windows.numpy(),
             "cu_images": cu_images.numpy()}
    for graph in (model, low):
        np.testing.assert_allclose(session(graph).run(None, feeds)[0], expected, atol=1e-5, rtol=1e-4)


def test_lowering_keeps_a_node_it_cannot_lower(monkeypatch):
    """A node whose H and D the graph does not record, or any node on an ONNX Runtime before 1.23
    (no Attention kernel), stays as it is, and ONNX Runtime runs its function body."""
    unshaped = model_of(HEADS, HEAD_DIM)
    unshaped.graph.input[0].type.tensor_type.ClearField("shape")
    inputs = make_inputs(CASES["ragged segments"], seed=9)
    expected = OneVisionAttention()(*inputs).numpy()
    kept = vision_attention.lower_for_onnxruntime(copy.deepcopy(unshaped))
    assert [n.op_type for n in kept.graph.node] == [vision_attention.OP_NAME]
    got = session(kept).run(None, {n: t.numpy() for n, t in zip(NAMES, inputs)})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)
    monkeypatch.setattr(vision_attention, "_onnxruntime_has_attention", lambda: False)
    old = vision_attention.lower_for_onnxruntime(model_of(HEADS, HEAD_DIM))
    assert [n.op_type for n in old.graph.node] == [vision_attention.OP_NAME]
    assert {o.domain: o.version for o in old.opset_import}[""] == 18


# ---------------------------------------------------------------------------------------------------
# Never quadratic: 16,384 patches as 16 images of 1,024. One [H, N, N] float32 tensor would be
# H * 16384^2 * 4 bytes (2 GiB at H = 2); the padded scores are [16, H, 1024, 1024], 1/16 of that.

MEMORY_PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    heads, head_dim = int(sys.argv[2]), int(sys.argv[3])
    feeds = {name: np.ones((16384, heads, head_dim), np.float32) for name in "qkv"}
    feeds["cu_seqlens"] = np.arange(0, 16385, 1024, dtype=np.int32)
    def peak():
        # VmHWM: this process image's high-water mark. Not ru_maxrss, which a child inherits from the
        # parent it forked from (a test session of several GB would hide the run's own peak).
        with open("/proc/self/status") as status:
            line = next(l for l in status if l.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * resource.getpagesize()
    session.run(None, feeds)
    print(peak() - resident)
""")


def model_of(heads: int, head_dim: int) -> onnx.ModelProto:
    """One node over graph inputs [N, heads, head_dim], with its function body."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", heads, head_dim]) for name in "qkv"]
    inputs.append(helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["S"]))
    node = helper.make_node(vision_attention.OP_NAME, NAMES, ["output"], domain=vision_attention.DOMAIN,
                            scale=head_dim ** -0.5, plugin_namespace=vision_attention.PLUGIN_NAMESPACE)
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", heads, head_dim])
    return helper.make_model(helper.make_graph([node], "vision_attention", inputs, [output]),
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(vision_attention.DOMAIN, 1)],
                             functions=vision_attention.function_protos())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("facet", ["function body", "onnxruntime lowering"])
def test_memory_is_not_quadratic_in_patches(tmp_path, facet):
    heads, head_dim = 2, 8
    model = model_of(heads, head_dim)
    path = tmp_path / "model.onnx"
    onnx.save(lowered(model) if facet == "onnxruntime lowering" else model, path)
    # A fresh process: its peak resident memory is this run's, not the test session's.
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path), str(heads), str(head_dim)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert probe.returncode == 0, probe.stderr
    growth = int(probe.stdout)
    quadratic = heads * 16384 ** 2 * 4
    # Measured: about twice the padded scores (the body 269 MiB, the lowering 256 MiB at H = 2).
    assert growth < quadratic / 4, f"{growth / 2**20:.0f} MiB for a run, an [H, N, N] tensor is {quadratic / 2**20:.0f}"


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT kernel (plain torch: checked here on the CPU) and TensorRT-RTX's build.


def test_tensorrt_kernel_equals_reference():
    for lengths in (CASES["ragged segments"], CASES["many small windows"], CASES["an empty segment"]):
        inputs = make_inputs(lengths, seed=7)
        expected = OneVisionAttention()(*inputs)
        torch.testing.assert_close(vision_attention.vision_attention_kernel(*inputs, SCALE), expected,
                                   atol=1e-5, rtol=1e-4)
        out = torch.full_like(expected, float("nan"))
        assert vision_attention.vision_attention_kernel(*inputs, SCALE, out=out) is out
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not HAS_RTX, reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_tensorrt_rtx_builds_a_plan_ahead_of_time(tmp_path):
    """The fp16 tower (three calls of the body, two cu_seqlens), N and S dynamic, parsed and built
    for SM80 without a GPU: TensorRT-RTX has no plugins and inlines the body at every call."""
    import tensorrt_rtx as trt
    from trt_llm.build.tensorrt_backend import (
        DEFAULT_COMPUTE_CAPABILITY,
        compute_capability,
    )
    from trt_llm.common.trt_import import make_logger

    patches, windows, images = Dim("patches"), Dim("window_bounds"), Dim("image_bounds")
    example = (*make_inputs([3, 4, 5], torch.float16)[:3], cu_of([3, 4, 5]), cu_of([7, 5]))
    names = ["q", "k", "v", "cu_windows", "cu_images"]
    path = tmp_path / "tower.onnx"
    export(Tower(), example, names, ({0: patches}, {0: patches}, {0: patches}, {0: windows}, {0: images}), path)

    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path)), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    output = network.get_output(0)
    assert tuple(output.shape) == (-1, HEADS, HEAD_DIM) and output.dtype == trt.DataType.HALF

    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(compute_capability(trt, DEFAULT_COMPUTE_CAPABILITY), 0)
    profile = builder.create_optimization_profile()
    for name in "qkv":
        profile.set_shape(name, (1, HEADS, HEAD_DIM), (1024, HEADS, HEAD_DIM), (4096, HEADS, HEAD_DIM))
    profile.set_shape("cu_windows", (2,), (17,), (257,))
    profile.set_shape("cu_images", (2,), (2,), (9,))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 0
