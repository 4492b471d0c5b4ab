"""What the hybrid families (trt_llm/families/qwen3_5/decoder.py, lfm2.py) share: decoders whose layers are
either full attention on our attention op or a recurrent mixer keeping fixed-size states
(schemas/layer_spec.py's `recurrent`), in the order the config's `layer_types` gives.

`HybridGraph` is their decoder graph: the decoder skeleton (build/models/skeleton.py: the LM head,
the layers made by the family's `make_layer`, the final norm, the rotary tables of the attention
layers), which passes each layer its own cache tensors by name (an attention layer's key and value,
a recurrent layer's states) and returns the logits and every present tensor in the graph spec's
order (schemas/graph_spec.py).

Rows are ragged and right-padded. A recurrent mixer must leave a row's state as it was after the
row's own tokens: `causal_conv` gathers the new convolution state at the row's end, the delta rule
treats padding as no-ops. A row whose past length is 0 is a new sequence (`fresh`): its past states
count as zeros, whatever its buffers hold (runtime/cache/recurrent_cache.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from trt_llm.build.models.layers import linear
from trt_llm.build.models.skeleton import DecoderSkeleton, ModelDims, text_decoder


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


class HybridGraph(DecoderSkeleton):
    """The decoder skeleton (build/models/skeleton.py) over attention and recurrent layers. A family
    subclasses it with `layer_specs_of(config, family, max_positions)`, `make_layer(hf_layer, spec,
    config, family, make_linear)` (a recurrent layer: forward(hidden, *states, past_lengths,
    query_lengths, lora) -> (hidden, *states); an attention one the skeleton's attention layer
    interface), `final_norm_of(hf_model)` (the checkpoint's module) and `norm_weight_of(norm,
    family)` (the weight rms_norm multiplies by). LoRA goes on the MLPs only (`LORA_TARGETS`), which
    every layer has; the mixers differ layer by layer."""

    name = "this hybrid family"

    def __init__(self, hf_model, family, max_positions: int, dtype: torch.dtype, lora_groups: list[list[str]] = (),
                 feature_layers: list[int] | None = None, make_linear=linear, release_layers: bool = False,
                 weights=None):
        from trt_llm.build.compile import BuildError

        if {g for names in lora_groups for g in names} - {"gate_up", "down"}:
            raise BuildError(f"lora: {self.name}'s adapters go on its MLPs only; build without lora:")
        super().__init__(hf_model, family, max_positions, dtype, lora_groups, feature_layers, make_linear,
                         release_layers, weights)


__all__ = ["HybridGraph", "ModelDims", "causal_conv", "fresh", "text_decoder"]
