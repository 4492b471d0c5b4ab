"""Whisper requests: transcription, as transformers' `WhisperForConditionalGeneration.generate` does it.

A request for a Whisper engine is a user message with one audio part; the message's text, if any, is
the previous-text prompt (transformers' `prompt_ids`). The decoder's prompt is

    [<|startofprev|> " " + text]  <|startoftranscript|>  [<|lang|> <|task|>]  <|notimestamps|>

(the language and task only for a multilingual checkpoint) and the encoder's output reaches the
decoder as each layer's cross-attention keys and values, computed once per request
(runtime/media/audio/encoder.py). The generation config's token rules are a per-sequence constraint:
`suppress_tokens` never, and `begin_suppress_tokens` (a space, end of text) not as the first token.
Clips longer than the encoder's 30 s window are refused (no window-by-window long-form
transcription yet).

The language is always English: a multilingual checkpoint's prompt is transformers' for
`generate(language="en", task="transcribe")`, token for token (tests/test_whisper_multilingual.py).
The input format names no language, and transformers' detection (what `generate` does without
`language=`) is a decoder pass over <|startoftranscript|> alone, before and apart from the prompt
(previous text included), argmax over the language tokens: to match it an engine would return those
logits from the encoder graph, beside the clip's keys and values (a graph-spec output and an
EncodedClip field), not guess the language inside the request's own decode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_llm.runtime.media.audio.encoder import AudioEncoder
from trt_llm.runtime.media.audio.prompt import pending_clips
from trt_llm.runtime.text.prompt import Prompt, PromptError
from trt_llm.runtime.media.sequence_media import SequenceMedia, media_parts


class TokenRules:
    """The generation config's suppressions as a sequence constraint (grammar.Constraint's face)."""

    failed = None

    def __init__(self, vocab_size: int, suppress: list[int], begin_suppress: list[int]):
        self._rest = np.ones(vocab_size, dtype=bool)
        self._rest[[t for t in suppress if t < vocab_size]] = False
        self._first = self._rest.copy()
        self._first[[t for t in begin_suppress if t < vocab_size]] = False
        self._generated = 0

    def allowed(self) -> np.ndarray:
        return self._first if self._generated == 0 else self._rest

    def accept(self, token: int) -> None:
        self._generated += 1


def _text_of(messages, where: str) -> str:
    """The previous-text prompt: the text parts of the request's messages, joined."""
    roles = {message.role for message in messages}
    if roles - {"user", "system"}:
        raise PromptError(f"{where}.messages: a Whisper engine transcribes one user message's audio; "
                          f"it takes no {', '.join(sorted(roles - {'user', 'system'}))} turns")
    return " ".join(part.text.strip() for message in messages for part in message.parts()
                    if part.type == "text" and part.text.strip())


def transcription_prompt(audio: AudioEncoder, tokenizer, messages, media_dir: Path | None, where: str,
                         vocab_size: int) -> tuple[Prompt, SequenceMedia, TokenRules]:
    """The decoder prompt of a transcription request, its clip's cross-attention keys and values,
    and its token rules. Raises ValueError / PromptError naming the field before the clip is encoded."""
    s = audio.settings
    parts = media_parts(messages, "audio")
    if len(parts) != 1:
        raise PromptError(f"{where}.messages: a Whisper engine transcribes one audio part per request, "
                          f"got {len(parts)}")
    text = _text_of(messages, where)
    ids = []
    if text:
        ids = [s["prev_token_id"], *tokenizer.encode(" " + text, add_special_tokens=False)]
        most = s["max_target_positions"] // 2 - 1  # what transformers keeps of prompt_ids
        if len(ids) > most:
            raise ValueError(f"{where}.messages: the previous-text prompt is {len(ids)} tokens, more than "
                             f"Whisper's {most} (half its {s['max_target_positions']} positions, less one)")
    ids.append(s["decoder_start_token_id"])
    if s["is_multilingual"]:
        ids += [s["lang_to_id"]["<|en|>"], s["task_to_id"]["transcribe"]]
    ids.append(s["no_timestamps_token_id"])
    (clip,) = pending_clips(audio, messages, media_dir, where)
    (encoded,) = audio.encode([clip])
    rules = TokenRules(vocab_size, s["suppress_tokens"], s["begin_suppress_tokens"])
    prompt_text = tokenizer.decode(ids, skip_special_tokens=False)
    return Prompt(prompt_text, "", ids), SequenceMedia([], cross=encoded.cross), rules
