"""The attention op over a fixed-capacity, in-place KV cache: all its facets in one file.

One op serves prefill, decode and multi-token verification for a ragged batch. It takes the packed
q/k/v projection and applies rotary itself (fewer, fatter nodes are what make the graph fast).

Inputs (shapes):
    qkv            [B, S, (Hq + 2*Hkv) * D]  packed projection, q heads then k heads then v heads
    past_key       [B, Hkv, L, D]            cache, L = capacity; rows are sequences
    past_value     [B, Hkv, L, D]
    past_lengths   [B] int32                 tokens already cached = write offset
    query_lengths  [B] int32                 valid new tokens per row (rows are right-padded, 0 = idle)
    position_ids   [B, S] int32              rotary positions of the new tokens
    cos_cache      [P, D/2] float            cos(position * inv_freq) * attention scaling
    sin_cache      [P, D/2] float
Attributes: num_heads, kv_num_heads, scale.
Outputs: attention output [B, S, Hq * D] (zeros at padded positions), present_key, present_value
(the caches with the new tokens written at past_lengths .. past_lengths + query_lengths - 1).

Facets:
 1. `attention`: a torch custom op with an eager reference implementation (the ground truth).
 2. `onnx_translation` + `FUNCTION_BODY`: a node `trt::AttentionPlugin` carrying a `plugin_namespace`
    attribute, and a model-local ONNX function of standard ops with the same name, so any runtime
    without our plugin (ONNX Runtime, TensorRT-RTX) can run it.
 3. `lower_for_onnxruntime`: rewrites the node to `com.microsoft.GroupQueryAttention`, whose CPU kernel
    does rotary, the in-place cache write and the ragged causal attention in one call.
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx import helper
from onnxscript import opset18 as op
from onnxscript.onnx_types import FLOAT
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "AttentionPlugin"
# "trt" is reserved by tensorrt.plugin, so the plugin lives in our own namespace.
PLUGIN_NAMESPACE = "trt_llm"
_TRT = onnxscript.values.Opset(DOMAIN, 1)


def _register_schema() -> None:
    """Register the node's schema so onnxscript (and the exporter) can emit `trt::AttentionPlugin`."""
    if onnx.defs.has(OP_NAME, DOMAIN):
        return
    float_types = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    int_types = ["tensor(int32)"]
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    AttrType = onnx.defs.OpSchema.AttrType
    schema = onnx.defs.OpSchema(
        OP_NAME, DOMAIN, 1,
        doc="Attention over an in-place KV cache with internal rotary (see trt_llm.plugins.attention).",
        inputs=[
            Param("qkv", "T"), Param("past_key", "T"), Param("past_value", "T"),
            Param("past_lengths", "I"), Param("query_lengths", "I"), Param("position_ids", "I"),
            Param("cos_cache", "T"), Param("sin_cache", "T"),
        ],
        outputs=[Param("output", "T"), Param("present_key", "T"), Param("present_value", "T")],
        type_constraints=[("T", float_types, "activations"), ("I", int_types, "lengths and positions")],
        attributes=[
            Attr("num_heads", AttrType.INT, "query heads"),
            Attr("kv_num_heads", AttrType.INT, "key/value heads"),
            Attr("scale", AttrType.FLOAT, "softmax scale"),
            Attr("plugin_namespace", AttrType.STRING, "TensorRT plugin namespace"),
        ],
    )
    onnx.defs.register_schema(schema)


_register_schema()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


