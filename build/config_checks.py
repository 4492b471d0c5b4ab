"""A checkpoint's config.json checked per family before any weights are read: one line naming the key.

transformers validates little of a config (the length of `layer_types`, some types), and what it
lets through either fails far away (a ZeroDivisionError while the model is made, a pydantic
traceback from a layer spec, an ONNX Runtime error when the engine first runs) or builds an engine
that computes something else (a top-k over more experts than there are). The tensors themselves
are checked against the model the config describes by build/checkpoint.py (missing, misshapen or
extra tensors); what is here is what the tensors cannot show: values the graph cannot take.

    check_config(hf_config, family)   raises ConfigCheckError("<key>: <value> ...") or returns None

Each family's face names its check (`Family.checks`, "module:function", called with the text decoder's
config and the face): a decoder of full and sliding attention layers takes `attention_layers`, one with
experts `moe_layers`, both here with the checks every family shares; a family with layers of its own
keeps its check in its package (trt_llm/families/qwen3_5/checks.py, lfm2/, whisper/). A multimodal
config is checked through its text decoder's.
"""

from __future__ import annotations

from importlib import import_module


class ConfigCheckError(ValueError):
    """A config value the build cannot take; the message starts with the key."""


ATTENTION_TYPES = ("full_attention", "sliding_attention")


def config_key(config, key: str) -> str:
    """The key as config.json spells it (transformers reads Qwen3-MoE's num_local_experts as num_experts)."""
    return getattr(config, "attribute_map", {}).get(key, key)


def whole_number(config, key: str, minimum: int, optional: bool = False) -> int | None:
    value = getattr(config, key, None)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigCheckError(f"{config_key(config, key)}: {value!r} is not a whole number")
    if value < minimum:
        raise ConfigCheckError(f"{config_key(config, key)}: {value} is less than {minimum}")
    return value


def common(config) -> None:
    """What every decoder needs: layers, heads that group evenly, a window that is a window."""
    layers = whole_number(config, "num_hidden_layers", 1)
    heads = whole_number(config, "num_attention_heads", 1)
    kv_heads = whole_number(config, "num_key_value_heads", 1, optional=True)
    if kv_heads is not None and heads % kv_heads:
        raise ConfigCheckError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads ({heads})")
    whole_number(config, "hidden_size", 1)
    whole_number(config, "head_dim", 1, optional=True)
    whole_number(config, "sliding_window", 1, optional=True)  # negative or zero: no window the attention can count
    types = getattr(config, "layer_types", None)
    if types is not None:
        if not isinstance(types, (list, tuple)) or len(types) != layers:
            count = len(types) if isinstance(types, (list, tuple)) else type(types).__name__
            raise ConfigCheckError(f"layer_types: {count} entries, num_hidden_layers is {layers}")


def layer_types(config, allowed: tuple[str, ...], label: str) -> list[str]:
    """The config's layer_types, each one of `allowed` (label: the family, for the message)."""
    types = list(getattr(config, "layer_types", None) or [])
    for index, kind in enumerate(types):
        if kind not in allowed:
            raise ConfigCheckError(f"layer_types[{index}]: {kind!r} is not a {label} layer type "
                                   f"({', '.join(allowed)})")
    return types


def attention_layers(config, family) -> None:
    """A decoder of full and sliding attention layers (Llama, Qwen2 / 3, Mistral, Gemma, Phi-3, and
    the text decoders of the VLMs and audio LLMs built on them)."""
    common(config)
    types = layer_types(config, ATTENTION_TYPES, family.architecture)
    if "sliding_attention" in types and getattr(config, "sliding_window", None) is None:
        index = types.index("sliding_attention")
        raise ConfigCheckError(f"sliding_window: not set, and layer_types[{index}] is 'sliding_attention'")


def experts(config) -> None:
    """A mixture of experts: each token's top num_experts_per_tok of num_experts, on the layers that
    mlp_only_layers and decoder_sparse_step leave sparse."""
    count = whole_number(config, "num_experts", 1)
    top = whole_number(config, "num_experts_per_tok", 1)
    if top > count:
        raise ConfigCheckError(f"{config_key(config, 'num_experts_per_tok')}: {top} is more than "
                               f"{config_key(config, 'num_experts')} ({count})")
    whole_number(config, "decoder_sparse_step", 1, optional=True)
    layers = config.num_hidden_layers
    for index in getattr(config, "mlp_only_layers", None) or []:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < layers:
            raise ConfigCheckError(f"mlp_only_layers: {index!r} is not a layer index (0 to {layers - 1})")


def moe_layers(config, family) -> None:
    """Attention layers with experts (Qwen3-MoE)."""
    attention_layers(config, family)
    experts(config)


def check_config(config, family) -> None:
    """Refuse (ConfigCheckError naming the key) a config the build cannot take, by the check its
    family's face names. A multimodal config (Qwen2.5-VL, Gemma 3, Qwen2-Audio, ...) is checked
    through its text decoder's."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    module, name = family.checks.split(":")
    try:
        getattr(import_module(module), name)(text, family)
    except ConfigCheckError as error:
        if text is not config:  # the key sits in the text decoder's section
            raise ConfigCheckError(f"text_config.{error}") from None
        raise


__all__ = ["ConfigCheckError", "attention_layers", "check_config", "common", "experts", "layer_types",
           "moe_layers", "whole_number"]
