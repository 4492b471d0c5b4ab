"""A checkpoint's config.json checked per family before any weights are read: one line naming the key.

transformers validates little of a config (the length of `layer_types`, some types), and what it
lets through either fails far away (a ZeroDivisionError while the model is made, a pydantic
traceback from a layer spec, an ONNX Runtime error when the engine first runs) or builds an engine
that computes something else (a top-k over more experts than there are). The tensors themselves
are checked against the model the config describes by build/checkpoint.py (missing, misshapen or
extra tensors); what is here is what the tensors cannot show: values the graph cannot take.

    check_config(hf_config)   raises ConfigCheckError("<key>: <value> ...") or returns None

One function per model_type (CHECKS); a multimodal config's text decoder is checked by its own
model_type. A model_type without an entry gets the common checks only.
"""

from __future__ import annotations

from collections.abc import Callable


class ConfigCheckError(ValueError):
    """A config value the build cannot take; the message starts with the key."""


ATTENTION_TYPES = ("full_attention", "sliding_attention")


def _name(config, key: str) -> str:
    """The key as config.json spells it (transformers reads Qwen3-MoE's num_local_experts as num_experts)."""
    return getattr(config, "attribute_map", {}).get(key, key)


def _int(config, key: str, minimum: int, optional: bool = False) -> int | None:
    value = getattr(config, key, None)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigCheckError(f"{_name(config, key)}: {value!r} is not a whole number")
    if value < minimum:
        raise ConfigCheckError(f"{_name(config, key)}: {value} is less than {minimum}")
    return value


def _common(config) -> None:
    """What every decoder needs: layers, heads that group evenly, a window that is a window."""
    layers = _int(config, "num_hidden_layers", 1)
    heads = _int(config, "num_attention_heads", 1)
    kv_heads = _int(config, "num_key_value_heads", 1, optional=True)
    if kv_heads is not None and heads % kv_heads:
        raise ConfigCheckError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads ({heads})")
    _int(config, "hidden_size", 1)
    _int(config, "head_dim", 1, optional=True)
    _int(config, "sliding_window", 1, optional=True)  # negative or zero: no window the attention can count
    types = getattr(config, "layer_types", None)
    if types is not None:
        if not isinstance(types, (list, tuple)) or len(types) != layers:
            count = len(types) if isinstance(types, (list, tuple)) else type(types).__name__
            raise ConfigCheckError(f"layer_types: {count} entries, num_hidden_layers is {layers}")


def _layer_types(config, allowed: tuple[str, ...], family: str) -> list[str]:
    types = list(getattr(config, "layer_types", None) or [])
    for index, kind in enumerate(types):
        if kind not in allowed:
            raise ConfigCheckError(f"layer_types[{index}]: {kind!r} is not a {family} layer type "
                                   f"({', '.join(allowed)})")
    return types


def _attention(config, family: str) -> None:
    """A decoder of full and sliding attention layers (Llama, Qwen2 / 3, Mistral, Gemma, Phi-3)."""
    _common(config)
    types = _layer_types(config, ATTENTION_TYPES, family)
    if "sliding_attention" in types and getattr(config, "sliding_window", None) is None:
        index = types.index("sliding_attention")
        raise ConfigCheckError(f"sliding_window: not set, and layer_types[{index}] is 'sliding_attention'")


def _experts(config) -> None:
    """A mixture of experts: each token's top num_experts_per_tok of num_experts, on the layers that
    mlp_only_layers and decoder_sparse_step leave sparse."""
    experts = _int(config, "num_experts", 1)
    top = _int(config, "num_experts_per_tok", 1)
    if top > experts:
        raise ConfigCheckError(f"{_name(config, 'num_experts_per_tok')}: {top} is more than "
                               f"{_name(config, 'num_experts')} ({experts})")
    _int(config, "decoder_sparse_step", 1, optional=True)
    layers = config.num_hidden_layers
    for index in getattr(config, "mlp_only_layers", None) or []:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < layers:
            raise ConfigCheckError(f"mlp_only_layers: {index!r} is not a layer index (0 to {layers - 1})")


def _moe(config) -> None:
    _attention(config, "Qwen3-MoE")
    _experts(config)


def _gated_delta(config, family: str) -> None:
    """Qwen3.5 / Qwen3-Next: Gated DeltaNet layers beside gated full attention."""
    _common(config)
    _layer_types(config, ("linear_attention", "full_attention"), family)
    key_heads = _int(config, "linear_num_key_heads", 1)
    value_heads = _int(config, "linear_num_value_heads", 1)
    if value_heads % key_heads:
        raise ConfigCheckError(f"linear_num_value_heads: {value_heads} is not a multiple of "
                               f"linear_num_key_heads ({key_heads})")
    _int(config, "linear_key_head_dim", 1)
    _int(config, "linear_value_head_dim", 1)
    _int(config, "linear_conv_kernel_dim", 2)  # its state holds the kernel's last K - 1 inputs


def _qwen3_5(config) -> None:
    _gated_delta(config, "Qwen3.5")


def _qwen3_next(config) -> None:
    _gated_delta(config, "Qwen3-Next")
    _experts(config)


def _lfm2(config) -> None:
    """LFM2: short gated convolutions beside attention."""
    _common(config)
    _layer_types(config, ("conv", "full_attention"), "LFM2")
    _int(config, "conv_L_cache", 2)  # its state holds the convolution's last L - 1 inputs


def _whisper(config) -> None:
    for key in ("d_model", "decoder_layers", "encoder_layers", "decoder_attention_heads",
                "encoder_attention_heads", "max_target_positions", "max_source_positions", "num_mel_bins"):
        _int(config, key, 1)


def _named(family: str) -> Callable:
    return lambda config: _attention(config, family)


CHECKS: dict[str, Callable] = {
    "llama": _named("Llama"),
    "qwen2": _named("Qwen2"),
    "qwen3": _named("Qwen3"),
    "mistral": _named("Mistral"),
    "ministral": _named("Ministral"),
    "phi3": _named("Phi-3"),
    "gemma2": _named("Gemma 2"),
    "gemma3_text": _named("Gemma 3"),
    "qwen2_5_vl_text": _named("Qwen2.5-VL"),
    "qwen3_vl_text": _named("Qwen3-VL"),
    "qwen3_moe": _moe,
    "qwen3_5": _qwen3_5,
    "qwen3_5_text": _qwen3_5,
    "qwen3_next": _qwen3_next,
    "lfm2": _lfm2,
    "whisper": _whisper,
}


def check_config(config) -> None:
    """Refuse (ConfigCheckError naming the key) a config the build cannot take. A multimodal config
    (Qwen2.5-VL, Gemma 3, Qwen2-Audio, ...) is checked through its text decoder's."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(text, "model_type", None)
    check = CHECKS.get(model_type, _common)
    try:
        check(text)
    except ConfigCheckError as error:
        if text is not config:  # the key sits in the text decoder's section
            raise ConfigCheckError(f"text_config.{error}") from None
        raise


__all__ = ["CHECKS", "ConfigCheckError", "check_config"]
