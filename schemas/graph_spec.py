"""The graphs' I/O contract: every input and output of the decoder and the EAGLE3 draft graph, in
order, with its dtype and its dimensions (a name for a dynamic one). The per-layer ones are derived
from the layers' specs (schemas/layer_spec.py). The exporter, the TensorRT profile builder and both
engines read the names here; nobody else spells them.

    decoder inputs   inputs_embeds [batch, seq, H], position_ids [batch, seq] (mRoPE: [3, batch, seq]),
                     past_lengths [batch], query_lengths [batch], logits_indices [batch, kept],
                     (Qwen3-VL: deepstack_embeds [k, batch, seq, H]), (an EAGLE base, Gemma 3
                     with images: tree_mask [batch, seq, seq]), (Gemma 4: per_layer_inputs
                     [batch, seq, layers * P], each token's rows of the per-layer table), (per sliding window W: past_lengths_w<W> [batch], the slots its
                     layers hold), then per layer its cache: past_key_i / past_value_i [batch, Hkv,
                     capacity (a sliding layer: capacity_w<W>), D], or a recurrent layer's
                     past_<state>_i [batch, *shape]; (an encoder-decoder: cross_key_i / cross_value_i
                     [batch, H, frames, D] per cross layer); then the LoRA pairs
                     lora_<group>_a_<layer> [batch, rank, in], _b_ [batch, out, rank]
    decoder outputs  logits [batch, kept, V] float32, (hidden_states [batch, seq, F]),
                     final_hidden_states [batch, seq, H] (the final norm's output at every position,
                     before the LM head and any soft-cap: embeddings, an MTP head's input; none where the
                     last layers run on the kept rows only: Gemma 4 with shared caches), the caches'
                     present_* in the same order
    draft inputs     inputs_embeds, hidden [batch, seq, H], position_ids, past_lengths, query_lengths,
                     tree_mask, logits_indices, past_key_0, past_value_0
    draft outputs    logits, hidden_out [batch, seq, H], present_key_0, present_value_0
    Whisper encoder  input_features [batch, mel bins, 2 * frames] -> cross_key_i / cross_value_i
                     [batch, H, frames, D] per decoder layer (trt_llm/families/whisper/graphs.py)
"""

from __future__ import annotations

from dataclasses import dataclass

from trt_llm.schemas.layer_spec import owns_cache, window_of

# The small per-step inputs every graph takes first, in this order.
STEP_INPUTS = ("inputs_embeds", "position_ids", "past_lengths", "query_lengths", "logits_indices")
LOGITS = "logits"
TREE_MASK = "tree_mask"  # [batch, seq, seq] bool: which new tokens each sees (an EAGLE base, the draft, Gemma 3)
FEATURES = "hidden_states"  # an EAGLE base's output: the hidden states entering the feature layers
# Every decoder graph's output (but see decoder_spec): the final norm's output at every position [batch, seq,
# H], model dtype, before the LM head and any logit soft-cap. Fetched only when a step names it (embeddings
# pool it; an MTP head takes it).
FINAL_HIDDEN = "final_hidden_states"
DRAFT_HIDDEN = "hidden"  # the draft's input: fc-projected features or its own previous hidden_out
DRAFT_HIDDEN_OUT = "hidden_out"
MODEL_DTYPE = "model"  # the graph's precision (fp32, fp16, bf16)


def past(kind: str, layer: int) -> str:
    """past_key_<layer> / past_value_<layer>: a layer's cache as an input."""
    return f"past_{kind}_{layer}"


def present(kind: str, layer: int) -> str:
    return f"present_{kind}_{layer}"


SHARED = "/shared/"


def shared_present(present_name: str, reader: int) -> str:
    """The cpu engine's output of the reader-th layer that reads the cache whose present is
    `present_name` (kv_source: `present_key_<source>/shared/<n>`; plugins/attention.py's lowering adds
    it): the runtime binds it to the source's own buffer, so ONNX Runtime updates it in place."""
    return f"{present_name}{SHARED}{reader}"


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


def window_lengths(window: int) -> str:
    """past_lengths_w<window>: the slots a sliding group holds per row (its cache keeps only the last
    tokens, so its write offset is not the row's length)."""
    return f"past_lengths_w{window}"


def window_capacity(window: int) -> str:
    """capacity_w<window>: the slots dimension of a sliding group's caches."""
    return f"capacity_w{window}"


def _capacity_dim(layer) -> str:
    window = window_of(layer)
    return window_capacity(window) if window else "capacity"


def _cache_tensors(layers, direction) -> list[TensorSpec]:
    """Every layer's cache tensors, layer by layer: key and value of an attention layer (its slots
    dimension: `capacity`, or a sliding group's own), the states of a recurrent one; none for a layer
    that reads another's (kv_source)."""
    specs = []
    for i, layer in enumerate(layers):
        if not owns_cache(layer):  # (it reads its kv_source's)
            continue
        if layer.kind == "recurrent":
            specs += [TensorSpec(direction(state.name, i), MODEL_DTYPE if state.dtype == "model" else state.dtype,
                                 ("batch", *[None] * len(state.shape))) for state in layer.states]
        else:
            specs += [TensorSpec(direction(kind, i), MODEL_DTYPE, ("batch", None, _capacity_dim(layer), None))
                      for kind in ("key", "value")]
    return specs


def _cross_tensors(layers) -> list[TensorSpec]:
    # frames: the encoder's output length, fixed by the model (1,500) but a name here, so the decoder
    # takes any (a tiny test model's fewer)
    return [TensorSpec(cross(kind, i), MODEL_DTYPE, ("batch", None, "frames", None))
            for i, layer in enumerate(layers) if layer.kind == "cross" for kind in ("key", "value")]