def rotate_half_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding in the non-interleaved ("rotate half") layout HF Llama/Qwen use.

    x: [B, S, H, D]; cos, sin: [B, S, D/2].
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@torch.library.custom_op("trt_llm::attention", mutates_args=())
def attention(
    qkv: Tensor,
    past_key: Tensor,
    past_value: Tensor,
    past_lengths: Tensor,
    query_lengths: Tensor,
    position_ids: Tensor,
    cos_cache: Tensor,
    sin_cache: Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    batch, seq, _ = qkv.shape
    _, _, capacity, head_dim = past_key.shape
    heads = qkv.view(batch, seq, num_heads + 2 * kv_num_heads, head_dim)
    q, k, v = heads.split([num_heads, kv_num_heads, kv_num_heads], dim=2)
    positions = position_ids.long()
    cos, sin = cos_cache[positions], sin_cache[positions]
    q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)

    past_lengths, query_lengths = past_lengths.long(), query_lengths.long()
    slots = torch.arange(capacity)
    offset = slots[None, :] - past_lengths[:, None]  # [B, L]: index of the new token written to a slot
    written = (offset >= 0) & (offset < query_lengths[:, None])
    source = offset.clamp(0, seq - 1)[:, None, :, None].expand(batch, kv_num_heads, capacity, head_dim)
    present_key = torch.where(
        written[:, None, :, None], torch.gather(k.transpose(1, 2), 2, source), past_key
    )
    present_value = torch.where(
        written[:, None, :, None], torch.gather(v.transpose(1, 2), 2, source), past_value
    )

    query_positions = past_lengths[:, None] + torch.arange(seq)[None, :]  # [B, S] absolute
    visible = slots[None, None, :] <= query_positions[:, :, None]  # [B, S, L] causal
    group = num_heads // kv_num_heads
    keys = present_key.repeat_interleave(group, dim=1)
    values = present_value.repeat_interleave(group, dim=1)
    scores = (q.transpose(1, 2) @ keys.transpose(-1, -2)) * scale  # [B, Hq, S, L]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    out = (scores.softmax(-1) @ values).transpose(1, 2).reshape(batch, seq, num_heads * head_dim)
    valid_query = torch.arange(seq)[None, :] < query_lengths[:, None]
    return out * valid_query[:, :, None].to(out.dtype), present_key, present_value


@attention.register_fake
def _attention_fake(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache,
                    sin_cache, num_heads, kv_num_heads, scale):
    batch, seq, _ = qkv.shape
    head_dim = past_key.shape[-1]
    return (
        qkv.new_empty(batch, seq, num_heads * head_dim),
        torch.empty_like(past_key),
        torch.empty_like(past_value),
    )


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face. The exporter maps the custom op to one node in our domain; the function
# body below, attached to the model, is what runs where no plugin is registered.


def onnx_translation(
    qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache,
    num_heads: int, kv_num_heads: int, scale: float,
) -> tuple[onnxscript.onnx_types.FLOAT, onnxscript.onnx_types.FLOAT, onnxscript.onnx_types.FLOAT]:
    # The return annotation matters: without it the exporter infers zero outputs.
    return _TRT.AttentionPlugin(
        qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache,
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
        plugin_namespace=PLUGIN_NAMESPACE, _outputs=3,
    )


