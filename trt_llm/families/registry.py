"""The one registry of model families: each family package's faces (its `FAMILIES`), by HF
architecture and by the name a manifest records. Adding a family is its package and one line in
PACKAGES."""

from __future__ import annotations

from functools import cache
from importlib import import_module

from trt_llm.families.face import Family

PACKAGES = (
    "llama",  # Llama, Qwen2/3, Mistral, Ministral, Phi-3, Gemma 2, Gemma 3 (text), Qwen3-MoE
    "qwen_vl",  # Qwen2.5-VL, Qwen3-VL: the decoder with mRoPE and the Qwen vision tower
    "qwen2_audio",  # Qwen2-Audio: the decoder reading its audio tower's rows
    "qwen3_asr",  # Qwen3-ASR: a Qwen3 decoder reading its chunked audio encoder's rows
    "whisper",  # Whisper: an encoder-decoder
    "qwen3_5",  # Qwen3.5, Qwen3-Next: Gated DeltaNet and gated attention
    "lfm2",  # LFM2: short gated convolutions and attention
    "smolvlm",  # SmolVLM2, Idefics3: a Llama decoder and a tiled SigLIP tower with pixel shuffle
    "gemma3",  # Gemma 3 with its SigLIP tower: 256 soft tokens an image, seen both ways
    "gemma4",  # Gemma 4: per-layer embeddings, layers of two widths, keys and values shared across layers
)


class UnsupportedArchitecture(ValueError):
    pass


@cache
def families() -> dict[str, Family]:
    """Every family's face by its HF architecture."""
    found: dict[str, Family] = {}
    for package in PACKAGES:
        for family in import_module(f"trt_llm.families.{package}").FAMILIES:
            found[family.architecture] = family
    return found


def family_for(config) -> Family:
    """The family of a HF config, by its `architectures` entry (or, without one, its model type)."""
    registry = families()
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        if architecture in registry:
            return registry[architecture]
    # A config saved without `architectures` (a GGUF's) still names its model type.
    if not architectures and getattr(config, "model_type", None) is not None:
        try:
            return family_named(config.model_type)
        except UnsupportedArchitecture:
            pass
    found = ", ".join(architectures) or f"model_type {getattr(config, 'model_type', None)!r}"
    raise UnsupportedArchitecture(f"unsupported architecture {found}; supported: {', '.join(sorted(registry))}")


def family_named(name: str) -> Family:
    """The family a manifest's model.family names."""
    for family in families().values():
        if family.name == name:
            return family
    known = sorted(family.name for family in families().values())
    raise UnsupportedArchitecture(f"unknown model family {name!r}; this version knows {', '.join(known)}")
