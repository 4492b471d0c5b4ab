"""A sparse mixture-of-experts block (Qwen3-MoE's, Gemma 4's), float or weight-only quantized: all its facets in one file.

The semantics are transformers' Qwen3MoeSparseMoeBlock: the router's logits, a softmax in float32
over all experts, the top k (num_experts_per_tok), renormalised to sum to 1 when `normalize`
(norm_topk_prob), the weights cast to the logits' dtype; each chosen expert's gated MLP
down(act(gate(x)) * up(x)), and their weighted sum. act: silu (`activation` 0, Qwen3-MoE) or GELU's tanh
approximation (1, Gemma 4's experts).

The router's logits come in as an input, computed by a plain linear outside the op: ONNX Runtime's
MoE kernels take logits (they apply the softmax and top-k themselves), the router weight stays float
whatever the experts' quantization (rounding it would change which experts a token goes to), and a
MatMul is what every backend already runs well.

Inputs (shapes; T = tokens, E = experts, H = hidden, I = expert width, k = top_k):
    hidden         [..., H] float   [B, S, H] or [T, H]; every token is routed on its own
    router_logits  [..., E] float   one row per token, in any float dtype
    gate_up        [E, 2I, H]       gate and up rows interleaved: row 2i is gate_i, row 2i + 1 up_i
                                    (the layout of ONNX Runtime's CPU kernels, which take no other;
                                    transformers' gate_up_proj [E, 2I, H] has [gate | up])
    down           [E, H, I]        transformers' down_proj as it is
Attributes: top_k, normalize (0 or 1), activation (0 silu, 1 gelu tanh). Output: [..., H], the hidden dtype.

Quantized experts (`QuantizedMoEPlugin`): gate_up and down as integers in blocks of G along their
input dimension K (H for gate_up, I for down), each block with a scale, symmetric round to nearest
(build/quantize/rtn.py's rule). Stored the way ONNX Runtime's QMoE reads them, so its lowering reads
the bundle's initializers as they are: unsigned u = q + 2^(bits-1) (QMoE's implicit zero point),
uint8 [E, N, K * bits / 8], a 4-bit pair per byte with the even k in the low nibble; scales
[E, N, K / G] in the hidden dtype (K / G = 1: one scale per row). w[e, n, k] = (u - 2^(bits-1)) *
scale[e, n, k // G], G = K / scales.shape[-1] (from the shapes: gate_up and down may block
differently). Inputs hidden, router_logits, gate_up, gate_up_scales, down, down_scales; attributes
top_k, normalize, bits (4 or 8).

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `moe` (`TORCH_OPS`): one torch custom op, `moe(hidden, router_logits, gate_up, down,
    gate_up_scales, down_scales, top_k, normalize, bits)` (bits 0 and no scales: float experts),
    whose eager body loops over the experts that have tokens, as transformers does (a quantized
    expert is dequantized when it is hit).
 2. `onnx_translation` + `function_protos`: a node `trt::MoEPlugin` or `trt::QuantizedMoEPlugin`
    (one node type per set of inputs, with `plugin_namespace`), whose model-local function is a
    gather decomposition in standard ops (opset 18): Softmax, TopK, Gather of the chosen experts'
    weights [T, k, 2I, H] (quantized: their bytes, unpacked in float arithmetic and scaled),
    batched MatMuls, the weighted ReduceSum over k. Exact and portable, but it copies k experts per
    token: sized for decode.
 3. `lower_for_onnxruntime`: com.microsoft.MoE (float32) and QMoE (int4 / int8: block_size G, or
    none for one scale per row), chosen by measurement (benchmarks/moe_op.py; Qwen3-30B-A3B's widths
    H 2048, E 128, k 8, I 768; one layer; ONNX Runtime 1.32, 2 threads on 2 shared cores of an AMD
    EPYC; medians of 20 interleaved calls, ms):
                        function body (gather)    kernel
        fp32,  1 token        106.9               31.7 (MoE)
        fp32,  8 tokens       304.4              126.4
        fp32, 64 tokens          -               332.7   (the body would gather 9.6 GB of weights)
        int4 g128,  1 token   258.5               12.9 (QMoE, accuracy level 0) /  7.8 (level 4)
        int4 g128,  8 tokens 1846.9              103.4                          / 51.0
        int4 g128, 64 tokens     -               204.6                          / 90.5
        int8 g32, 1 / 8 / 64 tokens               7.8 / 32.0 / 114.5 (QMoE)
    The kernels read each chosen expert's weights in place (the body copies them first, and a
    quantized body dequantizes its copies to float32), so they win at every token count. QMoE runs
    at accuracy level 4: int8 activations in the weights' blocks, as the int4 / int8 MatMulNBits of
    the other linears run (runtime/backends/ort_engine.py); level 0 keeps int4's activations float32,
    exact, at about half the speed. One scale per row runs float32 activations. Two quirks of
    ONNX Runtime 1.32's CPU kernels: both take only the interleaved gate/up layout (swiglu_fusion 1),
    and QMoE renormalises the top k whatever normalize_routing_weights says, so unnormalised
    routing passes the softmax as its router_weights. Nodes the kernels cannot take (float16 /
    bfloat16, gate_up and down in different blocks, a block size not a power of two of 16 or more,
    weights that are not initializers) stay, and ONNX Runtime runs their body; so do GELU experts
    (Gemma 4's): the kernels' gated activation is SwiGLU only (activation_type swiglu; their gelu is
    not gated).
 4. `register_tensorrt_plugin`: both node types as `tensorrt.plugin` plugins whose kernel is
    `moe_kernel` (plain torch on TensorRT's stream: the reference's arithmetic with nothing read back
    to the host, so it may be captured in a CUDA graph). TensorRT-RTX has no plugins: its parser
    inlines the body at every call.
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnxscript import opset18 as op
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "MoEPlugin"
QUANTIZED_OP_NAME = "QuantizedMoEPlugin"
OP_NAMES = (OP_NAME, QUANTIZED_OP_NAME)
# "trt" is reserved by tensorrt.plugin, so the plugin lives in our own namespace.
PLUGIN_NAMESPACE = "trt_llm"
_TRT = onnxscript.values.Opset(DOMAIN, 1)


def _register_schemas() -> None:
    """Register the nodes' schemas so onnxscript (and the exporter) can emit them."""
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    AttrType = onnx.defs.OpSchema.AttrType
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    routed = [Param("hidden", "T"), Param("router_logits", "R")]
    for name, weights, extra in (
        (OP_NAME, [Param("gate_up", "T"), Param("down", "T")], []),
        (QUANTIZED_OP_NAME, [Param("gate_up", "Q"), Param("gate_up_scales", "T"), Param("down", "Q"),
                             Param("down_scales", "T")], [Attr("bits", AttrType.INT, "4 or 8")]),
    ):
        if onnx.defs.has(name, DOMAIN):
            continue
        onnx.defs.register_schema(onnx.defs.OpSchema(
            name, DOMAIN, 1,
            doc="Qwen3-MoE's sparse mixture of experts (see trt_llm.plugins.moe).",
            inputs=routed + weights, outputs=[Param("output", "T")],
            type_constraints=[("T", floats, "activations"), ("R", floats, "router logits"),
                              ("Q", ["tensor(uint8)"], "quantized weights' bytes")],
            attributes=[Attr("top_k", AttrType.INT, "experts per token"),
                        Attr("normalize", AttrType.INT, "renormalise the top-k probabilities (0 or 1)"),
                        Attr("activation", AttrType.INT, "the experts' gate: 0 silu, 1 gelu (tanh)"),
                        Attr("plugin_namespace", AttrType.STRING, "TensorRT plugin namespace"), *extra],
        ))


