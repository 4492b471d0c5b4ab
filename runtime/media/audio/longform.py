"""Whisper transcription window by window: transformers' "sequential" long-form algorithm
(`WhisperGenerationMixin.generate` with `return_timestamps=True`, models/whisper/generation_whisper.py),
as a state machine that asks for one decode at a time, so that one window loop (`rounds`) serves a
driver that batches the decodes of several requests (`run_transcriptions`: trt-llm-run) and one that
feeds them to the server's engine as jobs (server/transcriptions.py).

The clip's log-mel features are the whole clip's (transformers' processor with `truncation=False,
padding="longest"`: its floor follows the loudest frame of the whole clip), computed as the clip
decodes and read back a window at a time from disk (streaming.py: `features[:, seek:seek + frames]`),
so neither the waveform nor the features are ever held whole. From `seek` = 0, a window
is the next 3,000 frames (fewer at the end, zero-padded to 3,000); its decoder prompt is

    [<|startofprev|> previous tokens]  <|startoftranscript|>  [<|lang|> <|task|>]

the previous tokens being the user's prompt and, with `condition_on_prev_tokens`, the segments
so far (their last 223 tokens). The decode follows the timestamp rules (whisper_sampling.py) at the
first temperature; when its compression ratio (zlib over the tokens' 2-byte ids) is over
`compression_ratio_threshold` or its average log-probability under `logprob_threshold`, it is decoded
again at the next temperature (seeded sampling), until one passes or none is left. A window whose
average log-probability is under the threshold while its no-speech probability is over
`no_speech_threshold` is skipped as silence. The tokens are cut into segments at each pair of
timestamps; the window advances to the last pair's timestamp, or by its whole length when it ends on
a single timestamp (no speech after it) or has no pair at all.

Without timestamps (a clip of at most 30 s, decoded once, when only the language must be detected or
fallback temperatures are given) the window is the whole clip's padded 30 s features and the prompt
ends <|notimestamps|>, as transformers' short-form generate has it.

Language detection (a multilingual checkpoint without a language): transformers' `detect_language`, a
decode of <|startoftranscript|> alone over the first window, argmax over the language tokens; once
for the whole clip.

A window's encoding (its cross-attention keys and values) is kept by the transcription for the
decodes at that seek (probes, fallbacks) and dropped when it moves on, never put in the encoder's
cache: memory stays flat with the recording's length. With `whisper.vad_filter` the clip's speech
chunks are each a Transcription, driven side by side (vad_transcription.py: `next_attempts`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from trt_llm.runtime.media.audio.encoder import PendingClip
from trt_llm.runtime.media.audio.languages import LANGUAGES
from trt_llm.runtime.media.audio.whisper_sampling import ProbeRules, WhisperParams, WhisperTokens, WindowRules

if TYPE_CHECKING:
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.media.audio.vad_transcription import VadTranscription

TIME_PRECISION = 0.02  # seconds per timestamp token
INPUT_STRIDE = 2  # mel frames per encoder position (the two convolutions' strides)
FEATURE_PRECISION = 0.01  # seconds per mel frame


@dataclass(frozen=True)
class Options:
    """A transcription's settings (the input file's `whisper` block, resolved)."""
    timestamps: bool
    temperatures: tuple[float, ...]
    compression_ratio_threshold: float | None
    logprob_threshold: float | None
    no_speech_threshold: float | None
    condition_on_prev_tokens: bool
    language_id: int | None  # None: detect (multilingual) / none (English-only)
    task_id: int | None
    max_new_tokens: int | None = None  # each decode's limit (max_generate_length) within the 448 positions


@dataclass
class Segment:
    seek: int
    start: float
    end: float
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None


@dataclass
class Attempt:
    """One decode the transcription asks for: its prompt, the window's clip (to be encoded: `cross`
    filled by the driver), its rules and sampling."""
    kind: str  # "language", "no_speech" or "window"
    prompt_ids: list[int]
    clip: PendingClip
    rules: object
    temperature: float
    max_new_tokens: int
    cross: list | None = None

    def params(self) -> WhisperParams:
        # Plain sampling, as openai-whisper's: no top-k or top-p cut.
        return WhisperParams(temperature=self.temperature, top_k=0, top_p=1.0, rules=self.rules)


def compression_ratio(tokens: list[int], vocab_size: int) -> float:
    """transformers' `_retrieve_compression_ratio`: the tokens' little-endian ids, raw bytes over zlib's."""
    width = int(np.log2(vocab_size) / 8) + 1
    data = b"".join(int(token).to_bytes(width, "little") for token in tokens)
    return len(data) / len(zlib.compress(data))


