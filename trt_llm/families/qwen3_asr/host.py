"""How many audio tokens a Qwen3-ASR clip takes, and its encoder graph's host inputs: the rules of
transformers' Qwen3ASRProcessor (`_get_audio_token_length`) and Qwen3ASREncoder (`_post_cnn_length`,
`get_audio_cu_seqlens`), in plain integer arithmetic so the runtime (no torch, no transformers)
widens a prompt's <|audio_pad|> exactly as the processor does.

A clip of `frames` valid mel frames (runtime/media/audio/features.py's Qwen3ASRFeatures) is zero-padded
to whole chunks of 2 * n_window (100) frames. The encoder's three stride-2 convolutions run on every
chunk alone and leave 13 rows of a full chunk; of the last, partial one, the rows its r valid frames
reach: r -> (r - 1) // 2 + 1, three times. Each kept row is one <|audio_pad|> token. Attention runs
within windows of n_window_infer frames' rows (800 frames: 104 rows) of each clip, the last window
of a clip what is left.

transformers sizes the window from the longest chunk of the batch (13 rows once any clip holds a
full chunk); a batch whose every clip is under one chunk has one window per clip either way, so
windows of 13 * (n_window_infer // chunk) rows are its windows for every clip on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def post_conv_rows(frames):
    """Rows after three (kernel 3, stride 2, padding 1) convolutions; 0 frames stay 0 (an int, or a
    numpy integer array elementwise)."""
    rows = np.asarray(frames)
    for _ in range(3):
        rows = np.where(rows > 0, (rows - 1) // 2 + 1, 0)
    return int(rows) if rows.ndim == 0 else rows.astype(np.int64)


@dataclass(frozen=True)
class Qwen3ASRLayout:
    """The chunking of Qwen3-ASR's encoder (its config's n_window, n_window_infer)."""

    n_window: int = 50
    n_window_infer: int = 800

    def __post_init__(self):
        for key in ("n_window", "n_window_infer"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"audio config: {key} must be a positive integer, got {value!r}")
        if self.n_window_infer % self.chunk_frames:
            raise ValueError(f"audio config: n_window_infer {self.n_window_infer} is not a multiple of "
                             f"2 * n_window ({self.chunk_frames})")

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def rows_per_chunk(self) -> int:
        return post_conv_rows(self.chunk_frames)

    @property
    def window_rows(self) -> int:
        return self.rows_per_chunk * (self.n_window_infer // self.chunk_frames)

    def chunks(self, frames: int) -> int:
        return -(-int(frames) // self.chunk_frames)

    def audio_token_count(self, frames: int) -> int:
        """The <|audio_pad|> tokens of a clip of `frames` valid mel frames (the processor's rule)."""
        if isinstance(frames, bool) or int(frames) != frames or frames < 0:
            raise ValueError(f"audio tokens: frames must be a non-negative integer, got {frames!r}")
        full, rest = divmod(int(frames), self.chunk_frames)
        return full * self.rows_per_chunk + post_conv_rows(rest)

    def packing(self, frames) -> tuple[np.ndarray, np.ndarray, int]:
        """The graph's host inputs for clips of `frames` valid mel frames each (audio_tower.py): row_index [N] (each kept row's chunk * 13 + row), cu_seqlens [windows + 1]
        int32 (each clip's windows of the N packed rows), and the chunks in all."""
        rows, bounds, chunk = [], [0], 0
        for n in frames:
            chunks = self.chunks(n)
            valid = np.minimum(self.chunk_frames, int(n) - self.chunk_frames * np.arange(chunks))
            for c, kept in enumerate(post_conv_rows(valid)):
                rows.append((chunk + c) * self.rows_per_chunk + np.arange(kept))
            chunk += chunks
            tokens = self.audio_token_count(int(n))
            windows = [self.window_rows] * (tokens // self.window_rows) + ([tokens % self.window_rows]
                                                                           if tokens % self.window_rows else [])
            bounds.extend(bounds[-1] + np.cumsum(windows))
        row_index = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
        return row_index, np.asarray(bounds, dtype=np.int32), chunk


@dataclass(frozen=True)
class AudioChunks:
    """Qwen3-ASR's runtime adapter: a clip's rows from its 100-frame chunks, clip after clip."""

    layout: Qwen3ASRLayout
    cross_attention = False  # its rows go in at the clip's <|audio_pad|> tokens

    @classmethod
    def from_settings(cls, settings: dict) -> "AudioChunks":
        return cls(Qwen3ASRLayout(settings.get("n_window", 50), settings.get("n_window_infer", 800)))

    def token_count(self, frames: int) -> int:
        return self.layout.audio_token_count(frames)

    @classmethod
    def tensorrt_profile(cls, config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The encoder's plan: from one clip of min_mel_frames to max_clips clips of max_mel_frames, as
        chunks, their kept rows and their attention windows; opt is one clip of the longest."""
        layout, clips = cls.from_settings(settings).layout, config.audio.max_clips
        longest = min(config.audio.max_mel_frames, settings.get("window_frames", config.audio.max_mel_frames))
        shortest = max(1, min(config.audio.min_mel_frames, longest))
        rows = [layout.audio_token_count(n) for n in (shortest, longest)]
        windows = [-(-r // layout.window_rows) for r in rows]
        return {"audio_chunks": (layout.chunks(shortest), layout.chunks(longest), clips * layout.chunks(longest)),
                "audio_rows": (rows[0], rows[1], clips * rows[1]),
                "windows_plus_one": (windows[0] + 1, windows[1] + 1, clips * windows[1] + 1)}

    def feeds(self, features: list[np.ndarray], frames: list[int], dtype) -> dict[str, np.ndarray]:
        """The graph's inputs: every clip's features [mel, chunks * 100] cut into its chunks."""
        size = self.layout.chunk_frames
        chunks = np.concatenate([f.reshape(f.shape[0], -1, size).transpose(1, 0, 2) for f in features]).astype(dtype)
        row_index, cu_seqlens, _ = self.layout.packing(frames)
        return {"input_features": chunks, "row_index": row_index, "cu_seqlens": cu_seqlens}