_register_schemas()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


def route(router_logits: Tensor, top_k: int, normalize: int) -> tuple[Tensor, Tensor]:
    """[T, E] logits -> (weights [T, k] in the logits' dtype, experts [T, k] int64), as Qwen3MoeTopKRouter."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


SILU, GELU_TANH = 0, 1  # the `activation` attribute


def gate_activation(gate: Tensor, activation: int) -> Tensor:
    return F.gelu(gate, approximate="tanh") if activation == GELU_TANH else F.silu(gate)


def expert_mlp(x: Tensor, gate_up: Tensor, down: Tensor, activation: int = SILU) -> Tensor:
    """One expert (or a batch of them, leading dims broadcast): x [..., H], gate_up [..., 2I, H]
    interleaved, down [..., H, I] -> down(act(gate(x)) * up(x)) [..., H]."""
    h = (gate_up @ x.unsqueeze(-1)).squeeze(-1)  # [..., 2I]
    gate, up = h[..., 0::2], h[..., 1::2]
    return (down @ (gate_activation(gate, activation) * up).unsqueeze(-1)).squeeze(-1)


def unpack(weight: Tensor, bits: int) -> Tensor:
    """Stored bytes uint8 [..., N, K * bits / 8] -> the signed integers [..., N, K] (float32)."""
    if bits == 8:
        return weight.float() - 128
    values = torch.stack([weight & 0xF, weight >> 4], dim=-1).flatten(-2)
    return values.float() - 8


def pack(values: Tensor, bits: int) -> Tensor:
    """unpack's inverse: signed integers [..., N, K] in [-2^(bits-1), 2^(bits-1)) -> uint8 bytes."""
    u = (values.to(torch.int16) + (1 << (bits - 1))).to(torch.uint8)
    return u if bits == 8 else u[..., 0::2] | (u[..., 1::2] << 4)


