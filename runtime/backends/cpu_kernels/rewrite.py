"""Which nodes our kernels take, and the swaps: MatMulNBits -> MatMulBlocks8 (the node keeps its inputs and
attributes; a Q4_1 file's offsets, which our lowering adds in six nodes beside it, folded in),
GroupQueryAttention -> CachedAttention (the inputs our lowering gives it, compacted), a float32 MoE ->
MixtureOfExperts (its four inputs), a gated MLP's Split + silu + Mul -> SwiGLU (the three, or four, nodes one)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

DOMAIN = "trt_llm.cpu"
OP = "MatMulBlocks8"
ATTENTION_OP = "CachedAttention"
# GroupQueryAttention's attributes CachedAttention computes, and those it takes only at these values (an
# optimised graph spells out every default); others, or other values: the node is left to ONNX Runtime
ATTENTION_ATTRIBUTES = {"num_heads", "kv_num_heads", "scale", "local_window_size", "softcap"}
ATTENTION_FIXED = {"do_rotary": (1,), "rotary_interleaved": (0,), "causal": (1,), "smooth_softmax": (-1, 0),
                   "sliding_window_cache": (0,), "qk_output": (0,), "k_quant_type": (b"NONE",),
                   "v_quant_type": (b"NONE",)}
ATTENTION_IGNORED = {"qk_norm_epsilon"}  # (of q/k norm weights, inputs it is never given)
# its inputs, as plugins/attention.lower_for_onnxruntime gives them: (index, required), in CachedAttention's
# order; total_sequence_length (6: the capacity, which the cache's shape says) is dropped, the rest are empty
ATTENTION_INPUTS = ((0, True), (3, True), (4, True), (5, True), (7, True), (8, True), (9, True), (16, True),
                    (10, False))
DROPPED_INPUTS = {6}
ACCURACY_LEVEL = 4  # int8 activations per block of 32: what the kernel computes
MOE_OP = "MixtureOfExperts"
SWIGLU_OP = "SwiGLU"
# ONNX Runtime's MoE attributes as plugins/moe.lower_for_onnxruntime writes them for SwiGLU experts: the
# values MixtureOfExperts computes (k and normalize_routing_weights it takes, whatever they are)
MOE_FIXED = {"activation_type": b"swiglu", "swiglu_fusion": 1, "activation_alpha": 1.0, "activation_beta": 0.0,
             "use_sparse_mixer": 0}


def takes(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A MatMulNBits the kernel computes as it does: 4 or 8 bits in blocks of 32 or a multiple of it (the
    activations then round per 32, finer than MatMulNBits' per block), no zero points, group index or bias,
    accuracy level 4 (a test's level 1 stays MatMulNBits'), K a multiple of 32 (of the block or not: the
    last block padded), N of 8, float32 scales (or fp16 ones widened by a Cast: `initializers` maps its
    output to them, half_scales), and constant weights."""
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
            and scales.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16))


def half_scales(graph: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> dict[str, str]:
    """{a Cast's output: its input} for each Cast that widens an fp16 initializer to float32 (a 4-bit
    matmul's scales as the build stores them: build/cpu_backend.HALF_SCALES_SUFFIX)."""
    return {n.output[0]: n.input[0] for n in graph.node
            if n.op_type == "Cast" and n.input[0] in initializers
            and initializers[n.input[0]].data_type == TensorProto.FLOAT16
            and any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute)}


def swap_matmuls(model: onnx.ModelProto) -> int:
    """Swap every node `takes` accepts for ours, in place (a Loop's or If's body too), and fold the offsets
    beside them (fold_offsets); how many swapped."""
    swapped = _swap(model.graph, {})
    if swapped:
        fold_offsets(model.graph)
    if swapped:
        _import_domain(model)
    return swapped