def _window_inputs(layers) -> list[TensorSpec]:
    windows = sorted({window_of(layer) for layer in layers} - {0})
    return [TensorSpec(window_lengths(w), "int32", ("batch",)) for w in windows]


def lora_groups_at(lora_layout: dict, layer: int) -> list[dict]:
    """Layer `layer`'s packed groups with LoRA inputs: the layout's `groups`, the same on every layer,
    unless its `layer_groups` gives each layer its own (Gemma 4: two head widths, the shared layers'
    q alone, double-wide MLPs)."""
    per_layer = lora_layout.get("layer_groups")
    return per_layer[layer] if per_layer else lora_layout["groups"]


def lora_inputs(lora_layout: dict | None) -> list[TensorSpec]:
    """The LoRA pairs, per layer and packed group (build/lora.py's layout); the ranks are dynamic."""
    if not lora_layout:
        return []
    specs = []
    for layer in range(lora_layout["num_layers"]):
        for group in lora_groups_at(lora_layout, layer):
            rank = f"lora_rank_{group['name']}"
            specs += [TensorSpec(lora_input(group["name"], "a", layer), MODEL_DTYPE, ("batch", rank, None)),
                      TensorSpec(lora_input(group["name"], "b", layer), MODEL_DTYPE, ("batch", None, rank))]
    return specs


DEEPSTACK = "deepstack_embeds"  # Qwen3-VL's [k, batch, seq, H]: vision features added after layer i < k
# Gemma 4's [batch, seq, layers * P]: each new token's row of the per-layer embedding table, which the
# runtime looks up (the table is too large for a graph: runtime/backends/embedding.py)
PER_LAYER_INPUTS = "per_layer_inputs"


def decoder_spec(layers, eagle: bool = False, lora_layout: dict | None = None, mrope: bool = False,
                 deepstack: int = 0, masked: bool = False, per_layer: int = 0, final_hidden: bool = True) -> GraphSpec:
    """The decoder graph of `layers` (schemas/layer_spec.py, one per decoder layer). mrope:
    position_ids is [3, batch, seq] (time, row, column); deepstack: how many early layers take the
    vision tower's features (a deepstack_embeds input after logits_indices); masked: the new tokens
    see each other as a tree_mask says (an EAGLE base has one too; Gemma 3's image blocks see
    themselves both ways); per_layer: the width of a per_layer_inputs input (Gemma 4's layers * P);
    final_hidden: a final_hidden_states output (False: a graph whose last layers see only the kept rows).
    Inputs: the step's, [deepstack_embeds], [tree_mask], [per_layer_inputs], a sliding group's lengths, every layer's cache tensors, an
    encoder-decoder's cross keys and values, the LoRA pairs."""
    inputs = _step_inputs()
    if mrope:
        inputs[1] = TensorSpec("position_ids", "int32", (None, "batch", "seq"))
    if deepstack:
        inputs.append(TensorSpec(DEEPSTACK, MODEL_DTYPE, (None, "batch", "seq", None)))
    if eagle or masked:
        inputs.append(TensorSpec(TREE_MASK, "bool", ("batch", "seq", "seq")))
    if per_layer:
        inputs.append(TensorSpec(PER_LAYER_INPUTS, MODEL_DTYPE, ("batch", "seq", None)))
    inputs += _window_inputs(layers) + _cache_tensors(layers, past) + _cross_tensors(layers) + lora_inputs(lora_layout)
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "kept", None))]
    if eagle:
        outputs.append(TensorSpec(FEATURES, MODEL_DTYPE, ("batch", "seq", None)))
    if final_hidden:
        outputs.append(TensorSpec(FINAL_HIDDEN, MODEL_DTYPE, ("batch", "seq", None)))
    outputs += _cache_tensors(layers, present)
    return GraphSpec(tuple(inputs), tuple(outputs))


def draft_spec(layer) -> GraphSpec:
    """The EAGLE3 draft's one-layer graph (`layer`: its spec, a full attention layer)."""
    step = _step_inputs()
    inputs = [step[0], TensorSpec(DRAFT_HIDDEN, MODEL_DTYPE, ("batch", "seq", None)), *step[1:4],
              TensorSpec(TREE_MASK, "bool", ("batch", "seq", "seq")), step[4], *_cache_tensors([layer], past)]
    outputs = [TensorSpec(LOGITS, "float32", ("batch", "kept", None)),
               TensorSpec(DRAFT_HIDDEN_OUT, MODEL_DTYPE, ("batch", "seq", None)), *_cache_tensors([layer], present)]
    return GraphSpec(tuple(inputs), tuple(outputs))


INPUT_FEATURES = "input_features"  # the Whisper encoder's log-mel features


def whisper_encoder_spec(layers) -> GraphSpec:
    """layers: the decoder's specs (one cross key / value pair per cross layer). The mel axis is fixed
    by the model (2 * frames)."""
    inputs = [TensorSpec(INPUT_FEATURES, MODEL_DTYPE, ("batch", None, None))]
    return GraphSpec(tuple(inputs), tuple(_cross_tensors(layers)))


__all__ = [
    "DEEPSTACK",
    "DRAFT_HIDDEN",
    "DRAFT_HIDDEN_OUT",
    "FEATURES",
    "FINAL_HIDDEN",
    "INPUT_FEATURES",
    "LOGITS",
    "PER_LAYER_INPUTS",
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
    "SHARED",
    "present",
    "shared_present",
    "window_capacity",
    "window_lengths",
    "whisper_encoder_spec",
]
