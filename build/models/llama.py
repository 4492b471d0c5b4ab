"""Llama-shaped decoders (Llama, Qwen2, Qwen3): our own forward pass over a Hugging Face model's
weights, the graph that gets exported.

Writing the forward ourselves keeps HF's mask and cache code out of the graph and gives the graph
contract of DESIGN.md section 5: per-sequence lengths, a fixed-capacity cache updated in place, and
logits only where asked. The families differ only in what `ModelFamily` says (Qwen3's q/k norm; Qwen2's
q/k/v biases are read from the checkpoint as they come).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import nn

from trt_llm.build.models.layers import (DecoderLayer, cast_floats, frozen, linear, mrope_streams, rms_norm,
                                        rotary_tables, sectioned_rotary)
from trt_llm.schemas.layer_spec import FullAttention, RotarySpec, SlidingAttention, window_of

if TYPE_CHECKING:
    from trt_llm.build.models import ModelFamily


class ModelDims:
    """The numbers the graph and the runtime agree on, read from a HF config."""

    def __init__(self, config):
        self.hidden_size = config.hidden_size
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.rms_norm_eps = config.rms_norm_eps

    def to_dict(self) -> dict:
        return dict(vars(self))



def rotary_spec(config, head_dim: int, mrope: str | None = None) -> RotarySpec:
    """What the rotary tables of a HF text config are (its rope_parameters, transformers 5)."""
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    base = parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    factor = parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    return RotarySpec(base=float(base), dims=int(head_dim * factor), scaling=str(parameters.get("rope_type", "default")),
                      mrope=mrope)


def layer_specs(config, family: "ModelFamily") -> list:
    """One spec per decoder layer of a Llama-shaped text config: full attention, or sliding-window
    attention where the config's layer_types says so (Qwen2 / Qwen3 with use_sliding_window: the
    layers from max_window_layers on)."""
    dims = ModelDims(config)
    kinds = list(getattr(config, "layer_types", None) or ["full_attention"] * dims.num_layers)
    common = dict(kv_heads=dims.kv_heads, head_dim=dims.head_dim, scale=dims.head_dim ** -0.5,
                  rotary=rotary_spec(config, dims.head_dim, family.mrope))
    specs = []
    for kind in kinds:
        if kind == "sliding_attention" and getattr(config, "sliding_window", None):
            specs.append(SlidingAttention(window=int(config.sliding_window), **common))
        elif kind in ("full_attention", "sliding_attention"):  # a sliding type without a window is full
            specs.append(FullAttention(**common))
        else:
            raise ValueError(f"layer_types: {kind!r} layers are not supported for {family.architecture}")
    return specs


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
                 lora_groups: list[str] = (), feature_layers: list[int] | None = None, make_linear=linear):
        """make_linear: every linear, the LM head included, is built by it (`linear`, or a
        quantizing build.quantize.factory.LinearFactory)."""
        super().__init__()
        vision_config = getattr(hf_model.config, "vision_config", None)
        hf_model = text_decoder(hf_model)
        self.dims = ModelDims(hf_model.config)
        self.layer_specs = layer_specs(hf_model.config, family)
        # One lengths input per sliding window (the slots its layers hold), after the tree mask.
        self.windows = sorted({window_of(spec) for spec in self.layer_specs} - {0})
        self.lora_groups = list(lora_groups)  # packed projections with LoRA inputs, per layer
        self.feature_layers = list(feature_layers) if feature_layers else None
        self.layers = nn.ModuleList(DecoderLayer(layer, self.dims, family.qk_norm, make_linear, spec)
                                    for layer, spec in zip(hf_model.model.layers, self.layer_specs))
        self.final_norm = frozen(hf_model.model.norm.weight)
        self.lm_head = make_linear(hf_model.lm_head)
        # HF's rotary module already resolved the rope type (default, llama3, yarn, ...) into
        # inv_freq and attention_scaling, so reading those keeps every scaling variant right.
        rotary = hf_model.model.rotary_emb
        cos, sin = rotary_tables(rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)),
                                 max_positions, dtype)
        self.register_buffer("cos_cache", cos)
        self.register_buffer("sin_cache", sin)
        streams = None if family.mrope is None else mrope_streams(rotary.mrope_section, family.mrope == "interleaved")
        self.register_buffer("mrope_streams", streams)
        self.deepstack_layers = len(getattr(vision_config, "deepstack_visual_indexes", None) or [])
        cast_floats(self, dtype)

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
        cos, sin = self.cos_cache, self.sin_cache
        if self.mrope_streams is not None:  # per-token rows, and position_ids becomes their index
            cos, sin, position_ids = sectioned_rotary(cos, sin, position_ids.long(), self.mrope_streams)
        caches, lora = tensors[: 2 * len(self.layers)], tensors[2 * len(self.layers):]
        per_layer = 2 * len(self.lora_groups)
        hidden = inputs_embeds
        presents, entering = [], {}
        for i, layer in enumerate(self.layers):
            entering[i] = hidden
            pairs = lora[i * per_layer: (i + 1) * per_layer]
            layer_lora = {g: (pairs[2 * j], pairs[2 * j + 1]) for j, g in enumerate(self.lora_groups)}
            hidden, key, value = layer(
                hidden, caches[2 * i], caches[2 * i + 1], lengths.get(layer.window, past_lengths), query_lengths,
                position_ids, cos, sin, layer_lora, tree_mask,
            )
            if i < self.deepstack_layers:
                hidden = hidden + deepstack[i]
            presents += [key, value]
        # The LM head runs only where logits are asked for: gather those positions first.
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        hidden = torch.gather(hidden, 1, index)
        hidden = rms_norm(hidden, self.final_norm, self.dims.rms_norm_eps)
        logits = self.lm_head(hidden).float()
        if self.feature_layers is not None:
            return (logits, torch.cat([entering[i] for i in self.feature_layers], dim=-1), *presents)
        return (logits, *presents)

