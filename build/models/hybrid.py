"""What the hybrid families (trt_llm/families/qwen3_5/decoder.py, lfm2.py) share: decoders whose layers are
either full attention on our attention op or a recurrent mixer keeping fixed-size states
(schemas/layer_spec.py's `recurrent`), in the order the config's `layer_types` gives.

`HybridGraph` is their decoder graph: the LM head, the layers made by the family's `make_layer`,
the final norm and one rotary table for the attention layers; its forward passes each layer its
own cache tensors (an attention layer's key and value, a recurrent layer's states, in spec order)
and returns the logits and every present tensor in the same order (schemas/graph_spec.py).

Rows are ragged and right-padded. A recurrent mixer must leave a row's state as it was after the
row's own tokens: `causal_conv` gathers the new convolution state at the row's end, the delta rule
treats padding as no-ops. A row whose past length is 0 is a new sequence (`fresh`): its past states
count as zeros, whatever its buffers hold (runtime/cache/recurrent_cache.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import cast_floats, linear, rms_norm
from trt_llm.build.models.llama import ModelDims, release, rotary_rows, text_decoder


def fresh(state: Tensor, past_lengths: Tensor) -> Tensor:
    """`state` [B, ...] with the rows of a new sequence (past length 0) as zeros."""
    keep = (past_lengths > 0).view(-1, *[1] * (state.dim() - 1))
    return torch.where(keep, state, torch.zeros_like(state))


def causal_conv(x: Tensor, state: Tensor, weight: Tensor, query_lengths: Tensor,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A depthwise causal convolution over each row's state and new tokens (no activation).

    x [B, S, C] (right-padded rows), state [B, C, K - 1], weight [C, K]. Returns the output [B, S, C]
    and the new state: the last K - 1 inputs before each row's end (its query length), which is the
    old state shifted where a row has fewer new tokens than K - 1 (none: unchanged)."""
    kernel = weight.shape[-1]
    both = torch.cat([state, x.transpose(1, 2)], dim=-1)  # [B, C, K - 1 + S]
    out = F.conv1d(both, weight.unsqueeze(1), bias, groups=weight.shape[0])  # [B, C, S]
    taps = query_lengths.long().view(-1, 1, 1) + torch.arange(kernel - 1, device=x.device).view(1, 1, -1)
    new_state = torch.gather(both, 2, taps.expand(-1, both.shape[1], -1))
    return out.transpose(1, 2), new_state


class HybridGraph(nn.Module):
    """inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, caches -> logits,
    caches. A family subclasses it with `layer_specs_of(config, family)`, `make_layer(hf_layer, spec, config,
    dims, make_linear)` (a recurrent layer: forward(hidden, *states, past_lengths, query_lengths,
    lora) -> (hidden, *states); an attention one: forward(hidden, key, value, past_lengths,
    query_lengths, position_ids, cos, sin, lora) -> (hidden, key, value); lora: the layer's LoRA
    pairs by group, its MLP's only), `final_norm(hf_model)` (the checkpoint's
    module) and `norm_weight(norm)` (the weight rms_norm multiplies by)."""

    name = "this hybrid family"

    def __init__(self, hf_model, family, max_positions: int, dtype: torch.dtype, lora_groups: list[str] = (),
                 feature_layers: list[int] | None = None, make_linear=linear, release_layers: bool = False,
                 weights=None):
        super().__init__()
        from trt_llm.build.compile import BuildError

        if feature_layers is not None:
            raise BuildError("draft: an EAGLE draft on a hybrid (recurrent) model is not supported: the rejected "
                             "nodes of a tree would stay in the recurrent states; build without draft:")
        if set(lora_groups) - {"gate_up", "down"}:
            raise BuildError(f"lora: {self.name}'s adapters go on its MLPs only; build without lora:")
        hf_model = text_decoder(hf_model)
        config = hf_model.config
        self.build_dtype, self.weights = dtype, weights  # (what a layer with experts reads them with)
        self.dims = ModelDims(config)
        self.layer_specs = self.layer_specs_of(config, family)
        # What the exporter and the build read of a decoder graph (build/export.py, build/bundle.py)
        self.windows, self.lora_groups, self.feature_layers = [], list(lora_groups), None
        self.deepstack_layers, self.mrope_streams = 0, None
        if weights is not None:
            weights.load(hf_model.lm_head, dtype=None)
        self.lm_head = make_linear(hf_model.lm_head)
        if weights is not None:
            release(hf_model.lm_head)
        layers = []
        for hf_layer, spec in zip(hf_model.model.layers, self.layer_specs):
            if weights is not None:
                weights.load(hf_layer)
            layers.append(self.make_layer(hf_layer, spec, config, self.dims, make_linear))
            if release_layers or weights is not None:
                release(hf_layer)
        self.layers = nn.ModuleList(layers)
        norm = self.final_norm(hf_model)
        if weights is not None:
            weights.load(norm)
        self.final_norm_weight = self.norm_weight(norm)
        cos, sin = rotary_rows(hf_model.model.rotary_emb, config, "full_attention", max_positions, dtype)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        cast_floats(self, dtype)
        for layer in self.layers:
            if hasattr(layer, "keep_float32"):
                layer.keep_float32()

    def forward(self, inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, *tensors):
        """tensors: the caches (each layer's, in order), then the LoRA pairs (per layer, per group)."""
        hidden, presents, at = inputs_embeds, [], 0
        per_layer = 2 * len(self.lora_groups)
        lora = tensors[len(tensors) - per_layer * len(self.layers):] if per_layer else ()
        for i, (layer, spec) in enumerate(zip(self.layers, self.layer_specs)):
            count = len(spec.states) if spec.kind == "recurrent" else 2
            mine = tensors[at: at + count]
            at += count
            pairs = lora[i * per_layer: (i + 1) * per_layer]
            layer_lora = {g: (pairs[2 * j], pairs[2 * j + 1]) for j, g in enumerate(self.lora_groups)}
            if spec.kind == "recurrent":
                hidden, *mine = layer(hidden, *mine, past_lengths, query_lengths, layer_lora)
            else:
                hidden, *mine = layer(hidden, *mine, past_lengths, query_lengths, position_ids, self.cos, self.sin,
                                      layer_lora)
            presents += mine
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        hidden = rms_norm(torch.gather(hidden, 1, index), self.final_norm_weight, self.dims.rms_norm_eps)
        return (self.lm_head(hidden).float(), *presents)


__all__ = ["HybridGraph", "ModelDims", "causal_conv", "fresh", "text_decoder"]
