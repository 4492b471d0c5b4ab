"""Whisper's config check (build/config_checks.py runs the one the face names)."""

from __future__ import annotations

from trt_llm.build.config_checks import whole_number


def whisper(config, family) -> None:
    for key in ("d_model", "decoder_layers", "encoder_layers", "decoder_attention_heads",
                "encoder_attention_heads", "max_target_positions", "max_source_positions", "num_mel_bins"):
        whole_number(config, key, 1)
