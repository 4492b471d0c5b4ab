"""LFM2's config check (build/config_checks.py runs the one the face names)."""

from __future__ import annotations

from trt_llm.build.config_checks import common, layer_types, whole_number


def lfm2(config, family) -> None:
    """Short gated convolutions beside attention."""
    common(config)
    layer_types(config, ("conv", "full_attention"), "LFM2")
    whole_number(config, "conv_L_cache", 2)  # its state holds the convolution's last L - 1 inputs
