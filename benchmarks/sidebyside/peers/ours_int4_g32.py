"""trt-llm int4 in GenAI's int4 layout: `quantization: {weights: int4, group_size: 32}` (round to nearest,
symmetric blocks of 32, the LM head int4 too), built from the same fp32 HF directory as GenAI's
`builder -p int4`, whose default blocks are 32 with an int4 LM head: the same precision, so the two
compare kernels and runtime, not weight bytes."""

from __future__ import annotations

from ..artifacts import Artifact, Context
from . import ours

NAME = "trt-llm-int4-g32"
BATCHED = True
missing = ours.missing
Runner = ours.Runner


def prepare(ctx: Context) -> Artifact:
    return ours.prepare(ctx, {"weights": "int4", "group_size": 32}, name="trt-llm-int4-g32", precision="int4-g32")
