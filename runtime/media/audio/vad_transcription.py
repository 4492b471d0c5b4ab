"""A clip transcribed by its speech only, as faster-whisper's BatchedInferencePipeline does it: Silero VAD
(runtime/media/audio/vad.py) cuts the clip into speech chunks of at most 30 s, the silences between
them left out; each chunk is transcribed as a clip of its own (a `Transcription` over the chunk's
audio: its own features, its own windows, its fallbacks; the text is the chunk's transcribed alone),
and the chunks' decodes run side by side, rows of one batch (`next_attempts`). The segments come back
in the recording's time: a chunk's segment at t is at offset + t in the joined speech, and the silence
cut out before the span it falls in is added back (faster-whisper's restore_speech_timestamps).

A VadTranscription has a Transcription's face (next_attempt / finish / seed_of / done, the segments,
the tokens, the language), so the drivers and the response (answer.py) take it as they take one.

Memory stays flat with the recording (runtime/media/audio/streaming.py): the probabilities are
computed as the clip decodes, its samples wait on disk, and a chunk's Transcription (its audio, its
features) is made when the chunk starts, at most PARTS_IN_FLIGHT at a time, and lets its features go
when it is done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from trt_llm.runtime.media.audio.longform import FEATURE_PRECISION, Attempt, Options, Segment, Transcription
from trt_llm.runtime.media.audio import vad
from trt_llm.runtime.media.audio.vad import (RATE, WINDOW_SECONDS, Chunk, TimeMap, VadOptions, VadUnavailable,
                                             merge_chunks, speech_spans)
from trt_llm.runtime.media.audio.whisper_sampling import WhisperTokens

ROUND = 3  # the mapped times to the millisecond (subtitles' precision)
# Chunks transcribed at once: each holds its features (1 MB for 80 bins) and its window's encoding
# (some 18 MB for tiny); more than an engine's batch of rows gains nothing.
PARTS_IN_FLIGHT = 16


class VadTranscription:
    def __init__(self, tokens: WhisperTokens, options: Options, chunks: list[Chunk], make_part: Callable[[int], Transcription],
                 time_map: TimeMap, seconds: float, seed: int | None):
        """make_part(i): chunk i's Transcription, made when the chunk starts."""
        self.tokens, self.options, self.chunks = tokens, options, chunks
        self.parts: list[Transcription | None] = [None] * len(chunks)
        self.time_map, self.seconds, self.seed, self._make = time_map, seconds, seed, make_part
        self._owner: dict[int, Transcription] = {}  # id(attempt) -> the chunk's transcription

    @property
    def done(self) -> bool:
        return all(part is not None and part.done for part in self.parts)

    def next_attempts(self) -> list[Attempt]:
        """The next decode of every unfinished chunk (the first PARTS_IN_FLIGHT of them): rows of one batch."""
        attempts, running = [], 0
        for i, part in enumerate(self.parts):
            if part is not None and part.done:
                continue
            if running == PARTS_IN_FLIGHT:
                break
            running += 1
            if part is None:
                part = self.parts[i] = self._make(i)
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
        times = [part.first_token_time for part in self.parts if part is not None and part.first_token_time is not None]
        return min(times) if times else None

    @property
    def first_prompt(self) -> list[int] | None:
        return self.parts[0].first_prompt if self.parts and self.parts[0] is not None else None

    @property
    def language(self) -> str | None:
        """The first chunk's (each chunk detects its own on a multilingual checkpoint without a language)."""
        if self.parts and self.parts[0] is not None:
            return self.parts[0].language
        return None if self.tokens.multilingual and self.options.language_id is None else "en"

    @property
    def segments(self) -> list[Segment]:
        out = []
        for chunk, part in zip(self.chunks, self.parts):
            if part is None:
                continue
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
            return [token for part in self.parts if part is not None for token in part.output_tokens()]
        eos = self.tokens.eos
        each = [part.output_tokens() for part in self.parts if part is not None]
        tokens = [token for sequence in each for token in (sequence[:-1] if sequence[-1:] == [eos] else sequence)]
        return tokens + ([eos] if each and all(sequence[-1:] == [eos] for sequence in each) else [])


def vad_model(where: str):
    """The process's Silero session; VadUnavailable names the request when the model is not installed."""
    try:
        return vad.shared_vad()  # looked up when called: a test replaces it
    except VadUnavailable as error:
        raise VadUnavailable(f"{where}: {error}") from None


def vad_transcription(audio, tokens: WhisperTokens, options: Options, clip, seed: int | None,
                      previous: list[int] | None, parameters) -> VadTranscription:
    """The VadTranscription of a clip streamed with its speech probabilities (streaming.StreamedClip;
    parameters: the input file's VadParameters)."""
    from trt_llm.runtime.media.audio.transcription import windowed

    spans = speech_spans(clip.probabilities, clip.samples, VadOptions(**parameters.model_dump()))
    chunks = merge_chunks(spans, WINDOW_SECONDS)

    def make_part(i: int) -> Transcription:
        chunk = chunks[i]
        waveform = np.concatenate([clip.waveform.read(start, end) for start, end in chunk.spans])
        # Each chunk's key names its samples: the encodings of its windows are its own.
        return windowed(audio, tokens, options, waveform,
                        f"{clip.key}#" + ",".join(f"{start}-{end}" for start, end in chunk.spans), clip.name,
                        seed, previous)

    return VadTranscription(tokens, options, chunks, make_part, TimeMap(spans), clip.samples / RATE, seed)
