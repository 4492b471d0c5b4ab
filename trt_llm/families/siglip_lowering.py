"""SigLIP's encoder layers (trt_llm/families/siglip.py) rewritten onto ONNX Runtime's fused CPU
kernels, in place: the cpu backend's lowering of a vision graph (build/cpu_backend.py).

The portable graph spells each layer out as the exporter wrote it, and ONNX Runtime's own fusions
take no GELU and no attention of it. Per layer:

- attention: q / k / v reshaped to heads and transposed, q k^T, the scale, the softmax, the
  product with v and the transposes back become one com.microsoft.MultiHeadAttention over the
  [F, L, H * D] projections, their biases its `bias` input (a Concat of the three, folded when the
  session loads): no head transposes, no separate scale and softmax passes over [F, H, L, L];
- the MLP's tanh GELU (eight elementwise nodes, each a pass over [F, L, 4 D]) and fc1's bias Add
  become one com.microsoft.FastGelu.

Measured on SmolVLM2-256M's tower widths (2 layers, 512-pixel frames; one thread, its CPU time,
interleaved runs on a shared 2-core AMD EPYC, ONNX Runtime 1.32), 17 frames, best of 3: 7259 ms
unfused, 7100 with the attention, 7021 with the GELU, 6958 with both (-4.1%); 5 frames, median of
7: 2090, 2065, 2040, 2029 ms (-2.9%). The residual Add + LayerNorm are left as they are:
com.microsoft.SkipLayerNormalization measured 4.5x slower than Add + LayerNormalization on
[5, 1024, 768] (20.6 against 4.5 ms; it does not use a second thread either), and fusing them
took back half of the gain (7106 ms; 2109 ms, slower than none).

Only nodes the exporter recorded as inside siglip.py's modules are rewritten (its namespace
metadata), and only where the whole pattern is there: anything else is left as it was. The
arithmetic is the same up to float32 rounding (tests/test_siglip_lowering.py: transformers'
encoder within 1e-5).
"""

from __future__ import annotations

import math

import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"
SCOPE = "trt_llm.families.siglip."  # the exporter's namespace for the modules of siglip.py


