"""Whisper requests: transcription, as transformers' `WhisperForConditionalGeneration.generate` does it.

A request for a Whisper engine is a user message with one audio part; the message's text, if any, is
the previous-text prompt (transformers' `prompt_ids`). The input file's `whisper` settings
(schemas/input_file.py's WhisperSettings) say how it is transcribed:

- a clip of at most 30 s, without timestamps, fallback temperatures or language detection, is one
  decode (this module): its prompt is

      [<|startofprev|> " " + text]  <|startoftranscript|>  [<|lang|> <|task|>]  <|notimestamps|>

  (the language and task only for a multilingual checkpoint) and the generation config's token rules
  are a per-sequence constraint: `suppress_tokens` never, and `begin_suppress_tokens` (a space, end of
  text) not as the first token;
- anything else (a longer clip, timestamps asked for, fallback temperatures, a multilingual
  checkpoint without a language) is a `Transcription` (runtime/media/audio/longform.py): window by
  window, its decodes run by a driver (`run_transcriptions`, or the server's);
- with `whisper.vad_filter`, the clip's speech chunks (Silero VAD, at most 30 s each) are each such a
  Transcription, decoded side by side (runtime/media/audio/vad_transcription.py).

The encoder's output reaches the decoder as each layer's cross-attention keys and values, computed
once per window (runtime/media/audio/encoder.py). A clip over `whisper.max_audio_seconds` is refused
from its header, before it is decoded; a long one is decoded as a stream (streaming.py), its file never
read whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import numpy as np

from trt_llm.runtime.media.audio.decode import AudioError, audio_info, decode_audio
from trt_llm.runtime.media.audio.encoder import AudioEncoder
from trt_llm.runtime.media.audio.languages import language_code
from trt_llm.runtime.media.audio.longform import Options, Transcription
from trt_llm.runtime.media.audio.streaming import StreamedClip, file_key, stream_clip
from trt_llm.runtime.media.audio.whisper_sampling import WhisperTokens
from trt_llm.runtime.media.sequence_media import SequenceMedia, media_parts
from trt_llm.runtime.media.sources import MediaError, media_file
from trt_llm.runtime.text.prompt import Prompt, PromptError
from trt_llm.schemas.input_file import WhisperSettings


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


def _language_and_task(tokens: WhisperTokens, whisper: WhisperSettings, where: str) -> tuple[int | None, int | None]:
    """The language and task tokens (None: detect the language; an English-only model has neither)."""
    if not tokens.multilingual:
        if whisper.language is not None and language_code(whisper.language) != "en":
            raise ValueError(f"{where}: whisper.language {whisper.language!r}: this Whisper is English-only (en)")
        if whisper.task != "transcribe":
            raise ValueError(f"{where}: whisper.task 'translate' needs a multilingual Whisper; this one is "
                             "English-only")
        return None, None
    task = tokens.task_to_id.get(whisper.task)
    if task is None:
        raise ValueError(f"{where}: whisper.task {whisper.task!r}: this checkpoint's tasks are "
                         f"{', '.join(sorted(tokens.task_to_id))}")
    if whisper.language is None:
        return None, task
    code = language_code(whisper.language)
    language = tokens.lang_to_id.get(f"<|{code}|>") if code else None
    if language is None:
        raise ValueError(f"{where}: whisper.language {whisper.language!r} is not a language of this checkpoint "
                         f"(an ISO 639-1 code: {', '.join(sorted(k.strip('<|>') for k in tokens.lang_to_id)[:8])}, ...)")
    return language, task


class _Clip:
    """A Whisper request's clip before its samples are decoded: its source (bytes, or the path of a
    file, which is decoded as a stream and never read whole), name and header. Each way to decode it
    refuses it over `whisper.max_audio_seconds` (from the header before decoding, and while decoding
    where the header understated it), in one line naming the part and the field."""

    def __init__(self, part, media_dir: Path | None, whisper: WhisperSettings, where: str, m: int, c: int):
        self.whisper, self.prefix = whisper, f"{where}.messages[{m}].content[{c}]"
        with self._named():
            self.source, self.name = media_file(part.audio, media_dir, "audio")
            self.info = audio_info(self.source, self.name, whisper.max_audio_seconds)

    @contextlib.contextmanager
    def _named(self):
        try:
            yield
        except MediaError as error:
            limit = " (whisper.max_audio_seconds)" if "over the limit" in str(error) else ""
            raise ValueError(f"{self.prefix}: {error}{limit}") from None

    def decoded(self, rate: int) -> tuple[np.ndarray, str]:
        """(the whole waveform, the content key): a clip of at most 30 s."""
        with self._named():
            return decode_audio(self.source, self.name, rate, self.whisper.max_audio_seconds), file_key(self.source)

    def streamed(self, extractor, vad=None) -> StreamedClip:
        with self._named():
            return stream_clip(self.source, self.name, extractor, self.whisper.max_audio_seconds, vad)


def transcription_prompt(audio: AudioEncoder, tokenizer, messages, media_dir: Path | None, where: str,
                         vocab_size: int, whisper: WhisperSettings | None = None, temperature: float = 0.0,
                         seed: int | None = None, max_new_tokens: int | None = None) -> tuple[Prompt, SequenceMedia | None, TokenRules | None, Transcription | None]:
    """The decoder prompt of a transcription request, and either its clip's cross-attention keys and
    values with its token rules (one decode) or its Transcription (windows; its first decode at
    `temperature`, its fallback sampling seeded with `seed`). Raises ValueError /
    PromptError naming the field before anything is encoded."""
    whisper = whisper or WhisperSettings()
    s = audio.settings
    tokens = WhisperTokens.from_settings(s, vocab_size)
    parts = media_parts(messages, "audio")
    if len(parts) != 1:
        raise PromptError(f"{where}.messages: a Whisper engine transcribes one audio part per request, "
                          f"got {len(parts)}")
    text = _text_of(messages, where)
    previous = []
    if text:
        previous = [s["prev_token_id"], *tokenizer.encode(" " + text, add_special_tokens=False)]
        most = s["max_target_positions"] // 2 - 1  # what transformers keeps of prompt_ids
        if len(previous) > most:
            raise ValueError(f"{where}.messages: the previous-text prompt is {len(previous)} tokens, more than "
                             f"Whisper's {most} (half its {s['max_target_positions']} positions, less one)")
    language, task = _language_and_task(tokens, whisper, where)
    ((m, c, part),) = parts
    clip = _Clip(part, media_dir, whisper, where, m, c)  # its header only: over the limit, refused here
    extractor = audio.extractor
    samples = math.ceil(clip.info.frames * extractor.sampling_rate / clip.info.samplerate)
    long = samples > extractor.chunk_samples and not whisper.vad_filter  # VAD: chunks of at most 30 s
    timestamps = long or whisper.return_timestamps
    streamed = None  # a long clip, or one cut by VAD: decoded as a stream, window by window (streaming.py)
    if whisper.vad_filter:
        from trt_llm.runtime.media.audio.vad_transcription import vad_model

        streamed = clip.streamed(extractor, vad_model(where))
    elif timestamps:
        streamed = clip.streamed(extractor)
    else:
        waveform, key = clip.decoded(extractor.sampling_rate)
        timestamps = len(waveform) > extractor.chunk_samples  # a header that understated the length
    name = clip.name
    if not (timestamps or whisper.temperature_fallback or (tokens.multilingual and language is None)
            or whisper.vad_filter):
        ids = previous + [tokens.sot] + ([language, task] if tokens.multilingual else []) + [tokens.no_timestamps]
        try:
            clip = audio.pending_waveform(waveform, key, name)
        except AudioError as error:
            (m, c, _), = parts
            raise ValueError(f"{where}.messages[{m}].content[{c}]: {error}") from None
        (encoded,) = audio.encode([clip])
        rules = TokenRules(vocab_size, s["suppress_tokens"], s["begin_suppress_tokens"])
        prompt_text = tokenizer.decode(ids, skip_special_tokens=False)
        return Prompt(prompt_text, "", ids), SequenceMedia([], cross=encoded.cross), rules, None
    temperatures = (temperature,) + tuple(whisper.temperature_fallback)
    options = Options(timestamps, temperatures, whisper.compression_ratio_threshold, whisper.logprob_threshold,
                      whisper.no_speech_threshold, whisper.condition_on_prev_tokens, language, task, max_new_tokens)
    if whisper.vad_filter:  # the speech chunks of the clip, each transcribed as a clip of its own
        from trt_llm.runtime.media.audio.vad_transcription import vad_transcription

        transcription = vad_transcription(audio, tokens, options, streamed, seed, previous or None,
                                          whisper.vad_parameters)
    elif streamed is not None:
        transcription = Transcription(tokens, options, streamed.features, streamed.key, name, streamed.seconds, seed,
                                      previous or None, window_frames=audio.window_frames)
    else:
        transcription = windowed(audio, tokens, options, waveform, key, name, seed, previous or None)
    # The first window's prompt as far as it is known (a detected language joins it later).
    ids = previous + [tokens.sot] + ([language, task] if tokens.multilingual and language is not None else []) + \
        ([] if timestamps else [tokens.no_timestamps])
    prompt_text = tokenizer.decode(ids, skip_special_tokens=False)
    return Prompt(prompt_text, "", ids), None, None, transcription


def windowed(audio: AudioEncoder, tokens: WhisperTokens, options: Options, waveform: np.ndarray, key: str, name: str,
             seed: int | None, previous: list[int] | None) -> Transcription:
    """The Transcription of a decoded clip: with timestamps over the whole clip's features, unpadded
    (transformers' truncation=False, padding="longest"), else its padded 30 s."""
    extractor = audio.extractor
    if options.timestamps:
        whole = dataclasses.replace(extractor, chunk_length=math.ceil(len(waveform) / extractor.sampling_rate) + 1,
                                    pad_to_chunk=False)
        features = whole(waveform).features
    else:
        features = extractor(waveform).features
    return Transcription(tokens, options, features, key, name, len(waveform) / extractor.sampling_rate,
                         seed, previous, window_frames=audio.window_frames)