def _swap(graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto]) -> int:
    initializers = {**outer, **{t.name: t for t in graph.initializer}}
    halves = half_scales(graph, initializers)
    seen = {**initializers, **{cast: initializers[half] for cast, half in halves.items()}}
    swapped = 0
    for node in graph.node:
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                swapped += _swap(body, initializers)
        if takes(node, seen):
            kept = [a for a in node.attribute if a.name in ("K", "N", "bits", "block_size")]
            del node.attribute[:]
            node.attribute.extend(kept)
            del node.input[3:]
            node.input[2] = halves.get(node.input[2], node.input[2])  # (the kernel reads fp16 scales itself)
            node.op_type, node.domain = OP, DOMAIN
            swapped += 1
    if halves:  # the Casts no node reads any more
        read = _names_read(graph.node) | {o.name for o in graph.output}
        kept_nodes = [n for n in graph.node if not (n.output and n.output[0] in halves and n.output[0] not in read)]
        del graph.node[:]
        graph.node.extend(kept_nodes)
    return swapped


def _import_domain(model: onnx.ModelProto) -> None:
    """Our ops' domain in the model's opset imports, once."""
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def _names_read(nodes) -> set[str]:
    """Every name `nodes` read, those of their Loop and If bodies included."""
    read = set()
    for node in nodes:
        read.update(node.input)
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                read |= _names_read(body.node)
    return read


def takes_attention(node: onnx.NodeProto, float_values: set[str]) -> bool:
    """A GroupQueryAttention as our lowering writes it (packed qkv, a cache bound in place, rotary in the op
    with its tables and positions, query lengths), in float32, with no attribute CachedAttention lacks."""
    if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if not set(attributes) <= ATTENTION_ATTRIBUTES | set(ATTENTION_FIXED) | ATTENTION_IGNORED:
        return False
    if attributes.get("do_rotary") != 1 or any(attributes[name] not in values
                                                for name, values in ATTENTION_FIXED.items() if name in attributes):
        return False
    inputs = list(node.input) + [""] * (17 - len(node.input))
    used = {index for index, _ in ATTENTION_INPUTS} | DROPPED_INPUTS
    if len(node.input) > 17 or any(name for i, name in enumerate(inputs) if i not in used):
        return False
    if not all(inputs[i] for i, required in ATTENTION_INPUTS if required):
        return False
    return node.input[3] in float_values


def swap_attention(model: onnx.ModelProto, threads: int = 0) -> int:
    """Swap every GroupQueryAttention `takes_attention` accepts for CachedAttention, in place; how many.
    threads: the session's intra-op threads (0: unknown), which the kernel cuts its work for."""
    graph = model.graph
    float_values = {v.name for v in (*graph.input, *graph.output, *graph.value_info)
                    if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    swapped = 0
    for node in graph.node:
        if not takes_attention(node, float_values):
            continue
        inputs = list(node.input) + [""] * (17 - len(node.input))
        compact = [inputs[i] for i, _ in ATTENTION_INPUTS]
        if not compact[-1]:
            compact.pop()
        kept = [a for a in node.attribute if a.name in ATTENTION_ATTRIBUTES]
        del node.attribute[:]
        node.attribute.extend(kept)
        if threads > 0:
            node.attribute.append(helper.make_attribute("threads", threads))
        del node.input[:]
        node.input.extend(compact)
        node.op_type, node.domain = ATTENTION_OP, DOMAIN
        swapped += 1
    if swapped:
        _import_domain(model)
    return swapped


def takes_moe(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A float32 MoE of SwiGLU experts (gate and up rows interleaved) as our lowering writes it: hidden, router
    logits, gate_up [E, 2I, H] and down [E, H, I] float32 initializers, no biases or third matrix, H and I
    multiples of 16."""
    if node.op_type != "MoE" or node.domain != "com.microsoft":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if not set(attributes) <= set(MOE_FIXED) | {"k", "normalize_routing_weights"} or attributes.get("k", 0) < 1:
        return False
    if any(name in attributes and attributes[name] != value for name, value in MOE_FIXED.items()):
        return False
    if "activation_type" not in attributes or attributes.get("swiglu_fusion") != 1:
        return False
    inputs = list(node.input) + [""] * 5
    if not all(inputs[i] for i in (0, 1, 2, 4)) or inputs[3] or any(inputs[5:]):
        return False
    gate_up, down = initializers.get(inputs[2]), initializers.get(inputs[4])
    if gate_up is None or down is None or TensorProto.FLOAT != gate_up.data_type or TensorProto.FLOAT != down.data_type:
        return False
    if len(gate_up.dims) != 3 or len(down.dims) != 3:
        return False
    (experts, rows, hidden), (experts_down, hidden_down, width) = gate_up.dims, down.dims
    return (experts == experts_down and rows == 2 * width and hidden == hidden_down and hidden % 16 == 0
            and width % 16 == 0)


def swap_moe(model: onnx.ModelProto) -> int:
    """Swap every MoE `takes_moe` accepts for MixtureOfExperts, in place; how many."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    swapped = 0
    for node in graph.node:
        if not takes_moe(node, initializers):
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        hidden, logits, gate_up, _, down = node.input[:5]
        del node.input[:]
        node.input.extend([hidden, logits, gate_up, down])
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute("k", attributes["k"]),
                               helper.make_attribute("normalize", attributes.get("normalize_routing_weights", 0))])
        node.op_type, node.domain = MOE_OP, DOMAIN
        swapped += 1
    if swapped:
        _import_domain(model)
    return swapped


