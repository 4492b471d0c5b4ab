"""A long clip read once, as a stream, for Whisper's long-form transcription: memory stays flat with the
recording's length.

The clip is decoded a block at a time (decode.stream_audio: soundfile's blocks, soxr's streaming
resampler) and each block goes on at once to what the transcription needs of it, then is dropped:

- sequential long form: its log-mel frames (features.WhisperLogMelStream, frame for frame the whole
  clip's), written to a temporary file; the floor that follows the loudest frame is known at the end
  and applied as each 30 s window is read back (`SpilledFeatures`, what a `Transcription` reads as
  `features[:, seek:seek + frames]`). An hour of 80-bin features is 115 MB on disk, a window 1 MB in
  memory.
- with VAD: Silero's probabilities (vad.VadStream, block by block with its state) and the 16 kHz
  samples, written to a temporary file from which each speech chunk's audio (at most 30 s) is read
  back when that chunk starts (`SpilledWaveform`).

The content key is the SHA-256 of the file's bytes, as encoder_cache.content_key has it, read a
MB at a time. The temporary files are unlinked from the start (tempfile.TemporaryFile) and go with
their object.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_llm.runtime.media.audio.decode import AudioError, stream_audio
from trt_llm.runtime.media.audio.features import WhisperFeatures, WhisperLogMelStream

READ_BYTES = 1 << 20


def _spill():
    return tempfile.TemporaryFile(prefix="trt-llm-audio-")


class SpilledFeatures:
    """A clip's Whisper features [mel bins, frames] on disk, frame after frame, before the floor;
    `self[:, a:b]` reads those frames with the floor applied (float32 [mel bins, b - a])."""

    def __init__(self, file, mel_bins: int, frames: int, floor: np.float32):
        self._file, self.shape, self.floor = file, (mel_bins, frames), floor

    def __getitem__(self, key) -> np.ndarray:
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        if rows != slice(None) or not isinstance(columns, slice) or columns.step not in (None, 1):
            raise IndexError("SpilledFeatures: only [:, start:stop] windows are read")
        start, stop, _ = columns.indices(self.shape[1])
        count = max(0, stop - start)
        mel_bins = self.shape[0]
        data = os.pread(self._file.fileno(), count * mel_bins * 4, start * mel_bins * 4)
        frames = np.frombuffer(data, dtype=np.float32).reshape(count, mel_bins)
        return np.maximum(frames, self.floor).T

    def close(self) -> None:
        self._file.close()


class SpilledWaveform:
    """A clip's 16 kHz mono samples on disk (float32); `read(start, end)` a span of them."""

    def __init__(self, file, samples: int):
        self._file, self.samples = file, samples

    def __len__(self) -> int:
        return self.samples

    def read(self, start: int, end: int) -> np.ndarray:
        start, end = max(0, start), min(end, self.samples)
        data = os.pread(self._file.fileno(), max(0, end - start) * 4, start * 4)
        return np.frombuffer(data, dtype=np.float32).copy()

    def close(self) -> None:
        self._file.close()


@dataclass
class StreamedClip:
    key: str  # the file's content hash
    name: str
    samples: int  # at the extractor's rate
    seconds: float
    features: SpilledFeatures | None = None  # sequential long form
    probabilities: np.ndarray | None = None  # with VAD: one per 512-sample frame
    waveform: SpilledWaveform | None = None  # with VAD


def file_key(source) -> str:
    """encoder_cache.content_key of a clip's file, read a MB at a time (`source`: bytes or a path)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    with open(source, "rb") as file:
        while piece := file.read(READ_BYTES):
            digest.update(piece)
    return digest.hexdigest()


def stream_clip(source, name: str, extractor: WhisperFeatures, max_seconds: float | None,
                vad=None) -> StreamedClip:
    """The clip (`source`: its bytes or its path) decoded once as a stream: its features spilled to
    disk, or with `vad` (a vad.SileroVad) its speech probabilities and its samples. AudioError
    (decode.py) names the clip when it cannot be decoded or is over `max_seconds` (from its header,
    before decoding)."""
    source = str(source) if isinstance(source, Path) else source
    blocks = stream_audio(source, name, extractor.sampling_rate, max_seconds)
    file = _spill()
    try:
        if vad is not None:
            stream, probabilities, samples = vad.stream(), [], 0
            for block in blocks:
                file.write(block.data)
                probabilities.append(stream.feed(block))
                samples += len(block)
            file.flush()
            probabilities.append(stream.finish())
            return StreamedClip(file_key(source), name, samples, samples / extractor.sampling_rate,
                                probabilities=np.concatenate(probabilities), waveform=SpilledWaveform(file, samples))
        mel = WhisperLogMelStream(extractor.num_mel_bins, extractor.sampling_rate, extractor.n_fft,
                                  extractor.hop_length)
        for block in blocks:
            file.write(mel.feed(block).data)
        file.write(mel.finish().data)
        file.flush()
        if mel.frames == 0:
            raise AudioError(f"audio {name}: {mel.samples} samples make no whisper frame; a frame needs "
                             f"hop_length ({extractor.hop_length}) samples")
        features = SpilledFeatures(file, extractor.num_mel_bins, mel.frames, mel.floor())
        return StreamedClip(file_key(source), name, mel.samples, mel.samples / extractor.sampling_rate,
                            features=features)
    except BaseException:
        file.close()
        raise