def dequantize(weight: Tensor, scales: Tensor, bits: int) -> Tensor:
    """Bytes [..., N, K * bits / 8] and scales [..., N, K / G] -> w [..., N, K] in the scales' dtype."""
    q = unpack(weight, bits)
    blocks = q.view(*q.shape[:-1], scales.shape[-1], -1) * scales.float().unsqueeze(-1)
    return blocks.flatten(-2).to(scales.dtype)


def _reference(hidden: Tensor, router_logits: Tensor, top_k: int, normalize: int, expert, activation: int) -> Tensor:
    """The loop of transformers' Qwen3MoeExperts over the experts that have tokens; expert(e) gives
    expert e's (gate_up, down) in the hidden dtype."""
    shape = hidden.shape
    x = hidden.reshape(-1, shape[-1])
    weights, experts = route(router_logits.reshape(x.shape[0], -1), top_k, normalize)
    out = torch.zeros_like(x)
    for e in torch.unique(experts).tolist():
        token, slot = torch.where(experts == e)
        gate_up, down = expert(e)
        y = expert_mlp(x[token], gate_up, down, activation) * weights[token, slot, None].to(x.dtype)
        out.index_add_(0, token, y.to(x.dtype))
    return out.view(shape)



@torch.library.custom_op("trt_llm::moe", mutates_args=())
def moe(hidden: Tensor, router_logits: Tensor, gate_up: Tensor, down: Tensor, gate_up_scales: Tensor | None,
        down_scales: Tensor | None, top_k: int, normalize: int, bits: int, activation: int = SILU) -> Tensor:
    """bits 0: float experts; 4 or 8: quantized ones with their scales (see the module docstring)."""
    def expert(e):
        if not bits:
            return gate_up[e].to(hidden.dtype), down[e].to(hidden.dtype)
        return (dequantize(gate_up[e], gate_up_scales[e], bits).to(hidden.dtype),
                dequantize(down[e], down_scales[e], bits).to(hidden.dtype))

    return _reference(hidden, router_logits, top_k, normalize, expert, activation)


@moe.register_fake
def _moe_fake(hidden, router_logits, gate_up, down, gate_up_scales, down_scales, top_k, normalize, bits, activation=SILU):
    return torch.empty_like(hidden)


TORCH_OPS = (torch.ops.trt_llm.moe.default,)


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face: our nodes, and a gather decomposition as their function bodies.


def onnx_translation(hidden, router_logits, gate_up, down, gate_up_scales, down_scales, top_k: int, normalize: int,
                     bits: int, activation: int = SILU) -> onnxscript.onnx_types.FLOAT:
    # The return annotation matters: without it the exporter infers zero outputs.
    attributes = dict(top_k=top_k, normalize=normalize, activation=activation, plugin_namespace=PLUGIN_NAMESPACE)
    if not bits:
        return _TRT.MoEPlugin(hidden, router_logits, gate_up, down, **attributes)
    return _TRT.QuantizedMoEPlugin(hidden, router_logits, gate_up, gate_up_scales, down, down_scales, bits=bits,
                                   **attributes)


