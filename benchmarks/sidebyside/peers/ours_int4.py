"""trt-llm int4 on llama.cpp's Q4_0 weights: built from the Q4_0 GGUF that llama.cpp-Q4_0 runs
(sidebyside/gguf_convert.py --type Q4_0 from the same fp32 directory), `quantization: {weights: int4,
group_size: 32}`, which keeps the file's blocks bit for bit (the tied LM head and the embedding
stay Q8_0 in both)."""

from __future__ import annotations

from ..artifacts import Artifact, Context
from . import llamacpp_q4_0, ours

NAME = "trt-llm-int4"
BATCHED = True
Runner = ours.Runner


def missing(ctx: Context) -> str | None:
    return None if ctx.gguf is not None else llamacpp_q4_0.missing_converter()


def prepare(ctx: Context) -> Artifact:
    gguf = llamacpp_q4_0.prepare(ctx)
    artifact = ours.prepare(ctx, {"weights": "int4", "group_size": 32}, model=gguf.path, name="trt-llm-int4-q4_0",
                            precision="Q4_0")
    artifact.notes.append("built from the Q4_0 GGUF llama.cpp-Q4_0 runs: the same weights")
    return artifact
