"""Weight quantization at export: what a quantized weight is, and how the graph's linears get one.

A `QuantizedWeight` holds the operands of the weight-only matmul op (plugins/weight_only_matmul.py)
for one packed linear: integers [K, N] in blocks of `group_size` along K, their scales and optional
zero points. It comes from round-to-nearest (`rtn.py`), from AWQ's scaled round-to-nearest
(`awq.py`), or from a published checkpoint's own blocks (`formats.py`: GPTQ, AWQ, GGUF), which are
kept as they are.

`LinearFactory` is what the model families call for every linear (build/models/layers.py): it
returns the float Linear of the checkpoint, or a QuantizedLinear with the checkpoint's own blocks
or freshly quantized ones, as the build config's `quantization:` says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from trt_llm.plugins.weight_only_matmul import dequantize, pack_int4, unpacked


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a float weight: bits 4 or 8, group_size rows of K per scale (0: one scale per
    column, i.e. all of K), symmetric (no zero points) or not; fp8: E4M3 values (bits 8, one scale
    per column, symmetric) instead of integers."""
    bits: int
    group_size: int
    symmetric: bool = True
    fp8: bool = False

    def group_for(self, in_features: int) -> int:
        return self.group_size or in_features

    def describe(self) -> str:
        """E.g. "int4 in groups of 32", "fp8 with a scale per column" (for messages)."""
        name = "fp8" if self.fp8 else f"int{self.bits}"
        return f"{name} in groups of {self.group_size}" if self.group_size else f"{name} with a scale per column"


@dataclass
class QuantizedWeight:
    """The op's operands for a weight of K inputs and N outputs (see the op's docstring for dtypes)."""
    qweight: Tensor
    scales: Tensor
    zero_points: Tensor | None
    bits: int
    group_size: int
    offsets: Tensor | None = None
    # GPTQ act-order: the input rows in the order of qweight's rows (x is gathered so), else None
    input_order: Tensor | None = None

    @property
    def out_features(self) -> int:
        return self.scales.shape[1]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def fp8(self) -> bool:
        return self.qweight.dtype == torch.float8_e4m3fn

    def dequantize(self) -> Tensor:
        """W^T [N, K], the float weight in nn.Linear's layout (in the input's own order)."""
        w = dequantize(self.qweight, self.scales, self.zero_points, self.bits, self.group_size, self.offsets)
        if self.input_order is not None:
            w = torch.empty_like(w).index_copy_(0, self.input_order, w)
        return w.t()

    def values(self) -> tuple[Tensor, Tensor | None]:
        """The integers of qweight [K, N] and of the zero points [nb, N]."""
        return unpacked(self.qweight, self.zero_points, self.bits)

    @staticmethod
    def from_values(q: Tensor, scales: Tensor, zero_points: Tensor | None, bits: int, group_size: int,
                    offsets: Tensor | None = None, input_order: Tensor | None = None) -> "QuantizedWeight":
        """From integers [K, N] (signed when there are no zero points, else unsigned), zero points or
        offsets [nb, N]: packed as the op stores them."""
        if bits == 4:
            if q.shape[1] % 2:
                raise ValueError(f"int4 weights need an even number of output features, got {q.shape[1]}")
            return QuantizedWeight(pack_int4(q), scales, None if zero_points is None else pack_int4(zero_points),
                                   bits, group_size, offsets, input_order)
        dtype = torch.int8 if zero_points is None else torch.uint8
        return QuantizedWeight(q.to(dtype), scales, None if zero_points is None else zero_points.to(torch.uint8),
                               bits, group_size, offsets, input_order)

    def with_scales_in(self, dtype: torch.dtype) -> "QuantizedWeight":
        """The float operands (scales, offsets) in the graph's dtype."""
        return dataclasses.replace(self, scales=self.scales.to(dtype),
                                   offsets=None if self.offsets is None else self.offsets.to(dtype))

    def to_signed(self) -> "QuantizedWeight":
        """Zero points that are all 2^(bits-1) (GPTQ's and GGUF Q4_0's symmetric form) dropped: the
        same weights as signed integers, which every backend takes (TensorRT refuses zero points)."""
        if self.zero_points is None:
            return self
        q, zero = self.values()
        middle = 1 << (self.bits - 1)
        if not bool((zero == middle).all()):
            return self
        return QuantizedWeight.from_values(q - middle, self.scales, None, self.bits, self.group_size, self.offsets,
                                           self.input_order)


def concat(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Packed projections (q/k/v, gate/up): the parts side by side along N. Blocks run along K, so
    this is exact; every part needs the same format."""
    first = parts[0]
    if len(parts) == 1:
        return first
    def form(p):
        return p.bits, p.fp8, p.group_size, p.in_features, p.zero_points is None, p.offsets is None

    if any(form(p) != form(first) for p in parts) or not same_input_order(parts):
        raise ValueError("the parts of a packed projection are quantized differently")

    def side_by_side(name):
        tensors = [getattr(p, name) for p in parts]
        return None if tensors[0] is None else torch.cat(tensors, dim=1)

    return QuantizedWeight(side_by_side("qweight"), side_by_side("scales"), side_by_side("zero_points"),
                           first.bits, first.group_size, side_by_side("offsets"), first.input_order)


def same_input_order(parts: list[QuantizedWeight]) -> bool:
    orders = [p.input_order for p in parts]
    if all(o is None for o in orders):
        return True
    return all(o is not None and torch.equal(o, orders[0]) for o in orders)
