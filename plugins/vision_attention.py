"""Bidirectional attention of a vision tower over ragged images / windows: all its facets in one file.

A request's images are one packed sequence of patches; each segment of it (an image, or one window of
Qwen2.5-VL's window attention) attends to itself only, with no causal mask. It is the attention of
transformers' Qwen2_5_VLVisionAttention (its eager path splits q/k/v at cu_seqlens and runs plain
softmax attention on each part, scale head_dim ** -0.5), after the rotary and before the output
projection.

Inputs (shapes):
    q, k, v      [N, H, D] float   N = the patches of all segments, packed in segment order
    cu_seqlens   [S + 1] int32     segment boundaries: segment s is rows cu[s] .. cu[s+1] - 1,
                                   0 = cu[0] <= cu[1] <= ... <= cu[S] = N (an empty segment is allowed)
Attributes: scale (the softmax scale, head_dim ** -0.5 for Qwen2.5-VL).
Output: [N, H, D], row n = softmax(scale * q[n] . k[seg]^T) @ v[seg] per head, seg = n's segment.

Nothing here is quadratic in N: every facet pads the segments to the longest one (Lmax) and attends
within [S, Lmax], so the largest intermediate is the scores [S, H, Lmax, Lmax], never [H, N, N]
(16 images of 1,024 patches: 16 * H * 1024^2 scores, 1/16 of a block-diagonal mask over all N).

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `vision_attention` (`TORCH_OPS`): a torch custom op whose eager body loops over the segments
    (float32 softmax, the result in the input dtype): the ground truth.
 2. `onnx_translation` + `function_protos`: a node `trt::VisionAttentionPlugin` carrying a
    `plugin_namespace` attribute, and a model-local function of standard ops (opset 18) with the
    same name: Gather the segments into [S, Lmax, H, D] (row = start + slot, Lmax = ReduceMax of the
    lengths, so the padded shapes are data-dependent), attend with a key-padding bias
    [S, 1, 1, Lmax], and Gather each packed row's slot back to [N, H, D] (the slots found by one
    ScatterElements of slot numbers, not NonZero, which TensorRT-RTX lacks). N and S are dynamic:
    one graph serves any number and size of images.
 3. `lower_for_onnxruntime`: the opset-23 Attention op on the padded [S, Lmax, H * D] layout (the
    model goes to opset 23; ONNX Runtime 1.23+), the padding computed once per cu_seqlens tensor
    and shared by every layer that reads it. Measured on the 2 shared cores of an AMD EPYC (ONNX
    Runtime 1.32, one thread, fp32, H = 16, D = 80 as in Qwen2.5-VL-3B's tower), one call, best of
    16 calls in two runs (a run's median in brackets):
                                     function body    Attention    com.microsoft.MultiHeadAttention
        4 images of 1,024 patches:   338 (391) ms     337 (370)    347 (383)
        64 windows of 64 patches:     50  (60) ms      37  (39)     48  (58)
    Equal where the matmuls dominate; on windows the Attention kernel saves the body's head
    transposes (it reads [S, Lmax, H * D] in place). MultiHeadAttention (key_padding_mask [S, Lmax])
    is no faster than the body. Where the graph does not record H and D, or ONNX Runtime is older,
    the node stays and ONNX Runtime runs its body.
 4. `register_tensorrt_plugin`: the node as a `tensorrt.plugin` plugin whose kernel is
    `vision_attention_kernel` (plain torch: torch's scaled_dot_product_attention on the padded
    layout). TensorRT-RTX has no plugins: its parser inlines the function body at every call, with
    the self-attention fusion of its builder (a plan builds ahead of time for SM80 without a GPU,
    tests/test_vision_attention.py), so no `lower_for_tensorrt` rewrite is needed.
"""

from __future__ import annotations

import itertools

import onnx
import onnxscript
import torch
from onnx import TensorProto, helper
from onnxscript import opset18 as op
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "VisionAttentionPlugin"
OP_NAMES = (OP_NAME,)
# "trt" is reserved by tensorrt.plugin, so the plugin lives in our own namespace.
PLUGIN_NAMESPACE = "trt_llm"
_TRT = onnxscript.values.Opset(DOMAIN, 1)


