"""The weight-only quantized matmul: y = x @ dequantize(W), all its facets in one file.

The weights are integers in blocks along the input dimension, each block with its own scale and,
optionally, its own integer zero point or float offset; activations stay in floating point. It is
the form every published quantized checkpoint reduces to (GPTQ, AWQ, llama.cpp's Q4_0 / Q4_1 /
Q8_0) and the one ONNX writes as a blocked DequantizeLinear, which ONNX Runtime fuses into
MatMulNBits and TensorRT parses as weight-only quantization.

Inputs (shapes; K = in features, N = out features, G = group_size, nb = ceil(K / G)):
    x            [..., K]  float activations
    qweight      [K, N]    INT4 / INT8, or UINT4 / UINT8 with zero points, or FLOAT8E4M3FN (fp8:
                           one scale per column, no zero points; the TensorRT backends). In torch
                           (facet 1) a 4-bit tensor is its ONNX bytes: uint8 [K, N/2], two values per
                           byte, the even column in the low nibble; an 8-bit one is int8 / uint8 /
                           float8_e4m3fn [K, N].
    scales       [nb, N]   the activation dtype
    zero_points  [nb, N]   optional, the type of qweight (4-bit: uint8 [nb, N/2] bytes in torch)
    offsets      [nb, N]   optional (not with zero points; K a multiple of G), the activation dtype
Attributes: bits (4 or 8; fp8 is 8), group_size (G; G = K is one scale per output column).
Output: [..., N] = x @ W, W[k, n] = (qweight[k, n] - zero_points[b, n]) * scales[b, n] + offsets[b, n]
for b = k // G (a missing zero point or offset is 0).

Offsets are llama.cpp's Q4_1 (w = q * d + m): it computes x . w as d * (x . q) + m * sum(x), and so
do the body and the lowering here: the matmul of the blocks, plus the block sums of x times the
offsets, a matmul of K / G inputs. Q4_1's q in [0, 15] are stored as q - 8 with offset m + 8d.

The layout is ONNX's own ([K, N], blocked along axis 0, as MatMul takes its second input), so the
function body is standard nodes and the bundle's bytes are what every backend reads.

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `weight_only_matmul` (`TORCH_OPS`): a torch custom op whose eager body dequantizes and multiplies.
 2. `onnx_translation` + `function_protos`: a node `trt::WeightOnlyMatMul`, `trt::ZeroPoint...` or
    `trt::Offset...` (one node type per set of inputs: TensorRT's parser wants a node to pass every
    input its function declares) whose model-local function is DequantizeLinear (opset 21:
    block_size, 4-bit types) + MatMul (+ the offsets' matmul); `finish_export` gives the exported
    4-bit initializers their ONNX type (torch has no 4-bit dtype) and the model opset 21.
 3. `lower_for_onnxruntime`: int8 with one scale per column (the TensorRT backends' int8, the EAGLE
    draft's) becomes DynamicQuantizeMatMul (faster than MatMulNBits' 8-bit kernel on a decoder
    layer's matmuls, but it quantizes the activations per tensor: with SmolLM2's outlier channels its
    perplexity on 1,024 tokens of the sonnets went from 58.2 to 97.4 that way, 58.8 with blocks of
    32 on MatMulNBits); everything else becomes the body,
    which ONNX Runtime's own QDQ fusion turns into MatMulNBits at session creation (int8 compute,
    accuracy level 4, runtime/backends/ort_engine.py). Both read the bundle's initializers as they are, so a
    quantized engine shares the bundle's weight file.
 4. `register_tensorrt_plugin`: none. TensorRT parses the body, inlined by `lower_for_tensorrt`: a
    DequantizeLinear of a constant INT4 / INT8 / FP8 weight into a MatMul is its weight-only
    quantization (its dequantize layer takes no zero points: build/compile.py refuses them for the
    TensorRT backends, and fp8 elsewhere).
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx import TensorProto, helper
from torch import Tensor

DOMAIN = "trt"
OP_NAME = "WeightOnlyMatMul"  # x, qweight, scales
ZERO_POINT_OP_NAME = "ZeroPointWeightOnlyMatMul"  # x, qweight, scales, zero_points
OFFSET_OP_NAME = "OffsetWeightOnlyMatMul"  # x, qweight, scales, offsets
OP_NAMES = (OP_NAME, ZERO_POINT_OP_NAME, OFFSET_OP_NAME)
OPSET = 21  # DequantizeLinear's block_size and the 4-bit types
_TRT = onnxscript.values.Opset(DOMAIN, 1)


def _register_schemas() -> None:
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    AttrType = onnx.defs.OpSchema.AttrType
    inputs = [Param("x", "T"), Param("qweight", "Q"), Param("scales", "T")]
    for name, extra in ((OP_NAME, []), (ZERO_POINT_OP_NAME, [Param("zero_points", "Q")]),
                        (OFFSET_OP_NAME, [Param("offsets", "T")])):
        if onnx.defs.has(name, DOMAIN):
            continue
        onnx.defs.register_schema(onnx.defs.OpSchema(
            name, DOMAIN, 1,
            doc="y = x @ dequantize(qweight): blocked weight-only matmul (see trt_llm.plugins.weight_only_matmul).",
            inputs=inputs + extra,
            outputs=[Param("y", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "activations"),
                              ("Q", ["tensor(int4)", "tensor(uint4)", "tensor(int8)", "tensor(uint8)",
                                     "tensor(float8e4m3fn)"], "weights")],
            attributes=[Attr("bits", AttrType.INT, "4 or 8"), Attr("group_size", AttrType.INT, "rows per scale")],
        ))


_register_schemas()


# ---------------------------------------------------------------------------------------------------
# Packing (ONNX's 4-bit layout: row-major, two values per byte, the first in the low nibble).


def pack_int4(values: Tensor) -> Tensor:
    """[R, C] integers in [-8, 7] or [0, 15] (C even) -> their ONNX bytes uint8 [R, C/2]."""
    nibbles = (values.to(torch.int16) & 0xF).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def unpack_int4(packed: Tensor, signed: bool) -> Tensor:
    """pack_int4's inverse: uint8 [R, C/2] -> int16 [R, C]."""
    low, high = (packed & 0xF).to(torch.int16), (packed >> 4).to(torch.int16)
    values = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)
    return values - 16 * (values >= 8).to(torch.int16) if signed else values


