"""The graphs' I/O contract: every input and output of the decoder and the EAGLE3 draft graph, in
order, with its dtype and its dimensions (a name for a dynamic one). The exporter, the TensorRT
profile builder and both engines read the names here; nobody else spells them.

    decoder inputs   inputs_embeds [batch, seq, H], position_ids [batch, seq] (mRoPE: [3, batch, seq]),
                     past_lengths [batch], query_lengths [batch], logits_indices [batch, kept],
                     (Qwen3-VL: deepstack_embeds [k, batch, seq, H]), (an EAGLE base: tree_mask
                     [batch, seq, seq]), past_key_i / past_value_i [batch, Hkv, capacity, D] per layer,
                     then the LoRA pairs lora_<group>_a_<layer> [batch, rank, in], _b_ [batch, out, rank]
    decoder outputs  logits [batch, kept, V] float32, (hidden_states [batch, seq, F]), present_key_i /
                     present_value_i
    draft inputs     inputs_embeds, hidden [batch, seq, H], position_ids, past_lengths, query_lengths,
                     tree_mask, logits_indices, past_key_0, past_value_0
    draft outputs    logits, hidden_out [batch, seq, H], present_key_0, present_value_0
    Whisper encoder  input_features [batch, mel bins, 2 * frames] -> cross_key_i / cross_value_i
                     [batch, H, frames, D] per decoder layer (build/models/whisper.py)
    Whisper decoder  the decoder's step inputs and caches, then cross_key_i / cross_value_i per layer;
                     outputs logits, present_key_i / present_value_i
"""

from __future__ import annotations

from dataclasses import dataclass

# The small per-step inputs every graph takes first, in this order.
STEP_INPUTS = ("inputs_embeds", "position_ids", "past_lengths", "query_lengths", "logits_indices")
LOGITS = "logits"
TREE_MASK = "tree_mask"  # an EAGLE base's and the draft's [batch, seq, seq] bool
FEATURES = "hidden_states"  # an EAGLE base's output: the hidden states entering the feature layers
DRAFT_HIDDEN = "hidden"  # the draft's input: fc-projected features or its own previous hidden_out
DRAFT_HIDDEN_OUT = "hidden_out"
MODEL_DTYPE = "model"  # the graph's precision (fp32, fp16, bf16)


def past(kind: str, layer: int) -> str:
    """past_key_<layer> / past_value_<layer>: a layer's cache as an input."""
    return f"past_{kind}_{layer}"


def present(kind: str, layer: int) -> str:
    return f"present_{kind}_{layer}"


def cross(kind: str, layer: int) -> str:
    """cross_key_<layer> / cross_value_<layer>: a Whisper decoder layer's keys / values of the encoder's
    output, which the encoder graph returns and the decoder graph takes."""
    return f"cross_{kind}_{layer}"


def lora_input(group: str, matrix: str, layer: int) -> str:
    """lora_<group>_<a|b>_<layer>: one LoRA matrix of a packed projection."""
    return f"lora_{group}_{matrix}_{layer}"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # MODEL_DTYPE, "float32", "int32" or "bool"
    dims: tuple[str | None, ...]  # a name: dynamic; None: fixed by the model


@dataclass(frozen=True)
class GraphSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def _step_inputs() -> list[TensorSpec]:
    return [TensorSpec("inputs_embeds", MODEL_DTYPE, ("batch", "seq", None)),
            TensorSpec("position_ids", "int32", ("batch", "seq")),
            TensorSpec("past_lengths", "int32", ("batch",)),
            TensorSpec("query_lengths", "int32", ("batch",)),
            TensorSpec("logits_indices", "int32", ("batch", "kept"))]


def _caches(layers: int, direction) -> list[TensorSpec]:
    return [TensorSpec(direction(kind, i), MODEL_DTYPE, ("batch", None, "capacity", None))
            for i in range(layers) for kind in ("key", "value")]