@onnxscript.script(_TRT, default_opset=op)
def _routing(hidden, router_logits, top_k: int, normalize: int):
    """x [T, H], the chosen experts [T, k] and their weights [T, k, 1] in the hidden dtype."""
    x = op.Reshape(hidden, op.Concat(op.Constant(value_ints=[-1]), op.Shape(hidden, start=-1), axis=0))
    logits = op.Reshape(op.Cast(router_logits, to=1),
                        op.Concat(op.Constant(value_ints=[-1]), op.Shape(router_logits, start=-1), axis=0))
    probs = op.Softmax(logits, axis=-1)  # float32, as transformers
    k = op.Unsqueeze(op.Constant(value_int=top_k), op.Constant(value_ints=[0]))
    top, chosen = op.TopK(probs, k, axis=-1)
    # normalize picks the denominator (a Where, not an If: nothing for a parser to fold)
    total = op.ReduceSum(top, op.Constant(value_ints=[-1]), keepdims=1)
    normalized = op.Greater(op.Constant(value_int=normalize), op.Constant(value_int=0))
    denominator = op.Where(normalized, total, op.Constant(value_float=1.0))
    # the logits' dtype first (transformers' router_top_value.to(router_logits.dtype)), then the hidden one
    weights = op.CastLike(op.CastLike(op.Div(top, denominator), router_logits), hidden)
    return x, chosen, op.Unsqueeze(weights, op.Constant(value_ints=[2]))


@onnxscript.script(_TRT, default_opset=op)
def _experts(hidden, x, weights, w1, w2, activation: int):
    """The chosen experts' MLPs on their gathered weights w1 [T, k, 2I, H], w2 [T, k, H, I]: the
    weighted sum [..., H] in the input's shape."""
    h = op.MatMul(w1, op.Unsqueeze(x, op.Constant(value_ints=[1, 3])))  # [T, k, 2I, 1]
    pairs = op.Reshape(h, op.Constant(value_ints=[0, 0, -1, 2]))  # [T, k, I, 2]: (gate, up)
    gate, up = op.Split(pairs, axis=3, num_outputs=2)
    silu = op.Mul(gate, op.Sigmoid(gate))
    # GELU's tanh approximation, 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), in the gate's dtype
    cube = op.Mul(op.Mul(gate, gate), gate)
    inner = op.Mul(op.CastLike(op.Constant(value_float=0.7978845608028654), gate),
                   op.Add(gate, op.Mul(op.CastLike(op.Constant(value_float=0.044715), gate), cube)))
    half = op.CastLike(op.Constant(value_float=0.5), gate)
    gelu = op.Mul(op.Mul(half, gate), op.Add(op.CastLike(op.Constant(value_float=1.0), gate), op.Tanh(inner)))
    # (a Where on the attribute, not an If: nothing for a parser to fold, both are elementwise)
    chosen = op.Where(op.Equal(op.Constant(value_int=activation), op.Constant(value_int=1)), gelu, silu)
    act = op.Mul(chosen, up)  # [T, k, I, 1]
    y = op.Squeeze(op.MatMul(w2, act), op.Constant(value_ints=[3]))  # [T, k, H]
    out = op.ReduceSum(op.Mul(y, weights), op.Constant(value_ints=[1]), keepdims=0)
    return op.Reshape(out, op.Shape(hidden))