@onnxscript.script(_TRT, default_opset=op)
def AttentionPlugin(  # noqa: N802 - the function's name is the node's op type
    qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache,
    num_heads: int, kv_num_heads: int, scale: float, plugin_namespace: str,
):
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    three = op.Constant(value_ints=[3])
    q_heads = op.Unsqueeze(op.Constant(value_int=num_heads), zero)
    kv_heads = op.Unsqueeze(op.Constant(value_int=kv_num_heads), zero)
    batch = op.Shape(qkv, start=0, end=1)
    seq = op.Shape(qkv, start=1, end=2)
    capacity = op.Shape(past_key, start=2, end=3)
    head_dim = op.Shape(past_key, start=3, end=4)
    half = op.Div(head_dim, two)

    heads = op.Reshape(qkv, op.Concat(batch, seq, op.Constant(value_ints=[-1]), head_dim, axis=0))
    q, k, v = op.Split(heads, op.Concat(q_heads, kv_heads, kv_heads, axis=0), axis=2)

    # Rotary, rotate-half layout; cos/sin [B, S, 1, D/2] broadcast over heads.
    positions = op.Cast(position_ids, to=7)
    cos = op.Unsqueeze(op.Gather(cos_cache, positions, axis=0), two)
    sin = op.Unsqueeze(op.Gather(sin_cache, positions, axis=0), two)
    q1, q2 = op.Split(q, op.Concat(half, half, axis=0), axis=3)
    k1, k2 = op.Split(k, op.Concat(half, half, axis=0), axis=3)
    q = op.Concat(q1 * cos - q2 * sin, q2 * cos + q1 * sin, axis=3)
    k = op.Concat(k1 * cos - k2 * sin, k2 * cos + k1 * sin, axis=3)

    # Cache write as a select over all slots: slot j takes new token j - past when that is in range.
    past = op.Cast(past_lengths, to=7)
    new = op.Cast(query_lengths, to=7)
    slots = op.Range(op.Constant(value_int=0), op.Squeeze(capacity, zero), op.Constant(value_int=1))
    offset = op.Sub(op.Unsqueeze(slots, zero), op.Unsqueeze(past, one))  # [B, L]
    written = op.And(op.GreaterOrEqual(offset, op.Constant(value_int=0)), op.Less(offset, op.Unsqueeze(new, one)))
    seq_last = op.Sub(op.Squeeze(seq, zero), op.Constant(value_int=1))
    source = op.Clip(offset, op.Constant(value_int=0), seq_last)  # [B, L]
    k_t = op.Transpose(k, perm=[0, 2, 1, 3])  # [B, Hkv, S, D]
    v_t = op.Transpose(v, perm=[0, 2, 1, 3])
    gather_shape = op.Concat(batch, kv_heads, capacity, head_dim, axis=0)
    source_idx = op.Expand(op.Unsqueeze(source, op.Constant(value_ints=[1, 3])), gather_shape)
    written_4d = op.Unsqueeze(written, op.Constant(value_ints=[1, 3]))
    present_key = op.Where(written_4d, op.GatherElements(k_t, source_idx, axis=2), past_key)
    present_value = op.Where(written_4d, op.GatherElements(v_t, source_idx, axis=2), past_value)

    # Grouped-query attention over the whole capacity with a causal mask on absolute positions.
    seq_range = op.Range(op.Constant(value_int=0), op.Squeeze(seq, zero), op.Constant(value_int=1))
    query_pos = op.Add(op.Unsqueeze(past, one), op.Unsqueeze(seq_range, zero))  # [B, S]
    visible = op.LessOrEqual(op.Unsqueeze(slots, op.Constant(value_ints=[0, 1])), op.Unsqueeze(query_pos, two))
    group = op.Div(q_heads, kv_heads)
    rep_shape = op.Concat(batch, kv_heads, group, capacity, head_dim, axis=0)
    flat_shape = op.Concat(batch, q_heads, capacity, head_dim, axis=0)
    keys = op.Reshape(op.Expand(op.Unsqueeze(present_key, two), rep_shape), flat_shape)
    values = op.Reshape(op.Expand(op.Unsqueeze(present_value, two), rep_shape), flat_shape)
    q_t = op.Transpose(q, perm=[0, 2, 1, 3])  # [B, Hq, S, D]
    scores = op.Mul(op.MatMul(q_t, op.Transpose(keys, perm=[0, 1, 3, 2])), op.CastLike(op.Constant(value_float=scale), q_t))
    neg_inf = op.CastLike(op.Constant(value_float=float("-inf")), scores)
    scores = op.Where(op.Unsqueeze(visible, one), scores, neg_inf)
    probs = op.Softmax(scores, axis=-1)
    out = op.Transpose(op.MatMul(probs, values), perm=[0, 2, 1, 3])  # [B, S, Hq, D]
    out = op.Reshape(out, op.Concat(batch, seq, op.Constant(value_ints=[-1]), axis=0))
    valid = op.Less(op.Unsqueeze(seq_range, zero), op.Unsqueeze(new, one))  # [B, S]
    out = op.Mul(out, op.CastLike(op.Unsqueeze(valid, two), out))
    return out, present_key, present_value


def function_proto() -> onnx.FunctionProto:
    """The function body to attach to a model that holds `trt::AttentionPlugin` nodes."""
    return AttentionPlugin.to_function_proto()


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering.