@dataclass
class Transcription:
    """One request's transcription: its features, settings and progress. `next_attempt()` the decode
    it needs next (None when done), `finish(attempt)` after that decode ran."""
    tokens: WhisperTokens
    options: Options
    features: np.ndarray  # [mel bins, frames]: the whole clip's (timestamps; streaming.SpilledFeatures) or its padded 30 s
    key: str  # the clip's content hash (the encoder cache's key, with the window's seek)
    name: str
    seconds: float
    seed: int | None
    prompt_ids: list[int] | None = None  # the user's previous text, <|startofprev|> first
    window_frames: int = 3000
    seek: int = 0
    segments: list[Segment] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)  # without timestamps: the one decode's tokens
    language_id: int | None = None
    first_token_time: float | None = None
    first_prompt: list[int] | None = None  # the first window's decoder prompt
    _fallback: int = 0
    _condition: bool = True  # the last window's temperature let the next one condition on it
    _no_speech: float | None = None
    _no_speech_seek: int | None = None
    _done: bool = False
    _pending: Attempt | None = None
    _encoded: tuple[int, list] | None = None  # (seek, cross): this window's encoding, for its next decodes

    def __post_init__(self):
        self.language_id = self.options.language_id
        self.max_frames = self.features.shape[1]

    @property
    def done(self) -> bool:
        return self._done

    @property
    def language(self) -> str | None:
        """The language's code ("en"): the given or detected one, English for an English-only model."""
        if self.language_id is None:
            return None if self.tokens.multilingual else "en"
        token = next((k for k, v in self.tokens.lang_to_id.items() if v == self.language_id), "")
        code = token.strip("<|>")
        return code if code in LANGUAGES else None

    # -- what to decode next -------------------------------------------------------------------

    def _window_frames(self) -> int:
        return min(self.max_frames - self.seek, self.window_frames)

    def _clip(self) -> PendingClip:
        frames = self._window_frames()
        window = np.zeros((self.features.shape[0], self.window_frames), dtype=np.float32)
        window[:, :frames] = self.features[:, self.seek:self.seek + frames]
        seconds = frames * FEATURE_PRECISION
        return PendingClip(f"{self.key}@{self.seek}/{self.max_frames}", self.name, window, frames, seconds)

    def _init_tokens(self) -> list[int]:
        t = self.tokens
        ids = [t.sot]
        if t.multilingual:
            ids += [self.language_id, self.options.task_id]
        if not self.options.timestamps:
            ids.append(t.no_timestamps)
        return ids

    def _previous(self) -> list[int]:
        """The prompt's part before <|startoftranscript|> (transformers' `_prepare_decoder_input_ids`)."""
        history = ([{"tokens": self.prompt_ids[1:]}] if self.prompt_ids else []) + \
            [{"tokens": s.tokens} for s in self.segments]
        if self.options.condition_on_prev_tokens and history:
            if not self._condition:  # the last window was decoded hot: the marker alone
                return [self.tokens.prev]
            begin = self.tokens.timestamp_begin
            joined = []
            for entry in history:
                tokens = entry["tokens"]
                # a segment ending on two timestamps gives its last one to the next segment
                joined += tokens[:-1] if len(tokens) > 2 and tokens[-2] >= begin else tokens
            return [self.tokens.prev] + joined[-(self.tokens.max_target_positions // 2 - 1):]
        return list(self.prompt_ids or [])

    def next_attempt(self) -> Attempt | None:
        if self._done:
            return None
        if self._pending is not None:
            return self._pending
        t = self.tokens
        clip = self._clip()
        if t.multilingual and self.language_id is None:
            attempt = Attempt("language", [t.sot], clip, ProbeRules(t), 0.0, 1)
        else:
            previous = self._previous()
            prompt = previous + self._init_tokens()
            needs_probe = t.multilingual and self.options.no_speech_threshold is not None
            if needs_probe and self._no_speech_seek != self.seek:
                attempt = Attempt("no_speech", previous + [t.sot], clip, ProbeRules(t), 0.0, 1)
            else:
                temperature = self.options.temperatures[self._fallback]
                rules = WindowRules(t, self.options.timestamps, no_speech_from_logits=not t.multilingual)
                if self.first_prompt is None:
                    self.first_prompt = prompt
                most = t.max_target_positions - len(prompt)
                attempt = Attempt("window", prompt, clip, rules, temperature,
                                  max(1, min(most, self.options.max_new_tokens or most)))
        if self._encoded is not None and self._encoded[0] == self.seek:  # a probe's or a fallback's window
            attempt.cross = self._encoded[1]
        self._pending = attempt
        return attempt

    def next_attempts(self) -> list[Attempt]:
        """The decodes that can run now, side by side (one: a window waits for the one before it)."""
        attempt = self.next_attempt()
        return [] if attempt is None else [attempt]

    def seed_of(self, attempt: Attempt) -> int | None:
        """Each window and temperature its own sampling stream, from the request's seed."""
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + self.seek * 31 + self._fallback) % (2 ** 63)

    # -- what a decode means -------------------------------------------------------------------

    def finish(self, attempt: Attempt, first_token_time: float | None = None) -> None:
        self._pending = None
        # The window's encoding stays for the decodes still to come at this seek, and only for them.
        self._encoded = (self.seek, attempt.cross) if attempt.cross is not None else self._encoded
        self._decoded(attempt, first_token_time)
        if self._done or self._encoded is not None and self._encoded[0] != self.seek:
            self._encoded = None
        if self._done:  # nothing reads them again (a VAD transcription's finished chunks free theirs)
            self.features = None

    def _decoded(self, attempt: Attempt, first_token_time: float | None) -> None:
        if self.first_token_time is None:
            self.first_token_time = first_token_time
        if attempt.kind == "language":
            self.language_id = attempt.rules.language_id
            return
        if attempt.kind == "no_speech":
            self._no_speech, self._no_speech_seek = attempt.rules.no_speech_prob, self.seek
            return
        rules: WindowRules = attempt.rules
        no_speech = rules.no_speech_prob if rules.no_speech_prob is not None else self._no_speech
        sequence = list(rules.generated)  # with its <|endoftext|>, which the heuristics count
        o = self.options
        ratio = compression_ratio(sequence, self.tokens.vocab_size)
        avg_logprob = float(sum(rules.logprobs) / len(sequence)) if sequence else 0.0
        needs_fallback = skip = False
        if o.compression_ratio_threshold is not None and ratio > o.compression_ratio_threshold:
            needs_fallback = True
        if o.logprob_threshold is not None and avg_logprob < o.logprob_threshold:
            needs_fallback = True
            if o.no_speech_threshold is not None and no_speech is not None and no_speech > o.no_speech_threshold:
                needs_fallback, skip = False, True
        if needs_fallback and self._fallback + 1 < len(o.temperatures):
            self._fallback += 1
            return
        temperature = attempt.temperature
        self._fallback = 0
        self._condition = temperature < 0.5
        if sequence and sequence[-1] == self.tokens.eos:
            sequence = sequence[:-1]
        frames = self._window_frames()
        if not o.timestamps:
            self.generated = [] if skip else list(rules.generated)  # with its <|endoftext|>, as a single decode's
            self.segments = [] if skip else [Segment(0, 0.0, self.seconds, sequence, temperature, avg_logprob, ratio,
                                                      no_speech)]
            self._done = True
            return
        if skip:
            self.seek += frames
        else:
            found, offset = self._segments(sequence, frames)
            stats = (temperature, avg_logprob, ratio, no_speech)
            self.segments += [Segment(self.seek, start, end, tokens, *stats) for start, end, tokens in found]
            self.seek += offset
        self._done = self.seek >= self.max_frames

    def _segments(self, sequence: list[int], frames: int) -> tuple[list[tuple[float, float, list[int]]], int]:
        """transformers' `_retrieve_segment`: (start, end, tokens) per segment, and the frames to seek."""
        begin = self.tokens.timestamp_begin
        offset = self.seek * TIME_PRECISION / INPUT_STRIDE
        is_stamp = [token >= begin for token in sequence]
        single_ending = is_stamp[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(is_stamp) - 1) if is_stamp[i] and is_stamp[i + 1]]
        if cuts:
            if single_ending:
                cuts.append(len(sequence))
            else:
                cuts[-1] += 1  # the last segment keeps its closing timestamp
            found, last = [], 0
            for i, cut in enumerate(cuts):
                piece = sequence[last:cut]
                final = i == len(cuts) - 1
                start = offset + float(piece[0] - begin) * TIME_PRECISION
                end = offset + float(piece[-1 if not final or single_ending else -2] - begin) * TIME_PRECISION
                found.append((start, end, piece))
                last = cut
            if single_ending:
                return found, frames
            return found, (sequence[last - 2] - begin) * INPUT_STRIDE
        position = float(int(frames * FEATURE_PRECISION / TIME_PRECISION))
        stamps = [i for i, stamp in enumerate(is_stamp) if stamp]
        if stamps and sequence[stamps[-1]] != begin:
            position = float(sequence[stamps[-1]] - begin)
        return [(offset, offset + position * TIME_PRECISION, sequence)], frames

    # -- the result ----------------------------------------------------------------------------

    def output_tokens(self) -> list[int]:
        """transformers' `sequences`: every segment's tokens, timestamps included."""
        if not self.options.timestamps:
            return list(self.generated)
        return [token for segment in self.segments for token in segment.tokens]


