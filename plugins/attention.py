"""The attention op over a fixed-capacity, in-place KV cache: all its facets in one file.

One op serves prefill, decode and multi-token verification for a ragged batch. It takes the packed
q/k/v projection and applies rotary itself (fewer, fatter nodes are what make the graph fast).

Inputs (shapes):
    qkv            [B, S, (Hq + 2*Hkv) * D]  packed projection, q heads then k heads then v heads
    past_key       [B, Hkv, L, D]            cache, L = capacity; rows are sequences
    past_value     [B, Hkv, L, D]
    past_lengths   [B] int32                 tokens already cached = write offset
    query_lengths  [B] int32                 valid new tokens per row (rows are right-padded, 0 = idle)
    position_ids   [B, S] int32              each new token's row of cos_cache / sin_cache
    cos_cache      [P, D/2] float            rotation rows, any P: token (b, s) turns by
    sin_cache      [P, D/2] float            row position_ids[b, s] (rotate-half layout)
    tree_mask      [B, S, S] bool, optional  which new tokens each new token sees (EAGLE tree
                                             verification); without it the new tokens are causal
Attributes: num_heads, kv_num_heads, scale; window (0 = none), softcap (0.0 = none).
Outputs: attention output [B, S, Hq * D] (zeros at padded positions), present_key, present_value
(the caches with the new tokens written at past_lengths .. past_lengths + query_lengths - 1).
Every new token sees all cached slots before past_lengths, and the new tokens that tree_mask allows
(itself and its ancestors, which the runtime orders before it).

Sliding window (window W > 0): the new token in cache slot q = past_lengths[b] + s sees a key slot k
it would see otherwise only when q - k < W, so itself and at most the W - 1 slots before it
(transformers' sliding_window, `kv_idx > q_idx - sliding_window`, in slot coordinates). Slots, not rotary positions: the runtime
keeps a row's tokens in consecutive slots and may keep only its last ones, so nothing but the rotary
rows is ever read from position_ids. Soft-capping (softcap c > 0): scores = c * tanh(scores / c),
after the softmax scale and before masking (Gemma 2's attn_logit_softcapping).

The rotary contract: a text model passes its position tables (row p = cos(p * inv_freq) * scale,
build/models/layers.rotary_tables) and the token positions; mRoPE (Qwen2.5-VL, Qwen3-VL: positions
[3, B, S], sectioned frequencies) passes per-token rows and their indices (layers.sectioned_rotary).
Every facet below only ever looks rows up, so both run on all of them; tests/test_rotary_contract.py
checks each against transformers' mRoPE.

The ONNX face has two node types: `AttentionPlugin` (causal) and `TreeAttentionPlugin` (with the
tree_mask input); the causal one's function body builds a causal mask and calls the tree one's.

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `attention` (`TORCH_OPS`): a torch custom op with an eager reference implementation (the ground truth).
 2. `onnx_translation` + `FUNCTION_BODY`: a node `trt::AttentionPlugin` carrying a `plugin_namespace`
    attribute, and a model-local ONNX function of standard ops with the same name, so any runtime
    without our plugin (ONNX Runtime, TensorRT-RTX) can run it. `finish_export` then fixes the
    soft-cap's branch of the attached bodies for the model (TensorRT-RTX cannot build that If).
 3. `lower_for_onnxruntime`: rewrites the node to `com.microsoft.GroupQueryAttention`, whose CPU kernel
    does rotary, the in-place cache write and the ragged causal attention in one call (a computed
    rotation table is padded to the capacity rows GQA wants). Its causal mask is always on, so a tree
    mask that lets a token see later ones (Gemma 3's image tokens see their whole image) cannot be
    its attention_bias: a graph whose metadata says so (LOOKAHEAD_KEY) keeps its tree nodes' body.
 4. `register_tensorrt_plugin`: both node types as `tensorrt.plugin` plugins whose kernel is
    `attention_kernel` (plain torch, any device, safe to capture in a CUDA graph).
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx import helper
from onnxscript import opset18 as op
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "AttentionPlugin"
TREE_OP_NAME = "TreeAttentionPlugin"
OP_NAMES = (OP_NAME, TREE_OP_NAME)
# "trt" is reserved by tensorrt.plugin, so the plugin lives in our own namespace.
PLUGIN_NAMESPACE = "trt_llm"
_TRT = onnxscript.values.Opset(DOMAIN, 1)
# A decoder graph's metadata_props key, "1" where its tree_mask may let a new token see later new tokens
# (not only its ancestors, as an EAGLE tree's does).
LOOKAHEAD_KEY = "trt_llm.tree_mask_looks_ahead"


def _register_schemas() -> None:
    """Register the nodes' schemas so onnxscript (and the exporter) can emit them."""
    float_types = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    AttrType = onnx.defs.OpSchema.AttrType
    inputs = [
        Param("qkv", "T"), Param("past_key", "T"), Param("past_value", "T"),
        Param("past_lengths", "I"), Param("query_lengths", "I"), Param("position_ids", "I"),
        Param("cos_cache", "T"), Param("sin_cache", "T"),
    ]
    for name, extra in ((OP_NAME, []), (TREE_OP_NAME, [Param("tree_mask", "B")])):
        if onnx.defs.has(name, DOMAIN):
            continue
        onnx.defs.register_schema(onnx.defs.OpSchema(
            name, DOMAIN, 1,
            doc="Attention over an in-place KV cache with internal rotary (see trt_llm.plugins.attention).",
            inputs=inputs + extra,
            outputs=[Param("output", "T"), Param("present_key", "T"), Param("present_value", "T")],
            type_constraints=[("T", float_types, "activations"), ("I", ["tensor(int32)"], "lengths, positions"),
                              ("B", ["tensor(bool)"], "tree mask")],
            attributes=[
                Attr("num_heads", AttrType.INT, "query heads"),
                Attr("kv_num_heads", AttrType.INT, "key/value heads"),
                Attr("scale", AttrType.FLOAT, "softmax scale"),
                # Optional, so graphs made before they existed stay valid.
                Attr("window", helper.make_attribute("window", 0), "sliding window in slots (0: none)"),
                Attr("softcap", helper.make_attribute("softcap", 0.0), "attention logit soft-cap (0: none)"),
                Attr("plugin_namespace", AttrType.STRING, "TensorRT plugin namespace"),
            ],
        ))