def swap_swiglu(model: onnx.ModelProto) -> int:
    """Swap every gated MLP activation our lowering writes for one SwiGLU node, in place; how many. The pattern:
    a float32 Split of the fused gate/up projection into two halves of its last axis, silu of the first half
    (QuickGelu with alpha 1 in a graph ONNX Runtime optimised; Sigmoid and a Mul in a lowered one, which ONNX
    Runtime fuses into that QuickGelu as it loads it), times the second half; nothing else reads what they
    make in between. SwiGLU computes those nodes' bits (swiglu.c)."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    typed = {v.name: v.type.tensor_type for v in (*graph.input, *graph.value_info)}
    kept = {o.name for o in graph.output}
    readers = _readers(graph)

    def only_reader(name: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and name not in kept else None

    swapped, dropped = 0, set()
    for split in graph.node:
        if split.op_type != "Split" or split.domain not in ("", "ai.onnx") or len(split.output) != 2:
            continue
        if not _halves_of_last_axis(split, typed.get(split.input[0]), initializers):
            continue
        gate, up = split.output
        silu = _silu_of(gate, readers, only_reader)
        mul = only_reader(silu[-1].output[0]) if silu else None
        if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([silu[-1].output[0], up]):
            continue
        if only_reader(up) is not mul:
            continue
        mul.op_type, mul.domain, mul.name = SWIGLU_OP, DOMAIN, f"{mul.name}/swiglu"
        del mul.input[:]
        mul.input.append(split.input[0])
        del mul.attribute[:]
        dropped |= {id(split)} | {id(n) for n in silu}
        swapped += 1
    if swapped:
        nodes = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(nodes)
        _import_domain(model)
    return swapped


def _halves_of_last_axis(split: onnx.NodeProto, value, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A Split of a float32 value of known rank into two equal halves of its last axis."""
    from onnx import numpy_helper

    if value is None or value.elem_type != TensorProto.FLOAT or not value.HasField("shape"):
        return False
    rank = len(value.shape.dim)
    attributes = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    if attributes.get("axis", 0) not in (-1, rank - 1) or rank < 1:
        return False
    if len(split.input) > 1 and split.input[1]:  # sizes given: two equal ones
        sizes = initializers.get(split.input[1])
        return sizes is not None and len(set(numpy_helper.to_array(sizes).reshape(-1).tolist())) == 1
    if "split" in attributes:  # (before opset 13: an attribute)
        return len(set(attributes["split"])) == 1
    return attributes.get("num_outputs", 2) == 2


