"""trt-llm int8: `quantization: int8` (round to nearest, one scale per output column; cpu lowering:
ONNX Runtime's DynamicQuantizeMatMul), built from the same fp32 HF directory."""

from __future__ import annotations

from ..artifacts import Artifact, Context
from . import ours

NAME = "trt-llm-int8"
BATCHED = True
missing = ours.missing
Runner = ours.Runner


def prepare(ctx: Context) -> Artifact:
    return ours.prepare(ctx, {"weights": "int8"}, name="trt-llm-int8", precision="int8")