_register_schemas()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


def tree_mask_for(parents: list[int | None], width: int) -> tuple[Tensor, list[int]]:
    """One row's tree_mask [width, width] for new tokens that form a tree (parents[i] is node i's
    parent index, None for a root; parents come before children): a node sees itself and its
    ancestors; rows past the tree stay empty. Also each node's depth (0 for a root), which puts it
    at position past + depth."""
    mask = torch.zeros(width, width, dtype=torch.bool)
    depths = []
    for node in range(len(parents)):
        mask[node, node] = True
        ancestor, depth = parents[node], 0
        while ancestor is not None:
            mask[node, ancestor] = True
            ancestor, depth = parents[ancestor], depth + 1
        depths.append(depth)
    return mask, depths


def rotate_half_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding in the non-interleaved ("rotate half") layout HF Llama/Qwen use.

    x: [B, S, H, D]; cos, sin: [B, S, R/2]. Partial rotary (Phi-3's partial_rotary_factor) rotates
    the first R dims only and passes the rest through: the tables' width says how many.
    """
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half: 2 * half], x[..., 2 * half:]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


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
    tree_mask: Tensor | None,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
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

    if tree_mask is None:
        tree_mask = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, seq, seq)
    # Key slot j: cached (j < past) is always visible; new token j - past when the tree allows.
    allowed = torch.gather(tree_mask, 2, offset.clamp(0, seq - 1)[:, None, :].expand(batch, seq, capacity))
    visible = (offset < 0)[:, None, :] | (written[:, None, :] & allowed)  # [B, S, L]
    if window > 0:
        # New token s sits in slot past + s, so its distance to slot j is s - offset[j].
        lag = torch.arange(seq)[None, :, None] - offset[:, None, :]
        visible = visible & (lag < window)
    group = num_heads // kv_num_heads
    keys = present_key.repeat_interleave(group, dim=1)
    values = present_value.repeat_interleave(group, dim=1)
    scores = (q.transpose(1, 2) @ keys.transpose(-1, -2)) * scale  # [B, Hq, S, L]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    # A padded query may see nothing at all: its softmax is NaN, and it is zeroed below anyway.
    probs = torch.nan_to_num(scores.softmax(-1), nan=0.0)
    out = (probs @ values).transpose(1, 2).reshape(batch, seq, num_heads * head_dim)
    valid_query = torch.arange(seq)[None, :] < query_lengths[:, None]
    return out * valid_query[:, :, None].to(out.dtype), present_key, present_value


@attention.register_fake
def _attention_fake(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache,
                    sin_cache, tree_mask, num_heads, kv_num_heads, scale, window=0, softcap=0.0):
    batch, seq, _ = qkv.shape
    head_dim = past_key.shape[-1]
    return (
        qkv.new_empty(batch, seq, num_heads * head_dim),
        torch.empty_like(past_key),
        torch.empty_like(past_value),
    )


# ---------------------------------------------------------------------------------------------------
# The torch ops this file defines, for the registry (plugins/__init__.py).
TORCH_OPS = (torch.ops.trt_llm.attention.default,)


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face. The exporter maps the custom op to one node in our domain; the function
# body below, attached to the model, is what runs where no plugin is registered.


def onnx_translation(
    qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache,
    tree_mask, num_heads: int, kv_num_heads: int, scale: float, window: int = 0, softcap: float = 0.0,
) -> tuple[onnxscript.onnx_types.FLOAT, onnxscript.onnx_types.FLOAT, onnxscript.onnx_types.FLOAT]:
    # The return annotation matters: without it the exporter infers zero outputs.
    inputs = [qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache]
    attributes = dict(num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, window=window,
                      softcap=softcap, plugin_namespace=PLUGIN_NAMESPACE, _outputs=3)
    if tree_mask is None:
        return _TRT.AttentionPlugin(*inputs, **attributes)
    return _TRT.TreeAttentionPlugin(*inputs, tree_mask, **attributes)


@onnxscript.script(_TRT, default_opset=op)
def TreeAttentionPlugin(  # noqa: N802 - the function's name is the node's op type
    qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos_cache, sin_cache, tree_mask,
    num_heads: int, kv_num_heads: int, scale: float, plugin_namespace: str, window: int = 0, softcap: float = 0.0,
):
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    q_heads = op.Unsqueeze(op.Constant(value_int=num_heads), zero)
    kv_heads = op.Unsqueeze(op.Constant(value_int=kv_num_heads), zero)
    batch = op.Shape(qkv, start=0, end=1)
    seq = op.Shape(qkv, start=1, end=2)
    capacity = op.Shape(past_key, start=2, end=3)
    head_dim = op.Shape(past_key, start=3, end=4)
    half = op.Shape(cos_cache, start=1, end=2)  # R/2: partial rotary passes dims R.. through

    heads = op.Reshape(qkv, op.Concat(batch, seq, op.Constant(value_ints=[-1]), head_dim, axis=0))
    q, k, v = op.Split(heads, op.Concat(q_heads, kv_heads, kv_heads, axis=0), axis=2)

    # Rotary, rotate-half layout over the first R dims; cos/sin [B, S, 1, R/2] broadcast over heads.
    positions = op.Cast(position_ids, to=7)
    cos = op.Unsqueeze(op.Gather(cos_cache, positions, axis=0), two)
    sin = op.Unsqueeze(op.Gather(sin_cache, positions, axis=0), two)
    rest = op.Sub(head_dim, op.Add(half, half))
    q1, q2, q3 = op.Split(q, op.Concat(half, half, rest, axis=0), axis=3)
    k1, k2, k3 = op.Split(k, op.Concat(half, half, rest, axis=0), axis=3)
    q = op.Concat(q1 * cos - q2 * sin, q2 * cos + q1 * sin, q3, axis=3)
    k = op.Concat(k1 * cos - k2 * sin, k2 * cos + k1 * sin, k3, axis=3)

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

    # Grouped-query attention over the whole capacity. Key slot j: cached (j < past) is visible;
    # new token j - past when the tree mask allows it.
    seq_range = op.Range(op.Constant(value_int=0), op.Squeeze(seq, zero), op.Constant(value_int=1))
    mask_shape = op.Concat(batch, seq, capacity, axis=0)
    allowed = op.GatherElements(tree_mask, op.Expand(op.Unsqueeze(source, one), mask_shape), axis=2)
    cached = op.Less(offset, op.Constant(value_int=0))
    visible = op.Or(op.Unsqueeze(cached, one), op.And(op.Unsqueeze(written, one), allowed))  # [B, S, L]
    # The sliding window and the soft-cap sit behind an If on their attribute, a constant ONNX Runtime
    # folds (so does TensorRT-RTX's builder the window's; the soft-cap's finish_export resolves): a
    # graph without them runs no node of theirs.
    window_slots = op.Constant(value_int=window)
    windowed = op.Greater(window_slots, op.Constant(value_int=0))
    if windowed:
        # New token s sits in slot past + s, so its distance to slot j is s - offset[j].
        lag = op.Sub(op.Unsqueeze(seq_range, op.Constant(value_ints=[0, 2])), op.Unsqueeze(offset, one))
        visible = op.And(visible, op.Less(lag, window_slots))
    group = op.Div(q_heads, kv_heads)
    rep_shape = op.Concat(batch, kv_heads, group, capacity, head_dim, axis=0)
    flat_shape = op.Concat(batch, q_heads, capacity, head_dim, axis=0)
    keys = op.Reshape(op.Expand(op.Unsqueeze(present_key, two), rep_shape), flat_shape)
    values = op.Reshape(op.Expand(op.Unsqueeze(present_value, two), rep_shape), flat_shape)
    q_t = op.Transpose(q, perm=[0, 2, 1, 3])  # [B, Hq, S, D]
    scores = op.Mul(op.MatMul(q_t, op.Transpose(keys, perm=[0, 1, 3, 2])), op.CastLike(op.Constant(value_float=scale), q_t))
    cap = op.Constant(value_float=softcap)
    capped = op.Greater(cap, op.Constant(value_float=0.0))  # resolved at export (finish_export)
    if capped:
        cap_like = op.CastLike(cap, scores)
        scores = op.Mul(op.Tanh(op.Div(scores, cap_like)), cap_like)
    neg_inf = op.CastLike(op.Constant(value_float=float("-inf")), scores)
    scores = op.Where(op.Unsqueeze(visible, one), scores, neg_inf)
    probs = op.Softmax(scores, axis=-1)
    # A padded query may see nothing at all: its NaN row is zeroed below anyway.
    probs = op.Where(op.IsNaN(probs), op.CastLike(op.Constant(value_float=0.0), probs), probs)
    out = op.Transpose(op.MatMul(probs, values), perm=[0, 2, 1, 3])  # [B, S, Hq, D]
    out = op.Reshape(out, op.Concat(batch, seq, op.Constant(value_ints=[-1]), axis=0))
    valid = op.Less(op.Unsqueeze(seq_range, zero), op.Unsqueeze(new, one))  # [B, S]
    out = op.Mul(out, op.CastLike(op.Unsqueeze(valid, two), out))
    return out, present_key, present_value


@onnxscript.script(_TRT, default_opset=op)
def _causal_tree_mask(qkv):
    # Causal = a tree in which every new token's ancestors are all the tokens before it.
    seq = op.Shape(qkv, start=1, end=2)
    square = op.Concat(op.Shape(qkv, start=0, end=1), seq, seq, axis=0)
    ones = op.Expand(op.Constant(value_int=1), op.Concat(seq, seq, axis=0))
    causal = op.Cast(op.Trilu(ones, upper=0), to=9)
    tree_mask = op.Expand(op.Unsqueeze(causal, op.Constant(value_ints=[0])), square)
    return tree_mask


def _causal_function_proto() -> onnx.FunctionProto:
    """AttentionPlugin's body: the causal mask, then the tree body, in one flat function.

    Flat rather than a call of the tree function: TensorRT-RTX's parser rejects a model-local
    function that calls another one."""
    tree = TreeAttentionPlugin.to_function_proto()
    prelude = _causal_tree_mask.to_function_proto()
    rename = {name: f"causal/{name}" for node in prelude.node for name in node.output}
    nodes = []
    for node in prelude.node:
        renamed = onnx.NodeProto()
        renamed.CopyFrom(node)
        renamed.input[:] = [rename.get(name, name) for name in node.input]
        renamed.output[:] = [rename[name] for name in node.output]
        renamed.name = f"causal/{node.name}"
        nodes.append(renamed)
    mask = rename[prelude.output[0]]
    for node in tree.node:
        bound = onnx.NodeProto()
        bound.CopyFrom(node)
        bound.input[:] = [mask if name == "tree_mask" else name for name in node.input]
        nodes.append(bound)
    function = onnx.FunctionProto()
    function.CopyFrom(tree)
    function.name = OP_NAME
    del function.input[:]
    function.input.extend(tree.input[:8])
    del function.node[:]
    function.node.extend(nodes)
    return function


def function_protos() -> list[onnx.FunctionProto]:
    """The function bodies of both node types, to attach to a model that holds them."""
    return [TreeAttentionPlugin.to_function_proto(), _causal_function_proto()]


def finish_export(model: onnx.ModelProto) -> None:
    """After the bodies are attached, in place: the soft-cap's If becomes the branch the model's nodes
    take. TensorRT-RTX's builder fails on an If whose condition comes from a float constant (Myelin
    "CHECK(def_tactic_desc) failed"), as the soft-cap's does; the window's, of integers, it folds.
    A model soft-caps every attention layer or none (Gemma 2 caps all), so one branch serves all its
    nodes; a model that mixes keeps the If, which ONNX Runtime folds per node."""
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type in OP_NAMES]
    capped = {_attr(n, "softcap", 0.0) > 0 for n in nodes}
    if len(capped) != 1:
        return
    taken = "then_branch" if capped.pop() else "else_branch"
    for function in model.functions:
        if function.domain == DOMAIN and function.name in OP_NAMES:
            _inline_branch(function, "capped", taken)


def _inline_branch(function: onnx.FunctionProto, condition: str, taken: str) -> None:
    """Replace the If on `condition` by the nodes of its branch `taken`, then drop what fed only the If."""
    nodes = []
    for node in function.node:
        if node.op_type != "If" or node.input[0] != condition:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == taken)
        nodes.extend(branch.node)
        nodes.append(helper.make_node("Identity", [branch.output[0].name], [node.output[0]]))
    needed, kept = set(function.output), []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed |= _names_read(node)
    del function.node[:]
    function.node.extend(reversed(kept))


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The values a node reads, those its subgraphs read from the outer scope included."""
    names = set(node.input)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            for inner in attribute.g.node:
                names |= _names_read(inner)
    return names


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering.


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    if default is not None:  # an optional attribute, which graphs made before it lack
        return default
    raise KeyError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every attention node into com.microsoft.GroupQueryAttention, in place.

    GQA wants seqlens_k = past + new - 1, total_sequence_length = the cache capacity (so present and
    past share one buffer when bound to the same memory) and query_seqlens so that a ragged batch may
    have several new tokens on a non-empty cache. A tree mask becomes an additive attention_bias
    [B, 1, S, L] over absolute key slots (GQA's own causal mask agrees with it: a node's ancestors
    come before it). These are computed once and shared by all layers.
    """
    graph = model.graph
    looks_ahead = any(p.key == LOOKAHEAD_KEY and p.value == "1" for p in model.metadata_props)
    # (a tree node that may look ahead stays its function body: GQA's causal mask would hide what it allows)
    lowered = (OP_NAME,) if looks_ahead else OP_NAMES
    plugin_nodes = [n for n in graph.node if n.domain == DOMAIN and n.op_type in lowered]
    if not plugin_nodes:
        return model
    first = plugin_nodes[0]
    past_lengths, query_lengths = first.input[3], first.input[4]
    p = "trt_llm_gqa"

    def const(name, value, dtype=onnx.TensorProto.INT32):
        return helper.make_node("Constant", [], [f"{p}/{name}"], value=helper.make_tensor(name, dtype, [], [value]))

    shared = [const("one", 1)]
    # Each node's step inputs, computed once per distinct input and placed before the first node that reads
    # them (a layer reading another's cache on the kept rows only, Gemma 4's, has its own, computed in the
    # graph after the layers before it): the positions as int64, which new tokens are valid, and
    # seqlens_k / total_sequence_length per (lengths, query lengths): a sliding-window group's layers hold
    # their own slots (past_lengths_w<W>) in caches of their own capacity.
    before: dict[int, list[onnx.NodeProto]] = {}
    positions_of: dict[str, str] = {}
    valid_of: dict[str, str] = {}
    lengths_of: dict[tuple[str, str], str] = {}
    for node in plugin_nodes:
        qkv, _, _, lengths, queries, positions = node.input[:6]
        mine = before.setdefault(id(node), [])
        if positions not in positions_of:
            positions_of[positions] = f"{p}/position_ids" + (str(len(positions_of)) if positions_of else "")
            mine.append(helper.make_node("Cast", [positions], [positions_of[positions]], to=onnx.TensorProto.INT64))
        if queries not in valid_of:
            valid_of[queries] = p if not valid_of else f"{p}/q{len(valid_of)}"
            mine += _valid_query_nodes(valid_of[queries], qkv, queries)
        if (lengths, queries) in lengths_of:
            continue
        q = p if not lengths_of else f"{p}/g{len(lengths_of)}"
        lengths_of[(lengths, queries)] = q
        mine += [
            helper.make_node("Add", [lengths, queries], [f"{q}/total"]),
            helper.make_node("Sub", [f"{q}/total", f"{p}/one"], [f"{q}/seqlens_k"]),
            helper.make_node("Shape", [node.input[1]], [f"{q}/capacity_1d"], start=2, end=3),
            helper.make_node("Cast", [f"{q}/capacity_1d"], [f"{q}/capacity_i32"], to=onnx.TensorProto.INT32),
            helper.make_node("Squeeze", [f"{q}/capacity_i32"], [f"{q}/total_sequence_length"]),
        ]
    for table in graph.initializer:  # ONNX Runtime's GQA reads only tables of 8k frequencies
        if table.name in {name for n in plugin_nodes for name in n.input[6:8]} and table.dims[1] % 8:
            raise ValueError(f"the cpu backend's attention (ONNX Runtime's GroupQueryAttention) rotates a multiple "
                             f"of 16 dims per head; this model rotates {2 * table.dims[1]} (partial rotary)")
    tables = _tables_of_capacity(graph, plugin_nodes, p)
    before[id(first)] = shared + before[id(first)]  # (the first group's capacity: the tree bias reads it)
    shared = []
    for nodes in tables.values():
        shared += nodes
    tree_nodes = [n for n in plugin_nodes if n.op_type == TREE_OP_NAME]
    if tree_nodes:
        shared += _attention_bias_nodes(p, tree_nodes[0].input[8], past_lengths, query_lengths, first.input[0],
                                        const)
    _share_readers_presents(graph, plugin_nodes)
    new_nodes = []
    for node in graph.node:
        if node not in plugin_nodes:
            new_nodes.append(node)
            continue
        new_nodes.extend(before[id(node)])
        if node is first:
            new_nodes.extend(shared)
        qkv, past_k, past_v, lengths, queries, positions, cos_cache, sin_cache = node.input[:8]
        cos_cache, sin_cache = (f"{p}/{name}/rows" if name in tables else name for name in (cos_cache, sin_cache))
        bias = f"{p}/attention_bias" if node.op_type == TREE_OP_NAME else ""
        window = _attr(node, "window", 0)
        q, valid = lengths_of[(lengths, queries)], valid_of[queries]
        raw = f"{node.output[0]}/gqa"
        new_nodes.append(helper.make_node(
            "GroupQueryAttention",
            [qkv, "", "", past_k, past_v, f"{q}/seqlens_k", f"{q}/total_sequence_length",
             cos_cache, sin_cache, positions_of[positions], bias, "", "", "", "", "", queries],
            [raw, *node.output[1:]],
            name=node.name,
            domain="com.microsoft",
            num_heads=_attr(node, "num_heads"),
            kv_num_heads=_attr(node, "kv_num_heads"),
            scale=_attr(node, "scale"),
            # ONNX Runtime 1.32's CPU kernel counts the query itself: local_window_size W keeps the W
            # slots up to its own, our window W (tests/test_attention_plugin.py compares the two).
            local_window_size=window if window > 0 else -1,
            softcap=_attr(node, "softcap", 0.0),
            do_rotary=1,
            rotary_interleaved=0,
        ))
        # GQA leaves a padded or idle query's row as it finds the memory; the op's output is zeros there.
        new_nodes.append(helper.make_node("Where", [f"{valid}/valid_query", raw, f"{valid}/zero_output"], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _share_readers_presents(graph, plugin_nodes) -> None:
    """A layer that reads another's keys and values (kv_source: Gemma 4) takes its source's present as
    its past. Its own present, unused, would be a fresh buffer that GroupQueryAttention fills by copying
    the whole past first, every step (measured: decode, B 2, 4,096 slots of 512: 11.4 ms a layer, 1.5 ms
    in place). As graph outputs (shared_present) the runtime binds them to the source's buffer: past and
    present are then one memory, which GQA updates in place (the same new keys and values again)."""
    from trt_llm.schemas.graph_spec import shared_present

    outputs = {o.name: o for o in graph.output}
    readers: dict[str, int] = {}
    for node in plugin_nodes:
        past_key, past_value = node.input[1], node.input[2]
        if past_key not in outputs or past_value not in outputs:
            continue  # (its past is a graph input: it owns its cache)
        for source, index in ((past_key, 1), (past_value, 2)):
            name = shared_present(source, readers.get(source, 0))
            readers[source] = readers.get(source, 0) + 1
            node.output[index] = name
            value = outputs[source].type.tensor_type
            graph.output.append(helper.make_tensor_value_info(name, value.elem_type, None))


def _valid_query_nodes(p, qkv, query_lengths) -> list[onnx.NodeProto]:
    """valid_query [B, S, 1]: whether new token s of row b is one of its query_lengths[b]; and a zero of
    the activations' type (the padded rows of every layer's output)."""
    n = helper.make_node
    return [
        n("Shape", [qkv], [f"{p}/q_seq_1d"], start=1, end=2),
        n("Squeeze", [f"{p}/q_seq_1d"], [f"{p}/q_seq"]),
        n("Constant", [], [f"{p}/q_zero"], value=helper.make_tensor("q0", onnx.TensorProto.INT64, [], [0])),
        n("Constant", [], [f"{p}/q_step"], value=helper.make_tensor("q1", onnx.TensorProto.INT64, [], [1])),
        n("Range", [f"{p}/q_zero", f"{p}/q_seq", f"{p}/q_step"], [f"{p}/q_positions"]),
        n("Cast", [query_lengths], [f"{p}/q_lengths_i64"], to=onnx.TensorProto.INT64),
        n("Constant", [], [f"{p}/q_axis1"], value=helper.make_tensor("qa1", onnx.TensorProto.INT64, [1], [1])),
        n("Constant", [], [f"{p}/q_axis0"], value=helper.make_tensor("qa0", onnx.TensorProto.INT64, [1], [0])),
        n("Unsqueeze", [f"{p}/q_lengths_i64", f"{p}/q_axis1"], [f"{p}/q_lengths_col"]),  # [B, 1]
        n("Unsqueeze", [f"{p}/q_positions", f"{p}/q_axis0"], [f"{p}/q_positions_row"]),  # [1, S]
        n("Less", [f"{p}/q_positions_row", f"{p}/q_lengths_col"], [f"{p}/valid_2d"]),  # [B, S]
        n("Constant", [], [f"{p}/q_axis2"], value=helper.make_tensor("qa2", onnx.TensorProto.INT64, [1], [2])),
        n("Unsqueeze", [f"{p}/valid_2d", f"{p}/q_axis2"], [f"{p}/valid_query"]),  # [B, S, 1]
        n("Constant", [], [f"{p}/zero_f32"], value=helper.make_tensor("z", onnx.TensorProto.FLOAT, [], [0.0])),
        n("CastLike", [f"{p}/zero_f32", qkv], [f"{p}/zero_output"]),
    ]


def _tables_of_capacity(graph, plugin_nodes, p) -> dict[str, list[onnx.NodeProto]]:
    """GQA wants at least total_sequence_length (= the capacity) rows in cos_cache / sin_cache. The
    text tables are initializers of max_positions rows and pass as they are; a table the graph
    computes (mRoPE's per-token rows, B * S of them) is zero-padded to the capacity, once per step for
    all layers: {table name: the nodes making f"{p}/{name}/rows"}."""
    constant = {t.name for t in graph.initializer}
    constant |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    names = {name for n in plugin_nodes for name in n.input[6:8] if name not in constant}
    tables = {}
    for name in sorted(names):
        q = f"{p}/{name}"
        tables[name] = [
            helper.make_node("Shape", [name], [f"{q}/count"], start=0, end=1),
            helper.make_node("Shape", [plugin_nodes[0].input[1]], [f"{q}/capacity"], start=2, end=3),
            helper.make_node("Sub", [f"{q}/capacity", f"{q}/count"], [f"{q}/short"]),
            helper.make_node("Constant", [], [f"{q}/none"], value=helper.make_tensor("none", onnx.TensorProto.INT64, [1], [0])),
            helper.make_node("Max", [f"{q}/short", f"{q}/none"], [f"{q}/missing"]),
            helper.make_node("Constant", [], [f"{q}/zeros"],
                             value=helper.make_tensor("zeros", onnx.TensorProto.INT64, [2], [0, 0])),
            helper.make_node("Concat", [f"{q}/zeros", f"{q}/missing", f"{q}/none"], [f"{q}/pads"], axis=0),
            helper.make_node("Pad", [name, f"{q}/pads"], [f"{q}/rows"]),
        ]
    return tables


def _attention_bias_nodes(p, tree_mask, past_lengths, query_lengths, activations, const) -> list[onnx.NodeProto]:
    """attention_bias [B, 1, S, L]: 0 where key slot j is visible to new token i, else -inf.

    Visible: a cached slot (j < past), or a new token (past <= j < past + new) the tree allows."""
    n = helper.make_node
    return [
        const("zero", 0, onnx.TensorProto.INT64), const("step", 1, onnx.TensorProto.INT64),
        n("Cast", [f"{p}/capacity_1d"], [f"{p}/capacity_i64"], to=onnx.TensorProto.INT64),
        n("Squeeze", [f"{p}/capacity_i64"], [f"{p}/capacity"]),
        n("Range", [f"{p}/zero", f"{p}/capacity", f"{p}/step"], [f"{p}/slots"]),
        n("Cast", [past_lengths], [f"{p}/past_i64"], to=onnx.TensorProto.INT64),
        n("Cast", [query_lengths], [f"{p}/new_i64"], to=onnx.TensorProto.INT64),
        n("Constant", [], [f"{p}/axes0"], value=helper.make_tensor("a0", onnx.TensorProto.INT64, [1], [0])),
        n("Constant", [], [f"{p}/axes1"], value=helper.make_tensor("a1", onnx.TensorProto.INT64, [1], [1])),
        n("Unsqueeze", [f"{p}/slots", f"{p}/axes0"], [f"{p}/slots_row"]),
        n("Unsqueeze", [f"{p}/past_i64", f"{p}/axes1"], [f"{p}/past_col"]),
        n("Unsqueeze", [f"{p}/new_i64", f"{p}/axes1"], [f"{p}/new_col"]),
        n("Sub", [f"{p}/slots_row", f"{p}/past_col"], [f"{p}/offset"]),  # [B, L]
        n("Less", [f"{p}/offset", f"{p}/zero"], [f"{p}/cached"]),
        n("Less", [f"{p}/offset", f"{p}/new_col"], [f"{p}/below_end"]),
        n("Not", [f"{p}/cached"], [f"{p}/not_cached"]),
        n("And", [f"{p}/not_cached", f"{p}/below_end"], [f"{p}/is_new"]),
        n("Shape", [tree_mask], [f"{p}/tree_shape"]),
        n("Shape", [tree_mask], [f"{p}/seq_1d"], start=2, end=3),
        n("Sub", [f"{p}/seq_1d", f"{p}/axes1"], [f"{p}/seq_last"]),
        n("Squeeze", [f"{p}/seq_last"], [f"{p}/seq_last_scalar"]),
        n("Clip", [f"{p}/offset", f"{p}/zero", f"{p}/seq_last_scalar"], [f"{p}/source"]),
        n("Unsqueeze", [f"{p}/source", f"{p}/axes1"], [f"{p}/source_3d"]),
        n("Shape", [tree_mask], [f"{p}/bs"], start=0, end=2),
        n("Concat", [f"{p}/bs", f"{p}/capacity_1d"], [f"{p}/mask_shape"], axis=0),
        n("Expand", [f"{p}/source_3d", f"{p}/mask_shape"], [f"{p}/source_index"]),
        n("GatherElements", [tree_mask, f"{p}/source_index"], [f"{p}/allowed"], axis=2),
        n("Unsqueeze", [f"{p}/cached", f"{p}/axes1"], [f"{p}/cached_3d"]),
        n("Unsqueeze", [f"{p}/is_new", f"{p}/axes1"], [f"{p}/is_new_3d"]),
        n("And", [f"{p}/is_new_3d", f"{p}/allowed"], [f"{p}/new_visible"]),
        n("Or", [f"{p}/cached_3d", f"{p}/new_visible"], [f"{p}/visible"]),
        n("Unsqueeze", [f"{p}/visible", f"{p}/axes1"], [f"{p}/visible_4d"]),
        const("open", 0.0, onnx.TensorProto.FLOAT), const("closed", float("-inf"), onnx.TensorProto.FLOAT),
        n("Where", [f"{p}/visible_4d", f"{p}/open", f"{p}/closed"], [f"{p}/attention_bias_f32"]),
        n("CastLike", [f"{p}/attention_bias_f32", activations], [f"{p}/attention_bias"]),
    ]


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt.
#
# The parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute
# (PLUGIN_NAMESPACE; tensorrt.plugin reserves "trt", "", "tensorrt" and "std").

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_IDS = tuple(f"{TENSORRT_PLUGIN_NAMESPACE}::{name}" for name in OP_NAMES)
_tensorrt_registered = False


def attention_kernel(
    qkv: Tensor, past_key: Tensor, past_value: Tensor, past_lengths: Tensor, query_lengths: Tensor,
    position_ids: Tensor, cos_cache: Tensor, sin_cache: Tensor, tree_mask: Tensor | None,
    num_heads: int, kv_num_heads: int, scale: float, window: int = 0, softcap: float = 0.0,
    out: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The plugin's kernel: the op of facet 1 on tensors of any one device, in plain torch.

    Same inputs and results as `attention`; with `out` (output, present_key, present_value) the
    results are written there, which may be the very memory of past_key / past_value (all of past
    is read before anything is written). Unlike the reference it is written for the device: every
    index tensor is made on the inputs' device, grouped-query heads are broadcast rather than
    repeated, the softmax runs in float32, and nothing reads a value back to the host, so the
    kernel can be captured in a CUDA graph (its shapes depend on the input shapes only).
    """
    device = qkv.device
    batch, seq, _ = qkv.shape
    capacity, head_dim = past_key.shape[2], past_key.shape[3]
    group = num_heads // kv_num_heads
    heads = qkv.view(batch, seq, num_heads + 2 * kv_num_heads, head_dim)
    q, k, v = heads.split([num_heads, kv_num_heads, kv_num_heads], dim=2)
    positions = position_ids.long()
    cos, sin = cos_cache[positions], sin_cache[positions]  # [B, S, D/2]
    q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)

    # The cache write: slot j of a row takes new token j - past when that is one of its new tokens.
    offset = torch.arange(capacity, device=device)[None, :] - past_lengths.long()[:, None]  # [B, L]
    written = (offset >= 0) & (offset < query_lengths.long()[:, None])
    source = offset.clamp(0, seq - 1)
    index = source[:, None, :, None].expand(batch, kv_num_heads, capacity, head_dim)
    write = written[:, None, :, None]
    present_key = torch.where(write, torch.gather(k.transpose(1, 2), 2, index), past_key)
    present_value = torch.where(write, torch.gather(v.transpose(1, 2), 2, index), past_value)

    # Visibility [B, S, L]: cached slots always; a new token's slot where the tree (or causality) allows;
    # with a window, only slots less than `window` before the token's own (slot past + s).
    steps = torch.arange(seq, device=device)
    if tree_mask is None:
        allowed = source[:, None, :] <= steps[None, :, None]
    else:
        allowed = torch.gather(tree_mask, 2, source[:, None, :].expand(batch, seq, capacity))
    visible = (offset < 0)[:, None, :] | (written[:, None, :] & allowed)
    if window > 0:
        visible = visible & (steps[None, :, None] - offset[:, None, :] < window)

    # Query head h reads kv head h // group: queries as [B, Hkv, group * S, D] against [B, Hkv, L, D].
    queries = q.transpose(1, 2).reshape(batch, kv_num_heads, group * seq, head_dim)
    scores = (queries @ present_key.transpose(-1, -2)).float() * scale  # [B, Hkv, group * S, L]
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, kv_num_heads, group, seq, capacity)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    # A padded query may see nothing at all: its NaN row is zeroed here and below.
    probs = torch.nan_to_num(scores.softmax(-1), nan=0.0).to(qkv.dtype)
    context = probs.view(batch, kv_num_heads, group * seq, capacity) @ present_value  # [B, Hkv, group*S, D]
    output = context.view(batch, kv_num_heads * group, seq, head_dim).transpose(1, 2)
    output = output.reshape(batch, seq, num_heads * head_dim)
    valid_query = steps[None, :] < query_lengths.long()[:, None]
    output = output * valid_query[:, :, None].to(output.dtype)
    if out is None:
        return output, present_key, present_value
    for target, result in zip(out, (output, present_key, present_value)):
        target.copy_(result)
    return tuple(out)


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