def _register_schema() -> None:
    """Register the node's schema so onnxscript (and the exporter) can emit it."""
    if onnx.defs.has(OP_NAME, DOMAIN):
        return
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    AttrType = onnx.defs.OpSchema.AttrType
    onnx.defs.register_schema(onnx.defs.OpSchema(
        OP_NAME, DOMAIN, 1,
        doc="Bidirectional attention within packed segments (see trt_llm.plugins.vision_attention).",
        inputs=[Param("q", "T"), Param("k", "T"), Param("v", "T"), Param("cu_seqlens", "I")],
        outputs=[Param("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "activations"),
                          ("I", ["tensor(int32)"], "segment boundaries")],
        attributes=[
            Attr("scale", AttrType.FLOAT, "softmax scale"),
            Attr("plugin_namespace", AttrType.STRING, "TensorRT plugin namespace"),
        ],
    ))


_register_schema()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


@torch.library.custom_op("trt_llm::vision_attention", mutates_args=())
def vision_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float) -> Tensor:
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in itertools.pairwise(bounds):
        # [H, L, D] per segment; float32 throughout, as transformers' eager softmax is.
        qs, ks, vs = (t[start:end].transpose(0, 1).float() for t in (q, k, v))
        probs = ((qs @ ks.transpose(-1, -2)) * scale).softmax(-1)
        out[start:end] = (probs @ vs).transpose(0, 1).to(q.dtype)
    return out


@vision_attention.register_fake
def _vision_attention_fake(q, k, v, cu_seqlens, scale):
    return torch.empty_like(q)


# ---------------------------------------------------------------------------------------------------
# The torch ops this file defines, for the registry (plugins/__init__.py).
TORCH_OPS = (torch.ops.trt_llm.vision_attention.default,)


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face: our node, and the padded attention as its function body.


def onnx_translation(q, k, v, cu_seqlens, scale: float) -> onnxscript.onnx_types.FLOAT:
    # The return annotation matters: without it the exporter infers zero outputs.
    return _TRT.VisionAttentionPlugin(q, k, v, cu_seqlens, scale=scale, plugin_namespace=PLUGIN_NAMESPACE)


@onnxscript.script(_TRT, default_opset=op)
def VisionAttentionPlugin(q, k, v, cu_seqlens, scale: float, plugin_namespace: str):
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    cu = op.Cast(cu_seqlens, to=7)
    starts = op.Slice(cu, zero, last)  # [S]
    lengths = op.Sub(op.Slice(cu, one, op.Shape(cu)), starts)  # [S]
    longest = op.ReduceMax(lengths, keepdims=0)  # Lmax, a scalar
    slots = op.Range(op.Constant(value_int=0), longest, op.Constant(value_int=1))  # [Lmax]

    # Segment s, slot j reads packed row starts[s] + j; a padding slot (j >= length) reads row 0:
    # its query's output is never read back and its key is masked.
    valid = op.Less(op.Unsqueeze(slots, zero), op.Unsqueeze(lengths, one))  # [S, Lmax]
    rows = op.Where(valid, op.Add(op.Unsqueeze(starts, one), op.Unsqueeze(slots, zero)),
                    op.Constant(value_int=0))
    # Scaling q first: N * H * D products rather than S * H * Lmax^2.
    qs = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    q_t = op.Transpose(op.Gather(qs, rows, axis=0), perm=[0, 2, 1, 3])  # [S, H, Lmax, D]
    k_t = op.Transpose(op.Gather(k, rows, axis=0), perm=[0, 2, 3, 1])  # [S, H, D, Lmax]
    v_t = op.Transpose(op.Gather(v, rows, axis=0), perm=[0, 2, 1, 3])  # [S, H, Lmax, D]
    open_ = op.CastLike(op.Constant(value_float=0.0), q)
    closed = op.CastLike(op.Constant(value_float=float("-inf")), q)
    bias = op.Unsqueeze(op.Where(valid, open_, closed), op.Constant(value_ints=[1, 2]))  # [S, 1, 1, Lmax]
    probs = op.Softmax(op.Add(op.MatMul(q_t, k_t), bias), axis=-1)  # [S, H, Lmax, Lmax]
    padded = op.Transpose(op.MatMul(probs, v_t), perm=[0, 2, 1, 3])  # [S, Lmax, H, D]

    # Back to packed rows: row n reads flat slot picks[n], the inverse of `rows` over the valid
    # slots, made by one scatter of slot numbers. Padding slots scatter past row N - 1, each to a
    # place of its own (N + its slot), so no two writes meet; the first N entries are the picks.
    # (Not NonZero of the mask: TensorRT-RTX has no NonZero, a plugin in TensorRT.)
    count = op.Shape(q, start=0, end=1)
    flat_slots = op.Range(op.Constant(value_int=0), op.Size(valid), op.Constant(value_int=1))  # [S * Lmax]
    targets = op.Where(op.Reshape(valid, last), op.Reshape(rows, last), op.Add(flat_slots, count))
    places = op.Expand(op.Constant(value_ints=[0]), op.Add(count, op.Shape(flat_slots)))
    picks = op.Slice(op.ScatterElements(places, targets, flat_slots, axis=0), zero, count)  # [N]
    flat = op.Reshape(padded, op.Concat(last, op.Shape(q, start=1, end=3), axis=0))  # [S * Lmax, H, D]
    return op.Gather(flat, picks, axis=0)