def lora_inputs(lora_layout: dict | None) -> list[TensorSpec]:
    """The LoRA pairs, per layer and packed group (build/lora.py's layout); the ranks are dynamic."""
    if not lora_layout:
        return []
    specs = []
    for layer in range(lora_layout["num_layers"]):
        for group in lora_layout["groups"]:
            rank = f"lora_rank_{group['name']}"
            specs += [TensorSpec(lora_input(group["name"], "a", layer), MODEL_DTYPE, ("batch", rank, None)),
                      TensorSpec(lora_input(group["name"], "b", layer), MODEL_DTYPE, ("batch", None, rank))]
    return specs


DEEPSTACK = "deepstack_embeds"  # Qwen3-VL's [k, batch, seq, H]: vision features added after layer i < k


def decoder_spec(num_layers: int, eagle: bool = False, lora_layout: dict | None = None, mrope: bool = False,
                 deepstack: int = 0) -> GraphSpec:
    """mrope: position_ids is [3, batch, seq] (time, row, column); deepstack: how many early layers
    take the vision tower's features (a deepstack_embeds input after logits_indices)."""
    inputs = _step_inputs()
    if mrope:
        inputs[1] = TensorSpec("position_ids", "int32", (None, "batch", "seq"))
    if deepstack:
        inputs.append(TensorSpec(DEEPSTACK, MODEL_DTYPE, (None, "batch", "seq", None)))
    if eagle:
        inputs.append(TensorSpec(TREE_MASK, "bool", ("batch", "seq", "seq")))
    inputs += _caches(num_layers, past) + lora_inputs(lora_layout)
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "kept", None))]
    if eagle:
        outputs.append(TensorSpec(FEATURES, MODEL_DTYPE, ("batch", "seq", None)))
    outputs += _caches(num_layers, present)
    return GraphSpec(tuple(inputs), tuple(outputs))


def draft_spec() -> GraphSpec:
    step = _step_inputs()
    inputs = [step[0], TensorSpec(DRAFT_HIDDEN, MODEL_DTYPE, ("batch", "seq", None)), *step[1:4],
              TensorSpec(TREE_MASK, "bool", ("batch", "seq", "seq")), step[4], *_caches(1, past)]
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "kept", None)),
               TensorSpec(DRAFT_HIDDEN_OUT, MODEL_DTYPE, ("batch", "seq", None)), *_caches(1, present)]
    return GraphSpec(tuple(inputs), tuple(outputs))


INPUT_FEATURES = "input_features"  # the Whisper encoder's log-mel features


def _cross(layers: int) -> list[TensorSpec]:
    # frames: the encoder's output length, fixed by the model (1,500) but a name here, so the decoder
    # takes any (a tiny test model's fewer)
    return [TensorSpec(cross(kind, i), MODEL_DTYPE, ("batch", None, "frames", None))
            for i in range(layers) for kind in ("key", "value")]


def whisper_encoder_spec(num_layers: int) -> GraphSpec:
    """num_layers: the decoder's (one cross key / value pair per decoder layer). The mel axis is fixed
    by the model (2 * frames)."""
    inputs = [TensorSpec(INPUT_FEATURES, MODEL_DTYPE, ("batch", None, None))]
    return GraphSpec(tuple(inputs), tuple(_cross(num_layers)))


def whisper_decoder_spec(num_layers: int) -> GraphSpec:
    """The decoder graph (decoder_spec's inputs and outputs) with the cross keys / values after the caches."""
    inputs = [*_step_inputs(), *_caches(num_layers, past), *_cross(num_layers)]
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "kept", None)), *_caches(num_layers, present)]
    return GraphSpec(tuple(inputs), tuple(outputs))


__all__ = [
    "DEEPSTACK",
    "DRAFT_HIDDEN",
    "DRAFT_HIDDEN_OUT",
    "FEATURES",
    "INPUT_FEATURES",
    "LOGITS",
    "STEP_INPUTS",
    "TREE_MASK",
    "GraphSpec",
    "TensorSpec",
    "cross",
    "decoder_spec",
    "draft_spec",
    "lora_input",
    "lora_inputs",
    "past",
    "present",
    "whisper_decoder_spec",
    "whisper_encoder_spec",
]
