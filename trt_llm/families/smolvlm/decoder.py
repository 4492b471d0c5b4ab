"""The text decoder of a SmolVLM / Idefics3 checkpoint: build/models/llama.py's graph over its
language model, which these checkpoints keep at `model.text_model` (Qwen-VL's and Gemma 3's at
`model.language_model`, where llama.text_decoder looks)."""

from __future__ import annotations

from types import SimpleNamespace

from trt_llm.build.models import llama
from trt_llm.build.models.llama import ModelDims  # noqa: F401 - the build reads it from the family's module


def _as_language_model(hf_model):
    """The checkpoint seen with its text model where llama.text_decoder looks for it."""
    return SimpleNamespace(model=SimpleNamespace(language_model=hf_model.model.text_model),
                           lm_head=hf_model.lm_head, config=hf_model.config)


def text_decoder(hf_model):
    return llama.text_decoder(_as_language_model(hf_model))


class DecoderGraph(llama.DecoderGraph):
    def __init__(self, hf_model, *args, **kwargs):
        super().__init__(_as_language_model(hf_model), *args, **kwargs)