@onnxscript.script(_TRT, default_opset=op)
def _dequantized(weight, scales, bits: int):
    """Gathered bytes [T, k, N, K * bits / 8], scales [T, k, N, K / G] -> w [T, k, N, K], the scales' dtype."""
    four = op.Equal(op.Constant(value_int=bits), op.Constant(value_int=4))
    if four:  # an If on a constant: ONNX Runtime folds it
        # The nibbles in float arithmetic, exact on 0..255 (TensorRT-RTX parses no BitShift)
        last = op.Constant(value_ints=[-1])
        sixteen = op.Constant(value_float=16.0)
        byte = op.Cast(weight, to=1)
        high = op.Floor(op.Div(byte, sixteen))
        low = op.Sub(byte, op.Mul(high, sixteen))
        pairs = op.Concat(op.Unsqueeze(low, last), op.Unsqueeze(high, last), axis=-1)  # the even k in the low nibble
        values = op.Sub(op.Reshape(pairs, op.Constant(value_ints=[0, 0, 0, -1])), op.Constant(value_float=8.0))
    else:
        values = op.Sub(op.Cast(weight, to=1), op.Constant(value_float=128.0))
    blocks_shape = op.Concat(op.Shape(scales), op.Constant(value_ints=[-1]), axis=0)  # [T, k, N, K/G, G]
    scaled = op.Mul(op.Reshape(values, blocks_shape),
                    op.Unsqueeze(op.Cast(scales, to=1), op.Constant(value_ints=[-1])))
    return op.CastLike(op.Reshape(scaled, op.Shape(values)), scales)


def _inline(function: onnx.FunctionProto, inputs: list[str], outputs: list[str], prefix: str) -> list[onnx.NodeProto]:
    """A helper script's nodes, its inputs and outputs renamed to ours and every other value (in its
    If branches too) prefixed: one flat function (TensorRT-RTX's parser rejects a function that
    calls another one)."""
    rename = {**dict(zip(function.input, inputs)), **dict(zip(function.output, outputs))}

    def renamed(nodes) -> list[onnx.NodeProto]:
        result = []
        for node in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            for name in node.output:
                rename.setdefault(name, f"{prefix}{name}")
            copy.input[:] = [rename.get(name, name) for name in node.input]
            copy.output[:] = [rename[name] for name in node.output]
            copy.name = f"{prefix}{node.name}"
            for attribute in copy.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    branch = attribute.g
                    nodes_of_branch = renamed(branch.node)
                    del branch.node[:]
                    branch.node.extend(nodes_of_branch)
                    for value in branch.output:
                        value.name = rename.get(value.name, value.name)
            result.append(copy)
        return result

    return renamed(function.node)


def function_protos() -> list[onnx.FunctionProto]:
    """The bodies of both node types: routing, the chosen experts' weights gathered (and dequantized),
    their MLPs."""
    routing, experts, dequantized = (f.to_function_proto() for f in (_routing, _experts, _dequantized))
    head = _inline(routing, ["hidden", "router_logits"], ["x", "chosen", "weights"], "route/")
    tail = _inline(experts, ["hidden", "x", "weights", "w1", "w2"], ["output"], "experts/")

    def gather(weight, output):
        return helper.make_node("Gather", [weight, "chosen"], [output], axis=0, name=f"gather/{output}")

    plain = [*head, gather("gate_up", "w1"), gather("down", "w2"), *tail]
    quantized = list(head)
    for w, weight in (("w1", "gate_up"), ("w2", "down")):
        quantized += [gather(weight, f"{w}_bytes"), gather(f"{weight}_scales", f"{w}_scales"),
                      *_inline(dequantized, [f"{w}_bytes", f"{w}_scales"], [w], f"{w}/")]
    quantized += tail
    attributes = ["top_k", "normalize", "activation", "plugin_namespace"]
    opsets = [helper.make_opsetid("", 18)]
    return [
        helper.make_function(DOMAIN, OP_NAME, ["hidden", "router_logits", "gate_up", "down"], ["output"], plain,
                             opsets, attributes=attributes),
        helper.make_function(DOMAIN, QUANTIZED_OP_NAME, ["hidden", "router_logits", "gate_up", "gate_up_scales",
                                                          "down", "down_scales"], ["output"], quantized, opsets,
                             attributes=[*attributes, "bits"]),
    ]



# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering (com.microsoft.MoE / QMoE; see the module docstring).


