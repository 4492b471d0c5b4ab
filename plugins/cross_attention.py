"""Attention over a fixed set of keys and values, every key visible: all its facets in one file.

Whisper's decoder attends to the encoder's output in every layer (cross-attention); the keys and
values are the encoder's hidden states projected once per request (trt_llm/families/whisper/graphs.py's
encoder graph returns them), so the decoder graph takes them as inputs and never recomputes them.
There is no mask: every query sees all L keys of its row. The same op is the encoder's own
(bidirectional, unmasked) self-attention.

Inputs (shapes):
    q       [B, S, H * D] float   the new tokens' queries, heads side by side (a projection's output)
    key     [B, H, L, D] float    the keys, heads first (the layout the decoder reads them in)
    value   [B, H, L, D] float
Attributes: num_heads (H, which key.shape[1] must equal), scale (the softmax scale, head_dim ** -0.5
for Whisper, which scales q itself before the product: the same thing up to rounding).
Output: [B, S, H * D], per row and head softmax(scale * q . key^T) @ value.

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `cross_attention` (`TORCH_OPS`): a torch custom op, float32 softmax, the result in the input
    dtype: the ground truth.
 2. `onnx_translation` + `function_protos`: a node `trt::CrossAttentionPlugin` carrying a
    `plugin_namespace` attribute, and a model-local function of standard ops (opset 18) with the
    same name: scale q, split its heads, MatMul with the transposed keys, Softmax, MatMul, merge the
    heads. B, S and L are dynamic.
 3. `lower_for_onnxruntime`: the body written into the graph in place of each node (its standard ops
    under the node's name), which is what ONNX Runtime runs fastest. Measured on the 2 shared cores of
    an AMD EPYC (ONNX Runtime 1.32, one thread, fp32), best of two runs of 20 calls (a decode step:
    15; the encoder: one run of 5), the last run's median in brackets, in ms: one op at
    whisper-tiny.en's shapes (H 6, D 64, L 1,500), then its whole graphs (the decoder's 4
    cross-attention nodes lowered each way, capacity 448; the encoder's 4 self-attention nodes, 3,000
    mel frames):
                            body            com.microsoft.MultiHeadAttention   Attention (opset 23)
        op, B 1, S 1:     0.077 (0.079)     0.125 (0.127)                      0.122 (0.127)
        op, B 8, S 1:     1.07  (1.19)      2.85  (3.11)                       3.10  (3.88)
        op, B 8, S 4:     5.30  (5.96)      5.51  (6.11)                       5.30  (6.54)
        op, B 8, S 8:     6.20  (6.59)      6.02  (6.83)                       6.24  (6.86)
        decode step, B 1:  8.3  (8.9)       9.2  (9.5)
        decode step, B 4: 12.4 (13.2)      15.9 (17.2)
        decode step, B 8: 19.5 (21.6)      33.5 (37.0)
        encoder, B 1:      505  (521)        515  (550)                         571  (592)
    MultiHeadAttention takes key/value in this BNSH layout as they are; Attention wants q as
    [B, H, S, D] (two transposes around it). A decode step (S = 1) is where they differ: ONNX Runtime
    makes the body's transposed-key product one FusedMatMul over all rows and heads, 1.6-2.7x faster
    than either kernel from B 1 to 8 (a whole decode step of B 8: 28-42% less time, in two
    measurements); prefill and the encoder are equal within the noise. So the lowering is the body, inlined: nothing in the engine's graph then
    depends on ONNX Runtime running model-local functions, and a profile names each node's parts.
 4. `register_tensorrt_plugin`: the node as a `tensorrt.plugin` plugin whose kernel is
    `cross_attention_kernel` (plain torch: torch's scaled_dot_product_attention). TensorRT-RTX has
    no plugins: its parser inlines the function body (a plan builds ahead of time for SM80 without
    a GPU, tests/test_cross_attention.py), so no `lower_for_tensorrt` rewrite is needed.
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx import helper
from onnxscript import opset18 as op
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "CrossAttentionPlugin"
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
        doc="Unmasked attention over fixed keys/values (see trt_llm.plugins.cross_attention).",
        inputs=[Param("q", "T"), Param("key", "T"), Param("value", "T")],
        outputs=[Param("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "activations")],
        attributes=[
            Attr("num_heads", AttrType.INT, "heads"),
            Attr("scale", AttrType.FLOAT, "softmax scale"),
            Attr("plugin_namespace", AttrType.STRING, "TensorRT plugin namespace"),
        ],
    ))


_register_schema()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


@torch.library.custom_op("trt_llm::cross_attention", mutates_args=())
def cross_attention(q: Tensor, key: Tensor, value: Tensor, num_heads: int, scale: float) -> Tensor:
    batch, seq, width = q.shape
    if key.shape[1] != num_heads or width != num_heads * key.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and key {tuple(key.shape)} do not make {num_heads} heads")
    heads = q.view(batch, seq, num_heads, -1).transpose(1, 2).float()  # [B, H, S, D]
    probs = ((heads @ key.float().transpose(-1, -2)) * scale).softmax(-1)  # [B, H, S, L]
    return (probs @ value.float()).transpose(1, 2).reshape(batch, seq, width).to(q.dtype)


@cross_attention.register_fake
def _cross_attention_fake(q, key, value, num_heads, scale):
    return torch.empty_like(q)


# ---------------------------------------------------------------------------------------------------
# The torch ops this file defines, for the registry (plugins/__init__.py).
TORCH_OPS = (torch.ops.trt_llm.cross_attention.default,)


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face: our node, and plain attention as its function body.


def onnx_translation(q, key, value, num_heads: int, scale: float) -> onnxscript.onnx_types.FLOAT:
    # The return annotation matters: without it the exporter infers zero outputs.
    return _TRT.CrossAttentionPlugin(q, key, value, num_heads=num_heads, scale=scale,
                                     plugin_namespace=PLUGIN_NAMESPACE)


@onnxscript.script(_TRT, default_opset=op)
def CrossAttentionPlugin(q, key, value, num_heads: int, scale: float, plugin_namespace: str):
    # Scaling q first: S * H * D products rather than S * H * L.
    qs = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    split = op.Concat(op.Shape(q, start=0, end=2), op.Shape(key, start=1, end=2), op.Constant(value_ints=[-1]), axis=0)
    q_t = op.Transpose(op.Reshape(qs, split), perm=[0, 2, 1, 3])  # [B, H, S, D]
    probs = op.Softmax(op.MatMul(q_t, op.Transpose(key, perm=[0, 1, 3, 2])), axis=-1)  # [B, H, S, L]
    context = op.Transpose(op.MatMul(probs, value), perm=[0, 2, 1, 3])  # [B, S, H, D]
    return op.Reshape(context, op.Concat(op.Shape(q, start=0, end=2), op.Constant(value_ints=[-1]), axis=0))


def function_protos() -> list[onnx.FunctionProto]:
    return [CrossAttentionPlugin.to_function_proto()]


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering: the body in place of each node (see the module docstring).


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _inlined(node: onnx.NodeProto, function: onnx.FunctionProto) -> list[onnx.NodeProto]:
    """The function's nodes for one call: its formal inputs and outputs bound to the node's, its
    internal names prefixed by the node's name, its attribute references resolved."""
    prefix = node.name or node.output[0]
    names = dict(zip(function.input, node.input)) | dict(zip(function.output, node.output))
    attributes = _attributes(node)
    nodes = []
    for body_node in function.node:
        new = onnx.NodeProto()
        new.CopyFrom(body_node)
        new.input[:] = [names.get(n, f"{prefix}/{n}") if n else n for n in body_node.input]
        new.output[:] = [names.get(n, f"{prefix}/{n}") for n in body_node.output]
        new.name = f"{prefix}/{body_node.name or body_node.output[0]}"
        for attribute in new.attribute:
            if attribute.ref_attr_name:  # e.g. Constant(value_float=scale): the node's value
                value = attributes[attribute.ref_attr_name]
                resolved = helper.make_attribute(attribute.name, value)
                attribute.Clear()
                attribute.CopyFrom(resolved)
        nodes.append(new)
    return nodes


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Write every cross-attention node as its function body, in place; the function goes too."""
    if not any(n.domain == DOMAIN and n.op_type == OP_NAME for n in model.graph.node):
        return model
    function = function_protos()[0]
    new_nodes = []
    for node in model.graph.node:
        is_ours = node.domain == DOMAIN and node.op_type == OP_NAME
        new_nodes.extend(_inlined(node, function) if is_ours else [node])
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    kept = [f for f in model.functions if (f.domain, f.name) != (DOMAIN, OP_NAME)]
    del model.functions[:]
    model.functions.extend(kept)
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt.
#
# The parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute.
# TensorRT-RTX has none: it inlines the body at every call.

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_IDS = (f"{TENSORRT_PLUGIN_NAMESPACE}::{OP_NAME}",)
_tensorrt_registered = False


def cross_attention_kernel(q: Tensor, key: Tensor, value: Tensor, num_heads: int, scale: float,
                           out: Tensor | None = None) -> Tensor:
    """The plugin's kernel: the op of facet 1 on tensors of any one device, in plain torch.

    torch's scaled_dot_product_attention on the heads (its fused kernels keep the softmax in float32
    on a GPU); nothing is read back to the host, so a decode step's call can be captured in a CUDA
    graph. With `out` the result is written there."""
    batch, seq, width = q.shape
    heads = q.view(batch, seq, num_heads, -1).transpose(1, 2)  # [B, H, S, D]
    context = torch.nn.functional.scaled_dot_product_attention(heads, key, value, scale=scale)
    result = context.transpose(1, 2).reshape(batch, seq, width)
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

    def describe(q, key, value, num_heads, scale):
        return q.like()  # [B, S, H * D], the activation dtype

    def run(q, key, value, num_heads, scale, outputs, stream):
        # The kernel on the plugin's device buffers, on TensorRT's stream (the views are made inside
        # the stream context, so nothing waits on another stream, also under graph capture).
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.no_grad():
            inputs = [_tensorrt_as_torch(t) for t in (q, key, value)]
            cross_attention_kernel(*inputs, num_heads, scale, out=_tensorrt_as_torch(outputs[0]))

    # tensorrt.plugin reads the real annotation objects (this module's annotations are strings).
    tensors = ("q", "key", "value")
    describe.__annotations__ = {**{name: trtp.TensorDesc for name in tensors}, "num_heads": int, "scale": float,
                                "return": trtp.TensorDesc}
    run.__annotations__ = {**{name: trtp.Tensor for name in tensors}, "num_heads": int, "scale": float,
                           "outputs": tuple[trtp.Tensor], "stream": int}
    trtp.register(TENSORRT_PLUGIN_IDS[0])(describe)
    trtp.impl(TENSORRT_PLUGIN_IDS[0])(run)
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_IDS
