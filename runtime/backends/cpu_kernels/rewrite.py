"""Which of ONNX Runtime's nodes our kernels take, and the swap: MatMulNBits -> MatMulBlocks8 (the node keeps
its inputs and attributes), QMoE as plugins/moe.py lowers it -> MoEBlocks8."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

DOMAIN = "trt_llm.cpu"
OP = "MatMulBlocks8"
MOE_OP = "MoEBlocks8"
ACCURACY_LEVEL = 4  # int8 activations per block of 32: what the kernel computes


def takes(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A MatMulNBits the kernel computes as it does: 4 or 8 bits in blocks of 32 or a multiple of it (the
    activations then round per 32, finer than MatMulNBits' per block), no zero points, group index or bias,
    accuracy level 4 (a test's level 1 stays MatMulNBits'), N a multiple of 8, float32 scales, and
    constant weights."""
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    block = attributes.get("block_size", 0)
    if (attributes.get("bits") not in (4, 8) or not block or block % 32
            or attributes.get("accuracy_level") != ACCURACY_LEVEL
            or attributes.get("K", 0) % block or attributes.get("N", 1) % 8):
        return False
    if len(node.input) < 3 or any(node.input[3:]):
        return False
    weights, scales = initializers.get(node.input[1]), initializers.get(node.input[2])
    return (weights is not None and scales is not None and weights.data_type == TensorProto.UINT8
            and scales.data_type == TensorProto.FLOAT)


def takes_moe(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A QMoE as plugins/moe.py writes it that the kernel computes as it does: SwiGLU experts of 4 or 8
    bits in blocks of a multiple of 32 (block_size; per-row scales have none), no biases, accuracy level 4,
    constant weights; a router_probs input only as the lowering adds it (the softmax: unnormalised weights)."""
    if node.op_type != "QMoE" or node.domain != "com.microsoft":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (attributes.get("expert_weight_bits") not in (4, 8) or attributes.get("block_size", 0) % 32
            or not attributes.get("block_size") or attributes.get("activation_type") != b"swiglu"
            or attributes.get("swiglu_fusion") != 1 or attributes.get("activation_alpha", 1.0) != 1.0
            or attributes.get("activation_beta", 0.0) != 0.0 or attributes.get("accuracy_level") != ACCURACY_LEVEL):
        return False
    inputs = list(node.input) + [""] * (15 - len(node.input))
    if len(node.input) > 15 or inputs[4] or any(inputs[7:14]):
        return False
    weights = [initializers.get(name) for name in (inputs[2], inputs[3], inputs[5], inputs[6])]
    return (all(w is not None and len(w.dims) == 3 for w in weights)
            and [w.data_type for w in weights] == [TensorProto.UINT8, TensorProto.FLOAT] * 2)


def _as_moe_blocks(node: onnx.NodeProto) -> None:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (15 - len(node.input))
    # ONNX Runtime 1.32's QMoE renormalises the top k unless given router_probs (plugins/moe.py)
    normalize = 0 if inputs[14] else 1
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute("k", attributes["k"]), helper.make_attribute("normalize", normalize),
                           helper.make_attribute("bits", attributes["expert_weight_bits"]),
                           helper.make_attribute("block_size", attributes["block_size"])])
    del node.input[:]
    node.input.extend([inputs[0], inputs[1], inputs[2], inputs[3], inputs[5], inputs[6]])
    node.op_type, node.domain = MOE_OP, DOMAIN


def swap_matmuls(model: onnx.ModelProto) -> int:
    """Swap every node `takes` or `takes_moe` accepts for ours, in place (a Loop's or If's body too); how many."""
    swapped = _swap(model.graph, {})
    if swapped and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return swapped


def _swap(graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto]) -> int:
    initializers = {**outer, **{t.name: t for t in graph.initializer}}
    swapped = 0
    for node in graph.node:
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                swapped += _swap(body, initializers)
        if takes(node, initializers):
            kept = [a for a in node.attribute if a.name in ("K", "N", "bits", "block_size")]
            del node.attribute[:]
            node.attribute.extend(kept)
            del node.input[3:]
            node.op_type, node.domain = OP, DOMAIN
            swapped += 1
        elif takes_moe(node, initializers):
            _as_moe_blocks(node)
            swapped += 1
    return swapped
