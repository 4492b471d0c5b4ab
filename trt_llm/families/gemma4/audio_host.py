"""The Gemma 4 audio component at run time (torch-free): how many soft tokens a clip takes, its graph's
host inputs (trt_llm/families/gemma4/audio_tower.py) and its prompt layout, made from the component's
config.json (audio_tower.export_audio).

A clip of n samples has `frames` valid mel frames (runtime/media/audio/gemma4_features.py: (n + 160 -
321) // 160 + 1 at 16 kHz, after the cut at 30 s); the tower's two stride-2 convolutions keep
ceil(frames / 2) then ceil of half that: ceil(frames / 4) soft tokens, one a 40 ms (transformers'
Gemma4Processor.replace_audio_token: its feature mask subsampled [::2] twice and summed; 750 for 30 s).

Prompt: the chat template writes one `<|audio|>` per audio part, and Gemma4Processor makes it
`<|audio>` + n x `<|audio|>` + `<audio|>` (all special tokens: the widening is made on the ids, by
runtime/media/sequence_media.widen_placeholders with `wrap_tokens`); the graph's rows go in at the n
`<|audio|>` positions, clip after clip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def soft_tokens(frames) -> int:
    """The `<|audio|>` tokens of a clip of `frames` valid mel frames: ceil(frames / 4)."""
    if isinstance(frames, bool) or int(frames) != frames or frames < 0:
        raise ValueError(f"audio tokens: frames must be a non-negative integer, got {frames!r}")
    return (int(frames) + 3) // 4


def feeds(features: list[np.ndarray], frames: list[int], dtype) -> dict[str, np.ndarray]:
    """The graph's inputs for clips of `frames` valid frames, each's features [>= frames, mel bins]:
    input_features [clips, longest, mel] (zeros past each clip), frame_counts [clips] int64, row_index
    [soft tokens] int64 (each token's clip * rows + row, rows = ceil(longest / 4))."""
    if len(features) != len(frames) or not frames:
        raise ValueError(f"audio feeds: {len(features)} clips' features for {len(frames)} frame counts")
    longest = max(int(n) for n in frames)
    bins = features[0].shape[1]
    batch = np.zeros((len(frames), longest, bins), dtype=dtype)
    for i, (f, n) in enumerate(zip(features, frames)):
        if f.ndim != 2 or f.shape[1] != bins or f.shape[0] < n:
            raise ValueError(f"audio feeds: clip {i}'s features are {f.shape}, not [>= {n}, {bins}]")
        batch[i, :n] = f[:n]
    rows = soft_tokens(longest)
    row_index = np.concatenate([i * rows + np.arange(soft_tokens(n)) for i, n in enumerate(frames)]).astype(np.int64)
    return {"input_features": batch, "frame_counts": np.asarray(frames, dtype=np.int64), "row_index": row_index}


@dataclass(frozen=True)
class AudioSoftTokens:
    """Gemma 4's runtime adapter: the clips padded to the longest, one soft token per 4 valid frames."""

    window_frames: int = 3000  # the most frames a clip has (the extractor cuts it at 30 s)
    audio_token_id: int | None = None  # <|audio|>
    boa_token_id: int | None = None  # <|audio>
    eoa_token_id: int | None = None  # <audio|>
    cross_attention = False  # its rows go in at the clip's <|audio|> tokens

    @classmethod
    def from_settings(cls, settings: dict) -> "AudioSoftTokens":
        return cls(settings.get("window_frames", 3000), settings.get("audio_token_id"), settings.get("boa_token_id"),
                   settings.get("eoa_token_id"))

    def token_count(self, frames: int) -> int:
        return soft_tokens(frames)

    @staticmethod
    def tensorrt_profile(config, settings: dict) -> dict[str, tuple[int, int, int]]:
        """From one clip of min_mel_frames to max_clips clips of the longest the runtime accepts
        (max_mel_frames, at most the 30 s window); opt is one clip of the longest."""
        clips = config.audio.max_clips
        longest = min(config.audio.max_mel_frames, settings.get("window_frames", 3000))
        shortest = max(1, min(config.audio.min_mel_frames, longest))
        return {"clips": (1, 1, clips), "audio_frames": (shortest, longest, longest),
                "audio_tokens": (soft_tokens(shortest), soft_tokens(longest), clips * soft_tokens(longest))}

    def feeds(self, features: list[np.ndarray], frames: list[int], dtype) -> dict[str, np.ndarray]:
        return feeds(features, frames, dtype)

    @property
    def wrap_tokens(self) -> tuple[int, int] | None:
        """(`<|audio>`, `<audio|>`): the tokens around each clip's run (runtime/media/audio/prompt.py)."""
        return None if self.boa_token_id is None or self.eoa_token_id is None else (self.boa_token_id,
                                                                                    self.eoa_token_id)