def _attr(node: onnx.NodeProto, name: str):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    raise KeyError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every AttentionPlugin node into com.microsoft.GroupQueryAttention, in place.

    GQA wants seqlens_k = past + new - 1, total_sequence_length = the cache capacity (so present and
    past share one buffer when bound to the same memory) and query_seqlens so that a ragged batch may
    have several new tokens on a non-empty cache. These are computed once and shared by all layers.
    """
    graph = model.graph
    plugin_nodes = [n for n in graph.node if n.domain == DOMAIN and n.op_type == OP_NAME]
    if not plugin_nodes:
        return model
    first = plugin_nodes[0]
    past_key, past_lengths, query_lengths, position_ids = (
        first.input[1], first.input[3], first.input[4], first.input[5])
    prefix = "trt_llm_gqa"
    shared = [
        helper.make_node("Add", [past_lengths, query_lengths], [f"{prefix}/total"]),
        helper.make_node("Constant", [], [f"{prefix}/one"], value=helper.make_tensor("one", onnx.TensorProto.INT32, [], [1])),
        helper.make_node("Sub", [f"{prefix}/total", f"{prefix}/one"], [f"{prefix}/seqlens_k"]),
        helper.make_node("Shape", [past_key], [f"{prefix}/capacity_1d"], start=2, end=3),
        helper.make_node("Cast", [f"{prefix}/capacity_1d"], [f"{prefix}/capacity_i32"], to=onnx.TensorProto.INT32),
        helper.make_node("Squeeze", [f"{prefix}/capacity_i32"], [f"{prefix}/total_sequence_length"]),
        helper.make_node("Cast", [position_ids], [f"{prefix}/position_ids"], to=onnx.TensorProto.INT64),
    ]
    new_nodes = []
    for node in graph.node:
        if node not in plugin_nodes:
            new_nodes.append(node)
            continue
        if node is first:
            new_nodes.extend(shared)
        qkv, past_k, past_v, _, _, _, cos_cache, sin_cache = node.input
        new_nodes.append(helper.make_node(
            "GroupQueryAttention",
            [qkv, "", "", past_k, past_v, f"{prefix}/seqlens_k", f"{prefix}/total_sequence_length",
             cos_cache, sin_cache, f"{prefix}/position_ids", "", "", "", "", "", "", query_lengths],
            list(node.output),
            name=node.name,
            domain="com.microsoft",
            num_heads=_attr(node, "num_heads"),
            kv_num_heads=_attr(node, "kv_num_heads"),
            scale=_attr(node, "scale"),
            do_rotary=1,
            rotary_interleaved=0,
        ))
    del graph.node[:]
    graph.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt.
#
# The parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute
# (PLUGIN_NAMESPACE; tensorrt.plugin reserves "trt", "", "tensorrt" and "std").

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_ID = f"{TENSORRT_PLUGIN_NAMESPACE}::{OP_NAME}"
_tensorrt_registered = False


def _tensorrt_as_torch(tensor) -> Tensor:
    """A torch view of a `tensorrt.plugin.Tensor` (device memory, no copy)."""
    import tensorrt as trt

    if tensor.dtype != trt.DataType.BF16:
        return torch.as_tensor(tensor, device="cuda")

    class Int16View:  # __cuda_array_interface__ has no bf16: view the bits as int16
        __cuda_array_interface__ = {
            "shape": tuple(tensor.shape), "typestr": "<i2", "data": (tensor.data_ptr, False),
            "strides": tuple(2 * s for s in tensor.strides), "version": 3}

    return torch.as_tensor(Int16View(), device="cuda").view(torch.bfloat16)


def register_tensorrt_plugin() -> str:
    """Register the op with TensorRT (once per process); returns its plugin id.

    Needed before parsing a graph (the parser then builds a plugin layer for each node whose
    `plugin_namespace` is TENSORRT_PLUGIN_NAMESPACE) and before deserializing an engine built with
    it: the kernel is the Python function below (a JIT plugin), which TensorRT calls on its stream.
    """
    global _tensorrt_registered
    if _tensorrt_registered:
        return TENSORRT_PLUGIN_ID
    import tensorrt.plugin as trtp

    def describe(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache,
                 sin_cache, num_heads, kv_num_heads, scale):
        output = qkv.like()  # [B, S, Hq * D], the activation dtype
        output.shape_expr[2] = past_key.shape_expr[3] * num_heads
        return output, past_key.like(), past_value.like()

    def run(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache,
            num_heads, kv_num_heads, scale, outputs, stream):
        # The reference on the plugin's device buffers. `torch.device("cuda")` as a context puts the
        # reference's own aranges on the GPU too. The runtime may bind the cache as both past and
        # present (the same memory): the reference reads all of past before anything is written.
        inputs = [_tensorrt_as_torch(t) for t in (qkv, past_key, past_value, past_lengths, query_lengths,
                                                   position_ids, cos_cache, sin_cache)]
        targets = [_tensorrt_as_torch(t) for t in outputs]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.device("cuda"), torch.no_grad():
            results = attention(*inputs, num_heads, kv_num_heads, scale)
            for target, result in zip(targets, results):
                target.copy_(result)

    # tensorrt.plugin validates real annotation objects; this module's are strings (postponed).
    descs = ("qkv", "past_key", "past_value", "past_lengths", "query_lengths", "position_ids",
             "cos_cache", "sin_cache")
    describe.__annotations__ = {**{name: trtp.TensorDesc for name in descs}, "num_heads": int,
                                "kv_num_heads": int, "scale": float,
                                "return": tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]}
    trtp.register(TENSORRT_PLUGIN_ID)(describe)
    trtp.impl(TENSORRT_PLUGIN_ID)(run)
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_ID
