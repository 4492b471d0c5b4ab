"""llama.cpp on a Q4_0 GGUF written from the same fp32 HF directory (sidebyside/gguf_convert.py
--type Q4_0: every matmul weight Q4_0 by gguf's own quantizer, the tied embedding Q8_0), or on the ready
file of ctx.gguf (a model gguf_convert.py does not write: llama.cpp's own requantization). trt-llm-int4
is built from this very file."""

from __future__ import annotations

import importlib.util
import sys

from ..artifacts import Artifact, Context, cached_build, source_hash
from ..measure import run_timed
from . import llamacpp

NAME = "llama.cpp-Q4_0"
BATCHED = False
BATCH_NOTE = llamacpp.BATCH_NOTE
Runner = llamacpp.Runner


def missing_converter() -> str | None:
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is not installed (pip install gguf): no GGUF conversion"
    return None


def missing(ctx: Context) -> str | None:
    return llamacpp.missing(ctx)


def prepare(ctx: Context) -> Artifact:
    from importlib import metadata

    if ctx.gguf is not None:  # the model's own file, requantized by llama-quantize: nothing to build here
        return Artifact(path=ctx.gguf, precision="Q4_0", build=None,
                        notes=[f"{ctx.gguf.name}, written by llama.cpp's llama-quantize (see the source above)"])
    out = ctx.work_dir / "model-q4_0.gguf"

    def build():
        return run_timed([sys.executable, str(llamacpp.CONVERTER), str(ctx.hf_dir), str(out), "--type", "Q4_0"],
                         ctx.work_dir / "model-q4_0.log")

    key = {"hf_dir": str(ctx.hf_dir), "converter": source_hash(llamacpp.CONVERTER), "gguf": metadata.version("gguf")}
    info = cached_build(ctx, "model-q4_0", out, key, build, "HF -> Q4_0 GGUF (gguf_convert.py --type Q4_0)")
    return Artifact(path=out, precision="Q4_0", build=info)