def function_protos() -> list[onnx.FunctionProto]:
    return [VisionAttentionPlugin.to_function_proto()]


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering.

ONNXRUNTIME_OPSET = 23  # the Attention op


def _nodes(model: onnx.ModelProto) -> dict[int, onnx.NodeProto]:
    """This op's nodes by their index in the graph (protobuf wrappers have no stable id())."""
    return {i: n for i, n in enumerate(model.graph.node) if n.domain == DOMAIN and n.op_type == OP_NAME}


def _attr(node: onnx.NodeProto, name: str):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    raise KeyError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")


def _heads_and_dim(model: onnx.ModelProto, name: str) -> tuple[int, int] | None:
    """(H, D) of an activation [N, H, D] from the exporter's shapes; None where it left them out."""
    for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if info.name == name:
            dims = info.type.tensor_type.shape.dim
            if len(dims) == 3 and dims[1].HasField("dim_value") and dims[2].HasField("dim_value"):
                return dims[1].dim_value, dims[2].dim_value
    return None


def _onnxruntime_has_attention() -> bool:
    """ONNX Runtime's CPU kernel of the opset-23 Attention op came with 1.23."""
    import onnxruntime

    major, minor = (int(part) for part in onnxruntime.__version__.split(".")[:2])
    return (major, minor) >= (1, 23)


def _int64(name: str, values: list[int], scalar: bool = False) -> onnx.NodeProto:
    tensor = helper.make_tensor(name, TensorProto.INT64, [] if scalar else [len(values)], values)
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def _padding_nodes(cu_seqlens: str, p: str) -> list[onnx.NodeProto]:
    """The padded layout of one cu_seqlens, shared by every node that reads it: f"{p}/rows" [S, Lmax]
    (each slot's packed row, 0 for padding), f"{p}/mask" bool [S, 1, Lmax, Lmax] (ONNX Runtime's
    Attention wants the query dimension spelt out; S * Lmax^2 bytes) and f"{p}/picks" [N] (the flat
    slot of each packed row: NonZero of the valid slots, which ONNX Runtime has)."""
    def node(op_type, inputs, output, **attributes):
        return helper.make_node(op_type, inputs, [f"{p}/{output}"], name=f"{p}/{output}", **attributes)

    return [
        _int64(f"{p}/zero", [0]), _int64(f"{p}/one", [1]), _int64(f"{p}/last", [-1]), _int64(f"{p}/axes", [1, 2]),
        _int64(f"{p}/first", [0], scalar=True), _int64(f"{p}/step", [1], scalar=True),
        node("Cast", [cu_seqlens], "cu", to=TensorProto.INT64),
        node("Slice", [f"{p}/cu", f"{p}/zero", f"{p}/last"], "starts"),
        node("Shape", [f"{p}/cu"], "bounds"),
        node("Slice", [f"{p}/cu", f"{p}/one", f"{p}/bounds"], "ends"),
        node("Sub", [f"{p}/ends", f"{p}/starts"], "lengths"),
        node("ReduceMax", [f"{p}/lengths"], "longest", keepdims=0),
        node("Range", [f"{p}/first", f"{p}/longest", f"{p}/step"], "slots"),
        node("Unsqueeze", [f"{p}/slots", f"{p}/zero"], "slot_row"),
        node("Unsqueeze", [f"{p}/lengths", f"{p}/one"], "length_column"),
        node("Unsqueeze", [f"{p}/starts", f"{p}/one"], "start_column"),
        node("Less", [f"{p}/slot_row", f"{p}/length_column"], "valid"),  # [S, Lmax]
        node("Add", [f"{p}/start_column", f"{p}/slot_row"], "slot_rows"),
        node("Where", [f"{p}/valid", f"{p}/slot_rows", f"{p}/first"], "rows"),
        node("Shape", [f"{p}/rows"], "padded_shape"),  # [S, Lmax]
        node("Shape", [f"{p}/rows"], "segments_1d", start=0, end=1),
        node("Shape", [f"{p}/rows"], "longest_1d", start=1, end=2),
        node("Concat", [f"{p}/segments_1d", f"{p}/one", f"{p}/longest_1d", f"{p}/longest_1d"], "mask_shape", axis=0),
        node("Unsqueeze", [f"{p}/valid", f"{p}/axes"], "key_mask"),  # [S, 1, 1, Lmax]
        node("Expand", [f"{p}/key_mask", f"{p}/mask_shape"], "mask"),
        node("Reshape", [f"{p}/valid", f"{p}/last"], "valid_flat"),
        node("NonZero", [f"{p}/valid_flat"], "nonzero"),
        node("Squeeze", [f"{p}/nonzero", f"{p}/zero"], "picks"),
    ]


