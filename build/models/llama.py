"""Llama-shaped decoders (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 2 / 3, Qwen3-MoE): our own forward
pass over a Hugging Face model's weights, the graph that gets exported.

Writing the forward ourselves keeps HF's mask and cache code out of the graph and gives the graph
contract of DESIGN.md section 5: per-sequence lengths, a fixed-capacity cache updated in place, and
logits only where asked. The families differ in what `ModelFamily` says (Qwen3's q/k norm, Gemma's
norms and embedding scale, a mixture of experts) and in what their config says, which is read here:
layer_types and sliding_window, rope_parameters (per layer type for Gemma 3; LongRoPE for Phi-3),
partial rotary, query_pre_attn_scalar, the soft-caps, the activation. Qwen2's q/k/v biases and Phi-3's
packed projections are read from the checkpoint as they come.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import nn

from trt_llm.build.models.layers import (DecoderLayer, GatedMLP, activation, cast_floats, linear, mrope_streams,
                                        norm_weight, rms_norm, rotary_tables, sectioned_rotary)
from trt_llm.schemas.layer_spec import FullAttention, RotarySpec, SlidingAttention, window_of

if TYPE_CHECKING:
    from trt_llm.families.face import Family as ModelFamily


class ModelDims:
    """The numbers the graph and the runtime agree on, read from a HF config."""

    def __init__(self, config):
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
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


def layer_specs(config, family: "ModelFamily", max_positions: int | None = None) -> list:
    """One spec per decoder layer of a Llama-shaped text config: full attention, or sliding-window
    attention where the config's layer_types says so (Qwen2 / Qwen3 with use_sliding_window: the
    layers from max_window_layers on; Gemma 2 / 3: their local layers), or on every layer when a
    config with a sliding_window has no layer_types (Mistral, Phi-3, as transformers reads them)."""
    dims = ModelDims(config)
    window = getattr(config, "sliding_window", None)
    if window and max_positions and window >= max_positions:
        window = None  # a window of the whole capacity (Phi-3-128k's 262144) is full attention
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        kinds = ["sliding_attention" if window else "full_attention"] * dims.num_layers
    scalar = getattr(config, "query_pre_attn_scalar", None)  # Gemma: q k^T / sqrt(this), not head_dim
    common = dict(kv_heads=dims.kv_heads, head_dim=dims.head_dim, scale=float(scalar or dims.head_dim) ** -0.5,
                  soft_cap=getattr(config, "attn_logit_softcapping", None))
    specs = []
    for kind in kinds:
        rotary = rotary_spec(config, dims.head_dim, family.mrope, kind, max_positions)
        if kind == "sliding_attention" and window:
            specs.append(SlidingAttention(window=int(window), rotary=rotary, **common))
        elif kind in ("full_attention", "sliding_attention"):  # a sliding type without a window is full
            specs.append(FullAttention(rotary=rotary, **common))
        else:
            raise ValueError(f"layer_types: {kind!r} layers are not supported for {family.architecture}")
    return specs


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
    if hasattr(inner, "language_model"):
        return SimpleNamespace(model=inner.language_model, lm_head=hf_model.lm_head,
                               config=hf_model.config.text_config)
    return hf_model


class DecoderGraph(nn.Module):
    """inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, caches -> logits, caches.

    As an EAGLE base (`feature_layers` set) it also takes a tree_mask [B, S, S] (after
    logits_indices) and returns hidden_states [B, S, 3H]: the hidden states entering those layers,
    for every new token, which the draft model reads.

    A vision-language decoder (family.mrope) takes position_ids [3, B, S], the time, row and column
    of each token (all three the same for text), and turns each rotary frequency by one of them;
    Qwen3-VL's also takes deepstack_embeds [k, B, S, H] after logits_indices, the vision tower's
    early features at the image tokens (zeros elsewhere), added to the hidden states after its
    first k layers.
    """

    def __init__(self, hf_model, family: "ModelFamily", max_positions: int, dtype: torch.dtype,
                 lora_groups: list[str] = (), feature_layers: list[int] | None = None, make_linear=linear,
                 release_layers: bool = False, weights=None):
        """make_linear: every linear, the LM head included, is built by it (`linear`, or a
        quantizing build.quantize.factory.LinearFactory). release_layers: empty each of hf_model's
        decoder layers once it is converted (the build, which needs them no more: the checkpoint and
        the graph are then never both in memory whole). weights: a build.streamed_weights
        StreamedWeights when hf_model is on the meta device: each module is read from the files just
        before it is converted (the experts one at a time), and emptied after."""
        super().__init__()
        vision_config = getattr(hf_model.config, "vision_config", None)
        hf_model = text_decoder(hf_model)
        config = hf_model.config
        self.dims = ModelDims(config)
        self.layer_specs = layer_specs(config, family, max_positions)
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * self.dims.num_layers
        # One lengths input per sliding window (the slots its layers hold), after the tree mask.
        self.windows = sorted({window_of(spec) for spec in self.layer_specs} - {0})
        self.lora_groups = list(lora_groups)  # packed projections with LoRA inputs, per layer
        self.feature_layers = list(feature_layers) if feature_layers else None
        act = activation(config)
        # The LM head first: a large one (a 150k vocabulary) is read and quantized before the
        # layers' weights have accumulated.
        if weights is not None:
            weights.load(hf_model.lm_head, dtype=None)  # as stored: the factory converts it in slices
        self.lm_head = make_linear(hf_model.lm_head)
        if weights is not None:
            release(hf_model.lm_head)
        layers = []
        for layer, spec in zip(hf_model.model.layers, self.layer_specs):
            if weights is not None:
                weights.load(layer)
            layers.append(DecoderLayer(layer, self.dims, family, make_linear, spec,
                                       self._mlp(layer.mlp, act, make_linear, dtype, weights)))
            if release_layers or weights is not None:  # every tensor of ours is a copy (frozen, packed, quantized)
                release(layer)
        self.layers = nn.ModuleList(layers)
        if weights is not None:
            weights.load(hf_model.model.norm)
        self.final_norm = norm_weight(hf_model.model.norm, family.gemma)
        # Gemma scales the embedding by sqrt(hidden), rounded to the dtype the model runs in.
        self.embed_scale = float(torch.tensor(self.dims.hidden_size ** 0.5, dtype=dtype)) if family.gemma else None
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        # The rotary tables, one pair per layer type that has its own (Gemma 3's local layers).
        rotary = hf_model.model.rotary_emb
        keys = [kind if hasattr(rotary, f"{kind}_inv_freq") else "default" for kind in kinds]
        first_kind = {}
        for key, kind in zip(keys, kinds):
            first_kind.setdefault(key, kind)
        tables = {key: i for i, key in enumerate(first_kind)}
        for key, kind in first_kind.items():
            cos, sin = rotary_rows(rotary, config, kind, max_positions, dtype)
            self.register_buffer(f"cos_{tables[key]}", cos)
            self.register_buffer(f"sin_{tables[key]}", sin)
        self.table_of = [tables[key] for key in keys]
        streams = None if family.mrope is None else mrope_streams(rotary.mrope_section, family.mrope == "interleaved")
        self.register_buffer("mrope_streams", streams)
        self.deepstack_layers = len(getattr(vision_config, "deepstack_visual_indexes", None) or [])
        cast_floats(self, dtype)

    @staticmethod
    def _mlp(hf_mlp, act, make_linear, dtype: torch.dtype, weights=None) -> nn.Module:
        """A layer's MLP: gated, or a mixture of experts where the checkpoint has one (Qwen3-MoE: its
        `mlp_only_layers` and `decoder_sparse_step` already chose which), quantized as the linears are."""
        if hasattr(hf_mlp, "experts"):
            from trt_llm.build.models.moe import SparseMoe

            try:
                if hasattr(make_linear, "moe"):  # a quantizing factory
                    return make_linear.moe(hf_mlp, weights)
                return SparseMoe.from_hf(hf_mlp, None, dtype, weights)
            except ValueError as error:  # a quantization the experts cannot take: the build's one line
                from trt_llm.build.compile import BuildError

                raise BuildError(f"quantization: {error}") from None
        return GatedMLP(hf_mlp, act, make_linear)

    def forward(self, inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, *tensors):
        """tensors: [deepstack_embeds], [tree_mask if an EAGLE base], each sliding window's lengths,
        the caches (key, value per layer), then the LoRA pairs (per layer, per group)."""
        tree_mask = deepstack = None
        if self.deepstack_layers:
            deepstack, tensors = tensors[0], tensors[1:]
        if self.feature_layers is not None:
            tree_mask, tensors = tensors[0], tensors[1:]
        lengths = dict(zip(self.windows, tensors[: len(self.windows)]))
        tensors = tensors[len(self.windows):]
        tables = [(getattr(self, f"cos_{i}"), getattr(self, f"sin_{i}")) for i in range(max(self.table_of) + 1)]
        if self.mrope_streams is not None:  # per-token rows, and position_ids becomes their index
            (cos, sin, index), = [sectioned_rotary(*tables[0], position_ids.long(), self.mrope_streams)]
            tables, position_ids = [(cos, sin)], index
        caches, lora = tensors[: 2 * len(self.layers)], tensors[2 * len(self.layers):]
        per_layer = 2 * len(self.lora_groups)
        hidden = inputs_embeds if self.embed_scale is None else inputs_embeds * self.embed_scale
        presents, entering = [], {}
        for i, layer in enumerate(self.layers):
            entering[i] = hidden
            pairs = lora[i * per_layer: (i + 1) * per_layer]
            layer_lora = {g: (pairs[2 * j], pairs[2 * j + 1]) for j, g in enumerate(self.lora_groups)}
            hidden, key, value = layer(
                hidden, caches[2 * i], caches[2 * i + 1], lengths.get(layer.window, past_lengths), query_lengths,
                position_ids, *tables[self.table_of[i]], layer_lora, tree_mask,
            )
            if i < self.deepstack_layers:
                hidden = hidden + deepstack[i]
            presents += [key, value]
        # The LM head runs only where logits are asked for: gather those positions first.
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        hidden = torch.gather(hidden, 1, index)
        hidden = rms_norm(hidden, self.final_norm, self.dims.rms_norm_eps)
        logits = self.lm_head(hidden).float()
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        if self.feature_layers is not None:
            return (logits, torch.cat([entering[i] for i in self.feature_layers], dim=-1), *presents)
        return (logits, *presents)