def _attr(node: onnx.NodeProto, name: str, default: int | None = None) -> int:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _kernel(node: onnx.NodeProto, tensors: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    """The node as ONNX Runtime's MoE or QMoE, or None where neither takes it (see the docstring)."""
    weights = [tensors.get(name) for name in node.input[2:]]
    if _attr(node, "activation", SILU) != SILU:
        return None  # the kernels gate by SwiGLU only
    if any(t is None for t in weights):
        return None  # weights the graph computes: the kernels' shapes come from the initializers
    if any(t.data_type not in (TensorProto.FLOAT, TensorProto.UINT8) for t in weights):
        return None  # float16 / bfloat16: ONNX Runtime's CPU kernels are float32
    name = node.name or node.output[0]
    hidden, logits, *_ = node.input
    experts = weights[0].dims[0]
    attributes = dict(k=_attr(node, "top_k"), normalize_routing_weights=_attr(node, "normalize"),
                      activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0)
    nodes = [  # the kernels take the logits as [T, E] whatever the hidden's rank
        helper.make_node("Constant", [], [f"{name}/rows"],
                         value=helper.make_tensor("rows", TensorProto.INT64, [2], [-1, experts])),
        helper.make_node("Reshape", [logits, f"{name}/rows"], [f"{name}/router_logits"]),
    ]
    if node.op_type == OP_NAME:
        gate_up, down = node.input[2:4]
        return nodes + [helper.make_node("MoE", [hidden, f"{name}/router_logits", gate_up, "", down], [node.output[0]],
                                         name=name, domain="com.microsoft", **attributes)]
    gate_up, gate_up_scales, down, down_scales = node.input[2:6]
    bits = _attr(node, "bits")
    groups = {(weights[0].dims[2] * 8 // bits) // weights[1].dims[2], (weights[2].dims[2] * 8 // bits) // weights[3].dims[2]}
    if all(t.dims[2] == 1 for t in (weights[1], weights[3])):  # one scale per row: QMoE's 2-D scales
        nodes += [helper.make_node("Constant", [], [f"{name}/last"],
                                   value=helper.make_tensor("last", TensorProto.INT64, [1], [2]))]
        for scales in (gate_up_scales, down_scales):
            nodes.append(helper.make_node("Squeeze", [scales, f"{name}/last"], [f"{name}/{scales}/rows"]))
        gate_up_scales, down_scales = f"{name}/{gate_up_scales}/rows", f"{name}/{down_scales}/rows"
    elif len(groups) == 1 and (group := groups.pop()) >= 16 and group & (group - 1) == 0:
        attributes["block_size"] = group
    else:
        return None
    inputs = [hidden, f"{name}/router_logits", gate_up, gate_up_scales, "", down, down_scales]
    if not attributes["normalize_routing_weights"]:
        # ONNX Runtime 1.32's CPU QMoE renormalises the top k whatever the attribute says (MoE does
        # not); given router_weights it mixes by those: the softmax over all experts, transformers' weights.
        nodes.append(helper.make_node("Softmax", [f"{name}/router_logits"], [f"{name}/router_probs"], axis=-1))
        inputs += [""] * 7 + [f"{name}/router_probs"]
    # Accuracy level 4: int8 activations in the weights' blocks (level 0 keeps int4's float32 but is
    # measured 1.2-2.3x slower; blocked int8 has the int8 kernel only; one scale per row runs float32).
    return nodes + [helper.make_node("QMoE", inputs, [node.output[0]], name=name, domain="com.microsoft",
                                     expert_weight_bits=bits, accuracy_level=4, **attributes)]


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every MoE node that ONNX Runtime's kernels take rewritten into them, in place; the others stay
    (ONNX Runtime runs their body). Only nodes are added: the initializers are read where they are."""
    tensors = {t.name: t for t in model.graph.initializer}
    new_nodes, lowered = [], False
    for node in model.graph.node:
        kernel = _kernel(node, tensors) if node.domain == DOMAIN and node.op_type in OP_NAMES else None
        new_nodes.extend(kernel or [node])
        lowered = lowered or kernel is not None
    if not lowered:
        return model
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt. The
# parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute.
# TensorRT-RTX has no plugins: its parser inlines the body at every call.

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_IDS = tuple(f"{TENSORRT_PLUGIN_NAMESPACE}::{name}" for name in OP_NAMES)
_tensorrt_registered = False


def moe_kernel(hidden: Tensor, router_logits: Tensor, gate_up: Tensor, down: Tensor, gate_up_scales: Tensor | None,
               down_scales: Tensor | None, top_k: int, normalize: int, bits: int, out: Tensor | None = None,
               activation: int = SILU) -> Tensor:
    """The plugin's kernel: the op of facet 1 on tensors of any one device, in plain torch, reading
    nothing back to the host (the reference's loop asks which experts have tokens), so it can be
    captured in a CUDA graph: its work depends on the shapes only. At most E token-expert pairs
    (decode) it gathers each token's k experts, as the body; past that (prefill) it runs every
    expert on every token, weighted by its routing weight, zero where the expert was not chosen.
    With `out` the result is written there."""
    shape, dtype = hidden.shape, hidden.dtype
    x = hidden.reshape(-1, shape[-1])
    weights, experts = route(router_logits.reshape(x.shape[0], -1), top_k, normalize)
    weights = weights.to(dtype)

    def expert_weights(index):
        if not bits:
            return gate_up[index].to(dtype), down[index].to(dtype)
        return (dequantize(gate_up[index], gate_up_scales[index], bits).to(dtype),
                dequantize(down[index], down_scales[index], bits).to(dtype))

    if x.shape[0] * top_k <= gate_up.shape[0]:
        w1, w2 = expert_weights(experts)  # [T, k, 2I, H], [T, k, H, I]
        result = (expert_mlp(x[:, None, :], w1, w2, activation) * weights[..., None]).sum(dim=1)
    else:
        dense = torch.zeros(x.shape[0], gate_up.shape[0], dtype=dtype, device=x.device).scatter(1, experts, weights)
        result = torch.zeros_like(x)
        for e in range(gate_up.shape[0]):
            w1, w2 = expert_weights(e)
            result = result + expert_mlp(x, w1, w2, activation) * dense[:, e, None]
    result = result.view(shape)
    return result if out is None else out.copy_(result)


def register_tensorrt_plugin() -> tuple[str, ...]:
    """Register both node types with TensorRT (once per process); returns their plugin ids.

    Needed before parsing a graph and before deserializing an engine built with it: the kernel is
    the Python function below (a JIT plugin), which TensorRT calls on its stream."""
    global _tensorrt_registered
    if _tensorrt_registered:
        return TENSORRT_PLUGIN_IDS
    import tensorrt.plugin as trtp

    from trt_llm.plugins.attention import _tensorrt_as_torch

    def register(plugin_id: str, inputs: tuple[str, ...], attributes: dict[str, type]) -> None:
        def describe(*tensors, **attributes):
            # tensorrt.plugin passes the tensor descriptors by position and the attributes by name.
            return tensors[0].like()  # [..., H], the activation dtype

        def run(*args, stream):
            # The tensors, the attributes (in `attributes`' order) and the outputs by position, the
            # stream by name: the kernel on the plugin's device buffers, on TensorRT's stream.
            tensors, values, outputs = args[:len(inputs)], dict(zip(attributes, args[len(inputs):-1])), args[-1]
            with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.no_grad():
                t = dict(zip(inputs, (_tensorrt_as_torch(a) for a in tensors)))
                moe_kernel(t["hidden"], t["router_logits"], t["gate_up"], t["down"], t.get("gate_up_scales"),
                           t.get("down_scales"), values["top_k"], values["normalize"], values.get("bits", 0),
                           out=_tensorrt_as_torch(outputs[0]), activation=values.get("activation", SILU))

        # tensorrt.plugin reads the names and annotations of these functions' parameters from their signatures.
        import inspect

        def signature(kind, extra, returns=inspect.Signature.empty):
            parameters = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind) for n in inputs]
            parameters += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a)
                           for n, a in [*attributes.items(), *extra]]
            return inspect.Signature(parameters, return_annotation=returns)

        describe.__signature__ = signature(trtp.TensorDesc, [], trtp.TensorDesc)
        run.__signature__ = signature(trtp.Tensor, [("outputs", tuple[trtp.Tensor]), ("stream", int)])
        trtp.register(plugin_id)(describe)
        trtp.impl(plugin_id)(run)

    routed = {"top_k": int, "normalize": int, "activation": int}
    register(TENSORRT_PLUGIN_IDS[0], ("hidden", "router_logits", "gate_up", "down"), routed)
    register(TENSORRT_PLUGIN_IDS[1], ("hidden", "router_logits", "gate_up", "gate_up_scales", "down", "down_scales"),
             {**routed, "bits": int})
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_IDS
