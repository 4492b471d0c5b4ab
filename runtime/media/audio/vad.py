"""Voice activity detection: Silero VAD on ONNX Runtime, and the speech chunks a recording is cut into.

The model is the ONNX file the PyPI package `silero-vad` ships (`silero_vad/data/`, the extra
`trt-llm[vad]`): its "sequence" export, which takes a block of 32 ms frames at once (each frame's 512
samples after the previous frame's last 64, the first frame's context zeros) with the LSTM state
(h, c) carried from block to block, and gives one speech probability per frame: bit-identical to
silero-vad's own streaming path (`OnnxWrapper.audio_forward`, one frame a call) and to its numpy
front end (`SileroVADSequence.audio_forward`). Only the file is read: the package's Python imports
torch, which the runtime does not.

From the probabilities to speech and to chunks, faster-whisper's code (faster_whisper/vad.py, itself
adapted from silero-vad): `speech_spans` is its `get_speech_timestamps` (speech starts at a frame
over `threshold`, ends after `min_silence_duration_ms` under `neg_threshold`; a span reaching
`max_speech_duration_s` is cut at its last silence over 98 ms, else where it is; spans shorter than
`min_speech_duration_ms` are dropped; each is padded by `speech_pad_ms`, half the gap each when two
are closer than twice that), `merge_chunks` its `collect_chunks` (consecutive spans joined into chunks
of at most 30 s of speech) and `TimeMap` its `SpeechTimestampsMap` (a time in the joined speech back
to the recording's).
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16000
FRAME = 512  # samples per probability (32 ms)
CONTEXT = 64  # samples of the previous frame before each
BLOCK_FRAMES = 512  # frames per model call (16 s): silero-vad's sequence default
STATE = (1, 1, 128)
MODEL_FILE = "silero_vad_16k_sequence.onnx"
MIN_SILENCE_AT_MAX_SPEECH_MS = 98
WINDOW_SECONDS = 30.0  # Whisper's window: a chunk's most speech (max_speech_duration_s is at most this)


class VadUnavailable(ValueError):
    """The Silero model file is not installed (a request's error, the others run)."""


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's VadOptions, with its batched pipeline's defaults (max 30 s, 160 ms silences)."""
    threshold: float = 0.5
    neg_threshold: float | None = None  # None: threshold - 0.15 (at least 0.01)
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = 30.0
    min_silence_duration_ms: int = 160
    speech_pad_ms: int = 400


def model_path() -> Path:
    """The sequence model inside the installed silero-vad package, found without importing the package
    (its __init__ imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / "data" / MODEL_FILE
        if path.is_file():
            return path
    raise VadUnavailable("whisper.vad_filter needs the Silero VAD model of the silero-vad package "
                         "(pip install 'trt-llm[vad]')")


class SileroVad:
    """One ONNX Runtime session over the model; `probabilities` is thread-safe (each call its own state)."""

    def __init__(self, path: Path | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        # One thread, as both references run it: the model is small and sequential (an LSTM over frames).
        options.inter_op_num_threads = options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path or model_path()), sess_options=options,
                                            providers=["CPUExecutionProvider"])

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """One speech probability per 512-sample frame of 16 kHz mono `audio` (the last frame zero-padded)."""
        stream = self.stream()
        out = [stream.feed(audio), stream.finish()]
        return np.concatenate(out)

    def stream(self) -> VadStream:
        """The probabilities of a recording given in pieces (its state carried from block to block)."""
        return VadStream(self.session)


class VadStream:
    """`SileroVad.probabilities` of a recording fed in pieces: the model runs on whole blocks of
    BLOCK_FRAMES frames as their samples arrive, the last block at `finish`, so the calls and their
    inputs are those of the whole recording's (the same probabilities, bit for bit) while only a
    block's samples are held."""

    def __init__(self, session):
        self.session = session
        self.h = np.zeros(STATE, dtype=np.float32)
        self.c = np.zeros(STATE, dtype=np.float32)
        self.previous = np.zeros(CONTEXT, dtype=np.float32)
        self.pending = np.zeros(0, dtype=np.float32)
        self.samples = 0

    def _run(self, audio: np.ndarray) -> np.ndarray:
        count = -(-audio.size // FRAME)
        frames = np.zeros((count, FRAME), dtype=np.float32)
        frames.reshape(-1)[:audio.size] = audio
        block = np.empty((count, CONTEXT + FRAME), dtype=np.float32)
        block[:, CONTEXT:] = frames
        block[0, :CONTEXT] = self.previous
        block[1:, :CONTEXT] = frames[:-1, -CONTEXT:]
        self.previous = frames[-1, -CONTEXT:].copy()
        probs, self.h, self.c = self.session.run(["speech_probs", "hn", "cn"],
                                                 {"input": block, "h": self.h, "c": self.c})
        return np.asarray(probs, dtype=np.float32).reshape(-1)

    def feed(self, audio: np.ndarray) -> np.ndarray:
        """The probabilities of the whole blocks the samples so far complete."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        self.samples += audio.size
        pending = np.concatenate([self.pending, audio])
        size = BLOCK_FRAMES * FRAME
        whole = pending.size // size * size
        out = [self._run(pending[start:start + size]) for start in range(0, whole, size)]
        self.pending = pending[whole:].copy()
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def finish(self) -> np.ndarray:
        """The last block's probabilities (its last frame zero-padded)."""
        pending, self.pending = self.pending, np.zeros(0, dtype=np.float32)
        return self._run(pending) if pending.size else np.zeros(0, dtype=np.float32)


_LOCK = threading.Lock()


@functools.cache
def _shared() -> SileroVad:
    return SileroVad()


def shared_vad() -> SileroVad:
    """The process's one session (made on first use)."""
    with _LOCK:
        return _shared()


def speech_spans(probs: np.ndarray, samples: int, o: VadOptions) -> list[tuple[int, int]]:
    """faster-whisper's get_speech_timestamps from the frames' probabilities: (start, end) samples of
    each stretch of speech in a recording of `samples` samples."""
    neg = o.neg_threshold if o.neg_threshold is not None else max(o.threshold - 0.15, 0.01)
    min_speech = RATE * o.min_speech_duration_ms / 1000
    pad = RATE * o.speech_pad_ms / 1000
    max_speech = RATE * o.max_speech_duration_s - FRAME - 2 * pad
    min_silence = RATE * o.min_silence_duration_ms / 1000
    min_silence_at_max = RATE * MIN_SILENCE_AT_MAX_SPEECH_MS / 1000
    triggered, speeches, current = False, [], {}
    temp_end = prev_end = next_start = 0  # a possible end (silence tolerated so far); the last long silence
    for i, p in enumerate(probs):
        at = FRAME * i
        if p >= o.threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = at
        if p >= o.threshold and not triggered:
            triggered, current = True, {"start": at}
            continue
        if triggered and at - current["start"] > max_speech:
            if prev_end:  # cut at the last silence over 98 ms
                speeches.append({"start": current["start"], "end": prev_end})
                if next_start < prev_end:  # silence since then: no speech running
                    triggered, current = False, {}
                else:
                    current = {"start": next_start}
                prev_end = next_start = temp_end = 0
            else:  # none: cut here
                speeches.append({"start": current["start"], "end": at})
                current, prev_end, next_start, temp_end, triggered = {}, 0, 0, 0, False
                continue
        if p < neg and triggered:
            if not temp_end:
                temp_end = at
            if at - temp_end > min_silence_at_max:
                prev_end = temp_end
            if at - temp_end < min_silence:
                continue
            if temp_end - current["start"] > min_speech:
                speeches.append({"start": current["start"], "end": temp_end})
            current, prev_end, next_start, temp_end, triggered = {}, 0, 0, 0, False
            continue
    if current and samples - current["start"] > min_speech:
        speeches.append({"start": current["start"], "end": samples})
    for i, speech in enumerate(speeches):  # the padding
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - pad))
        if i != len(speeches) - 1:
            gap = speeches[i + 1]["start"] - speech["end"]
            if gap < 2 * pad:
                speech["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                speech["end"] = int(min(samples, speech["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            speech["end"] = int(min(samples, speech["end"] + pad))
    return [(int(s["start"]), int(s["end"])) for s in speeches]


@dataclass(frozen=True)
class Chunk:
    """Consecutive speech spans (samples of the recording) transcribed as one clip: their audio joined.
    `offset`: where the chunk starts in the joined speech of the whole recording (seconds)."""
    spans: tuple[tuple[int, int], ...]
    offset: float

    @property
    def samples(self) -> int:
        return sum(end - start for start, end in self.spans)

    @property
    def duration(self) -> float:
        return self.samples / RATE

    def audio(self, recording: np.ndarray) -> np.ndarray:
        return np.concatenate([recording[start:end] for start, end in self.spans]).astype(np.float32, copy=False)


def merge_chunks(spans: list[tuple[int, int]], max_seconds: float = WINDOW_SECONDS) -> list[Chunk]:
    """faster-whisper's collect_chunks: spans joined in order while the chunk stays within `max_seconds`
    of speech (each span is at most that long: speech_spans cut them)."""
    chunks, current, length, before = [], [], 0, 0
    for start, end in spans:
        if current and length + end - start > max_seconds * RATE:
            chunks.append(Chunk(tuple(current), before / RATE))
            before += length
            current, length = [], 0
        current.append((start, end))
        length += end - start
    if current:
        chunks.append(Chunk(tuple(current), before / RATE))
    return chunks


class TimeMap:
    """faster-whisper's SpeechTimestampsMap: a time in the joined speech (seconds) -> the recording's,
    by the silence cut out before the span it falls in."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.span_end: list[int] = []  # each span's end in the joined speech (samples)
        self.silence_before: list[float] = []  # seconds cut out before each span
        previous = silent = 0
        for start, end in spans:
            silent += start - previous
            previous = end
            self.span_end.append(end - silent)
            self.silence_before.append(silent / RATE)

    def original(self, time: float, is_end: bool = False) -> float:
        """`time` in the recording. An end that falls exactly on a span's end belongs to that span (not
        the next one's start): faster-whisper's rule."""
        if not self.span_end:
            return time
        sample = int(time * RATE)
        if is_end and sample in self.span_end:
            index = self.span_end.index(sample)
        else:
            index = min(bisect.bisect(self.span_end, sample), len(self.span_end) - 1)
        return time + self.silence_before[index]


def speech_chunks(audio: np.ndarray, options: VadOptions, vad: SileroVad | None = None) -> tuple[list[Chunk], TimeMap]:
    """The recording's speech chunks (at most 30 s each) and the map of their times back to it."""
    vad = vad or shared_vad()
    spans = speech_spans(vad.probabilities(audio), len(audio), options)
    return merge_chunks(spans, WINDOW_SECONDS), TimeMap(spans)