@dataclass
class Decode:
    """One decode of a round: a transcription's next attempt and, once its window is encoded, its
    sequence (`start`); `finish` hands the decoded sequence back to the transcription."""
    transcription: Transcription | VadTranscription
    attempt: Attempt
    sequence: Sequence | None = None  # made by start

    def start(self, detokenizer=None):
        """The decode's engine sequence: its prompt, length and window (the attempt's cross inputs,
        `encode` them first); detokenizer: an IncrementalDetokenizer where the driver streams text."""
        from trt_llm.runtime.engine.sequence import Sequence
        from trt_llm.runtime.media.sequence_media import SequenceMedia

        a = self.attempt
        self.sequence = Sequence(a.prompt_ids, a.max_new_tokens, detokenizer, media=SequenceMedia([], cross=a.cross))
        return self.sequence

    def finish(self) -> None:
        self.transcription.finish(self.attempt, self.sequence.first_token_time)


def rounds(transcriptions: list):
    """The window loop of Whisper transcriptions, written once for both drivers (trt-llm-run's static
    batches: `run_transcriptions`; the server's jobs: server/transcriptions.py): each round is every
    unfinished transcription's next decodes (one, or a VAD transcription's one per speech chunk), which
    the driver encodes (`encode`), starts, runs on its engine and finishes before it asks for the next."""
    while True:
        work = [Decode(t, a) for t in transcriptions if not t.done for a in t.next_attempts()]
        if not work:
            return
        yield work


