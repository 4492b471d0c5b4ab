"""The SigLIP vision encoder as our own forward pass over transformers' submodules, shared by the
families whose towers are SigLIP (SmolVLM / Idefics3, Gemma 3): square frames of one size, each frame's
patches attending to each other with plain batched attention (no mask, no segments).

    x [F, L, D] -> SiglipEncoder(hf_encoder_layers)(x) -> [F, L, D]

The cpu backend rewrites these layers' nodes onto ONNX Runtime's fused kernels
(trt_llm/families/siglip_lowering.py), finding them by the exporter's record of the module each node
came from: it knows them by this module's name.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FrameAttention(nn.Module):
    """transformers' SigLIP attention (eager: float32 softmax) over each frame's patches."""

    def __init__(self, hf_attention):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = hf_attention.q_proj, hf_attention.k_proj, hf_attention.v_proj
        self.out_proj = hf_attention.out_proj
        self.num_heads, self.head_dim = hf_attention.num_heads, hf_attention.head_dim
        self.scale = float(hf_attention.scale)

    def forward(self, x: Tensor) -> Tensor:
        frames, length, _ = x.shape
        shape = (frames, length, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1, dtype=torch.float32)
        out = torch.matmul(weights.to(q.dtype), v).transpose(1, 2).reshape(frames, length, -1)
        return self.out_proj(out)


class EncoderLayer(nn.Module):
    def __init__(self, hf_layer):
        super().__init__()
        self.layer_norm1, self.layer_norm2, self.mlp = hf_layer.layer_norm1, hf_layer.layer_norm2, hf_layer.mlp
        self.self_attn = FrameAttention(hf_layer.self_attn)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    """transformers' SiglipEncoder (and SmolVLM's / Idefics3's copy of it) over frames [F, L, D]."""

    def __init__(self, hf_layers):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(layer) for layer in hf_layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
