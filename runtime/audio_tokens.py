"""How many audio tokens a Qwen2-Audio clip takes: the rule of transformers' Qwen2AudioProcessor, in
plain integer arithmetic so the runtime (no torch, no transformers) widens a prompt's <|AUDIO|>
exactly as the processor does, and the audio graph's `embed_lengths` output agrees with it.

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