def unpacked(qweight: Tensor, zero_points: Tensor | None, bits: int) -> tuple[Tensor, Tensor | None]:
    """The integer values of qweight [K, N] and of the zero points [nb, N] (int16); fp8's values
    in float32."""
    if qweight.dtype == torch.float8_e4m3fn:
        return qweight.float(), None
    if bits == 4:
        return (unpack_int4(qweight, signed=zero_points is None),
                None if zero_points is None else unpack_int4(zero_points, signed=False))
    return qweight.to(torch.int16), None if zero_points is None else zero_points.to(torch.int16)


def dequantize(qweight: Tensor, scales: Tensor, zero_points: Tensor | None, bits: int, group_size: int,
               offsets: Tensor | None = None) -> Tensor:
    """W [K, N] in the scales' dtype, computed in float32 (as DequantizeLinear does)."""
    q, zero = unpacked(qweight, zero_points, bits)
    rows = q.shape[0]
    if zero is not None:
        q = q - zero.repeat_interleave(group_size, dim=0)[:rows]
    w = q.float() * scales.float().repeat_interleave(group_size, dim=0)[:rows]
    if offsets is not None:
        w = w + offsets.float().repeat_interleave(group_size, dim=0)[:rows]
    return w.to(scales.dtype)


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference.


@torch.library.custom_op("trt_llm::weight_only_matmul", mutates_args=())
def weight_only_matmul(x: Tensor, qweight: Tensor, scales: Tensor, zero_points: Tensor | None,
                       offsets: Tensor | None, bits: int, group_size: int) -> Tensor:
    return torch.matmul(x, dequantize(qweight, scales, zero_points, bits, group_size, offsets).to(x.dtype))


@weight_only_matmul.register_fake
def _weight_only_matmul_fake(x, qweight, scales, zero_points, offsets, bits, group_size):
    return x.new_empty(*x.shape[:-1], scales.shape[1])


TORCH_OPS = (torch.ops.trt_llm.weight_only_matmul.default,)


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face: our node, and DequantizeLinear + MatMul as its function body.


def onnx_translation(x, qweight, scales, zero_points, offsets, bits: int,
                     group_size: int) -> onnxscript.onnx_types.FLOAT:
    # The return annotation matters: without it the exporter infers zero outputs.
    if zero_points is not None and offsets is not None:
        raise ValueError("a weight-only matmul takes zero points or offsets, not both")
    if zero_points is not None:
        return _TRT.ZeroPointWeightOnlyMatMul(x, qweight, scales, zero_points, bits=bits, group_size=group_size)
    if offsets is not None:
        return _TRT.OffsetWeightOnlyMatMul(x, qweight, scales, offsets, bits=bits, group_size=group_size)
    return _TRT.WeightOnlyMatMul(x, qweight, scales, bits=bits, group_size=group_size)


