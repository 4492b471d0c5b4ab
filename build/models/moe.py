"""Qwen3-MoE's sparse mixture-of-experts block as our MoE op (plugins/moe.py), float or with
weight-only quantized experts.

    mlp = SparseMoe.from_hf(hf_layer.mlp, quant_spec, dtype)   # a transformers Qwen3MoeSparseMoeBlock
    y = mlp(x)                                                 # x [B, S, H] (or [T, H]) -> same shape

in a decoder layer whose HF MLP is the sparse block (transformers already applied mlp_only_layers and
decoder_sparse_step); the other layers keep the dense gated MLP.
The router is a plain float linear before the op (its logits are the op's input); the experts are
the op's stacked weights: gate_up [E, 2I, H] with gate and up rows interleaved (the layout ONNX
Runtime's kernels read; transformers' gate_up_proj is [gate | up]) and down [E, H, I], or their
blocks of round-to-nearest integers and scales (build/quantize/rtn.py's rule, per expert) stored as
the op's docstring says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import frozen
from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.rtn import quantize_rtn
from trt_llm.plugins import moe as moe_op


def interleaved(gate_up_proj: Tensor) -> Tensor:
    """transformers' [E, 2I, H] ([gate | up] rows) -> the op's [E, 2I, H] (gate_i, up_i, ...)."""
    experts, rows, hidden = gate_up_proj.shape
    gate, up = gate_up_proj.view(experts, 2, rows // 2, hidden).unbind(1)
    return torch.stack([gate, up], dim=2).reshape(experts, rows, hidden)


def quantize_experts(weight: Tensor, spec: QuantSpec, scale_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Stacked weights [E, N, K] -> the op's bytes uint8 [E, N, K * bits / 8] and scales [E, N, K / G]:
    each expert by round to nearest in blocks of G along K (one expert at a time: a layer's experts
    at once would take several copies of all of them in float32)."""
    if spec.fp8 or not spec.symmetric:
        raise ValueError(f"MoE experts take symmetric int4 / int8 blocks, not {spec.describe()}"
                         f"{'' if spec.symmetric else ' with zero points'}")
    in_features = weight.shape[-1]
    group = spec.group_for(in_features)
    if in_features % group:
        raise ValueError(f"MoE experts: {in_features} inputs are not a whole number of blocks of {group}")
    packed, scales = [], []
    for expert in weight:
        blocks = quantize_rtn(expert, spec, scale_dtype)
        q, _ = blocks.values()  # [K, N] signed
        packed.append(moe_op.pack(q.t(), spec.bits))
        scales.append(blocks.scales.t())
    return torch.stack(packed), torch.stack(scales).contiguous()


class SparseMoe(nn.Module):
    """Router linear + the MoE op. Build it with `from_hf`."""

    def __init__(self, router: Tensor, gate_up: Tensor, down: Tensor, top_k: int, normalize: bool,
                 spec: QuantSpec | None, dtype: torch.dtype):
        super().__init__()
        self.router = frozen(router.to(dtype))
        self.top_k, self.normalize = top_k, int(normalize)
        self.bits = 0 if spec is None else spec.bits
        if spec is None:
            self.gate_up, self.down = frozen(gate_up.to(dtype)), frozen(down.to(dtype))
            self.gate_up_scales = self.down_scales = None
            return
        gate_up_q, gate_up_scales = quantize_experts(gate_up, spec, dtype)
        down_q, down_scales = quantize_experts(down, spec, dtype)
        self.register_buffer("gate_up", gate_up_q)
        self.register_buffer("down", down_q)
        self.gate_up_scales, self.down_scales = frozen(gate_up_scales), frozen(down_scales)

    @classmethod
    def from_hf(cls, block: nn.Module, spec: QuantSpec | None = None, dtype: torch.dtype = torch.float32) -> "SparseMoe":
        """From a transformers Qwen3MoeSparseMoeBlock (its `gate`: weight [E, H], top_k, norm_topk_prob;
        its `experts`: gate_up_proj [E, 2I, H], down_proj [E, H, I]); spec None keeps the experts float."""
        gate, experts = block.gate, block.experts
        return cls(gate.weight.detach(), interleaved(experts.gate_up_proj.detach()), experts.down_proj.detach(),
                   gate.top_k, gate.norm_topk_prob, spec, dtype)

    def forward(self, x: Tensor, lora: dict | None = None) -> Tensor:
        """lora: the decoder layer's LoRA pairs, none of which are the experts' (the build refuses them)."""
        logits = F.linear(x, self.router)
        return torch.ops.trt_llm.moe(x, logits, self.gate_up, self.down, self.gate_up_scales, self.down_scales,
                                     self.top_k, self.normalize, self.bits)
