"""Our own forward pass over a Hugging Face decoder's weights: the graph that gets exported.

Writing the forward ourselves keeps HF's mask and cache code out of the graph and gives the graph
contract of DESIGN.md section 5: per-sequence lengths, a fixed-capacity cache updated in place, and
logits only where asked. q/k/v and gate/up are packed into single matmuls, and attention is our
plugin op, which applies rotary itself: fewer, fatter nodes are what make the graph fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.families import Family
from trt_llm.plugins import attention as _attention  # noqa: F401 - registers torch.ops.trt_llm.attention


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # Written as w * (x / sqrt(mean(x.pow(2)) + eps)): ONNX Runtime fuses exactly this form (with
    # Pow, not Mul(x, x); sqrt and divide, not rsqrt) into (Skip)SimplifiedLayerNormalization.
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _linear_params(*linears: nn.Linear) -> tuple[nn.Parameter, nn.Parameter | None]:
    weight = torch.cat([linear.weight.detach() for linear in linears], dim=0)
    biases = [linear.bias for linear in linears]
    if all(b is None for b in biases):
        return nn.Parameter(weight, requires_grad=False), None
    bias = torch.cat([
        b.detach() if b is not None else torch.zeros(l.out_features, dtype=weight.dtype)
        for b, l in zip(biases, linears)
    ])
    return nn.Parameter(weight, requires_grad=False), nn.Parameter(bias, requires_grad=False)


def _with_lora(y: Tensor, x: Tensor, ab: tuple[Tensor, Tensor] | None) -> Tensor:
    """y + x A^T B^T with a per-row (A [B, r, in], B [B, out, r]) pair: each row its own adapter."""
    if ab is None:
        return y
    a, b = ab
    return y + torch.matmul(torch.matmul(x, a.transpose(1, 2)), b.transpose(1, 2))


class DecoderLayer(nn.Module):
    def __init__(self, hf_layer, dims: "ModelDims", family: Family):
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.dims = dims
        self.input_norm = nn.Parameter(hf_layer.input_layernorm.weight.detach(), requires_grad=False)
        self.post_norm = nn.Parameter(hf_layer.post_attention_layernorm.weight.detach(), requires_grad=False)
        self.qkv_weight, self.qkv_bias = _linear_params(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_weight, self.o_bias = _linear_params(attn.o_proj)
        self.gate_up_weight, self.gate_up_bias = _linear_params(mlp.gate_proj, mlp.up_proj)
        self.down_weight, self.down_bias = _linear_params(mlp.down_proj)
        self.q_norm = self.k_norm = None
        if family.qk_norm:
            self.q_norm = nn.Parameter(attn.q_norm.weight.detach(), requires_grad=False)
            self.k_norm = nn.Parameter(attn.k_norm.weight.detach(), requires_grad=False)

    def forward(self, hidden, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin,
                lora: dict | None = None, tree_mask: Tensor | None = None):
        d = self.dims
        lora = lora or {}
        x = rms_norm(hidden, self.input_norm, d.rms_norm_eps)
        qkv = _with_lora(F.linear(x, self.qkv_weight, self.qkv_bias), x, lora.get("qkv"))
        if self.q_norm is not None:
            batch, seq = qkv.shape[0], qkv.shape[1]
            q, k, v = qkv.split([d.num_heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim], -1)
            q = rms_norm(q.reshape(batch, seq, d.num_heads, d.head_dim), self.q_norm, d.rms_norm_eps)
            k = rms_norm(k.reshape(batch, seq, d.kv_heads, d.head_dim), self.k_norm, d.rms_norm_eps)
            qkv = torch.cat([q.reshape(batch, seq, -1), k.reshape(batch, seq, -1), v], dim=-1)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, tree_mask,
            d.num_heads, d.kv_heads, d.head_dim ** -0.5,
        )
        hidden = hidden + _with_lora(F.linear(attn, self.o_weight, self.o_bias), attn, lora.get("o"))
        x = rms_norm(hidden, self.post_norm, d.rms_norm_eps)
        gate_up = _with_lora(F.linear(x, self.gate_up_weight, self.gate_up_bias), x, lora.get("gate_up"))
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.silu(gate) * up
        hidden = hidden + _with_lora(F.linear(act, self.down_weight, self.down_bias), act, lora.get("down"))
        return hidden, present_key, present_value


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


def rotary_tables(hf_model, positions: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [positions, head_dim/2] exactly as HF computes them (fp32, then scaled).

    HF's rotary module already resolved the rope type (default, llama3, yarn, ...) into inv_freq and
    attention_scaling, so reading those keeps every scaling variant right.
    """
    rotary = hf_model.model.rotary_emb
    inv_freq = rotary.inv_freq.detach().float()
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    return (freqs.cos() * scaling).to(dtype), (freqs.sin() * scaling).to(dtype)