def _body(x: str, operands: list[str], offsets: str, y: str, prefix: str, group_size,
          per_column: bool = False) -> list[onnx.NodeProto]:
    """The nodes of the op: DequantizeLinear + MatMul, plus sum-over-blocks(x) @ offsets.

    group_size: an int, or an AttributeProto referring to the function's attribute. per_column (one
    scale per column, no zero points): the dequantize per channel (axis 1, scales [N]) instead of
    one block of K, the form TensorRT takes for int8 and fp8 weights (it blocks 4-bit types only).
    Every node is named (prefix + its role): TensorRT's parser names an unnamed one after its output."""
    def node(op_type, inputs, output, role, **attributes):
        return helper.make_node(op_type, inputs, [output], name=f"{prefix}{role}", **attributes)

    def const(role, values):
        return node("Constant", [], f"{prefix}{role}", role,
                    value=helper.make_tensor(role, TensorProto.INT64, [len(values)], values))

    weight = f"{prefix}weight"
    if per_column:
        qweight, scales = operands
        return [const("axes", [0]), node("Squeeze", [scales, f"{prefix}axes"], f"{prefix}column_scales", "squeeze"),
                node("DequantizeLinear", [qweight, f"{prefix}column_scales"], weight, "dequantize", axis=1),
                node("MatMul", [x, weight], y, "matmul")]
    dequantize_node = node("DequantizeLinear", operands, weight, "dequantize", axis=0)
    if isinstance(group_size, int):
        dequantize_node.attribute.append(helper.make_attribute("block_size", group_size))
    else:
        dequantize_node.attribute.append(group_size)
    if not offsets:
        return [dequantize_node, node("MatMul", [x, weight], y, "matmul")]
    p = prefix
    group = helper.make_node("Constant", [], [f"{p}group_scalar"], name=f"{p}group_scalar")
    if isinstance(group_size, int):
        group.attribute.append(helper.make_attribute("value_int", group_size))
    else:
        group.attribute.append(onnx.AttributeProto(name="value_int", ref_attr_name=group_size.ref_attr_name,
                                                   type=onnx.AttributeProto.INT))
    return [
        dequantize_node, node("MatMul", [x, weight], f"{p}blocks_product", "matmul"),
        # x [..., K] -> [..., K / G, G] -> the sum of each block [..., K / G], @ offsets [K / G, N]
        node("Shape", [x], f"{p}leading", "leading", start=0, end=-1), const("last", [-1]),
        group, const("first", [0]), node("Unsqueeze", [f"{p}group_scalar", f"{p}first"], f"{p}group", "group"),
        node("Concat", [f"{p}leading", f"{p}last", f"{p}group"], f"{p}block_shape", "block_shape", axis=0),
        node("Reshape", [x, f"{p}block_shape"], f"{p}x_blocks", "x_blocks"),
        node("ReduceSum", [f"{p}x_blocks", f"{p}last"], f"{p}block_sums", "block_sums", keepdims=0),
        node("MatMul", [f"{p}block_sums", offsets], f"{p}offsets_product", "offsets_matmul"),
        node("Add", [f"{p}blocks_product", f"{p}offsets_product"], y, "add"),
    ]


def _function_proto(name: str, operands: list[str], offsets: str = "") -> onnx.FunctionProto:
    group_size = onnx.AttributeProto(name="block_size", ref_attr_name="group_size", type=onnx.AttributeProto.INT)
    inputs = ["x", *operands] + ([offsets] if offsets else [])
    return helper.make_function(DOMAIN, name, inputs, ["y"], _body("x", operands, offsets, "y", "", group_size),
                                [helper.make_opsetid("", OPSET)], attributes=["bits", "group_size"])


def function_protos() -> list[onnx.FunctionProto]:
    return [_function_proto(OP_NAME, ["qweight", "scales"]),
            _function_proto(ZERO_POINT_OP_NAME, ["qweight", "scales", "zero_points"]),
            _function_proto(OFFSET_OP_NAME, ["qweight", "scales"], "offsets")]


