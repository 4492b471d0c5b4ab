"""How many audio tokens a Qwen2-Audio clip takes: the rule of transformers' Qwen2AudioProcessor, in
plain integer arithmetic so the runtime (no torch, no transformers) widens a prompt's <|AUDIO|>
exactly as the processor does, and the audio graph's host inputs (`packing`) that select the clips'
valid rows.

The tower sees 3,000 mel frames (30 s, Whisper features padded to the chunk); of those, the clip
holds `num_frames` (runtime/audio_features.WhisperFeatures.num_frames: ceil(samples / 160), the
processor's feature_attention_mask.sum(-1)). Its first convolution keeps the frame rate, the second
has stride 2, so (num_frames - 1) // 2 + 1 rows are valid after it; the average pool (kernel 2,
stride 2) then leaves (conv - 2) // 2 + 1 of them, one <|AUDIO|> token each (750 for a full chunk).
"""

from __future__ import annotations

import numpy as np

MEL_FRAMES = 3000  # the frames the tower takes: its max_source_positions (1500) times the stride (2)
MAX_AUDIO_TOKENS = 750  # the rows the tower gives per clip


def conv_length(num_frames):
    """Rows of the tower's sequence that hold the clip (the attention mask's valid keys)."""
    return (num_frames - 1) // 2 + 1


def audio_token_count(num_frames):
    """The <|AUDIO|> tokens of a clip with `num_frames` valid mel frames (an int, or a numpy integer
    array elementwise): 0 for 0 to 2 frames, 750 for the full 3,000. Frames past 3,000 are refused:
    the features are cut to the chunk before they are counted."""
    frames = np.asarray(num_frames)
    if frames.dtype.kind not in "iu":
        raise TypeError(f"audio tokens: num_frames must be integers, got {frames.dtype}")
    if (frames < 0).any() or (frames > MEL_FRAMES).any():
        raise ValueError(f"audio tokens: num_frames must be within 0..{MEL_FRAMES}, got {num_frames!r}")
    tokens = (conv_length(frames) - 2) // 2 + 1
    return int(tokens) if tokens.ndim == 0 else tokens.astype(np.int64)


def packing(frames, rows: int = MEL_FRAMES // 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The audio graph's host inputs for clips of `frames` valid mel frames each (audio_tower.py): row_index [N] (each valid row's clip * rows + row), cu_seqlens [clips + 1]
    int32 (the clips' segments of the N packed rows), pool_index [M] (the packed row of each output
    row's first pooled row: its pair is it and the next)."""
    valid = [conv_length(int(n)) for n in frames]
    tokens = [audio_token_count(int(n)) for n in frames]
    starts = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)
    row_index = np.concatenate([clip * rows + np.arange(n) for clip, n in enumerate(valid)]).astype(np.int64)
    pool_index = np.concatenate([start + 2 * np.arange(t) for start, t in zip(starts, tokens)]).astype(np.int64)
    return row_index, starts.astype(np.int32), pool_index


class AudioRows:
    """Qwen2-Audio's runtime adapter: one 30 s window of features per clip, its valid rows packed."""

    cross_attention = False  # its rows go in at the clip's <|AUDIO|> tokens

    @classmethod
    def from_settings(cls, settings: dict) -> "AudioRows":
        return cls()

    def token_count(self, frames: int) -> int:
        return audio_token_count(frames)

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """The packed tower's plan: the clips' valid rows, their segment bounds and their audio tokens,
        from one clip of min_mel_frames to max_clips clips of the longest the runtime accepts
        (max_mel_frames, at most the encoder's window); opt is one clip of the longest."""
        clips = config.audio.max_clips
        longest = min(config.audio.max_mel_frames, settings.get("window_frames", MEL_FRAMES))
        shortest = min(config.audio.min_mel_frames, longest)
        rows = (conv_length(shortest), conv_length(longest), clips * conv_length(longest))
        tokens = (audio_token_count(shortest), audio_token_count(longest), clips * audio_token_count(longest))
        return {"clips": (1, 1, clips), "clips_plus_one": (2, 2, clips + 1), "audio_rows": rows, "audio_tokens": tokens}

    def feeds(self, features: list[np.ndarray], frames: list[int], dtype) -> dict[str, np.ndarray]:
        row_index, cu_seqlens, pool_index = packing(frames)
        return {"input_features": np.stack(features).astype(dtype), "row_index": row_index, "cu_seqlens": cu_seqlens,
                "pool_index": pool_index}
