"""Which MatMulNBits nodes our kernel takes, and the swap (the node keeps its inputs and attributes)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

DOMAIN = "trt_llm.cpu"
OP = "MatMulBlocks8"
ACCURACY_LEVEL = 4  # int8 activations per block of 32: what the kernel computes


def takes(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A MatMulNBits the kernel computes as it does: 4 or 8 bits in blocks of 32 or a multiple of it (the
    activations then round per 32, finer than MatMulNBits' per block), no zero points, group index or bias,
    accuracy level 4 (a test's level 1 stays MatMulNBits'), K a multiple of 32 (of the block or not: the
    last block padded), N of 8, float32 scales, and constant weights."""
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    block = attributes.get("block_size", 0)
    if (attributes.get("bits") not in (4, 8) or not block or block % 32
            or attributes.get("accuracy_level") != ACCURACY_LEVEL
            or attributes.get("K", 0) % 32 or attributes.get("N", 1) % 8):
        return False
    if len(node.input) < 3 or any(node.input[3:]):
        return False
    weights, scales = initializers.get(node.input[1]), initializers.get(node.input[2])
    return (weights is not None and scales is not None and weights.data_type == TensorProto.UINT8
            and scales.data_type == TensorProto.FLOAT)


def swap_matmuls(model: onnx.ModelProto) -> int:
    """Swap every node `takes` accepts for ours, in place (a Loop's or If's body too); how many."""
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
    return swapped
