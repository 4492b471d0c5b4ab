"""LFM2 (`Lfm2ForCausalLM`, Liquid AI): a hybrid decoder of short gated convolutions and grouped-query
attention layers, per the config's `layer_types` ("conv" / "full_attention").

Chosen as the second recurrent mechanism (beside Qwen3.5's Gated DeltaNet) over NemotronH's Mamba2
because it runs in transformers on a CPU with nothing optional: its convolution is plain torch,
while NemotronH's Mamba2 mixer wants the mamba-ssm kernels for its fast path and its long
reference scan for the rest. Its one state per conv layer is the short convolution's:

    conv   [hidden, L - 1]   the last inputs of the depthwise convolution (L = conv_L_cache)

A conv layer (transformers' Lfm2ShortConv): in_proj gives B, C and x; the convolution runs over B * x
after the state, its output is gated by C, then out_proj. The attention layers are Llama's with an
RMSNorm over each head of q and k (q_layernorm / k_layernorm). Every block is pre-norm (operator_norm,
ffn_norm) with a SwiGLU feed-forward (w1 gate, w3 up, w2 down); the final norm is `embedding_norm`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from trt_llm.build.models.hybrid import HybridGraph, ModelDims, causal_conv, fresh, text_decoder
from trt_llm.build.models.layers import GatedMLP, frozen, norm_weight, rms_norm
from trt_llm.build.models.skeleton import rotary_spec
from trt_llm.schemas.layer_spec import FullAttention, Recurrent, StateTensor

__all__ = ["DecoderGraph", "LORA_TARGETS", "ModelDims", "layer_specs", "text_decoder"]

# What LoRA adapters may target (build/bundle.hybrid_lora_layout): none yet (its MLP's modules are
# w1 / w3 / w2, which the adapters' loader does not name).
LORA_TARGETS = ()


def layer_specs(config) -> list:
    dims = ModelDims(config)
    specs = []
    for kind in config.layer_types:
        if kind == "conv":
            specs.append(Recurrent(states=[StateTensor(name="conv", shape=[dims.hidden_size, config.conv_L_cache - 1])]))
        elif kind == "full_attention":
            specs.append(FullAttention(kv_heads=dims.kv_heads, head_dim=dims.head_dim, scale=dims.head_dim ** -0.5,
                                       rotary=rotary_spec(config, dims.head_dim)))
        else:
            raise ValueError(f"layer_types: {kind!r} layers are not supported for LFM2")
    return specs


def feed_forward(hf_layer, make_linear) -> GatedMLP:
    """LFM2's SwiGLU (w1 gate, w3 up, w2 down) as the gated MLP of every family."""
    ff = hf_layer.feed_forward
    return GatedMLP(SimpleNamespace(gate_proj=ff.w1, up_proj=ff.w3, down_proj=ff.w2), torch.nn.functional.silu,
                    make_linear)


class ShortConvLayer(nn.Module):
    def __init__(self, hf_layer, dims, make_linear):
        super().__init__()
        conv = hf_layer.conv
        self.eps = dims.rms_norm_eps
        self.input_norm = norm_weight(hf_layer.operator_norm, False)
        self.post_norm = norm_weight(hf_layer.ffn_norm, False)
        self.proj = make_linear(conv.in_proj)
        self.conv_weight = frozen(conv.conv.weight.detach().squeeze(1))  # [H, L]
        self.conv_bias = frozen(conv.conv.bias) if conv.conv.bias is not None else None
        self.out = make_linear(conv.out_proj)
        self.mlp = feed_forward(hf_layer, make_linear)

    def forward(self, hidden, conv_state, past_lengths, query_lengths, lora: dict):
        b, c, x = self.proj(rms_norm(hidden, self.input_norm, self.eps)).chunk(3, dim=-1)
        y, new_state = causal_conv(b * x, fresh(conv_state, past_lengths), self.conv_weight, query_lengths,
                                   self.conv_bias)
        hidden = hidden + self.out(c * y)
        return hidden + self.mlp(rms_norm(hidden, self.post_norm, self.eps), {}), new_state


class AttentionLayer(nn.Module):
    def __init__(self, hf_layer, dims, make_linear, spec):
        super().__init__()
        attn = hf_layer.self_attn
        self.dims, self.scale = dims, spec.scale
        self.input_norm = norm_weight(hf_layer.operator_norm, False)
        self.post_norm = norm_weight(hf_layer.ffn_norm, False)
        self.qkv = make_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = make_linear(attn.out_proj)
        self.q_norm = norm_weight(attn.q_layernorm, False)
        self.k_norm = norm_weight(attn.k_layernorm, False)
        self.mlp = feed_forward(hf_layer, make_linear)

    def forward(self, hidden, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, lora: dict,
                tree_mask=None):
        d = self.dims
        batch, seq, _ = hidden.shape
        q, k, v = self.qkv(rms_norm(hidden, self.input_norm, d.rms_norm_eps)).split(
            [d.num_heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim], -1)
        q = rms_norm(q.reshape(batch, seq, d.num_heads, d.head_dim), self.q_norm, d.rms_norm_eps)
        k = rms_norm(k.reshape(batch, seq, d.kv_heads, d.head_dim), self.k_norm, d.rms_norm_eps)
        qkv = torch.cat([q.reshape(batch, seq, -1), k.reshape(batch, seq, -1), v], dim=-1)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, tree_mask,
            d.num_heads, d.kv_heads, self.scale, 0, 0.0,
        )
        hidden = hidden + self.o(attn)
        return hidden + self.mlp(rms_norm(hidden, self.post_norm, d.rms_norm_eps), {}), present_key, present_value


class DecoderGraph(HybridGraph):
    """The decoder graph (build/models/hybrid.py); per layer its caches: an attention layer's key and
    value, a conv layer's state."""

    name = "LFM2"

    @staticmethod
    def layer_specs_of(config, family, max_positions: int) -> list:
        return layer_specs(config)

    def make_layer(self, hf_layer, spec, config, family, make_linear) -> nn.Module:
        if spec.kind == "recurrent":
            return ShortConvLayer(hf_layer, self.dims, make_linear)
        return AttentionLayer(hf_layer, self.dims, make_linear, spec)

    @staticmethod
    def final_norm_of(hf_model) -> nn.Module:
        return hf_model.model.embedding_norm

    @staticmethod
    def norm_weight_of(norm, family) -> nn.Parameter:
        return norm_weight(norm, False)
