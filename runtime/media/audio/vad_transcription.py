"""A clip transcribed by its speech only, as faster-whisper's BatchedInferencePipeline does it: Silero VAD
(runtime/media/audio/vad.py) cuts the clip into speech chunks of at most 30 s, the silences between
them left out; each chunk is transcribed as a clip of its own (a `Transcription` over the chunk's
audio: its own features, its own windows, its fallbacks; the text is the chunk's transcribed alone),
and the chunks' decodes run side by side, rows of one batch (`next_attempts`). The segments come back
in the recording's time: a chunk's segment at t is at offset + t in the joined speech, and the silence
cut out before the span it falls in is added back (faster-whisper's restore_speech_timestamps).

A VadTranscription has a Transcription's face (next_attempt / finish / seed_of / done, the segments,
the tokens, the language), so the drivers and the response (answer.py) take it as they take one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trt_llm.runtime.media.audio.longform import FEATURE_PRECISION, Attempt, Options, Segment, Transcription
from trt_llm.runtime.media.audio.vad import RATE, Chunk, TimeMap, VadOptions, VadUnavailable, speech_chunks
from trt_llm.runtime.media.audio.whisper_sampling import WhisperTokens

ROUND = 3  # the mapped times to the millisecond (subtitles' precision)


class VadTranscription:
    def __init__(self, tokens: WhisperTokens, options: Options, chunks: list[Chunk], parts: list[Transcription],
                 time_map: TimeMap, seconds: float, seed: int | None):
        self.tokens, self.options, self.chunks, self.parts = tokens, options, chunks, parts
        self.time_map, self.seconds, self.seed = time_map, seconds, seed
        self._owner: dict[int, Transcription] = {}  # id(attempt) -> the chunk's transcription

    @property
    def done(self) -> bool:
        return all(part.done for part in self.parts)

    def next_attempts(self) -> list[Attempt]:
        """The next decode of every unfinished chunk: rows of one batch."""
        attempts = []
        for part in self.parts:
            attempt = part.next_attempt()
            if attempt is not None:
                self._owner[id(attempt)] = part
                attempts.append(attempt)
        return attempts

    def next_attempt(self) -> Attempt | None:
        """One decode at a time (a driver that sends one job after another)."""
        attempts = self.next_attempts()
        return attempts[0] if attempts else None

    def seed_of(self, attempt: Attempt) -> int | None:
        return self._owner[id(attempt)].seed_of(attempt)

    def finish(self, attempt: Attempt, first_token_time: float | None = None) -> None:
        self._owner.pop(id(attempt)).finish(attempt, first_token_time)

    # -- the result, in the recording's time -------------------------------------------------------

    @property
    def first_token_time(self) -> float | None:
        times = [part.first_token_time for part in self.parts if part.first_token_time is not None]
        return min(times) if times else None

    @property
    def first_prompt(self) -> list[int] | None:
        return self.parts[0].first_prompt if self.parts else None

    @property
    def language(self) -> str | None:
        """The first chunk's (each chunk detects its own on a multilingual checkpoint without a language)."""
        if self.parts:
            return self.parts[0].language
        return None if self.tokens.multilingual and self.options.language_id is None else "en"

    @property
    def segments(self) -> list[Segment]:
        out = []
        for chunk, part in zip(self.chunks, self.parts):
            end_of_chunk = chunk.offset + chunk.duration
            first = chunk.spans[0][0] / RATE
            for s in part.segments:
                # A timestamp past the chunk's audio (the window is zero-padded to 30 s) is its end.
                start = min(chunk.offset + s.start, end_of_chunk)
                end = min(chunk.offset + s.end, end_of_chunk)
                seek = int(round(first / FEATURE_PRECISION)) + s.seek
                out.append(dataclasses.replace(s, seek=seek, start=round(self.time_map.original(start), ROUND),
                                               end=round(self.time_map.original(end, is_end=True), ROUND)))
        return out

    def output_tokens(self) -> list[int]:
        """The chunks' tokens in order; without timestamps each chunk's <|endoftext|> left out but the
        last, which stays when every chunk ended on one."""
        if self.options.timestamps:
            return [token for part in self.parts for token in part.output_tokens()]
        eos = self.tokens.eos
        each = [part.output_tokens() for part in self.parts]
        tokens = [token for sequence in each for token in (sequence[:-1] if sequence[-1:] == [eos] else sequence)]
        return tokens + ([eos] if each and all(sequence[-1:] == [eos] for sequence in each) else [])


def vad_transcription(audio, tokens: WhisperTokens, options: Options, waveform: np.ndarray, key: str, name: str,
                      seed: int | None, previous: list[int] | None, parameters, where: str) -> VadTranscription:
    """The VadTranscription of a decoded clip (parameters: the input file's VadParameters; where: the
    request, named by the error when the VAD model is not installed)."""
    from trt_llm.runtime.media.audio.transcription import windowed

    try:
        chunks, time_map = speech_chunks(waveform, VadOptions(**parameters.model_dump()))
    except VadUnavailable as error:
        raise VadUnavailable(f"{where}: {error}") from None
    # Each chunk's key names its samples: the encodings of its windows are its own.
    parts = [windowed(audio, tokens, options, chunk.audio(waveform),
                      f"{key}#" + ",".join(f"{start}-{end}" for start, end in chunk.spans), name, seed, previous)
             for chunk in chunks]
    return VadTranscription(tokens, options, chunks, parts, time_map, len(waveform) / RATE, seed)