def _attention_nodes(node: onnx.NodeProto, p: str, heads: int, head_dim: int) -> list[onnx.NodeProto]:
    """One node as Attention on the padded [S, Lmax, H * D] layout (3D: the kernel reads the heads in
    place, no transposes), its result gathered back to [N, H, D]."""
    name = node.name or node.output[0]
    width, flat = f"{name}/width", f"{name}/flat_shape"
    nodes = [_int64(width, [heads * head_dim]), _int64(flat, [-1, heads, head_dim]),
             helper.make_node("Concat", [f"{p}/padded_shape", width], [f"{name}/packed_shape"],
                              name=f"{name}/packed_shape", axis=0)]
    padded = []
    for role, x in zip("qkv", node.input[:3]):
        nodes += [helper.make_node("Gather", [x, f"{p}/rows"], [f"{name}/{role}_rows"], name=f"{name}/{role}_rows",
                                   axis=0),
                  helper.make_node("Reshape", [f"{name}/{role}_rows", f"{name}/packed_shape"], [f"{name}/{role}_padded"],
                                   name=f"{name}/{role}_padded")]
        padded.append(f"{name}/{role}_padded")
    return nodes + [
        helper.make_node("Attention", [*padded, f"{p}/mask"], [f"{name}/attention"], name=f"{name}/attention",
                         q_num_heads=heads, kv_num_heads=heads, scale=_attr(node, "scale")),
        helper.make_node("Reshape", [f"{name}/attention", flat], [f"{name}/slots"], name=f"{name}/slots"),
        helper.make_node("Gather", [f"{name}/slots", f"{p}/picks"], [node.output[0]], name=f"{name}/picks", axis=0),
    ]


