"""Qwen3.5's and Qwen3-Next's config checks (build/config_checks.py runs the one the face names)."""

from __future__ import annotations

from trt_llm.build.config_checks import ConfigCheckError, common, experts, layer_types, whole_number


def gated_delta(config, label: str) -> None:
    """Gated DeltaNet layers beside gated full attention."""
    common(config)
    layer_types(config, ("linear_attention", "full_attention"), label)
    key_heads = whole_number(config, "linear_num_key_heads", 1)
    value_heads = whole_number(config, "linear_num_value_heads", 1)
    if value_heads % key_heads:
        raise ConfigCheckError(f"linear_num_value_heads: {value_heads} is not a multiple of "
                               f"linear_num_key_heads ({key_heads})")
    whole_number(config, "linear_key_head_dim", 1)
    whole_number(config, "linear_value_head_dim", 1)
    whole_number(config, "linear_conv_kernel_dim", 2)  # its state holds the kernel's last K - 1 inputs


def qwen3_5(config, family) -> None:
    gated_delta(config, "Qwen3.5")


def qwen3_next(config, family) -> None:
    gated_delta(config, "Qwen3-Next")
    experts(config)
