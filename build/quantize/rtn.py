"""Round-to-nearest: each block of a float weight gets the scale (and zero point) that spans it.

Symmetric int4 takes llama.cpp's Q4_0 rule: the block's value of largest magnitude maps to -8,
so all sixteen levels are used and that value is exact. Symmetric int8 is Q8_0's: largest
magnitude / 127. fp8 maps each column's largest magnitude to E4M3's largest value (448), as
TensorRT-LLM's and ModelOpt's per-channel fp8 weights do, then rounds to the nearest E4M3 value.
Asymmetric spans [min(min, 0), max(max, 0)] with 2^bits levels and an integer
zero point.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trt_llm.build.quantize import QuantizedWeight, QuantSpec, concat

# Output rows quantized at once: a large matrix (a 262k-row LM head) goes in slices, so its float32
# copy and temporaries never exist whole. Blocks run along K, so the slices' results side by side are
# the whole's exactly.
ROWS_AT_ONCE = 1 << 14


def blocks(weight: Tensor, group_size: int) -> Tensor:
    """nn.Linear's weight [N, K] -> float32 blocks [nb, G, N] along K (the last one zero-padded)."""
    w = weight.detach().float().t()
    in_features, out_features = w.shape
    count = -(-in_features // group_size)
    padded = torch.zeros(count * group_size, out_features)
    padded[:in_features] = w
    return padded.view(count, group_size, out_features)


def quantize_rtn(weight: Tensor, spec: QuantSpec, scale_dtype: torch.dtype) -> QuantizedWeight:
    """nn.Linear's weight [N, K] -> its QuantizedWeight (scales in `scale_dtype`, the graph's)."""
    if weight.shape[0] > ROWS_AT_ONCE:
        return concat([quantize_rtn(part, spec, scale_dtype) for part in weight.split(ROWS_AT_ONCE)])
    in_features = weight.shape[1]
    if spec.fp8:
        return _quantize_fp8(weight, scale_dtype)
    group = spec.group_for(in_features)
    b = blocks(weight, group)
    top = (1 << spec.bits) - 1
    if spec.symmetric:
        if spec.bits == 4:
            index = b.abs().argmax(dim=1, keepdim=True)
            scale = torch.gather(b, 1, index) / -8  # [nb, 1, N]
            low, high = -8, 7
        else:
            scale = b.abs().amax(dim=1, keepdim=True) / 127
            low, high = -127, 127
        scale = _nonzero(scale).to(scale_dtype).float()
        q = torch.round(b / scale).clamp(low, high)
        zero = None
    else:
        # The span includes 0, so zero stays exact (a padded row, a constant block), as ONNX Runtime's
        # own quantizer does.
        minimum, maximum = b.amin(dim=1, keepdim=True).clamp(max=0), b.amax(dim=1, keepdim=True).clamp(min=0)
        scale = _nonzero((maximum - minimum) / top).to(scale_dtype).float()
        zero = torch.round(-minimum / scale).clamp(0, top)
        q = (torch.round(b / scale) + zero).clamp(0, top)
    q = q.reshape(-1, q.shape[-1])[:in_features].to(torch.int16)
    zero_points = None if zero is None else zero[:, 0].to(torch.int16)
    return QuantizedWeight.from_values(q, scale[:, 0].to(scale_dtype), zero_points, spec.bits, group)


FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def _quantize_fp8(weight: Tensor, scale_dtype: torch.dtype) -> QuantizedWeight:
    """nn.Linear's weight [N, K] -> E4M3 values [K, N] and one scale per output column [1, N]."""
    w = weight.detach().float().t()
    scale = _nonzero(w.abs().amax(dim=0, keepdim=True) / FP8_MAX).to(scale_dtype).float()
    values = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantizedWeight(values, scale.to(scale_dtype), None, 8, w.shape[0])


def _nonzero(scale: Tensor) -> Tensor:
    """A block of zeros (an embedding's padding row, tied to the LM head) gets scale 1: its integers
    are 0 either way, and TensorRT refuses a zero scale."""
    return torch.where(scale == 0, torch.ones_like(scale), scale)
