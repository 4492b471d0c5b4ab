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
the op's docstring says, or a GPTQ / AWQ checkpoint's own symmetric blocks, kept as they are.

The experts arrive one at a time (a streamed build reads each from the checkpoint's files,
build/streamed_weights.py) and are written into the stacked tensors as they come: a layer's experts
are never in memory twice, nor in float32 whole when they are quantized.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trt_llm.build.models.layers import frozen
from trt_llm.build.quantize import QuantizedWeight, QuantSpec
from trt_llm.plugins import moe as moe_op


def interleaved(gate: Tensor, up: Tensor) -> Tensor:
    """An expert's gate and up [I, H] -> the op's gate_up rows [2I, H] (gate_i, up_i, ...)."""
    return torch.stack([gate, up], dim=1).reshape(-1, gate.shape[-1])


def quantize_expert(weight: Tensor, spec: QuantSpec, scale_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """One expert's weight [N, K] -> the op's bytes uint8 [N, K * bits / 8] and scales [N, K / G], by
    round to nearest in blocks of G along K: build/quantize/rtn.py's symmetric rule (int4: the block's
    value of largest magnitude maps to -8; int8: largest magnitude / 127), computed here in the op's
    own [N, K] layout (no transposes or repacking: a 30B MoE quantizes 6,000 experts)."""
    if spec.fp8 or not spec.symmetric:
        raise ValueError(f"MoE experts take symmetric int4 / int8 blocks, not {spec.describe()}"
                         f"{'' if spec.symmetric else ' with zero points'}")
    rows, in_features = weight.shape
    group = spec.group_for(in_features)
    if in_features % group:
        raise ValueError(f"MoE experts: {in_features} inputs are not a whole number of blocks of {group}")
    blocks = weight.float().view(rows, in_features // group, group)
    if spec.bits == 4:
        scale = torch.gather(blocks, -1, blocks.abs().argmax(dim=-1, keepdim=True)) / -8
        low, high = -8, 7
    else:
        scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
        low, high = -127, 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale).to(scale_dtype).float()
    q = torch.round(blocks / scale).clamp_(low, high).to(torch.int8).view(rows, in_features)
    return moe_op.pack(q, spec.bits), scale[..., 0].to(scale_dtype)


def op_blocks(*parts: QuantizedWeight) -> tuple[Tensor, Tensor]:
    """QuantizedWeights [K, N_i] of symmetric blocks (one expert's projection, or its gate and up)
    -> the op's bytes [sum N_i, K * bits / 8] and scales [sum N_i, K / G], the parts' rows
    interleaved (gate_i, up_i, ...) when there are two."""
    values = [p.values()[0].t() for p in parts]  # [N, K] signed
    scales = [p.scales.t() for p in parts]
    if len(parts) == 2:
        values, scales = [interleaved(*values)], [interleaved(*scales)]
    return moe_op.pack(values[0], parts[0].bits), scales[0].contiguous()


def fits_the_op(parts: tuple[QuantizedWeight, ...], spec: QuantSpec) -> bool:
    """A published expert's blocks are the op's as they are: symmetric, in input order, of the
    build's bits and block size."""
    return all(p.zero_points is None and p.input_order is None and p.offsets is None and not p.fp8
               and p.bits == spec.bits and p.group_size == spec.group_for(p.in_features) for p in parts)


class Stacked:
    """The experts' tensors [E, ...], filled one expert at a time (a layer's experts are never in
    memory twice: no list of them to stack)."""

    def __init__(self, count: int):
        self.count, self.tensors = count, None

    def put(self, e: int, *parts: Tensor) -> None:
        if self.tensors is None:
            self.tensors = [torch.empty((self.count, *p.shape), dtype=p.dtype) for p in parts]
        for stacked, part in zip(self.tensors, parts):
            stacked[e] = part


class SparseMoe(nn.Module):
    """Router linear + the MoE op. Build it with `from_hf`."""

    def __init__(self, router: Tensor, experts, count: int, top_k: int, normalize: bool, bits: int,
                 dtype: torch.dtype, activation: int = moe_op.SILU):
        """experts: `count` of them, each as the op stores it: float (gate_up [2I, H] with gate and
        up rows interleaved, down [H, I]), or with bits 4 / 8 (gate_up bytes, its scales, down bytes,
        its scales), made as they are consumed (the streamed build reads them one by one).
        activation: the op's gate (moe_op.SILU, or GELU_TANH for Gemma 4's experts)."""
        super().__init__()
        self.router = frozen(router.to(dtype))
        self.top_k, self.normalize, self.bits, self.activation = top_k, int(normalize), bits, activation
        stacked = Stacked(count)
        for e, tensors in enumerate(experts):
            stacked.put(e, *tensors)
        if not bits:
            gate_up, down = stacked.tensors  # fresh tensors of ours: no copy (frozen's) of a layer's experts
            self.gate_up = nn.Parameter(gate_up.to(dtype), requires_grad=False)
            self.down = nn.Parameter(down.to(dtype), requires_grad=False)
            self.gate_up_scales = self.down_scales = None
            return
        gate_up, gate_up_scales, down, down_scales = stacked.tensors
        self.register_buffer("gate_up", gate_up)
        self.register_buffer("down", down)
        self.gate_up_scales, self.down_scales = frozen(gate_up_scales.to(dtype)), frozen(down_scales.to(dtype))

    @classmethod
    def from_hf(cls, block: nn.Module, spec: QuantSpec | None = None, dtype: torch.dtype = torch.float32,
                weights=None, published: list | None = None, router: tuple[Tensor, int, bool] | None = None,
                activation: int = moe_op.SILU, expert_scale: Tensor | None = None) -> "SparseMoe":
        """From a transformers Qwen3MoeSparseMoeBlock (its `gate`: weight [E, H], top_k, norm_topk_prob;
        its `experts`: gate_up_proj [E, 2I, H] as [gate | up] rows, down_proj [E, H, I]); spec None
        keeps the experts float. weights: a build.streamed_weights.StreamedWeights the experts are
        read from (the block's own tensors are then on the meta device). published: a GPTQ / AWQ
        checkpoint's blocks of each expert, (gate, up, down) QuantizedWeights, kept as they are when
        `spec` takes them (fits_the_op), else quantized again from their dequantized weights.
        A family whose router is not a plain linear (Gemma 4) gives `router` (weight, top_k,
        normalize) instead of the block's gate, its experts' `activation`, and `expert_scale` [E]: each
        expert's output scaled (folded into its down rows, before any quantization)."""
        experts = block.experts
        count = experts.gate_up_proj.shape[0]
        if router is None:
            if weights is not None:
                weights.load(block.gate)
            router = (block.gate.weight.detach(), block.gate.top_k, block.gate.norm_topk_prob)
        if weights is not None:
            floats = weights.experts(experts)
        else:
            floats = ((*experts.gate_up_proj[e].detach().chunk(2, dim=0), experts.down_proj[e].detach())
                      for e in range(count))
        if expert_scale is not None:
            floats = ((g, u, d * expert_scale[e]) for e, (g, u, d) in enumerate(floats))
            published = None  # (its blocks are the unscaled weights: quantized again, scaled)
        if spec is not None and published is not None and all(fits_the_op(parts, spec) for parts in published):
            each = ((*op_blocks(g, u), *op_blocks(d)) for g, u, d in published)
        elif spec is None:
            each = ((interleaved(g, u).to(dtype), d.to(dtype)) for g, u, d in floats)
        else:
            each = ((*quantize_expert(interleaved(g, u), spec, dtype), *quantize_expert(d, spec, dtype))
                    for g, u, d in floats)
        weight, top_k, normalize = router
        return cls(weight, each, count, top_k, normalize, 0 if spec is None else spec.bits, dtype, activation)

    def forward(self, x: Tensor, lora: dict | None = None) -> Tensor:
        """lora: the decoder layer's LoRA pairs, none of which are the experts' (the build refuses them)."""
        return self.mix(x, F.linear(x, self.router))

    def mix(self, x: Tensor, logits: Tensor) -> Tensor:
        """The experts on x, routed by `logits` (a family whose router reads another input: Gemma 4's)."""
        return torch.ops.trt_llm.moe(x, logits, self.gate_up, self.down, self.gate_up_scales, self.down_scales,
                                     self.top_k, self.normalize, self.bits, self.activation)
