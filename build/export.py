"""Export the decoder graph to ONNX with our attention op as a custom node plus its function body."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from trt_llm.build.models.skeleton import DecoderSkeleton
from trt_llm.schemas.graph_spec import (DEEPSTACK, PER_LAYER_INPUTS, TREE_MASK, decoder_spec, draft_spec,
                                        lora_groups_at, lora_input, past, window_lengths)
from trt_llm.schemas.layer_spec import owns_cache, window_of
from trt_llm import plugins
from trt_llm.plugins.attention import LOOKAHEAD_KEY

ONNX_OPSET = 18
log = logging.getLogger(__name__)
# The exporter warns about every torchvision op it cannot register; we export no vision ops here.
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


# Example ranks of the stacked LoRA inputs: distinct from every other example size (see below).
_EXAMPLE_RANKS = {"qkv": 12, "o": 7, "gate_up": 10, "down": 11}


def _example_inputs(graph: DecoderSkeleton, dtype: torch.dtype, spec, lora_layout: dict | None) -> tuple:
    """One example tensor per input of the graph's spec, made by its name, in the spec's order."""
    # Distinct sizes per dimension, so the tracer cannot mistake one dynamic dimension for another.
    d = graph.dims
    batch, seq, kept, capacity = 2, 5, 3, 16
    # A sliding group's slots: distinct too (13, 14, ...), and its lengths input.
    slots = {0: capacity, **{w: 13 + i for i, w in enumerate(graph.windows)}}
    positions = torch.arange(seq, dtype=torch.int32).repeat(batch, 1)
    examples = {
        "inputs_embeds": torch.zeros(batch, seq, d.hidden_size, dtype=dtype),
        "position_ids": positions.repeat(3, 1, 1) if graph.mrope_streams is not None else positions,
        "past_lengths": torch.zeros(batch, dtype=torch.int32),
        "query_lengths": torch.full((batch,), seq, dtype=torch.int32),
        "logits_indices": torch.zeros(batch, kept, dtype=torch.int32),
        DEEPSTACK: torch.zeros(graph.deepstack_layers, batch, seq, d.hidden_size, dtype=dtype),
        TREE_MASK: torch.ones(seq, seq, dtype=torch.bool).tril().repeat(batch, 1, 1),
        PER_LAYER_INPUTS: torch.zeros(batch, seq, graph.per_layer_width, dtype=dtype),
        **{window_lengths(w): torch.zeros(batch, dtype=torch.int32) for w in graph.windows},
    }
    # One tensor object per cache: the tracer would merge inputs that are the same object.
    for i, layer in enumerate(graph.layer_specs):
        if not owns_cache(layer):  # it reads its kv_source's cache: no tensors of its own
            continue
        if layer.kind == "recurrent":  # its states, fixed shapes
            examples.update({past(state.name, i): torch.zeros(
                batch, *state.shape, dtype=dtype if state.dtype == "model" else torch.float32) for state in layer.states})
        else:
            examples.update({past(kind, i): torch.zeros(batch, layer.kv_heads, slots[window_of(layer)],
                                                        layer.head_dim, dtype=dtype) for kind in ("key", "value")})
    for i in range(d.num_layers if lora_layout else 0):
        for group in lora_groups_at(lora_layout, i):
            rank = _EXAMPLE_RANKS[group["name"]]
            examples[lora_input(group["name"], "a", i)] = torch.zeros(batch, rank, group["in_features"], dtype=dtype)
            examples[lora_input(group["name"], "b", i)] = torch.zeros(batch, group["out_features"], rank, dtype=dtype)
    return tuple(examples[name] for name in spec.input_names)


def _dynamic_axes(specs) -> list[dict]:
    """Each input's {axis: Dim} from its spec; one Dim per name, shared by every input that has it."""
    dims: dict[str, Dim] = {}
    return [{axis: dims.setdefault(name, Dim(name)) for axis, name in enumerate(spec.dims) if name} for spec in specs]


def _dynamic_shapes(spec) -> tuple:
    # forward(*tensors) takes every input by the spec's names: one positional entry holding a tuple.
    return (tuple(_dynamic_axes(spec.inputs)),)


