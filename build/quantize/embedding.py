"""The embedding table as the build stores it (`quantization.embedding`): the graph's dtype, fp16,
or int8 in Q8_0's blocks of 32 along a row; runtime/backends/embedding.py reads each."""

from __future__ import annotations

import torch
from torch import Tensor

from trt_llm.build.quantize import QuantizedWeight

EMBEDDING_BLOCK = 32


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
        grouped = table.float().reshape(table.shape[0], -1, group)
        scales = grouped.abs().amax(dim=-1, keepdim=True) / 127
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        rows = torch.round(grouped / scales).clamp(-127, 127).to(torch.int8).reshape(table.shape)
        return {"embedding": rows.contiguous(), "scales": scales[..., 0].contiguous()}
    return {"embedding": table.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[storage])
            .contiguous()}