def register_tensorrt_plugin() -> tuple[str, ...]:
    """Register both node types with TensorRT (once per process); returns their plugin ids.

    Needed before parsing a graph (the parser then builds a plugin layer for each node whose
    `plugin_namespace` is TENSORRT_PLUGIN_NAMESPACE) and before deserializing an engine built with
    it: the kernel is the Python function below (a JIT plugin), which TensorRT calls on its stream.
    """
    global _tensorrt_registered
    if _tensorrt_registered:
        return TENSORRT_PLUGIN_IDS
    import tensorrt.plugin as trtp

    names = ["qkv", "past_key", "past_value", "past_lengths", "query_lengths", "position_ids",
             "cos_cache", "sin_cache"]
    for plugin_id, inputs in zip(TENSORRT_PLUGIN_IDS, (names, names + ["tree_mask"])):
        _register_one(trtp, plugin_id, inputs)
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_IDS


# The node's attributes the plugin takes, in attention_kernel's order of its parameters.
PLUGIN_ATTRIBUTES = {"num_heads": int, "kv_num_heads": int, "scale": float, "window": int, "softcap": float}


def _register_one(trtp, plugin_id: str, input_names: list[str]) -> None:
    count = len(input_names)

    def describe(*tensors, **attributes):
        # tensorrt.plugin passes the tensor descriptors by position and the attributes by name.
        qkv, past_key, past_value = tensors[:3]
        output = qkv.like()  # [B, S, Hq * D], the activation dtype
        output.shape_expr[2] = past_key.shape_expr[3] * attributes["num_heads"]
        return output, past_key.like(), past_value.like()

    def run(*args, stream):
        # tensorrt.plugin passes the tensors, the attributes (in PLUGIN_ATTRIBUTES' order) and the
        # outputs by position, the stream by name. attention_kernel runs on the plugin's device buffers,
        # on TensorRT's stream (the views are made inside the stream context, so nothing waits on
        # another stream, also under graph capture).
        tensors, attributes, outputs = args[:count], args[count:-1], args[-1]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.no_grad():
            inputs = [_tensorrt_as_torch(t) for t in tensors]
            targets = [_tensorrt_as_torch(t) for t in outputs]
            attention_kernel(*inputs[:8], inputs[8] if count == 9 else None, *attributes, out=targets)

    # tensorrt.plugin reads the names and annotations of these functions' parameters from their signatures.
    import inspect

    def parameters(annotated):
        return [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
                for name, annotation in annotated]

    attributes = list(PLUGIN_ATTRIBUTES.items())
    describe.__signature__ = inspect.Signature(
        parameters([(name, trtp.TensorDesc) for name in input_names] + attributes),
        return_annotation=tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc])
    run.__signature__ = inspect.Signature(parameters(
        [(name, trtp.Tensor) for name in input_names] + attributes
        + [("outputs", tuple[trtp.Tensor]), ("stream", int)]))
    trtp.register(plugin_id)(describe)
    trtp.impl(plugin_id)(run)