class DecoderGraph(nn.Module):
    """inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, caches -> logits, caches.

    As an EAGLE base (`feature_layers` set) it also takes a tree_mask [B, S, S] (after
    logits_indices) and returns hidden_states [B, S, 3H]: the hidden states entering those layers,
    for every new token, which the draft model reads.
    """

    def __init__(self, hf_model, family: Family, max_positions: int, dtype: torch.dtype,
                 lora_groups: list[str] = (), feature_layers: list[int] | None = None):
        super().__init__()
        self.dims = ModelDims(hf_model.config)
        self.lora_groups = list(lora_groups)  # packed projections with LoRA inputs, per layer
        self.feature_layers = list(feature_layers) if feature_layers else None
        self.layers = nn.ModuleList(DecoderLayer(l, self.dims, family) for l in hf_model.model.layers)
        self.final_norm = nn.Parameter(hf_model.model.norm.weight.detach(), requires_grad=False)
        self.lm_head = nn.Parameter(hf_model.lm_head.weight.detach(), requires_grad=False)
        cos, sin = rotary_tables(hf_model, max_positions, dtype)
        self.register_buffer("cos_cache", cos)
        self.register_buffer("sin_cache", sin)
        self.to(dtype)

    def forward(self, inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices, *tensors):
        """tensors: [tree_mask if an EAGLE base], the caches (key, value per layer), then the LoRA
        pairs (per layer, per group)."""
        tree_mask = None
        if self.feature_layers is not None:
            tree_mask, tensors = tensors[0], tensors[1:]
        caches, lora = tensors[: 2 * len(self.layers)], tensors[2 * len(self.layers):]
        per_layer = 2 * len(self.lora_groups)
        hidden = inputs_embeds
        presents, entering = [], {}
        for i, layer in enumerate(self.layers):
            entering[i] = hidden
            pairs = lora[i * per_layer: (i + 1) * per_layer]
            layer_lora = {g: (pairs[2 * j], pairs[2 * j + 1]) for j, g in enumerate(self.lora_groups)}
            hidden, key, value = layer(
                hidden, caches[2 * i], caches[2 * i + 1], past_lengths, query_lengths, position_ids,
                self.cos_cache, self.sin_cache, layer_lora, tree_mask,
            )
            presents += [key, value]
        # The LM head runs only where logits are asked for: gather those positions first.
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        hidden = torch.gather(hidden, 1, index)
        hidden = rms_norm(hidden, self.final_norm, self.dims.rms_norm_eps)
        logits = F.linear(hidden, self.lm_head).float()
        if self.feature_layers is not None:
            return (logits, torch.cat([entering[i] for i in self.feature_layers], dim=-1), *presents)
        return (logits, *presents)


def input_names(num_layers: int, eagle: bool = False) -> list[str]:
    names = ["inputs_embeds", "position_ids", "past_lengths", "query_lengths", "logits_indices"]
    names += ["tree_mask"] if eagle else []
    for i in range(num_layers):
        names += [f"past_key_{i}", f"past_value_{i}"]
    return names


def output_names(num_layers: int, eagle: bool = False) -> list[str]:
    names = ["logits"] + (["hidden_states"] if eagle else [])
    for i in range(num_layers):
        names += [f"present_key_{i}", f"present_value_{i}"]
    return names
