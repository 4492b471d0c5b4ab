"""The `cpu` backend: our ops lowered to ONNX Runtime's fused contrib ops."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from trt_llm import plugins
from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.graph import quantize_matmuls
from trt_llm.families import siglip_lowering

ENGINE_NAME = "model.cpu.onnx"
# draft.quantization -> how its matmuls are quantized: int8 one scale per output column (ONNX
# Runtime's DynamicQuantizeMatMul), int4 in blocks of 32 (MatMulNBits).
DRAFT_SPECS = {"int8": QuantSpec(bits=8, group_size=0), "int4": QuantSpec(bits=4, group_size=32)}


def compile_cpu(graph_path: Path, quantization: str = "none") -> Path:
    """Write the lowered graph beside the portable one.

    Unquantized, both read the same external weight file: the graph is loaded without its weights,
    so only the node list is rewritten and the weights are neither copied nor duplicated on disk.
    A graph of weight-only matmuls (a quantized build) is no different: the lowered nodes read the
    bundle's initializers as they are. quantization int8 / int4 (an EAGLE draft, whose precision
    never reaches the output) quantizes a float graph here and writes its weights to the engine's
    own file instead.
    """
    model = onnx.load(graph_path, load_external_data=False)
    portable = [graph_path, *{graph_path.parent / ExternalDataInfo(t).location for t in _initializers(model.graph)
                               if uses_external_data(t)}]  # the graph and its weight files
    if quantization != "none":  # the draft's float matmuls become the weight-only op, then lowered below
        if quantization not in DRAFT_SPECS:
            raise ValueError(f"quantization must be none, int8 or int4, got {quantization!r}")
        _read_weights(model, graph_path.parent)
        quantize_matmuls(model, DRAFT_SPECS[quantization])
    plugins.lower_for_onnxruntime(model)
    siglip_lowering.lower_for_onnxruntime(model)  # a SigLIP vision tower's layers, where the graph has them
    fuse_rms_norms(model)
    engine_path = graph_path.parent / ENGINE_NAME
    if quantization == "none":
        onnx.save_model(model, engine_path)
    else:
        onnx.save_model(model, engine_path, save_as_external_data=True, location=ENGINE_NAME + ".data")
    if any(node.op_type == "DequantizeLinear" for node in model.graph.node):
        # Weight-only matmuls: ONNX Runtime's fusion of DequantizeLinear + MatMul into MatMulNBits is
        # most of a session's creation (SmolLM2-135M int4: ~500 of ~620 ms); done once here, the
        # session at run time loads the fused graph without optimising it (also the load check). The
        # fused graph is the engine: it holds every weight it reads, and the graphs it was made from
        # (the bundle's, in its own folder in a two-stage build) leave the engine directory, which would
        # otherwise hold each matmul's weights twice (SmolLM2 int4: 72 MB beside 78).
        optimised = optimise_offline(engine_path)
        for path in (*portable, engine_path, engine_path.with_name(ENGINE_NAME + ".data")):
            path.unlink(missing_ok=True)
        return optimised
    if quantization != "none":  # the draft's engine has its own weights: its float graph leaves
        for path in portable:
            path.unlink(missing_ok=True)
    # Fail at build time, not at run time, if ONNX Runtime cannot load what we wrote.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Its kernels are made, not prepacked: the check then maps the weights without copying them (a
    # prepacked MoE engine would be in the build's memory once more).
    options.add_session_config_entry("session.disable_prepacking", "1")
    ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])
    return engine_path


def optimise_offline(engine_path: Path) -> Path:
    """Write ONNX Runtime's optimised graph of `engine_path` beside it (runtime/backends/ort_engine.py's
    OFFLINE: the graph, its weights and what it was made with), which the runtime loads without
    optimising again where ONNX Runtime's version, the machine's architecture and the matmuls'
    accuracy level are the ones recorded. Extended level, not all: the layout transformations of the
    last level depend on the machine's instruction set, the extended fusions do not. Prepacked weights
    are not saved (the packing is the machine's; saved or not, measured no faster to load). Its data
    file holds every weight the optimised graph reads (own_weights), so it needs no other file."""
    import json

    import onnxruntime as ort

    from trt_llm.runtime.backends import ort_engine

    optimised, record = ort_engine.offline_paths(engine_path)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(ort_engine.BUILD_ACCURACY_LEVEL))
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.optimized_model_filepath = str(optimised)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                     optimised.name + ".data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])
    own_weights(optimised)
    record.write_text(json.dumps(ort_engine.offline_key(ort_engine.BUILD_ACCURACY_LEVEL), indent=2) + "\n")
    return optimised


ALIGNMENT = 4096  # a weight's offset in a data file we write: page-aligned, so ONNX Runtime can map it


def own_weights(optimised: Path) -> None:
    """Rewrite the optimised graph's data file to hold every initializer the graph reads: ONNX Runtime
    writes only those at least 1 KB (the rest stay in the proto) and keeps the ones its fusions left
    as they were (a MoE's experts, norms) pointing at the lowered graph's weight file, which leaves
    the engine directory. Each tensor page-aligned, so ONNX Runtime can map it. A 4-bit MatMulNBits'
    scales that are all exactly fp16 (a GGUF's are) are stored as fp16 (HALF_SCALES_SUFFIX)."""
    import os

    import numpy as np

    folder = optimised.parent
    graph = onnx.load(str(optimised), load_external_data=False)
    data_name = optimised.name + ".data"
    whole = folder / (data_name + ".whole")
    halvable, halved, top_level = _four_bit_scales(graph.graph), [], len(graph.graph.initializer)
    with open(whole, "wb") as out:
        # a Loop's body has its own initializers (the delta rule's chunked form), after the graph's
        for index, tensor in enumerate(_initializers(graph.graph)):
            if not uses_external_data(tensor):
                continue
            info = ExternalDataInfo(tensor)
            with open(folder / info.location, "rb") as data:
                data.seek(info.offset or 0)
                blob = data.read(info.length) if info.length else data.read()
            if index < top_level and tensor.name in halvable:
                values = np.frombuffer(blob, np.float32)
                with np.errstate(over="ignore"):  # (a value past fp16's range: not halved)
                    half = values.astype(np.float16)
                if np.array_equal(half.astype(np.float32), values):
                    blob = half.tobytes()
                    halved.append(tensor.name)
                    tensor.name, tensor.data_type = tensor.name + HALF_SCALES_SUFFIX, onnx.TensorProto.FLOAT16
            out.write(b"\0" * (-out.tell() % ALIGNMENT))
            _point(tensor, data_name, out.tell(), len(blob))
            out.write(blob)
    os.replace(whole, folder / data_name)
    # each halved tensor's old name is now a Cast's output, first in the graph (before any reader)
    casts = [helper.make_node("Cast", [name + HALF_SCALES_SUFFIX], [name], name=f"{name}/to_float",
                              to=onnx.TensorProto.FLOAT) for name in halved]
    if casts:
        nodes = [*casts, *graph.graph.node]
        del graph.graph.node[:]
        graph.graph.node.extend(nodes)
    onnx.save_model(graph, str(optimised))


# A 4-bit matmul's scales, all exact fp16 values (a GGUF's blocks carry fp16 scales), are stored as fp16
# under this suffix and widened by a Cast to their old name: 2 bytes a block of 32 instead of 4 (the
# SmolLM2 Q4_1 engine goes from 1.19x its file to 1.12x: README, "Quantization"). The Cast
# widens them exactly; our kernel reads the fp16 tensor itself (cpu_kernels/rewrite.py), and where
# ONNX Runtime's MatMulNBits runs, the runtime folds the Cast as the session opens (cpu_kernels.adopt:
# MatMulNBits reads a Cast's output wrongly when the graph is not optimised, measured). 8-bit matmuls
# keep fp32 scales: the tied LM head's are also the embedding's, read in place (build/tied_embedding.py).
HALF_SCALES_SUFFIX = "_fp16"


def _four_bit_scales(graph: onnx.GraphProto) -> set[str]:
    """The names of `graph`'s float32 initializers that only 4-bit MatMulNBits read, as their scales."""
    initializers = {t.name: t for t in graph.initializer}
    scales, other = set(), set()
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for index, name in enumerate(node.input):
            if node.op_type == "MatMulNBits" and index == 2 and attributes.get("bits") == 4:
                scales.add(name)
            else:
                other.add(name)
        for attribute in node.attribute:  # (a Loop's or If's body may read an outer initializer)
            for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                other |= {name for inner in body.node for name in inner.input}
    read_elsewhere = other | {o.name for o in graph.output}
    return {name for name in scales - read_elsewhere
            if name in initializers and initializers[name].data_type == onnx.TensorProto.FLOAT}


def _initializers(graph: onnx.GraphProto):
    """Every initializer of `graph` and of the subgraphs of its nodes (Loop, If, Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from _initializers(subgraph)


def _point(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """An initializer's external data entry (onnx's own helper wants the bytes in the proto first)."""
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def fuse_rms_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Write each RMSNorm as ONNX Runtime's own fused kernel, in place, the way GenAI's builder does.

    The portable graph spells RMSNorm out: w * (x / sqrt(mean(x^2) + eps)), six nodes. ONNX Runtime
    fuses those into SimplifiedLayerNormalization by itself, but not the residual Add in front of it
    into SkipSimplifiedLayerNormalization (that fusion wants shapes it cannot infer through our
    graph). Written here: the Add and the norm become one node that also returns the sum for the next
    residual. A batch-1 decode step of SmolLM2-135M (30 layers) then runs 60 Add nodes fewer (ONNX
    Runtime's profile on 2 cores: about 0.4 ms of Add kernels and 5 us of dispatch per node, of a 22 ms
    step). The arithmetic is ONNX Runtime's norm kernel in both cases (float sums, the same order).
    """
    graph = model.graph
    nodes = list(graph.node)
    constants = {t.name: t for t in graph.initializer}
    for node in nodes:
        if node.op_type == "Constant" and len(node.output) == 1 and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    producer = {name: node for node in nodes for name in node.output}

    def scalar(name):
        tensor = constants.get(name)
        if tensor is None:
            return None
        value = numpy_helper.to_array(tensor)
        return float(value.reshape(-1)[0]) if value.size == 1 else None

    def only_use(name, node):  # `name` feeds `node` alone and is no graph output
        return name not in graph_outputs and [id(n) for n in consumers.get(name, [])] == [id(node)]

    def single(name, op_type):
        found = [n for n in consumers.get(name, []) if n.op_type == op_type]
        return found[0] if len(found) == 1 else None

    def reduce_axes(node):
        if len(node.input) > 1 and node.input[1]:
            tensor = constants.get(node.input[1])
            return None if tensor is None else [int(a) for a in numpy_helper.to_array(tensor).reshape(-1)]
        attr = next((a for a in node.attribute if a.name == "axes"), None)
        return None if attr is None else list(attr.ints)

    replaced: dict[int, list[onnx.NodeProto]] = {}  # id(node) -> what stands in its place
    removed: set[int] = set()
    norms = []
    for pow_node in nodes:
        if pow_node.op_type != "Pow" or scalar(pow_node.input[1]) != 2.0:
            continue
        x = pow_node.input[0]
        mean = single(pow_node.output[0], "ReduceMean")
        add = mean and single(mean.output[0], "Add")
        sqrt = add and single(add.output[0], "Sqrt")
        div = sqrt and single(sqrt.output[0], "Div")
        mul = div and single(div.output[0], "Mul")
        if mul is None or div.input[0] != x or reduce_axes(mean) != [-1]:
            continue
        if next((a.i for a in mean.attribute if a.name == "keepdims"), 1) != 1:
            continue
        eps = scalar(add.input[1] if add.input[0] == mean.output[0] else add.input[0])
        weight = mul.input[0] if mul.input[1] == div.output[0] else mul.input[1]
        if eps is None or weight not in constants or len(constants[weight].dims) != 1:
            continue
        chain = [pow_node, mean, add, sqrt, div]
        if not all(only_use(n.output[0], nxt) for n, nxt in zip(chain, chain[1:] + [mul])):
            continue
        norms.append((x, weight, eps, chain, mul))
    for x, weight, eps, chain, mul in norms:
        residual = producer.get(x)
        inputs = list(residual.input) if residual is not None and residual.op_type == "Add" else []
        # The residual Add of two activations (a constant operand could broadcast): fused with the norm.
        skip = (len(inputs) == 2 and all(i and i not in constants for i in inputs) and id(residual) not in removed
                and id(residual) not in replaced)
        if skip:
            fused = helper.make_node("SkipSimplifiedLayerNormalization", [inputs[0], inputs[1], weight],
                                     [mul.output[0], "", "", x], name=f"{mul.name or x}/skip_rms_norm",
                                     domain="com.microsoft", epsilon=eps)
            replaced[id(residual)] = [fused]
        else:
            fused = helper.make_node("SimplifiedLayerNormalization", [x, weight], [mul.output[0]],
                                     name=f"{mul.name or x}/rms_norm", axis=-1, epsilon=eps, stash_type=1)
            replaced[id(chain[0])] = [fused]
        removed.update(id(n) for n in (*chain, mul) if id(n) not in replaced)
    if not norms:
        return model
    new_nodes = []
    for node in nodes:
        if id(node) in replaced:
            new_nodes.extend(replaced[id(node)])
        elif id(node) not in removed:
            new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _read_weights(model: onnx.ModelProto, folder: Path) -> None:
    """Bring the external weights into the model. (onnx.load_external_data_for_model refuses a file
    with several hard links, and a compile's staging folder hard-links the bundle's files.)"""
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        with open(folder / info.location, "rb") as data:
            data.seek(info.offset or 0)
            tensor.raw_data = data.read(info.length) if info.length else data.read()
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