def run_transcriptions(runner, transcriptions: list, max_rows: int) -> None:
    """Every transcription to its end: each round's decodes as static batches of at most `max_rows`
    rows on the runner's model (a VAD transcription's chunks may fill the engine's max_batch_size: the
    file's batch_size counts requests); the windows of a batch are encoded in one encoder batch."""
    from trt_llm.runtime.engine.engine_core import EngineRequest

    if any(len(getattr(t, "parts", ())) > 1 for t in transcriptions):
        max_rows = max(max_rows, runner.limits.get("max_batch_size", max_rows))
    core, group = runner.engine_core(max_rows, "static"), 0
    for work in rounds(transcriptions):
        for start in range(0, len(work), max_rows):
            batch = work[start:start + max_rows]
            encode(runner.audio, [d.attempt for d in batch])
            for i, d in enumerate(batch):
                core.add_request(EngineRequest((group, i), d.start(), d.attempt.params(),
                                               d.transcription.seed_of(d.attempt), group=group))
            group += 1
            core.run_to_completion()
            for d in batch:
                d.finish()


def encode(audio, attempts) -> None:
    """Fill each attempt's cross-attention keys and values (one encoder batch). Not in the encoder's
    cache: a window is read by its own decodes only (the transcription keeps it for them), and a cache
    of windows would hold a long recording's every one."""
    missing = [a for a in attempts if a.cross is None]
    if missing:
        for attempt, encoded in zip(missing, audio.encode([a.clip for a in missing], cached=False)):
            attempt.cross = encoded.cross
