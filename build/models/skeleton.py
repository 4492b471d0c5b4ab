"""The one decoder graph of every decoder-only family: its inputs taken by name from the graph spec
(schemas/graph_spec.py's `decoder_spec` of the layers' specs), the layer loop, the final norm and the
LM head written once. A family says what differs:

    layer_specs_of(config, family, max_positions)   one schemas/layer_spec entry per decoder layer
    make_layer(hf_layer, spec, config, family, make_linear)
                                                    the layer module: an attention layer's forward is
                                                    (hidden, key, value, lengths, query_lengths,
                                                    position_ids, cos, sin, lora, tree_mask) -> (hidden,
                                                    key, value); a recurrent one's (hidden, *states,
                                                    past_lengths, query_lengths, lora) -> (hidden, *states)
    final_norm_of(hf_model), norm_weight_of(norm, family)
                                                    the final norm's module and the weight rms_norm
                                                    multiplies by

and what it turns on, each a hook the skeleton runs where the graph spec has its input: sliding
windows (a `past_lengths_w<W>` per window, from the specs), mRoPE (the family's `mrope`: per-token
rotary rows from position_ids [3, B, S]), deepstack (Qwen3-VL: vision features added after the first k
layers), EAGLE's feature taps (the hidden states entering `feature_layers`, a `tree_mask` input), a
`tree_mask` alone (the family's `bidirectional_images`: Gemma 3's image tokens see each other both
ways), LoRA (pairs by packed group and layer) and the final logit soft-cap. Gemma's embedding scale is
the runtime's (the manifest's model.embedding_scale: it scales the token rows it looks up, not an
image's rows, which transformers leaves unscaled), so the graph takes inputs_embeds as they come.

Rows are ragged and right-padded; the LM head runs only where `logits_indices` asks, the final norm at
every position (the final_hidden_states output).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from trt_llm.build.models.layers import cast_floats, linear, mrope_streams, rms_norm, rotary_tables, sectioned_rotary
from trt_llm.schemas.graph_spec import DEEPSTACK, TREE_MASK, decoder_spec, lora_input, past, window_lengths
from trt_llm.schemas.layer_spec import RotarySpec, window_of


def _shared(config, name: str):
    """A config value of every layer. transformers 5.25's heterogeneous configs (Gemma 4's
    per_layer_config) raise for one that varies by layer: the first layer's then, which only the
    manifest's dims show (each layer's spec has its own)."""
    try:
        return getattr(config, name, None)
    except RuntimeError:  # (AmbiguousGlobalPerLayerAttributeError)
        return getattr(config.per_layer_config[0], name, None)


class ModelDims:
    """The numbers the graph and the runtime agree on, read from a HF config."""

    def __init__(self, config):
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.kv_heads = _shared(config, "num_key_value_heads") or self.num_heads
        self.head_dim = _shared(config, "head_dim") or self.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.rms_norm_eps = getattr(config, "norm_eps", None) or config.rms_norm_eps  # (LFM2 names it norm_eps)

    def to_dict(self) -> dict:
        return dict(vars(self))


def _rope_parameters(config, layer_type: str | None) -> dict:
    """A text config's rope_parameters (transformers 5) for a layer of `layer_type`: Gemma 3 keeps one
    set per layer type (its sliding layers' own base), the others one for all."""
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type in parameters and isinstance(parameters[layer_type], dict):
        return dict(parameters[layer_type])
    return parameters


def rotary_spec(config, head_dim: int, mrope: str | None = None, layer_type: str | None = None,
                max_positions: int | None = None) -> RotarySpec:
    """What the rotary tables of a layer of a HF text config are. LongRoPE (Phi-3): the tables hold
    the short factors' rows, then from row max_positions the long factors' (`long_rows`)."""
    parameters = _rope_parameters(config, layer_type)
    base = parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    factor = parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    scaling = str(parameters.get("rope_type", "default"))
    longrope = scaling == "longrope"
    return RotarySpec(base=float(base), dims=int(head_dim * factor), scaling=scaling, mrope=mrope,
                      original_context=int(parameters["original_max_position_embeddings"]) if longrope else None,
                      long_rows=max_positions if longrope else None)


def rotary_rows(hf_rotary, config, layer_type: str, max_positions: int, dtype: torch.dtype):
    """A layer type's cos/sin tables from transformers' rotary module, which already resolved the
    rope type (default, linear, llama3, yarn, longrope, ...) into inv_freq and attention_scaling (Gemma
    3's holds one pair per layer type). LongRoPE: the short factors' rows, then the long factors'."""
    prefix = f"{layer_type}_" if hasattr(hf_rotary, f"{layer_type}_inv_freq") else ""
    scaling = float(getattr(hf_rotary, f"{prefix}attention_scaling", 1.0))
    inv_freq = getattr(hf_rotary, f"{prefix}original_inv_freq", None)
    if inv_freq is None:
        inv_freq = getattr(hf_rotary, f"{prefix}inv_freq")
    cos, sin = rotary_tables(inv_freq, scaling, max_positions, dtype)
    parameters = _rope_parameters(config, layer_type)
    if parameters.get("rope_type") != "longrope":
        return cos, sin
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # transformers switches to the long factors once a forward's sequence is longer than this
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None,
                                                       seq_len=parameters["original_max_position_embeddings"] + 1)
    long_cos, long_sin = rotary_tables(long_inv_freq, scaling, max_positions, dtype)
    return torch.cat([cos, long_cos]), torch.cat([sin, long_sin])