def _silu_of(gate: str, readers: dict[str, list[onnx.NodeProto]], only_reader) -> list[onnx.NodeProto]:
    """The nodes that compute silu(gate) and nothing else reads from, the last one's output silu: QuickGelu
    (alpha 1), or Sigmoid then Mul by gate; [] where gate is read otherwise."""
    found = readers.get(gate, [])
    if len(found) == 1 and found[0].op_type == "QuickGelu" and found[0].domain == "com.microsoft":
        alpha = next((helper.get_attribute_value(a) for a in found[0].attribute if a.name == "alpha"), 1.0)
        return [found[0]] if alpha == 1.0 else []
    if len(found) != 2:
        return []
    sigmoid = next((n for n in found if n.op_type == "Sigmoid" and n.domain in ("", "ai.onnx")), None)
    mul = next((n for n in found if n.op_type == "Mul" and n.domain in ("", "ai.onnx")), None)
    if sigmoid is None or mul is None or only_reader(sigmoid.output[0]) is not mul:
        return []
    return [sigmoid, mul] if sorted(mul.input) == sorted([gate, sigmoid.output[0]]) else []


def fold_offsets(graph: onnx.GraphProto) -> int:
    """Fold a Q4_1 file's offsets into the MatMulBlocks8 beside them, in place; how many. Our lowering
    (plugins/weight_only_matmul.py) writes y = MatMulNBits(x) + ReduceSum(Reshape(x, [..., K/O, O])) @ offsets:
    six float nodes a matmul with the reshape's Shape and Concat (720 of the SmolLM2 Q4_1 graph's 1,070),
    whose MatMul's bits differ between a pass of one row and of several. The kernel adds the same term per
    row (sums of O inputs in order)."""
    initializers = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers = _readers(graph)
    dropped, folded = set(), 0
    for node in graph.node:
        if node.op_type != OP or node.domain != DOMAIN or len(readers.get(node.output[0], [])) != 1:
            continue
        add = readers[node.output[0]][0]
        other = [name for name in add.input if name != node.output[0]]
        matmul = producer.get(other[0]) if add.op_type == "Add" and len(other) == 1 else None
        if matmul is None or matmul.op_type != "MatMul" or len(readers[matmul.output[0]]) != 1:
            continue
        sums, offsets = producer.get(matmul.input[0]), initializers.get(matmul.input[1])
        blocks = producer.get(sums.input[0]) if sums is not None and sums.op_type == "ReduceSum" else None
        if (blocks is None or blocks.op_type != "Reshape" or blocks.input[0] != node.input[0] or offsets is None
                or offsets.data_type != TensorProto.FLOAT or len(offsets.dims) != 2):
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        K, N = attributes["K"], attributes["N"]
        if offsets.dims[1] != N or K % offsets.dims[0] or not _reduces_last_axis(sums, initializers):
            continue
        node.input.append(matmul.input[1])
        node.attribute.append(helper.make_attribute("offsets_group", K // offsets.dims[0]))
        node.output[0] = add.output[0]
        dropped |= {id(add), id(matmul), id(sums), id(blocks)}
        folded += 1
    if folded:
        kept = [n for n in graph.node if id(n) not in dropped]
        _drop_unread(graph, kept)
    return folded


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """{value: the graph's nodes that read it, in order}."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    return readers


def _reduces_last_axis(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    """A ReduceSum over its input's last axis only, dropping it."""
    from onnx import numpy_helper

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("keepdims", 1) != 0 or len(node.input) < 2 or node.input[1] not in initializers:
        return False
    return numpy_helper.to_array(initializers[node.input[1]]).reshape(-1).tolist() == [-1]


def _drop_unread(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """graph's nodes := `nodes` less those (Shape, Concat: the folded Reshape's shape) whose outputs nothing
    reads any more."""
    outputs = {o.name for o in graph.output}
    while True:
        read = _names_read(nodes) | outputs  # (a Loop's body may read what a node of the graph makes)
        unread = [n for n in nodes if not any(o in read for o in n.output)]
        if not unread:
            break
        nodes = [n for n in nodes if n not in unread]
    del graph.node[:]
    graph.node.extend(nodes)