def export_decoder(graph: DecoderSkeleton, path: Path, dtype: torch.dtype, lora_layout: dict | None = None) -> Path:
    """Write `path` (+ `path.data` external weights); returns the path."""
    spec = decoder_spec(graph.layer_specs, graph.feature_layers is not None, lora_layout,
                        graph.mrope_streams is not None, graph.deepstack_layers, graph.masked, graph.per_layer_width,
                        final_hidden=not graph.returns_kept)
    if spec.input_names != graph.input_names:  # (the LoRA layout's groups are the graph's)
        raise ValueError(f"the graph's inputs {graph.input_names} are not its spec's {spec.input_names}")
    # A tree_mask that lets a token see later ones (Gemma 3's images) is said in the graph: ONNX Runtime's
    # causal attention kernel cannot take it (plugins/attention.py's lowering).
    metadata = {LOOKAHEAD_KEY: "1"} if graph.masked else None
    return export_graph(graph, _example_inputs(graph, dtype, spec, lora_layout), spec.input_names, spec.output_names,
                        _dynamic_shapes(spec), path, metadata)


def export_draft(graph, hidden_size: int, kv_heads: int, head_dim: int, path: Path, dtype: torch.dtype) -> Path:
    """The EAGLE3 draft graph (build/eagle/graph.py's DraftGraph): one layer (graph.layer_spec), its own cache."""
    batch, seq, kept, capacity = 2, 5, 3, 16  # distinct example sizes, as for the decoder
    example = (
        torch.zeros(batch, seq, hidden_size, dtype=dtype), torch.zeros(batch, seq, hidden_size, dtype=dtype),
        torch.arange(seq, dtype=torch.int32).repeat(batch, 1), torch.zeros(batch, dtype=torch.int32),
        torch.full((batch,), seq, dtype=torch.int32), torch.ones(seq, seq, dtype=torch.bool).tril().repeat(batch, 1, 1),
        torch.zeros(batch, kept, dtype=torch.int32),
        torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype),
        torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype),
    )
    spec = draft_spec(graph.layer_spec)
    return export_graph(graph, example, spec.input_names, spec.output_names, tuple(_dynamic_axes(spec.inputs)), path)



def export_graph(module, example: tuple, names: list[str], outputs: list[str], dynamic_shapes, path: Path,
                 metadata: dict[str, str] | None = None) -> Path:
    """The graph of `module` at `path`; metadata: the model's metadata_props entries (what a lowering
    must know of the graph that its nodes do not say)."""
    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, dynamo=True, opset_version=ONNX_OPSET, input_names=names, output_names=outputs,
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=plugins.translation_table(),
            optimize=True, verbose=False,
        )
    save_program(program, path)
    del program
    model = onnx.load(path, load_external_data=False)
    finish_custom_nodes(model)  # the nodes and the tensors' types only: the weights stay where they are
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, **(metadata or {})})
    onnx.save_model(model, path)
    return path


def finish_custom_nodes(model: onnx.ModelProto) -> None:
    """Attach the ops' function bodies, drop exporter-internal attributes from their nodes and let
    each op finish its nodes (plugins.finish_export)."""
    domains = plugins.domains()
    for node in model.graph.node:
        if node.domain in domains:
            keep = [a for a in node.attribute if not a.name.startswith("_")]
            del node.attribute[:]
            node.attribute.extend(keep)
    # The bodies of the node types the model has (a weight-only body needs opset 21; an
    # unquantized model stays at ONNX_OPSET).
    used = {(n.domain, n.op_type) for n in model.graph.node}
    present = {(f.domain, f.name) for f in model.functions}
    for function in plugins.function_protos():
        key = (function.domain, function.name)
        if key in used and key not in present:
            model.functions.append(function)
    plugins.finish_export(model)


def save_program(program, path: Path) -> None:
    """Save an exported program with all its weights in one external file beside the graph, written
    tensor by tensor from torch's memory: the model's proto with the weights inside would hold a
    second copy of all of them (and one over 2 GB cannot be written at all)."""
    path = Path(path)
    data = path.parent / (path.name + ".data")  # the name program.save gives the file
    if data.exists():
        os.remove(data)
    program.save(str(path), external_data=True)