def release(module: nn.Module) -> None:
    """Empty a checkpoint module's tensors once the graph has its own copies."""
    for tensor in [*module.parameters(), *module.buffers()]:
        if not tensor.is_meta:  # a streamed module's experts were never read into it
            tensor.data = torch.empty(0, dtype=tensor.dtype)


def text_decoder(hf_model):
    """The causal LM part of a checkpoint, with the attributes DecoderGraph reads: `model` (layers,
    norm, rotary_emb), `lm_head` and `config`. A vision-language model's is its language model."""
    inner = getattr(hf_model, "model", None)
    language = getattr(inner, "language_model", None) or getattr(inner, "text_model", None)  # (Idefics3's name)
    if language is not None:
        return SimpleNamespace(model=language, lm_head=hf_model.lm_head, config=hf_model.config.text_config)
    return hf_model



class DecoderSkeleton(nn.Module):
    """inputs (by the graph spec's names) -> logits, [hidden_states], [final_hidden_states], the caches'
    presents."""

    per_layer_width = 0  # the width of a per_layer_inputs input (Gemma 4's layers x P); 0: none
    returns_kept = False  # run_layers returns the hidden states at logits_indices only (Gemma 4's)

    def __init__(self, hf_model, family, max_positions: int, dtype: torch.dtype, lora_groups: list[list[str]] = (),
                 feature_layers: list[int] | None = None, make_linear=linear, release_layers: bool = False,
                 weights=None):
        """make_linear: every linear, the LM head included, is built by it (`linear`, or a
        quantizing build.quantize.factory.LinearFactory). release_layers: empty each of hf_model's
        decoder layers once it is converted (the build, which needs them no more: the checkpoint and
        the graph are then never both in memory whole). weights: a build.streamed_weights
        StreamedWeights when hf_model is on the meta device: each module is read from the files just
        before it is converted, and emptied after. feature_layers: an EAGLE base's taps."""
        super().__init__()
        vision_config = getattr(hf_model.config, "vision_config", None)
        image_tokens = getattr(hf_model.config, "mm_tokens_per_image", 0)  # (Gemma 3's, per image or crop)
        hf_model = text_decoder(hf_model)
        config = hf_model.config
        self.build_dtype, self.weights = dtype, weights  # (what a layer with experts reads them with)
        self.dims = ModelDims(config)
        self.layer_specs = self.layer_specs_of(config, family, max_positions)
        self.windows = sorted({window_of(spec) for spec in self.layer_specs} - {0})
        # per layer, its packed projections with LoRA inputs (build/lora.graph_groups; none: no LoRA)
        self.lora_groups = [list(names) for names in lora_groups] or [[] for _ in range(config.num_hidden_layers)]
        self.feature_layers = list(feature_layers) if feature_layers else None
        self.deepstack_layers = len(getattr(vision_config, "deepstack_visual_indexes", None) or [])
        self.mrope = family.mrope
        self.masked = family.bidirectional_images
        self.bidirectional_block = image_tokens if self.masked else 0
        # The LM head first: a large one (a 150k vocabulary) is read and quantized before the
        # layers' weights have accumulated.
        if weights is not None:
            weights.load(hf_model.lm_head, dtype=None)  # as stored: the factory converts it in slices
        self.lm_head = make_linear(hf_model.lm_head)
        if weights is not None:
            release(hf_model.lm_head)
        layers = []
        for hf_layer, spec in zip(hf_model.model.layers, self.layer_specs):
            if weights is not None:
                weights.load(hf_layer)
            layers.append(self.make_layer(hf_layer, spec, config, family, make_linear))
            if release_layers or weights is not None:  # every tensor of ours is a copy (frozen, packed, quantized)
                release(hf_layer)
        self.layers = nn.ModuleList(layers)
        norm = self.final_norm_of(hf_model)
        if weights is not None:
            weights.load(norm)
        self.final_norm = self.norm_weight_of(norm, family)
        # Gemma scales the embedding by sqrt(hidden), rounded to the dtype the model runs in (the
        # runtime does, by the manifest: see the module docstring).
        self.embed_scale = float(torch.tensor(self.dims.hidden_size ** 0.5, dtype=dtype)) if family.gemma else None
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        self._rotary_tables(hf_model.model.rotary_emb, config, max_positions, dtype)
        cast_floats(self, dtype)
        for layer in self.layers:
            if hasattr(layer, "keep_float32"):  # (a recurrent layer's decay parameters)
                layer.keep_float32()

    def _rotary_tables(self, rotary, config, max_positions: int, dtype: torch.dtype) -> None:
        """One pair of cos/sin tables per attention layer type that has its own (Gemma 3's local
        layers), and which pair each layer reads (`table_of`; a recurrent layer reads none)."""
        types = getattr(config, "layer_types", None) or ["full_attention"] * len(self.layer_specs)
        keys, first_type = [], {}
        for spec, layer_type in zip(self.layer_specs, types):
            if spec.kind == "recurrent":
                keys.append(None)
                continue
            key = layer_type if hasattr(rotary, f"{layer_type}_inv_freq") else "default"
            first_type.setdefault(key, layer_type)
            keys.append(key)
        tables = {key: i for i, key in enumerate(first_type)}
        for key, layer_type in first_type.items():
            cos, sin = rotary_rows(rotary, config, layer_type, max_positions, dtype)
            self.register_buffer(f"cos_{tables[key]}", cos)
            self.register_buffer(f"sin_{tables[key]}", sin)
        self.table_of = [None if key is None else tables[key] for key in keys]
        width = self.cos_0.shape[-1] if tables else None
        streams = None if self.mrope is None else mrope_streams(rotary.mrope_section, self.mrope == "interleaved",
                                                                  width)
        self.register_buffer("mrope_streams", streams)

    @property
    def input_names(self) -> list[str]:
        """The graph's inputs in the spec's order (what the exporter passes, by these names)."""
        lora = {"num_layers": len(self.layers), "layer_groups": [[{"name": g} for g in names] for names in self.lora_groups]}
        return decoder_spec(self.layer_specs, self.feature_layers is not None, lora if any(self.lora_groups) else None,
                            self.mrope is not None, self.deepstack_layers, self.masked,
                            self.per_layer_width).input_names

    def forward(self, *tensors):
        inputs = dict(zip(self.input_names, tensors))
        position_ids = inputs["position_ids"]
        tables = [(getattr(self, f"cos_{i}"), getattr(self, f"sin_{i}"))
                  for i in range(max((t for t in self.table_of if t is not None), default=-1) + 1)]
        if self.mrope_streams is not None:  # per-token rows, and position_ids becomes their index
            rows = [sectioned_rotary(cos, sin, position_ids.long(), self.mrope_streams) for cos, sin in tables]
            tables, position_ids = [(cos, sin) for cos, sin, _ in rows], rows[0][2]
        hidden, presents, entering = self.run_layers(inputs, position_ids, tables)
        # The final norm at every position (final_hidden_states: embeddings, an MTP head), then the LM head
        # only where logits are asked for. The norm is row-wise: a row's value is the one it had normed
        # after the gather. A graph whose layers returned the kept rows only has no such output.
        hidden = rms_norm(hidden, self.final_norm, self.dims.rms_norm_eps)
        final = [] if self.returns_kept else [hidden]
        if not self.returns_kept:
            index = inputs["logits_indices"].long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            hidden = torch.gather(hidden, 1, index)
        logits = self.lm_head(hidden).float()
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        if self.feature_layers is not None:
            return (logits, torch.cat([entering[i] for i in self.feature_layers], dim=-1), *final, *presents)
        return (logits, *final, *presents)

    def lora_of(self, inputs: dict, layer: int) -> dict:
        """Layer `layer`'s LoRA pairs by packed group."""
        return {g: (inputs[lora_input(g, "a", layer)], inputs[lora_input(g, "b", layer)]) for g in self.lora_groups[layer]}

    def run_layers(self, inputs: dict, position_ids, tables: list) -> tuple:
        """The layer loop: (the last layer's hidden states, the caches' presents in the spec's order,
        the hidden states entering each layer). A family whose layers pass more between them than the
        hidden states (Gemma 4's per-layer inputs and shared keys and values) has its own."""
        past_lengths, query_lengths = inputs["past_lengths"], inputs["query_lengths"]
        tree_mask, deepstack = inputs.get(TREE_MASK), inputs.get(DEEPSTACK)
        hidden = inputs["inputs_embeds"]
        presents, entering = [], {}
        for i, (layer, spec) in enumerate(zip(self.layers, self.layer_specs)):
            entering[i] = hidden
            lora = self.lora_of(inputs, i)
            if spec.kind == "recurrent":
                hidden, *mine = layer(hidden, *(inputs[past(state.name, i)] for state in spec.states),
                                      past_lengths, query_lengths, lora)
            else:
                window = window_of(spec)
                lengths = inputs[window_lengths(window)] if window else past_lengths
                hidden, *mine = layer(hidden, inputs[past("key", i)], inputs[past("value", i)], lengths,
                                      query_lengths, position_ids, *tables[self.table_of[i]], lora, tree_mask)
            if deepstack is not None and i < self.deepstack_layers:
                hidden = hidden + deepstack[i]
            presents += mine
        return hidden, presents, entering