class _Graph:
    """The maps a rewrite needs: producers, consumers, constants, shapes."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.graph = model, model.graph
        self.nodes = list(self.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in self.graph.output}
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.constants = dict(self.initializers)
        for node in self.nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t
        # each value's shape where the exporter recorded it: dims as ints, or names for dynamic ones
        self.shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
                       for v in [*self.graph.value_info, *self.graph.input, *self.graph.output]
                       if v.type.tensor_type.HasField("shape")}
        self.removed: set[int] = set()
        self.replaced: dict[int, onnx.NodeProto] = {}

    def value(self, name: str):
        """A small constant's values (one held in the graph, not in the external weights), else None."""
        tensor = self.constants.get(name)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)

    def scalar(self, name: str):
        value = self.value(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def made_by(self, name: str, op_type: str, *, only_use: onnx.NodeProto | None = None):
        """The node of type `op_type` that makes `name`, if it does and is ours to remove: inside
        siglip.py's modules, not yet taken, and (only_use) `name` read by that node alone."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx") or id(node) in self.removed:
            return None
        if not _in_scope(node):
            return None
        if only_use is not None and (name in self.outputs or [id(n) for n in self.consumers.get(name, [])] != [id(only_use)]):
            return None
        return node

    def other(self, node: onnx.NodeProto, name: str) -> str:
        """The other input of a two-input node."""
        return node.input[1] if node.input[0] == name else node.input[0]

    def commit(self) -> None:
        nodes = []
        for node in self.nodes:
            if id(node) in self.replaced:
                nodes.append(self.replaced[id(node)])
            elif id(node) not in self.removed:
                nodes.append(node)
        # what only the removed nodes read (the Reshapes' computed targets): dropped too
        while True:
            read = {name for node in nodes for name in node.input} | self.outputs
            dead = {id(n) for n in nodes if (_in_scope(n) or n.op_type == "Constant") and not read & set(n.output)}
            if not dead:
                break
            nodes = [n for n in nodes if id(n) not in dead]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        if not any(o.domain == MS for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(MS, 1))


def _in_scope(node: onnx.NodeProto) -> bool:
    return any(p.key == "namespace" and SCOPE in p.value for p in node.metadata_props)


def _attribute(node: onnx.NodeProto, name: str, default=None):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _perm(node, perm) -> bool:
    return node is not None and list(_attribute(node, "perm", [])) == perm


def lower_for_onnxruntime(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite `model`'s SigLIP layers in place; returns how many of each fusion were made."""
    made = {}
    for name, fuse in (("MultiHeadAttention", _fuse_attention), ("FastGelu", _fuse_gelu)):
        graph = _Graph(model)
        made[name] = fuse(graph)
        if made[name]:
            graph.commit()
    return made


def _heads(graph: _Graph, transpose, perm):
    """(the [F, L, H * D] tensor, H, D, the nodes) that `transpose` (perm) reads through a Reshape to
    [F, L, H, D], or None. The shapes are the exporter's records (value_info): the Reshape's target
    is a constant where L is static, computed in the graph where it is not."""
    if not _perm(transpose, perm):
        return None
    reshape = graph.made_by(transpose.input[0], "Reshape", only_use=transpose)
    heads = reshape and graph.shapes.get(reshape.output[0])
    source = reshape and graph.shapes.get(reshape.input[0])
    if not heads or not source or len(heads) != 4 or len(source) != 3 or heads[:2] != source[:2]:
        return None
    if not all(isinstance(n, int) and n > 0 for n in heads[2:]) or source[2] != heads[2] * heads[3]:
        return None
    return reshape.input[0], heads[2], heads[3], (reshape, transpose)


def _fuse_attention(graph: _Graph) -> int:
    count = 0
    for softmax in graph.nodes:
        if softmax.op_type != "Softmax" or not _in_scope(softmax) or _attribute(softmax, "axis", -1) not in (-1, 3):
            continue
        scaled = graph.made_by(softmax.input[0], "Mul", only_use=softmax)
        scores = scaled and next((graph.made_by(i, "MatMul", only_use=scaled) for i in scaled.input
                                  if graph.producer.get(i) is not None and graph.producer[i].op_type == "MatMul"), None)
        scale = scores and graph.scalar(graph.other(scaled, scores.output[0]))
        readers = graph.consumers.get(softmax.output[0], [])
        product = readers[0] if len(readers) == 1 and readers[0].op_type == "MatMul" else None
        if not scale or product is None or product.input[0] != softmax.output[0] or softmax.output[0] in graph.outputs:
            continue
        q = _heads(graph, graph.made_by(scores.input[0], "Transpose", only_use=scores), [0, 2, 1, 3])
        k = _heads(graph, graph.made_by(scores.input[1], "Transpose", only_use=scores), [0, 2, 3, 1])
        v = _heads(graph, graph.made_by(product.input[1], "Transpose", only_use=product), [0, 2, 1, 3])
        after = graph.consumers.get(product.output[0], [])
        back = after[0] if len(after) == 1 and _perm(after[0], [0, 2, 1, 3]) else None
        merged = graph.consumers.get(back.output[0], []) if back is not None else []
        merge = merged[0] if len(merged) == 1 and merged[0].op_type == "Reshape" else None
        if None in (q, k, v, merge) or len({(h, d) for _, h, d, _ in (q, k, v)}) != 1:
            continue
        if product.output[0] in graph.outputs or back.output[0] in graph.outputs or len(graph.shapes.get(merge.output[0], [])) != 3:
            continue
        heads = q[1]
        inputs, biases = [], []
        for source, *_ in (q, k, v):  # each projection's bias Add, when it is a vector of its own
            add = graph.made_by(source, "Add")
            bias = add and next((i for i in add.input if i in graph.initializers
                                 and list(graph.initializers[i].dims) == [q[1] * q[2]]), None)
            if bias and len(graph.consumers.get(source, [])) == 1 and source not in graph.outputs:
                inputs.append(graph.other(add, bias))
                biases.append((bias, add))
            else:
                inputs.append(source)
        taken = [softmax, scaled, scores, product, back, merge, *q[3], *k[3], *v[3]]
        if len(biases) == 3:
            concat = helper.make_node("Concat", [b for b, _ in biases], [merge.output[0] + "/qkv_bias"], axis=0,
                                      name=merge.output[0] + "/qkv_bias")
            attention = helper.make_node("MultiHeadAttention", [*inputs, concat.output[0]], [merge.output[0]],
                                         domain=MS, name=merge.output[0] + "/mha", num_heads=heads, scale=scale)
            taken += [add for _, add in biases]
            graph.replaced[id(biases[0][1])] = concat  # the Concat stands where q's bias Add stood
            taken.remove(biases[0][1])
        else:
            inputs = [source for source, *_ in (q, k, v)]
            attention = helper.make_node("MultiHeadAttention", inputs, [merge.output[0]], domain=MS,
                                         name=merge.output[0] + "/mha", num_heads=heads, scale=scale)
        graph.replaced[id(merge)] = attention
        taken.remove(merge)
        graph.removed.update(id(n) for n in taken)
        count += 1
    return count


GELU = {"cube": 3.0, "coefficient": 0.044715, "sqrt_2_over_pi": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}


def _fuse_gelu(graph: _Graph) -> int:
    """x * (0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))), as the exporter writes
    transformers' gelu_pytorch_tanh, in any operand order."""
    count = 0

    def close(value, key):
        return value is not None and abs(value - GELU[key]) <= 1e-6 * abs(GELU[key])

    def scaled_by(node, key, op_type="Mul"):
        """(node, its non-constant input) when `node` is op_type with the constant GELU[key]."""
        if node is None or node.op_type != op_type or len(node.input) != 2:
            return None
        for i, name in enumerate(node.input):
            if close(graph.scalar(name), key):
                return node.input[1 - i]
        return None

    for tanh in graph.nodes:
        if tanh.op_type != "Tanh" or not _in_scope(tanh):
            continue
        inner = graph.made_by(tanh.input[0], "Mul", only_use=tanh)  # sqrt(2/pi) * (x + c x^3)
        cubic_sum = inner and graph.made_by(scaled_by(inner, "sqrt_2_over_pi") or "", "Add", only_use=inner)
        if cubic_sum is None:
            continue
        chain = None
        for x_name in cubic_sum.input:
            term = graph.made_by(graph.other(cubic_sum, x_name), "Mul", only_use=cubic_sum)
            power = term and graph.made_by(scaled_by(term, "coefficient") or "", "Pow", only_use=term)
            if power is not None and power.input[0] == x_name and close(graph.scalar(power.input[1]), "cube"):
                chain = (x_name, power, term)
        users = graph.consumers.get(tanh.output[0], [])
        plus_one = users[0] if len(users) == 1 and scaled_by(users[0], "one", "Add") == tanh.output[0] else None
        users = graph.consumers.get(plus_one.output[0], []) if plus_one is not None else []
        half = users[0] if len(users) == 1 and scaled_by(users[0], "half") == plus_one.output[0] else None
        users = graph.consumers.get(half.output[0], []) if half is not None else []
        final = users[0] if len(users) == 1 and users[0].op_type == "Mul" else None
        if chain is None or final is None or graph.other(final, half.output[0]) != chain[0]:
            continue
        if any(name in graph.outputs for name in (tanh.output[0], plus_one.output[0], half.output[0])):
            continue
        x, power, term = chain
        inputs = [x]
        biased = graph.made_by(x, "Add")
        bias = biased and next((i for i in biased.input if i in graph.initializers
                                and len(graph.initializers[i].dims) == 1), None)
        taken = [power, term, cubic_sum, inner, tanh, plus_one, half]
        if bias and sorted(id(n) for n in graph.consumers.get(x, [])) == sorted(id(n) for n in (power, cubic_sum, final)) \
                and x not in graph.outputs:
            inputs = [graph.other(biased, bias), bias]
            taken.append(biased)
        graph.replaced[id(final)] = helper.make_node("FastGelu", inputs, [final.output[0]], domain=MS,
                                                     name=final.output[0] + "/fast_gelu")
        graph.removed.update(id(n) for n in taken)
        count += 1
    return count
