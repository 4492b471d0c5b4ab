"""Qwen3.5 (`Qwen3_5ForCausalLM`) and Qwen3-Next (`Qwen3NextForCausalLM`): hybrid decoders whose
layers are mostly Gated DeltaNet linear attention, with a gated full-attention layer every few (the
config's `layer_types`). Qwen3-Next is the same mechanism with its projections packed per key head
(in_proj_qkvz, in_proj_ba: their rows are put in Qwen3.5's order here) and a mixture of experts
with a gated shared expert as the MLP of its sparse layers (`SharedExpertMoe`).

A Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet) keeps, per sequence, two fixed-size
states instead of a growing cache, declared as the layer's `recurrent` spec:

    conv   [conv_dim, kernel - 1]   the last inputs of its short causal depthwise convolution over
                                    the packed q / k / v projection (model dtype)
    delta  [Hv, Dk, Dv]             the gated delta rule's recurrent state (float32)

and computes: the packed projections (q k v | z | b | a, one matmul), the convolution over the
state and the new tokens with SiLU, beta = sigmoid(b), the log decay g = -exp(A_log) *
softplus(a + dt_bias), the delta rule (plugins/gated_delta_rule.py: q and k l2-normalised inside),
an RMSNorm of each head's output gated by silu(z), and the output projection.

Rows are ragged and right-padded. A row's new convolution state is the last kernel - 1 inputs
before its own end (a gather at its query length), and the delta rule leaves the state untouched
at padding, so padding never reaches a state. A row whose past length is 0 is a new sequence: its
past states are taken as zeros, whatever its buffers hold (runtime/cache/recurrent_cache.py).

The full-attention layers are Qwen3's with an output gate: q_proj gives each head's query and gate
side by side (split after the packed projection, so a published quantized q_proj stays whole),
the q / k norms (and every norm but the DeltaNet's gated one) scale by 1 + weight, rotary turns
the first quarter of each head (partial_rotary_factor), and the attention output is multiplied by
sigmoid(gate) before o_proj. They run on our attention op like every other family.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import trt_llm.plugins.gated_delta_rule  # noqa: F401 - registers torch.ops.trt_llm.gated_delta_rule
from trt_llm.build.models.hybrid import HybridGraph, ModelDims, causal_conv, fresh, text_decoder
from trt_llm.build.models.layers import GatedMLP, activation, frozen, linear, norm_weight, rms_norm
from trt_llm.build.models.llama import DecoderGraph as LlamaGraph
from trt_llm.build.models.skeleton import rotary_spec
from trt_llm.schemas.layer_spec import FullAttention, Recurrent, StateTensor

__all__ = ["DecoderGraph", "LORA_TARGETS", "ModelDims", "layer_specs", "text_decoder"]

# What LoRA adapters may target (build/bundle.hybrid_lora_layout): the MLPs, the same in every layer.
LORA_TARGETS = ("gate_proj", "up_proj", "down_proj")


def _delta_dims(config) -> tuple[int, int, int, int, int]:
    """(key heads, value heads, key head dim, value head dim, convolution kernel)."""
    return (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim, config.linear_conv_kernel_dim)


def layer_specs(config, mrope: str | None = None) -> list:
    dims = ModelDims(config)
    hk, hv, dk, dv, kernel = _delta_dims(config)
    conv_dim = 2 * hk * dk + hv * dv
    specs = []
    for kind in config.layer_types:
        if kind == "linear_attention":
            specs.append(Recurrent(states=[StateTensor(name="conv", shape=[conv_dim, kernel - 1]),
                                           StateTensor(name="delta", shape=[hv, dk, dv], dtype="float32")]))
        elif kind == "full_attention":
            specs.append(FullAttention(kv_heads=dims.kv_heads, head_dim=dims.head_dim, scale=dims.head_dim ** -0.5,
                                       rotary=rotary_spec(config, dims.head_dim, mrope)))
        else:
            raise ValueError(f"layer_types: {kind!r} layers are not supported for Qwen3.5")
    return specs


def _rows(weight: torch.Tensor) -> nn.Linear:
    """A bias-free linear over `weight` [out, in] (a part of a packed checkpoint projection)."""
    part = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    part.weight.data = weight
    return part


def delta_projections(attn, config) -> list:
    """The DeltaNet's input projections as [q k v | z | b | a] parts (Qwen3.5's own linears). Qwen3-Next
    packs them per key head ([q_h k_h v_h z_h] rows for each key head h, then [b_h a_h]): the same
    rows, regrouped (each key head's value heads stay consecutive, as the op pairs them)."""
    if hasattr(attn, "in_proj_qkv"):
        return [attn.in_proj_qkv, attn.in_proj_z, attn.in_proj_b, attn.in_proj_a]
    hk, hv, dk, dv, _ = _delta_dims(config)
    per = hv // hk
    qkvz = attn.in_proj_qkvz.weight.detach().view(hk, 2 * dk + 2 * per * dv, -1)
    q, k, v, z = qkvz.split([dk, dk, per * dv, per * dv], dim=1)
    b, a = attn.in_proj_ba.weight.detach().view(hk, 2 * per, -1).split([per, per], dim=1)
    flat = [t.reshape(-1, t.shape[-1]) for t in (q, k, v, z, b, a)]
    return [_rows(torch.cat(flat[:3])), _rows(flat[3]), _rows(flat[4]), _rows(flat[5])]


class SharedExpertMoe(nn.Module):
    """Qwen3-Next's sparse block: the routed experts (the MoE op, build/models/moe.py) plus a shared
    expert gated per token by sigmoid(shared_expert_gate(x))."""

    def __init__(self, hf_mlp, act, make_linear, dtype, weights):
        super().__init__()
        self.routed = LlamaGraph._mlp(hf_mlp, act, make_linear, dtype, weights)
        self.shared = GatedMLP(hf_mlp.shared_expert, act, make_linear)
        self.shared_gate = linear(hf_mlp.shared_expert_gate)  # [1, H]: float, as the router is

    def forward(self, x, lora: dict):
        return self.routed(x) + torch.sigmoid(self.shared_gate(x)) * self.shared(x, {})


def mlp_of(hf_layer, config, make_linear, dtype, weights) -> nn.Module:
    """A layer's MLP: gated, or Qwen3-Next's experts with their shared expert."""
    act = activation(config)
    if hasattr(hf_layer.mlp, "experts"):
        return SharedExpertMoe(hf_layer.mlp, act, make_linear, dtype, weights)
    return GatedMLP(hf_layer.mlp, act, make_linear)


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Qwen3_5RMSNormGated: weight * rmsnorm(x), times silu(gate), in float32."""
    dtype = x.dtype
    x = x.float()
    x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * x.to(dtype)).float() * F.silu(gate.float())).to(dtype)


class GatedDeltaNetLayer(nn.Module):
    """Pre-norm Gated DeltaNet + MLP (transformers' Qwen3_5DecoderLayer of a linear_attention type)."""

    def __init__(self, hf_layer, config, make_linear, mlp: nn.Module):
        super().__init__()
        attn = hf_layer.linear_attn
        self.hk, self.hv, self.dk, self.dv, self.kernel = _delta_dims(config)
        self.eps = config.rms_norm_eps
        self.input_norm = norm_weight(hf_layer.input_layernorm, True)
        self.post_norm = norm_weight(hf_layer.post_attention_layernorm, True)
        self.proj = make_linear(*delta_projections(attn, config))
        self.conv_weight = frozen(attn.conv1d.weight.detach().squeeze(1))  # [C, K]
        self.dt_bias = frozen(attn.dt_bias.detach().float())
        self.neg_a = frozen(-attn.A_log.detach().float().exp())  # -exp(A_log), once
        self.norm_weight = frozen(attn.norm.weight)
        self.out = make_linear(attn.out_proj)
        self.mlp = mlp

    def keep_float32(self) -> None:
        """The decay's parameters stay float32 whatever the model's dtype, as transformers computes them."""
        self.dt_bias.data, self.neg_a.data = self.dt_bias.data.float(), self.neg_a.data.float()

    def forward(self, hidden, conv_state, delta_state, past_lengths, query_lengths, lora: dict):
        batch, seq, _ = hidden.shape
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        x = rms_norm(hidden, self.input_norm, self.eps)
        mixed, z, b, a = self.proj(x).split([2 * key_dim + value_dim, value_dim, self.hv, self.hv], -1)
        mixed, new_conv = causal_conv(mixed, fresh(conv_state, past_lengths), self.conv_weight, query_lengths)
        q, k, v = F.silu(mixed).split([key_dim, key_dim, value_dim], -1)
        beta = torch.sigmoid(b)
        g = self.neg_a * F.softplus(a.float() + self.dt_bias)
        core, new_delta = torch.ops.trt_llm.gated_delta_rule(
            q.reshape(batch, seq, self.hk, self.dk), k.reshape(batch, seq, self.hk, self.dk),
            v.reshape(batch, seq, self.hv, self.dv), g, beta, fresh(delta_state, past_lengths), query_lengths)
        core = gated_rms_norm(core, z.reshape(batch, seq, self.hv, self.dv), self.norm_weight, self.eps)
        hidden = hidden + self.out(core.reshape(batch, seq, value_dim))
        return hidden + self.mlp(rms_norm(hidden, self.post_norm, self.eps), lora), new_conv, new_delta


class GatedAttentionLayer(nn.Module):
    """Pre-norm gated full attention + MLP (transformers' Qwen3_5Attention in its decoder layer)."""

    def __init__(self, hf_layer, dims, make_linear, spec, mlp: nn.Module):
        super().__init__()
        attn = hf_layer.self_attn
        self.dims, self.scale = dims, spec.scale
        self.input_norm = norm_weight(hf_layer.input_layernorm, True)
        self.post_norm = norm_weight(hf_layer.post_attention_layernorm, True)
        if attn.q_proj.bias is not None:
            raise ValueError("attention_bias: a biased Qwen3.5 attention is not supported")
        self.qkv = make_linear(attn.q_proj, attn.k_proj, attn.v_proj)  # q_proj: each head's query, then its gate
        self.o = make_linear(attn.o_proj)
        self.q_norm = norm_weight(attn.q_norm, True)
        self.k_norm = norm_weight(attn.k_norm, True)
        self.mlp = mlp

    def forward(self, hidden, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, lora: dict,
                tree_mask=None):
        d = self.dims
        batch, seq, _ = hidden.shape
        q_width, kv_width = d.num_heads * d.head_dim, d.kv_heads * d.head_dim
        x = rms_norm(hidden, self.input_norm, d.rms_norm_eps)
        q, k, v = self.qkv(x).split([2 * q_width, kv_width, kv_width], -1)
        q, gate = q.reshape(batch, seq, d.num_heads, 2 * d.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(batch, seq, q_width)
        q = rms_norm(q, self.q_norm, d.rms_norm_eps)
        k = rms_norm(k.reshape(batch, seq, d.kv_heads, d.head_dim), self.k_norm, d.rms_norm_eps)
        qkv = torch.cat([q.reshape(batch, seq, -1), k.reshape(batch, seq, -1), v], dim=-1)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, tree_mask,
            d.num_heads, d.kv_heads, self.scale, 0, 0.0,
        )
        hidden = hidden + self.o(attn * torch.sigmoid(gate))
        return hidden + self.mlp(rms_norm(hidden, self.post_norm, d.rms_norm_eps), lora), present_key, present_value


class DecoderGraph(HybridGraph):
    """The decoder graph (build/models/hybrid.py); per layer its caches: an attention layer's key and
    value, a Gated DeltaNet layer's conv and delta states."""

    name = "Qwen3.5"

    @staticmethod
    def layer_specs_of(config, family, max_positions: int) -> list:
        return layer_specs(config, family.mrope)

    def make_layer(self, hf_layer, spec, config, family, make_linear) -> nn.Module:
        mlp = mlp_of(hf_layer, config, make_linear, self.build_dtype, self.weights)
        if spec.kind == "recurrent":
            return GatedDeltaNetLayer(hf_layer, config, make_linear, mlp)
        return GatedAttentionLayer(hf_layer, self.dims, make_linear, spec, mlp)

    @staticmethod
    def final_norm_of(hf_model) -> nn.Module:
        return hf_model.model.norm

    @staticmethod
    def norm_weight_of(norm, family) -> nn.Parameter:
        return norm_weight(norm, True)  # every norm of the model scales by 1 + weight
