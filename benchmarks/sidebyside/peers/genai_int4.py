"""ONNX Runtime GenAI int4: its model builder with `-p int4` (its defaults: blocks of 32, int8
compute on the cpu) on the same fp32 HF directory, run with its Generator."""

from __future__ import annotations

from ..artifacts import Artifact, Context
from . import genai

NAME = "ort-genai-int4"
BATCHED = True
missing = genai.missing
Runner = genai.Runner


def prepare(ctx: Context) -> Artifact:
    return genai.prepare(ctx, precision="int4")
