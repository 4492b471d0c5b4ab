"""Audio sources of an input file: an `{"type": "audio", "audio": SOURCE}` part turned into the 16 kHz
mono float32 waveform an audio model's feature extractor expects.

The source is resolved by runtime/media/sources.py (a local path, a `file://` or `data:audio/...` URL; never
the network). Decoding repeats what transformers' `audio_utils.load_audio` does with its soundfile
backend -- itself `librosa.load`'s steps -- so the samples are the ones the model's processor would
have seen: soundfile (libsndfile) reads the clip as float32 (integer PCM scaled by 1 / 2^(bits-1)),
the channels are averaged with equal weights, *then* the mono signal is resampled with soxr at its
"HQ" quality (librosa's and transformers' `soxr_hq`) and padded or cut to ceil(n * rate / source
rate) samples. Averaging before resampling is also the order of transformers' ASR pipeline; the two
orders differ only by rounding, as resampling is linear, but one resampling is half the work.

Only common containers are decoded (WAV and its 64-bit variants, AIFF, FLAC, Ogg Vorbis / Opus,
MP3): libsndfile knows a score of legacy formats that no client sends and that would only widen what
a request can reach. `AudioError` is a `MediaError`, so a caller that catches the source errors of
`media_bytes` (missing file, bad data URL) catches the decoding ones too; each is one line naming
the source.

A clip's length is read from its header first (`audio_info`): over `max_seconds` it is refused before
a sample is decoded, and the frames are counted again as they decode (an MP3's header only estimates
them). `stream_audio` gives the same samples as consecutive blocks (soxr's streaming resampler is
bit-identical to its one-shot call), for a long clip that is never held whole (streaming.py).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import soxr

from trt_llm.runtime.media.sources import MediaError, media_bytes

# libsndfile's major-format ids, as `soundfile.SoundFile.format` names them.
AUDIO_FORMATS = ("WAV", "WAVEX", "RF64", "W64", "AIFF", "FLAC", "OGG", "MP3")
SAMPLING_RATE = 16000  # every Whisper-family and Parakeet extractor's rate
RESAMPLE_QUALITY = "HQ"  # soxr's default, what librosa and transformers call "soxr_hq"


class AudioError(MediaError):
    pass


def _one_line(error: BaseException) -> str:
    # libsndfile's own message: str() of its error names the BytesIO object, not the source
    text = error.error_string if isinstance(error, soundfile.LibsndfileError) else str(error)
    return " ".join(text.split()) or type(error).__name__


def _check_rate(sampling_rate) -> int:
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int) or sampling_rate < 1:
        raise ValueError(f"audio: sampling_rate must be a positive integer, got {sampling_rate!r}")
    return sampling_rate


def _check_max_seconds(max_seconds) -> float | None:
    if max_seconds is None:
        return None
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not max_seconds > 0:
        raise ValueError(f"audio: max_seconds must be a positive number or None, got {max_seconds!r}")
    return float(max_seconds)


def resample(waveform: np.ndarray, source_rate: int, sampling_rate: int) -> np.ndarray:
    """A mono float32 waveform at `sampling_rate`, of ceil(n * sampling_rate / source_rate) samples
    (soxr's own length can be a sample off; librosa and transformers fix it to this)."""
    if source_rate == sampling_rate:
        return np.ascontiguousarray(waveform, dtype=np.float32)
    length = math.ceil(len(waveform) * sampling_rate / source_rate)
    out = soxr.resample(waveform, source_rate, sampling_rate, quality=RESAMPLE_QUALITY)
    out = np.pad(out, (0, max(0, length - len(out))))[:length]
    return np.ascontiguousarray(out, dtype=np.float32)


# Source frames read at a time: a stream holds one block of samples (a few MB), whatever the clip's length.
BLOCK_FRAMES = 1 << 16


@dataclass(frozen=True)
class AudioInfo:
    """What a clip's header says, read before any sample is decoded."""
    frames: int  # source frames (an estimate for MP3: the stream is counted again as it decodes)
    samplerate: int
    channels: int
    format: str

    @property
    def seconds(self) -> float:
        return self.frames / self.samplerate


def _open(source, name: str) -> soundfile.SoundFile:
    """The clip opened (its header read, not a sample decoded); refused unless a common container."""
    supported = ", ".join(AUDIO_FORMATS)
    try:
        clip = soundfile.SoundFile(io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview))
                                   else str(source) if isinstance(source, Path) else source)
    except Exception as error:  # noqa: BLE001 -- LibsndfileError for bytes that are no audio it knows
        raise AudioError(f"audio {name}: not audio in a supported format ({supported}): {_one_line(error)}") from None
    if clip.format not in AUDIO_FORMATS:
        clip.close()
        raise AudioError(f"audio {name}: {clip.format_info} ({clip.format}) is not a supported format ({supported})")
    return clip


def _over(name: str, seconds: float, max_seconds: float) -> AudioError:
    return AudioError(f"audio {name}: {seconds:.2f} s long, over the limit of {max_seconds:g} s")


