"""The EAGLE3 draft's exported graph: one draft step over new tokens through our attention op."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trt_llm.build.eagle.model import Eagle3Draft
from trt_llm.build.models.layers import frozen, linear, rms_norm, rotary_tables
from trt_llm.schemas.layer_spec import FullAttention, RotarySpec


class DraftGraph(nn.Module):
    """One draft step over new tokens with a fixed-capacity KV cache (the exported graph).

    forward(inputs_embeds [B,S,H] (the base's embedding of the tokens), hidden [B,S,H] (fc-projected
    target features, or the draft's own hidden_out of the previous step), position_ids [B,S] int32,
    past_lengths [B] int32, query_lengths [B] int32, tree_mask [B,S,S] bool, logits_indices [B,K] int32,
    past_key [B,Hkv,L,D], past_value [B,Hkv,L,D])
      -> (logits [B,K,draft_vocab] float32, hidden_out [B,S,H] (midlayer output before `norm`),
          present_key, present_value)
    `fc` is not in the graph: the runtime applies `fc_weight` to the target features. Attention is our
    op (torch.ops.trt_llm.attention with its tree_mask): query i of row b sees the cache slots before
    past_lengths[b] and the new tokens j with tree_mask[b, i, j]; build/export.py's export_draft
    writes the ONNX graph.
    """

    def __init__(self, draft: Eagle3Draft, max_positions: int = 4096, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.dims = draft.dims
        layer = draft.midlayer
        self.input_norm = frozen(layer.input_layernorm.weight)
        self.hidden_norm = frozen(layer.hidden_norm.weight)
        self.post_norm = frozen(layer.post_attention_layernorm.weight)
        attn, mlp = layer.self_attn, layer.mlp
        # The decoder's layers (build/models/layers.py): the same packed linears and rotary tables.
        self.qkv = linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = linear(attn.o_proj)
        self.gate_up = linear(mlp.gate_proj, mlp.up_proj)
        self.down = linear(mlp.down_proj)
        self.final_norm = frozen(draft.norm.weight)
        self.lm_head = frozen(draft.lm_head.weight)
        cos, sin = rotary_tables(draft.inv_freq, draft.attention_scaling, max_positions, dtype)
        self.register_buffer("cos_cache", cos)
        self.register_buffer("sin_cache", sin)
        self.layer_spec = draft_layer_spec(draft)
        self.to(dtype)

    def forward(self, inputs_embeds, hidden, position_ids, past_lengths, query_lengths, tree_mask, logits_indices,
                past_key, past_value):
        d = self.dims
        eps = d.rms_norm_eps
        normed_hidden = rms_norm(hidden, self.hidden_norm, eps)
        x = torch.cat([rms_norm(inputs_embeds, self.input_norm, eps), normed_hidden], dim=-1)
        qkv = self.qkv(x)
        attn, present_key, present_value = torch.ops.trt_llm.attention(
            qkv, past_key, past_value, past_lengths, query_lengths, position_ids, self.cos_cache, self.sin_cache,
            tree_mask, d.num_heads, d.kv_heads, d.head_dim ** -0.5,
        )
        residual = normed_hidden if d.norm_before_residual else hidden
        h = residual + self.o(attn)
        gate, up = self.gate_up(rms_norm(h, self.post_norm, eps)).chunk(2, dim=-1)
        hidden_out = h + self.down(F.silu(gate) * up)
        index = logits_indices.long().unsqueeze(-1).expand(-1, -1, hidden_out.shape[-1])
        picked = rms_norm(torch.gather(hidden_out, 1, index), self.final_norm, eps)
        logits = F.linear(picked, self.lm_head).float()
        return logits, hidden_out, present_key, present_value


def draft_layer_spec(draft: Eagle3Draft) -> FullAttention:
    """The draft's one layer as the manifest records it (components.draft.layers)."""
    d, parameters = draft.dims, draft.config.get("rope_parameters") or {}
    theta = draft.config.get("rope_theta") or parameters.get("rope_theta") or 10000.0
    return FullAttention(kv_heads=d.kv_heads, head_dim=d.head_dim, scale=d.head_dim ** -0.5,
                         rotary=RotarySpec(base=float(theta), dims=d.head_dim))
