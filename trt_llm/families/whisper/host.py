"""Whisper's audio encoder at run time: a 30 s window of features per clip in, each decoder layer's
cross-attention keys and values out (graphs.py's encoder graph)."""

from __future__ import annotations

import numpy as np


class CrossAttention:
    """Whisper's runtime adapter: the encoder's outputs are the decoder's cross inputs, not prompt rows."""

    cross_attention = True

    @classmethod
    def from_settings(cls, settings: dict) -> "CrossAttention":
        return cls()

    def token_count(self, frames: int) -> int:
        return 0  # a clip takes no prompt tokens: the decoder attends to it at every step

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The encoder's plan: one request's clips a call (its window's frames are fixed)."""
        return {"batch": (1, 1, config.audio.max_clips)}

    def feeds(self, features: list[np.ndarray], frames: list[int], dtype) -> dict[str, np.ndarray]:
        return {"input_features": np.stack(features).astype(dtype)}