def audio_info(source, name: str, max_seconds: float | None = None) -> AudioInfo:
    """A clip's header (`source`: its bytes, a path or a binary file), refusing a clip longer than
    `max_seconds` before a sample is decoded."""
    max_seconds = _check_max_seconds(max_seconds)
    with _open(source, name) as clip:
        info = AudioInfo(clip.frames, clip.samplerate, clip.channels, clip.format)
    if info.frames == 0:
        raise AudioError(f"audio {name}: the clip is empty (no samples)")
    if max_seconds is not None and info.frames > max_seconds * info.samplerate:
        raise _over(name, info.seconds, max_seconds)
    return info


def _mono_blocks(clip: soundfile.SoundFile, name: str, max_seconds: float | None, block_frames: int):
    """The clip's samples as float32 mono blocks, each checked; the frames are counted as they decode,
    so a header that understates the length (an MP3's estimate) still stops at `max_seconds`."""
    most = None if max_seconds is None else max_seconds * clip.samplerate
    read = 0
    while True:
        try:
            samples = clip.read(block_frames, dtype="float32", always_2d=True)  # [frames, channels]
        except Exception as error:  # noqa: BLE001 -- a damaged stream: LibsndfileError, RuntimeError, MemoryError...
            raise AudioError(f"audio {name}: cannot decode it ({type(error).__name__}: {_one_line(error)})") from None
        if samples.shape[0] == 0:
            return
        read += samples.shape[0]
        if most is not None and read > most:
            raise _over(name, read / clip.samplerate, max_seconds)
        if not np.isfinite(samples).all():  # float WAVs can hold them, and soxr would smear them over the clip
            raise AudioError(f"audio {name}: holds NaN or infinite samples")
        # transformers' expression, [channels, frames] averaged over axis 0: the same float32 rounding
        # per sample whatever the block
        channels = samples.T
        yield channels.mean(axis=0) if channels.shape[0] > 1 else channels[0]  # contiguous: [frames, 1].T[0]


def stream_audio(source, name: str, sampling_rate: int = SAMPLING_RATE, max_seconds: float | None = None,
                 block_frames: int = BLOCK_FRAMES):
    """The mono float32 waveform `decode_audio` gives, as consecutive blocks: soxr's streaming
    resampler (bit-identical to its one-shot call) over the clip read a block at a time, the end
    padded or cut to ceil(n * rate / source rate) as the whole decode's. The clip is refused over
    `max_seconds` from its header before anything is decoded, and again while it decodes if the
    header understated it. `source`: the clip's bytes, a path or a binary file."""
    sampling_rate = _check_rate(sampling_rate)
    info = audio_info(source, name, max_seconds)
    with _open(source, name) as clip:
        source_rate = info.samplerate
        resampler = None if source_rate == sampling_rate else soxr.ResampleStream(
            source_rate, sampling_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        frames = given = 0
        held = None  # the last block, kept back until the length is known
        for mono in _mono_blocks(clip, name, max_seconds, block_frames):
            frames += len(mono)
            out = mono if resampler is None else resampler.resample_chunk(mono, last=False)
            if len(out) == 0:
                continue
            if held is not None:
                given += len(held)
                yield held
            held = np.ascontiguousarray(out, dtype=np.float32)
        if frames == 0:  # the header promised samples that the stream does not hold
            raise AudioError(f"audio {name}: the clip is empty (no samples could be decoded)")
        tail = [] if held is None else [held]
        if resampler is not None:
            tail.append(np.asarray(resampler.resample_chunk(np.zeros(0, np.float32), last=True), np.float32))
        tail = np.concatenate(tail) if tail else np.zeros(0, np.float32)
        length = math.ceil(frames * sampling_rate / source_rate)
        tail = np.pad(tail, (0, max(0, length - given - len(tail))))[:max(0, length - given)]
        if len(tail):
            yield np.ascontiguousarray(tail, dtype=np.float32)


def decode_audio(data: bytes | Path, name: str, sampling_rate: int = SAMPLING_RATE,
                 max_seconds: float | None = None) -> np.ndarray:
    """A clip's file bytes (or its path) as a mono float32 waveform at `sampling_rate`; `name` is what an
    AudioError calls the source. `max_seconds` refuses longer clips before their samples are decoded
    (from the header; a stream longer than its header said stops there)."""
    sampling_rate = _check_rate(sampling_rate)
    max_seconds = _check_max_seconds(max_seconds)
    info = audio_info(data, name, max_seconds)
    with _open(data, name) as clip:
        # One read of the whole clip when the header is honest (one buffer, no copies); a block more
        # only where it understated the length, each counted against the limit.
        blocks = list(_mono_blocks(clip, name, max_seconds, info.frames))
    if not blocks:  # the header promised samples that the stream does not hold
        raise AudioError(f"audio {name}: the clip is empty (no samples could be decoded)")
    mono = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    return resample(mono, info.samplerate, sampling_rate)


def load_audio(source: str, base_dir: Path | None = None, sampling_rate: int = SAMPLING_RATE,
               max_seconds: float | None = None) -> np.ndarray:
    """The mono float32 waveform at `sampling_rate` of an `"audio"` content part's source
    (`base_dir`: the input file's folder). Raises MediaError (AudioError for the clip itself)."""
    data, name = media_bytes(source, base_dir, "audio")
    return decode_audio(data, name, sampling_rate, max_seconds)
