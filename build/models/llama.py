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

from typing import TYPE_CHECKING

import torch
from torch import nn

from trt_llm.build.models.layers import DecoderLayer, GatedMLP, activation, norm_weight
from trt_llm.build.models.skeleton import (DecoderSkeleton, ModelDims, release, rotary_rows, rotary_spec,
                                          text_decoder)
from trt_llm.schemas.layer_spec import FullAttention, SlidingAttention

if TYPE_CHECKING:
    from trt_llm.families.face import Family as ModelFamily


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


class DecoderGraph(DecoderSkeleton):
    """The Llama-shaped decoder on the skeleton (build/models/skeleton.py: its inputs, the hooks it turns
    on: EAGLE's feature taps, mRoPE, deepstack, LoRA, sliding windows): pre-norm attention and an MLP
    per layer (layers.DecoderLayer), the final norm (Gemma's scales by 1 + weight)."""

    @staticmethod
    def layer_specs_of(config, family, max_positions: int) -> list:
        return layer_specs(config, family, max_positions)

    def make_layer(self, hf_layer, spec, config, family, make_linear) -> nn.Module:
        mlp = self._mlp(hf_layer.mlp, activation(config), make_linear, self.build_dtype, self.weights)
        return DecoderLayer(hf_layer, self.dims, family, make_linear, spec, mlp)

    @staticmethod
    def final_norm_of(hf_model) -> nn.Module:
        return hf_model.model.norm

    @staticmethod
    def norm_weight_of(norm, family) -> nn.Parameter:
        return norm_weight(norm, family.gemma)

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


# What the build reads of a family's decoder module (build/bundle.py: graphs.ModelDims, text_decoder),
# and what the hybrid families share from here.
__all__ = ["DecoderGraph", "ModelDims", "layer_specs", "release", "rotary_rows", "rotary_spec", "text_decoder"]