def require_opset(model: onnx.ModelProto) -> None:
    """The model and its functions at opset 23 or later, in place (a function imports its model's).
    Opsets 19-23 add types and attributes with defaults to the ops our graphs use."""
    for opsets in [model.opset_import, *(f.opset_import for f in model.functions)]:
        for opset in opsets:
            if opset.domain in ("", "ai.onnx"):
                opset.version = max(opset.version, ONNXRUNTIME_OPSET)


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every vision attention node into ONNX Runtime's Attention on the padded layout, in
    place (see facet 3 in the module docstring); the padding indices are computed once per
    cu_seqlens. A node whose H and D the exporter did not record, or an ONNX Runtime before 1.23,
    keeps the node: ONNX Runtime then runs its function body."""
    nodes = _nodes(model)
    if not nodes or not _onnxruntime_has_attention():
        return model
    layouts: dict[str, str] = {}  # cu_seqlens -> the prefix of its padding nodes
    replaced = {}
    for index, node in nodes.items():
        shape = _heads_and_dim(model, node.input[0])
        if shape is None:
            continue
        cu_seqlens = node.input[3]
        new = []
        if cu_seqlens not in layouts:
            layouts[cu_seqlens] = f"trt_llm_vision_attention/{len(layouts)}"
            new += _padding_nodes(cu_seqlens, layouts[cu_seqlens])
        replaced[index] = new + _attention_nodes(node, layouts[cu_seqlens], *shape)
    if not replaced:
        return model
    new_nodes = []
    for index, node in enumerate(model.graph.node):
        new_nodes.extend(replaced.get(index, [node]))
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    require_opset(model)
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt.
#
# The parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute.
# TensorRT-RTX has none: it inlines the body at every call (no rewrite needed: a node name repeated
# across calls is a warning, which runtime.trt_import.make_logger hides).

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_IDS = (f"{TENSORRT_PLUGIN_NAMESPACE}::{OP_NAME}",)
_tensorrt_registered = False


def vision_attention_kernel(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float,
                            out: Tensor | None = None) -> Tensor:
    """The plugin's kernel: the op of facet 1 on tensors of any one device, in plain torch.

    The padded layout of the body, attended by torch's scaled_dot_product_attention (its fused
    kernels keep the softmax in float32 on a GPU). One value is read back to the host, the longest
    segment, which sizes the padding: a vision tower runs once per request and is not captured in a
    CUDA graph. With `out` the result is written there.
    """
    cu = cu_seqlens.long()
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    slots = torch.arange(int(lengths.max()), device=q.device)
    valid = slots[None, :] < lengths[:, None]  # [S, Lmax]
    rows = torch.where(valid, starts[:, None] + slots[None, :], 0)
    padded = [t[rows].transpose(1, 2) for t in (q, k, v)]  # [S, H, Lmax, D]
    context = torch.nn.functional.scaled_dot_product_attention(*padded, attn_mask=valid[:, None, None, :],
                                                               scale=scale)
    # Packed row n is slot n - starts[s] of its segment s (repeat_interleave with output_size: no sync).
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths, output_size=q.shape[0])
    offset = torch.arange(q.shape[0], device=q.device) - starts[segment]
    result = context.transpose(1, 2)[segment, offset]  # [N, H, D]
    if out is None:
        return result
    return out.copy_(result)


def register_tensorrt_plugin() -> tuple[str, ...]:
    """Register the node with TensorRT (once per process); returns its plugin id.

    Needed before parsing a graph (the parser then builds a plugin layer for each node whose
    `plugin_namespace` is TENSORRT_PLUGIN_NAMESPACE) and before deserializing an engine built with
    it: the kernel is the Python function below (a JIT plugin), which TensorRT calls on its stream.
    """
    global _tensorrt_registered
    if _tensorrt_registered:
        return TENSORRT_PLUGIN_IDS
    import tensorrt.plugin as trtp

    from trt_llm.plugins.attention import _tensorrt_as_torch

    def describe(q, k, v, cu_seqlens, scale):
        return q.like()  # [N, H, D], the activation dtype

    def run(q, k, v, cu_seqlens, scale, outputs, stream):
        # The kernel on the plugin's device buffers, on TensorRT's stream (the views are made inside
        # the stream context, so nothing waits on another stream).
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.no_grad():
            inputs = [_tensorrt_as_torch(t) for t in (q, k, v, cu_seqlens)]
            vision_attention_kernel(*inputs, scale, out=_tensorrt_as_torch(outputs[0]))

    # tensorrt.plugin reads the real annotation objects (this module's annotations are strings).
    tensors = ("q", "k", "v", "cu_seqlens")
    describe.__annotations__ = {**{name: trtp.TensorDesc for name in tensors}, "scale": float,
                                "return": trtp.TensorDesc}
    run.__annotations__ = {**{name: trtp.Tensor for name in tensors}, "scale": float,
                           "outputs": tuple[trtp.Tensor], "stream": int}
    trtp.register(TENSORRT_PLUGIN_IDS[0])(describe)
    trtp.impl(TENSORRT_PLUGIN_IDS[0])(run)
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_IDS