def _nodes(model: onnx.ModelProto) -> dict[int, onnx.NodeProto]:
    """This op's nodes by their index in the graph (protobuf wrappers have no stable id())."""
    return {i: n for i, n in enumerate(model.graph.node) if n.domain == DOMAIN and n.op_type in OP_NAMES}


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def finish_export(model: onnx.ModelProto) -> None:
    """After torch.onnx.export, in place: a 4-bit weight was exported as its bytes (uint8 [R, C/2]);
    it becomes the INT4 / UINT4 [R, C] initializer those bytes already are. The model then needs
    opset 21, which changes nothing else it uses (opsets 19-21 only add types to the ops it has)."""
    nodes = _nodes(model)
    if not nodes:
        return
    initializers = {t.name: t for t in model.graph.initializer}
    for node in nodes.values():
        if _attr(node, "bits") != 4:
            continue
        signed = node.op_type != ZERO_POINT_OP_NAME
        for index, data_type in ((1, TensorProto.INT4 if signed else TensorProto.UINT4), (3, TensorProto.UINT4)):
            if index >= len(node.input) or not node.input[index]:
                continue
            tensor = initializers.get(node.input[index])
            if tensor is None:
                raise ValueError(f"{OP_NAME} node {node.name!r}: input {node.input[index]!r} is not an initializer")
            if tensor.data_type == TensorProto.UINT8:  # not yet retyped (a node may share it)
                tensor.data_type = data_type
                tensor.dims[-1] *= 2
    require_opset(model)


def require_opset(model: onnx.ModelProto) -> None:
    """The model and its functions at opset 21 or later, in place (a function imports its model's)."""
    for opsets in [model.opset_import, *(f.opset_import for f in model.functions)]:
        for opset in opsets:
            if opset.domain in ("", "ai.onnx"):
                opset.version = max(opset.version, OPSET)


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering.


def _inlined(node: onnx.NodeProto, per_column: bool = False) -> list[onnx.NodeProto]:
    """The node as its function body, in the graph itself, with names of its own."""
    name = node.name or node.output[0]
    operands = list(node.input[1:4 if node.op_type == ZERO_POINT_OP_NAME else 3])
    offsets = node.input[3] if node.op_type == OFFSET_OP_NAME else ""
    return _body(node.input[0], operands, offsets, node.output[0], f"{name}/", _attr(node, "group_size"),
                 per_column and node.op_type == OP_NAME)


def _one_scale_per_column(node: onnx.NodeProto, tensors: dict[str, onnx.TensorProto]) -> bool:
    """An 8-bit weight with one scale per column (4-bit ones stay blocks: TensorRT's int4 is)."""
    scale = tensors.get(node.input[2])
    return _attr(node, "bits") == 8 and scale is not None and scale.dims[0] == 1


def _replace(model: onnx.ModelProto, replaced: dict[int, list[onnx.NodeProto]]) -> None:
    """Node i of the graph replaced by the nodes replaced[i]."""
    new_nodes = []
    for index, node in enumerate(model.graph.node):
        new_nodes.extend(replaced.get(index, [node]))
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every weight-only node for ONNX Runtime's CPU kernels, in place (see facet 3 in the
    module docstring). Only nodes are added: the initializers are read where they are."""
    nodes = _nodes(model)
    if not nodes:
        return model
    tensors = {t.name: t for t in model.graph.initializer}
    replaced = {}
    for index, node in nodes.items():
        x, qweight, scales = node.input[:3]
        name, y = node.name or node.output[0], node.output[0]
        # DynamicQuantizeMatMul takes float32 activations only.
        per_column = _one_scale_per_column(node, tensors) and tensors[scales].data_type == TensorProto.FLOAT
        if per_column and node.op_type == OP_NAME and tensors[qweight].data_type == TensorProto.INT8:
            axes = f"{name}/axes"
            replaced[index] = [
                helper.make_node("Constant", [], [axes], value=helper.make_tensor("axes", TensorProto.INT64, [1], [0])),
                helper.make_node("Squeeze", [scales, axes], [f"{name}/column_scales"]),
                helper.make_node("DynamicQuantizeMatMul", [x, qweight, f"{name}/column_scales"], [y],
                                 name=name, domain="com.microsoft"),
            ]
        else:
            replaced[index] = _inlined(node)
    _replace(model, replaced)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: TensorRT parses the body (weight-only quantization); no plugin to register.


def register_tensorrt_plugin() -> tuple[str, ...]:
    return ()


def lower_for_tensorrt(model: onnx.ModelProto) -> bool:
    """Every weight-only node inlined as its body before TensorRT parses the graph, in place; True
    when there were any. (TensorRT's parser inlines a function under the same layer names at every
    call, and its dequantize layer refuses a name already taken.) One scale per column becomes a
    per-channel dequantize: TensorRT's block quantization is for 4-bit types only."""
    nodes = _nodes(model)
    tensors = {t.name: t for t in model.graph.initializer}
    _replace(model, {index: _inlined(node, _one_scale_per_column(node, tensors)) for index, node in nodes.items()})
    return bool(nodes)
