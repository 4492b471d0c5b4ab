"""Quantizing an exported ONNX graph's matmuls in place: every MatMul whose second input is a float32
initializer becomes the weight-only matmul node (plugins/weight_only_matmul.py) over its
round-to-nearest blocks. The EAGLE draft's cpu engine is quantized this way at compile time
(`draft.quantization`): its graph is exported in float, and only the cpu backend quantizes it."""

from __future__ import annotations

import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.rtn import quantize_rtn
from trt_llm.plugins import weight_only_matmul as op


def quantize_matmuls(model: onnx.ModelProto, spec: QuantSpec) -> int:
    """Rewrite `model` (its weights loaded) in place; returns how many matmuls were quantized."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 2}
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    replaced = {}  # node index -> its replacement (protobuf wrappers have no stable id())
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in weights:
            continue
        tensor = weights[node.input[1]]
        in_features, out_features = tensor.dims
        if uses[tensor.name] != 1 or (spec.bits == 4 and out_features % 2):
            continue
        # MatMul's weight is [K, N]; quantize_rtn takes nn.Linear's [N, K].
        w = quantize_rtn(torch.from_numpy(numpy_helper.to_array(tensor).copy()).t(), spec, torch.float32)
        name = node.name or node.output[0]
        qweight = numpy_helper.from_array(w.qweight.numpy(), f"{name}/qweight")
        if spec.bits == 4:  # the bytes of an INT4 [K, N] (see the op's finish_export)
            qweight.data_type, qweight.dims[-1] = TensorProto.INT4, out_features
        scales = numpy_helper.from_array(w.scales.numpy(), f"{name}/scales")
        graph.initializer.extend([qweight, scales])
        graph.initializer.remove(tensor)
        replaced[index] = helper.make_node(op.OP_NAME, [node.input[0], qweight.name, scales.name], list(node.output),
                                              name=name, domain=op.DOMAIN, bits=spec.bits, group_size=w.group_size)
    nodes = [replaced.get(index, node) for index, node in enumerate(graph.node)]
    del graph.node[:]
    graph.node.extend(nodes)
    if replaced:
        op.require_opset(model)
    return len(replaced)
