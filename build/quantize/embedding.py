"""The embedding table as the build stores it (`quantization.embedding`): the graph's dtype, fp16,
or int8 in Q8_0's blocks of 32 along a row; runtime/backends/embedding.py reads each."""

from __future__ import annotations

import torch
from torch import Tensor

from trt_llm.build.quantize import QuantizedWeight

EMBEDDING_BLOCK = 32
ROWS_AT_ONCE = 1 << 14  # rows converted at once


def embedding_tensors(table: Tensor, storage: str, blocks: QuantizedWeight | None = None) -> dict[str, Tensor]:
    """The embedding file's tensors, which runtime/backends/embedding.py reads: the table [V, H] in fp32 /
    fp16 / bf16, or int8 "embedding" [V, H] with "scales" [V, H / 32] (Q8_0: blocks of 32 along a row,
    largest magnitude / 127; a row that 32 does not divide is one block). `blocks`: a GGUF's Q8_0
    table ([H, V] as the op's operands), kept as it is."""
    if storage == "int8":
        if blocks is not None:
            q, _ = blocks.values()
            return {"embedding": q.t().to(torch.int8).contiguous(), "scales": blocks.scales.t().float().contiguous()}
        width = table.shape[1]
        group = EMBEDDING_BLOCK if width % EMBEDDING_BLOCK == 0 else width
        rows = torch.empty(table.shape, dtype=torch.int8)
        scales = torch.empty(table.shape[0], width // group)
        for start in range(0, table.shape[0], ROWS_AT_ONCE):  # slices: no float32 copy of the whole table
            grouped = table[start: start + ROWS_AT_ONCE].float().reshape(-1, width // group, group)
            scale = grouped.abs().amax(dim=-1, keepdim=True) / 127
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
            rows[start: start + ROWS_AT_ONCE] = torch.round(grouped / scale).clamp(-127, 127).reshape(-1, width)
            scales[start: start + ROWS_AT_ONCE] = scale[..., 0]
        return {"embedding": rows, "scales": scales}
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[storage]
    return {"embedding": table.to(dtype).contiguous()}
