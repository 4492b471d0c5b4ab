"""trt-llm int4 with the default group size: `quantization: int4` (round to nearest, groups of 128),
built from the same fp32 HF directory."""

from __future__ import annotations

from ..artifacts import Artifact, Context
from . import ours

NAME = "trt-llm-int4-g128"
BATCHED = True
missing = ours.missing
Runner = ours.Runner


def prepare(ctx: Context) -> Artifact:
    return ours.prepare(ctx, {"weights": "int4"}, name="trt-llm-int4-g128", precision="int4-g128")
