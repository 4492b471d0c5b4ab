"""Gemma 4's config check (build/config_checks.py runs the one the face names). Its head width and kv
heads are per layer (transformers 5.25's per_layer_config: reading config.head_dim raises), so the
shared `common` check reads them layer by layer here."""

from __future__ import annotations

from trt_llm.build.config_checks import ATTENTION_TYPES, ConfigCheckError, layer_types, whole_number


def gemma4(config, family) -> None:
    layers = whole_number(config, "num_hidden_layers", 1)
    heads = whole_number(config, "num_attention_heads", 1)
    whole_number(config, "hidden_size", 1)
    types = layer_types(config, ATTENTION_TYPES, "Gemma 4")
    if len(types) != layers:
        raise ConfigCheckError(f"layer_types: {len(types)} entries, num_hidden_layers is {layers}")
    if "sliding_attention" in types:
        whole_number(config, "sliding_window", 1)
    for index, layer in enumerate(config.per_layer_config[:layers]):
        kv_heads = layer.num_key_value_heads
        key = "num_global_key_value_heads" if types[index] == "full_attention" and config.attention_k_eq_v \
            else "num_key_value_heads"
        if not kv_heads or heads % kv_heads:
            raise ConfigCheckError(f"{key}: {kv_heads} does not divide num_attention_heads ({heads}) "
                                   f"(layer {index})")
    if config.use_bidirectional_attention == "all":
        raise ConfigCheckError("use_bidirectional_attention: 'all' (an encoder's attention, every token seeing every "
                               "other) is not supported; this runtime decodes causally")
    if config.hidden_size_per_layer_input:
        whole_number(config, "hidden_size_per_layer_input", 1)
        per_layer_vocab = whole_number(config, "vocab_size_per_layer_input", 1)
        if per_layer_vocab < config.vocab_size:
            raise ConfigCheckError(f"vocab_size_per_layer_input: {per_layer_vocab} is less than vocab_size "
                                   f"({config.vocab_size}): a token past it has no per-layer row")
    if config.enable_moe_block:  # experts beside the MLP, on every layer
        count = whole_number(config, "num_experts", 1)
        top = whole_number(config, "top_k_experts", 1)
        if top > count:
            raise ConfigCheckError(f"top_k_experts: {top} is more than num_experts ({count})")
        whole_number(config, "moe_intermediate_size", 1)
