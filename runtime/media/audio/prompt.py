"""A request's audio clips in its prompt (an audio-LLM: Qwen2-Audio, Gemma 4): each audio part's placeholder
token widened to the clip's tokens, and their rows from the audio encoder.

The chat template writes one `<|AUDIO|>` per audio part (inside `<|audio_bos|>` ... `<|audio_eos|>`);
transformers' processor widens it to as many as the clip has tokens, and so does this module, so the
prompt is token for token transformers'. Gemma 4's template writes a bare `<|audio|>` and its processor
wraps the run in `<|audio>` ... `<audio|>` (the adapter's `wrap_tokens`). A prompt may hold images too
(widened first): their rows move past the clips' tokens before them. Errors name the request, message and part, and the clip.
"""

from __future__ import annotations

from pathlib import Path

from trt_llm.runtime.media.audio.encoder import AudioEncoder, PendingClip
from trt_llm.runtime.text.prompt import PromptError
from trt_llm.runtime.media.sequence_media import (SequenceMedia, media_parts, read_parts, widen_placeholders,
                                                  widened_position)


def pending_clips(audio: AudioEncoder, messages, media_dir: Path | None, where: str) -> list[PendingClip]:
    """Every audio part decoded and cut into features; a ValueError names the part and the clip."""
    parts = media_parts(messages, "audio")
    if len(parts) > audio.max_clips:
        raise ValueError(f"{where}.messages: {len(parts)} audio clips, more than the engine's max_clips "
                         f"{audio.max_clips}")
    return read_parts(parts, "audio", media_dir, where, audio.pending)


def attach_audio(audio: AudioEncoder, messages, token_ids: list[int], media_dir: Path | None,
                 where: str, max_input_len: int, images: SequenceMedia | None = None) -> tuple[list[int], SequenceMedia]:
    """The prompt's token ids with the clips' tokens, and its SequenceMedia (with `images`, the rows of
    the prompt's images already widened in token_ids, moved past the clips' tokens before them). Raises
    ValueError (PromptError when the template placed the wrong number of audio tokens) before any clip is
    encoded, so a request that cannot run costs no encoder time."""
    pending = pending_clips(audio, messages, media_dir, where)
    placeholder = audio.audio_token_id
    placed = sum(1 for token in token_ids if token == placeholder)
    if placed != len(pending):
        raise PromptError(f"{where}.messages: the chat template placed {placed} audio token(s) for "
                          f"{len(pending)} audio part(s)")
    counts = [audio.tokens_of(clip) for clip in pending]
    wrap = getattr(audio.adapter, "wrap_tokens", None)  # the tokens around each clip's (Gemma 4's)
    widened, offsets = widen_placeholders(token_ids, placeholder, counts, wrap)
    if len(widened) > max_input_len:
        raise ValueError(f"{where}: prompt is {len(widened)} tokens with its clips' {sum(counts)}, longer than "
                         f"the engine's max_input_len {max_input_len}")
    clips = SequenceMedia(list(zip(offsets, audio.encode(pending))), keys=tuple(clip.key for clip in pending))
    if images is None:
        return widened, clips
    widths = [count + (2 if wrap else 0) for count in counts]
    return widened, images.joined(clips, widened_position(token_ids, placeholder, widths))
