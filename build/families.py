"""The model families the build supports, keyed by the checkpoint's `architectures` entry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # the HF class the manifest names (a GGUF's config lists none)
    # Qwen3 normalises q and k per head (RMSNorm over head_dim) before rotary.
    qk_norm: bool = False


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": Family("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": Family("qwen3", "Qwen3ForCausalLM", qk_norm=True),
}


class UnsupportedArchitecture(ValueError):
    pass


def family_for(config) -> Family:
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        if architecture in FAMILIES:
            return FAMILIES[architecture]
    # A config saved without `architectures` still names its model type.
    by_type = {family.name: family for family in FAMILIES.values()}
    if not architectures and getattr(config, "model_type", None) in by_type:
        return by_type[config.model_type]
    found = ", ".join(architectures) or f"model_type {getattr(config, 'model_type', None)!r}"
    raise UnsupportedArchitecture(
        f"unsupported architecture {found}; supported: {', '.join(sorted(FAMILIES))}"
    )
