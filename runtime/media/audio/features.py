"""Log-mel features of a 16 kHz mono waveform for an audio encoder, in numpy: the runtime needs
neither torch nor librosa to feed a Whisper-style, Qwen3-ASR or Parakeet encoder engine.

Three families, each the algorithm of its transformers feature extractor (tests/test_audio_inputs.py
and tests/test_qwen3_asr.py compare them within 1e-4). All compute in float64 -- but for Parakeet's preemphasis, float32 as in
transformers -- and hand back float32. transformers computes the spectrograms in float32 (torch), so
the two differ by its rounding: some 3e-5 for Whisper, up to 8e-5 for Parakeet on real speech, and far
more for Parakeet on very quiet or band-limited audio, where its per-bin normalisation divides by a
tiny spread (0.1 on speech at -60 dB); there this module stays within about 1e-6 of transformers'
own steps run in float64.

- whisper (`WhisperFeatureExtractor`: Whisper, Qwen2-Audio): the clip cut or zero-padded to
  `chunk_length` seconds (30 s: 480,000 samples, 3,000 frames), reflect-padded by n_fft / 2 at both
  ends, a periodic Hann window of n_fft (400) every hop (160) samples, |rfft|^2 with the last frame
  dropped, a Slaney mel filterbank (0 to 8 kHz), log10 of it clamped at 1e-10, floored at the
  spectrogram's maximum - 8, then (x + 4) / 4. Layout [mel bins, frames]. The frames that hold the
  clip are ceil(n / hop) of the 3,000: the `feature_attention_mask` Qwen2-Audio's processor counts
  its audio tokens from. Without the padding (`pad_to_chunk` false, transformers' `padding="longest"`;
  still cut to the chunk) there are n // hop frames, all of them the clip's, and the last ones differ
  from the padded features: reflection instead of silence past the end.
- qwen3_asr (`Qwen3ASRFeatureExtractor`, as Qwen3ASRProcessor calls it on one clip: padding
  "longest", no truncation): Whisper's spectrogram of the whole clip, zero-padded first to
  `min_length` samples (8,000: 0.5 s; those count as the clip), never cut; n // hop frames, all the
  clip's, then zeros (not silence's log-mel) up to a multiple of 2 * `n_window` frames (100: the
  encoder's chunk). Layout [mel bins, frames].
- parakeet (`ParakeetFeatureExtractor`): a 0.97 preemphasis, zero padding by n_fft / 2 at both ends,
  a symmetric Hann window of `win_length` (400) centred in n_fft (512), |rfft|^2 with every frame
  kept, a Slaney mel filterbank (0 to sampling_rate / 2), the natural log of (it + 2^-24), then each
  mel bin normalised to zero mean and unit (n - 1) variance over the clip's frames ((n + 2 *
  (n_fft // 2) - n_fft) // hop of the 1 + n // hop), std + 1e-5 in the denominator, and the frames
  past them zeroed. Layout [frames, mel bins].
- gemma4 (`Gemma4AudioFeatureExtractor`): runtime/media/audio/gemma4_features.py (its keys there:
  frame_length_ms, hop_length_ms, mel_floor, ...). Layout [frames, mel bins], the clip's frames only.

`extractor_for(config)` picks one from the audio settings of an engine (`audio/config.json`):

    feature_extractor  "whisper", "parakeet" or "qwen3_asr" (required)
    num_mel_bins       mel bins, default 80 (Whisper large-v3 and Qwen2-Audio use 128)
    sampling_rate      default 16000: the waveform's rate, from runtime/media/audio/decode.py
    n_fft, hop_length  defaults 400 / 160 (whisper), 512 / 160 (parakeet)
    chunk_length       whisper: seconds padded or cut to, default 30
    pad_to_chunk       whisper: pad to chunk_length (true, the default: Whisper and Qwen2-Audio) or not
    win_length         parakeet: the window inside n_fft, default 400
    preemphasis        parakeet: the filter's coefficient, default 0.97; null or 0 for none
    n_window           qwen3_asr: half the encoder's chunk of frames, default 50
    min_length         qwen3_asr: samples a shorter clip is zero-padded to, default 8000

Other keys are ignored (the file holds the encoder's settings too). `config_from_preprocessor`
writes these keys from a model's `preprocessor_config.json`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from trt_llm.runtime.media.audio import gemma4_features

FAMILIES = ("whisper", "parakeet", "qwen3_asr", "gemma4")
WHISPER_MAX_FREQUENCY = 8000.0  # WhisperFeatureExtractor's, whatever the sampling rate
WHISPER_MEL_FLOOR = 1e-10
WHISPER_DYNAMIC_RANGE = 8.0  # log10 units kept below the maximum: 80 dB
PARAKEET_LOG_GUARD = 2.0 ** -24
PARAKEET_STD_EPSILON = 1e-5


class AudioFeatures(NamedTuple):
    features: np.ndarray  # float32: whisper [mel bins, frames], parakeet [frames, mel bins]
    num_frames: int  # the frames that hold the clip (the attention mask's count); the rest is padding


# --- The Slaney mel filterbank (librosa's default, which both extractors use) ---

def _hertz_to_mel(hertz: np.ndarray) -> np.ndarray:
    """Slaney's scale: linear, 3 mels per 200 Hz, up to 1 kHz (15 mels), logarithmic above it."""
    hertz = np.asarray(hertz, dtype=np.float64)
    # np.where computes both branches: the maximum keeps the unused logarithm away from 0 Hz
    return np.where(hertz < 1000.0, 3.0 * hertz / 200.0,
                    15.0 + np.log(np.maximum(hertz, 1000.0) / 1000.0) * (27.0 / np.log(6.4)))


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    return np.where(mels < 15.0, 200.0 * mels / 3.0,
                    1000.0 * np.exp((np.log(6.4) / 27.0) * (np.maximum(mels, 15.0) - 15.0)))


@functools.lru_cache(maxsize=16)
def mel_filter_bank(num_frequency_bins: int, num_mel_bins: int, min_frequency: float, max_frequency: float,
                    sampling_rate: int) -> np.ndarray:
    """[num_frequency_bins, num_mel_bins] float64 (read-only: it is cached): triangles between
    centres evenly spaced in Slaney mels, each scaled by 2 / its width in Hz so every filter
    gathers about the same energy."""
    edges = _mel_to_hertz(np.linspace(_hertz_to_mel(min_frequency), _hertz_to_mel(max_frequency), num_mel_bins + 2))
    # transformers spaces the bins up to sampling_rate // 2, an integer; the same for even rates
    bins = np.linspace(0, sampling_rate // 2, num_frequency_bins)[:, None]
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins - lower) / (centre - lower)
    falling = (upper - bins) / (upper - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (upper - lower))
    filters.flags.writeable = False
    return filters


# --- Shared steps ---

def _waveform(audio) -> np.ndarray:
    """The clip as the float32 array transformers' extractors cast it to."""
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"audio features: expected a mono waveform (one dimension), got shape {samples.shape}")
    if samples.size == 0:
        raise ValueError("audio features: the waveform is empty")
    if not np.isfinite(samples).all():
        raise ValueError("audio features: the waveform holds NaN or infinite samples")
    return samples


FRAMES_PER_BLOCK = 2048  # the STFT of an hour of Parakeet audio would otherwise hold 1.5 GB at once


def _frames(padded: np.ndarray, frame_length: int, hop_length: int) -> np.ndarray:
    """[frames, frame_length], a view: one frame per hop that fits whole, as torch.stft and
    transformers' spectrogram frame an already padded signal."""
    return np.lib.stride_tricks.sliding_window_view(padded, frame_length)[::hop_length]


def _mel_power(frames: np.ndarray, window: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """[frames, mel bins]: the mel filterbank applied to |rfft|^2 of each windowed frame, a block
    of frames at a time (only the mel rows are kept)."""
    mel = np.empty((len(frames), filters.shape[1]))
    for start in range(0, len(frames), FRAMES_PER_BLOCK):
        spectrum = np.fft.rfft(frames[start:start + FRAMES_PER_BLOCK] * window, axis=-1)
        mel[start:start + FRAMES_PER_BLOCK] = (spectrum.real ** 2 + spectrum.imag ** 2) @ filters
    return mel


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"audio config: {key} must be a positive integer, got {value!r}")
    return value


def _whisper_log_mel(samples: np.ndarray, num_mel_bins: int, sampling_rate: int, n_fft: int,
                     hop_length: int) -> np.ndarray:
    """Whisper's log-mel spectrogram of float64 `samples`, float32 [mel bins, len // hop]."""
    half = n_fft // 2
    padded = np.pad(samples, (half, half), mode="reflect")
    # periodic Hann: np.hanning's symmetric window one sample longer, its last sample cut
    window = np.hanning(n_fft + 1)[:-1]
    frames = _frames(padded, n_fft, hop_length)[:-1]  # Whisper drops the last frame
    filters = mel_filter_bank(n_fft // 2 + 1, num_mel_bins, 0.0, WHISPER_MAX_FREQUENCY, sampling_rate)
    log_mel = np.log10(np.maximum(_mel_power(frames, window, filters).T, WHISPER_MEL_FLOOR))
    # the floor follows the loudest frame of the whole (padded) spectrogram
    log_mel = np.maximum(log_mel, log_mel.max() - WHISPER_DYNAMIC_RANGE)
    return ((log_mel + 4.0) / 4.0).astype(np.float32)


class WhisperLogMelStream:
    """Whisper's log-mel spectrogram of a clip given in pieces, unpadded (transformers'
    padding="longest"): frame for frame `_whisper_log_mel` of the whole clip, holding only a block of
    frames' samples. `feed` returns the frames its samples complete, `finish` the rest; both before
    the floor, which follows the loudest frame of the whole clip: `floor()` once it is all fed, to be
    applied as `np.maximum(frames, floor())`. That equals the whole computation exactly: x ->
    float32((x + 4) / 4) is monotone, so it commutes with the maximum. The frames are computed in
    blocks of FRAMES_PER_BLOCK aligned as the whole clip's, so every FFT and matrix product has the
    same operands. Each frame is [mel bins] float32; the arrays returned are [frames, mel bins]."""

    def __init__(self, num_mel_bins: int = 80, sampling_rate: int = 16000, n_fft: int = 400, hop_length: int = 160):
        self.n_fft, self.hop, self.half = n_fft, hop_length, n_fft // 2
        self.num_mel_bins = num_mel_bins
        self.window = np.hanning(n_fft + 1)[:-1]
        self.filters = mel_filter_bank(n_fft // 2 + 1, num_mel_bins, 0.0, WHISPER_MAX_FREQUENCY, sampling_rate)
        self.samples = 0  # fed so far
        self.frames = 0  # returned so far
        self.maximum = -np.inf  # of the log10 values so far (float64, as the whole computation's)
        self._head = np.zeros(0)  # the first samples, until the front reflection can be made
        self._padded = None  # the reflect-padded signal from frame `frames`'s first sample on

    def _block(self, frames: np.ndarray) -> np.ndarray:
        log_mel = np.log10(np.maximum(_mel_power(frames, self.window, self.filters).T, WHISPER_MEL_FLOOR))
        self.maximum = max(self.maximum, float(log_mel.max()))
        return np.ascontiguousarray(((log_mel + 4.0) / 4.0).astype(np.float32).T)

    def _take(self, count: int) -> np.ndarray:
        """`count` frames from the padded signal held, in the whole computation's blocks."""
        out = []
        while count:
            n = min(count, FRAMES_PER_BLOCK - self.frames % FRAMES_PER_BLOCK)
            out.append(self._block(_frames(self._padded[:(n - 1) * self.hop + self.n_fft], self.n_fft, self.hop)))
            self._padded = self._padded[n * self.hop:]
            self.frames += n
            count -= n
        self._padded = self._padded.copy()  # the rest only: the view would keep the whole piece alive
        return np.concatenate(out) if out else np.zeros((0, self.num_mel_bins), np.float32)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.float32).astype(np.float64)
        self.samples += len(samples)
        if self._padded is None:
            self._head = np.concatenate([self._head, samples])
            if len(self._head) <= self.half:
                return np.zeros((0, self.num_mel_bins), np.float32)
            samples, self._head = self._head, None
            self._padded = np.zeros(0)
            samples = np.concatenate([samples[self.half:0:-1], samples])  # np.pad's "reflect" at the start
        self._padded = np.concatenate([self._padded, samples])
        # Whole blocks only, and never the signal's last frames (they need its end, and the last is dropped).
        ready = max(0, (len(self._padded) - self.n_fft) // self.hop)  # frames with one more after them
        count = (self.frames + ready) // FRAMES_PER_BLOCK * FRAMES_PER_BLOCK - self.frames
        return self._take(count) if count > 0 else np.zeros((0, self.num_mel_bins), np.float32)

    def finish(self) -> np.ndarray:
        """The last frames (the end reflect-padded, the very last frame dropped, as Whisper's)."""
        if self._padded is None:  # too short to stream: the whole computation's own padding
            samples = self._head
            if len(samples) == 0:
                raise ValueError("audio features: the waveform is empty")
            padded = np.pad(samples, (self.half, self.half), mode="reflect")
            self._padded, self._head = padded, None
        else:
            # the last `half` samples of the signal are in what is held: the frames before them are out
            tail = self._padded[len(self._padded) - self.half - 1:-1][::-1]
            self._padded = np.concatenate([self._padded, tail])
        total = (self.samples + 2 * self.half - self.n_fft) // self.hop  # the frames but the dropped last
        return self._take(total - self.frames)

    def floor(self) -> np.float32:
        """The floor of every frame, the loudest frame's value less 80 dB."""
        return ((np.float64(self.maximum) - WHISPER_DYNAMIC_RANGE + 4.0) / 4.0).astype(np.float32)


# --- The families ---

@dataclass(frozen=True)
class WhisperFeatures:
    """WhisperFeatureExtractor's log-mel spectrogram (its defaults; Qwen2-Audio sets 128 mel bins)."""

    num_mel_bins: int = 80
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    chunk_length: int = 30
    pad_to_chunk: bool = True

    def __post_init__(self):
        for key in ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "chunk_length"):
            _positive_int(key, getattr(self, key))

    @property
    def chunk_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    def num_frames(self, num_samples: int) -> int:
        """The frames that hold a clip of `num_samples` (cut to the chunk first, as the features are)."""
        kept = min(num_samples, self.chunk_samples)
        return math.ceil(kept / self.hop_length) if self.pad_to_chunk else kept // self.hop_length

    def __call__(self, audio) -> AudioFeatures:
        samples = _waveform(audio)[:self.chunk_samples].astype(np.float64)  # cut in both padding modes
        valid = self.num_frames(len(samples))
        if self.pad_to_chunk:
            samples = np.pad(samples, (0, self.chunk_samples - len(samples)))
        elif valid == 0:
            raise ValueError(f"audio features: {len(samples)} samples make no whisper frame unpadded; "
                             f"a frame needs hop_length ({self.hop_length}) samples")
        return AudioFeatures(_whisper_log_mel(samples, self.num_mel_bins, self.sampling_rate, self.n_fft,
                                              self.hop_length), valid)


@dataclass(frozen=True)
class Qwen3ASRFeatures:
    """Qwen3ASRFeatureExtractor's log-mel spectrogram, as its processor computes it for one clip."""

    num_mel_bins: int = 128
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    n_window: int = 50
    min_length: int = 8000

    def __post_init__(self):
        for key in ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "n_window"):
            _positive_int(key, getattr(self, key))
        if isinstance(self.min_length, bool) or not isinstance(self.min_length, int) or self.min_length < 0:
            raise ValueError(f"audio config: min_length must be a non-negative integer, got {self.min_length!r}")

    def num_frames(self, num_samples: int) -> int:
        """The frames that hold a clip of `num_samples` (its padding to min_length included, as the
        extractor's attention mask counts it)."""
        return max(num_samples, self.min_length) // self.hop_length

    def __call__(self, audio) -> AudioFeatures:
        samples = _waveform(audio).astype(np.float64)
        # a clip under min_length samples is zero-padded first (and the padding counts as the clip)
        samples = np.pad(samples, (0, max(0, self.min_length - len(samples))))
        valid = self.num_frames(len(samples))
        if valid == 0:
            raise ValueError(f"audio features: {len(samples)} samples make no qwen3_asr frame; a frame needs "
                             f"hop_length ({self.hop_length}) samples")
        log_mel = _whisper_log_mel(samples, self.num_mel_bins, self.sampling_rate, self.n_fft, self.hop_length)
        chunk = 2 * self.n_window  # the encoder's chunk: zeros (not silence's log-mel) up to a whole one
        return AudioFeatures(np.pad(log_mel, ((0, 0), (0, -valid % chunk))), valid)


@dataclass(frozen=True)
class ParakeetFeatures:
    """ParakeetFeatureExtractor's normalised log-mel spectrogram (its defaults)."""

    num_mel_bins: int = 80
    sampling_rate: int = 16000
    n_fft: int = 512
    hop_length: int = 160
    win_length: int = 400
    preemphasis: float | None = 0.97

    def __post_init__(self):
        for key in ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "win_length"):
            _positive_int(key, getattr(self, key))
        if self.win_length > self.n_fft:
            raise ValueError(f"audio config: win_length {self.win_length} is over n_fft {self.n_fft}")
        if self.preemphasis is not None and (isinstance(self.preemphasis, bool)
                                             or not isinstance(self.preemphasis, (int, float))):
            raise ValueError(f"audio config: preemphasis must be a number or null, got {self.preemphasis!r}")

    def num_frames(self, num_samples: int) -> int:
        """The frames that hold a clip of `num_samples` (transformers' `features_lengths`); the
        spectrogram has one more (or a few more for odd n_fft), zeroed."""
        return max(0, (num_samples + (self.n_fft // 2) * 2 - self.n_fft) // self.hop_length)

    def __call__(self, audio) -> AudioFeatures:
        samples = _waveform(audio)
        valid = self.num_frames(len(samples))
        if valid < 2:  # the unbiased variance divides by frames - 1
            raise ValueError(f"audio features: {len(samples)} samples are too short for parakeet features; "
                             f"the normalisation needs 2 frames, {2 * self.hop_length + self.n_fft % 2} samples")
        if self.preemphasis:
            # In float32, as transformers (and NeMo) compute it: x[t] - 0.97 x[t-1] cancels most of the
            # low frequencies, so its rounding is not negligible there; the normalisation of quiet
            # mel bins magnifies it to some 4e-5. Reproducing it costs nothing, as elementwise
            # float32 arithmetic rounds alike everywhere (the STFT's rounding cannot be reproduced).
            samples = np.concatenate([samples[:1], samples[1:] - np.float32(self.preemphasis) * samples[:-1]])
        samples = samples.astype(np.float64)
        half = self.n_fft // 2
        padded = np.pad(samples, (half, half))  # torch.stft's pad_mode="constant": zeros
        # torch.stft centres a shorter window inside n_fft; periodic=False is np.hanning's symmetric one
        window = np.zeros(self.n_fft)
        offset = (self.n_fft - self.win_length) // 2
        window[offset:offset + self.win_length] = np.hanning(self.win_length)
        filters = mel_filter_bank(self.n_fft // 2 + 1, self.num_mel_bins, 0.0, self.sampling_rate / 2,
                                  self.sampling_rate)
        mel = _mel_power(_frames(padded, self.n_fft, self.hop_length), window, filters)
        log_mel = np.log(mel + PARAKEET_LOG_GUARD)  # [frames, mel bins]
        clip = log_mel[:valid]
        mean = clip.mean(axis=0)
        std = np.sqrt(((clip - mean) ** 2).sum(axis=0) / (valid - 1))
        features = (log_mel - mean) / (std + PARAKEET_STD_EPSILON)
        features[valid:] = 0.0
        return AudioFeatures(features.astype(np.float32), valid)


# --- Choosing one ---

_WHISPER_KEYS = ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "chunk_length", "pad_to_chunk")
_PARAKEET_KEYS = ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "win_length", "preemphasis")
_QWEN3_ASR_KEYS = ("num_mel_bins", "sampling_rate", "n_fft", "hop_length", "n_window", "min_length")


def extractor_for(config: dict):
    """The feature extractor an engine's audio config names (keys in the module docstring)."""
    if not isinstance(config, dict):
        raise TypeError(f"audio config: expected a JSON object, got {type(config).__name__}")
    family = config.get("feature_extractor")
    if family == "whisper":
        fields = {key: config[key] for key in _WHISPER_KEYS if key in config}
        if not isinstance(fields.get("pad_to_chunk", True), bool):
            raise ValueError(f"audio config: pad_to_chunk must be true or false, got {fields['pad_to_chunk']!r}")
        return WhisperFeatures(**fields)
    if family == "parakeet":
        return ParakeetFeatures(**{key: config[key] for key in _PARAKEET_KEYS if key in config})
    if family == "qwen3_asr":
        return Qwen3ASRFeatures(**{key: config[key] for key in _QWEN3_ASR_KEYS if key in config})
    if family == "gemma4":
        return gemma4_features.from_config(config)
    raise ValueError(f"audio config: feature_extractor must be one of {', '.join(map(repr, FAMILIES))}, "
                     f"got {family!r}")


_PREPROCESSOR_TYPES = {"WhisperFeatureExtractor": "whisper", "ParakeetFeatureExtractor": "parakeet",
                       "Qwen3ASRFeatureExtractor": "qwen3_asr", "Gemma4AudioFeatureExtractor": "gemma4"}
_FAMILY_KEYS = {"whisper": _WHISPER_KEYS, "parakeet": _PARAKEET_KEYS, "qwen3_asr": _QWEN3_ASR_KEYS,
                "gemma4": gemma4_features.KEYS}


def config_from_preprocessor(preprocessor: dict) -> dict:
    """The audio config keys of a model's `preprocessor_config.json` (transformers' names: its
    `feature_extractor_type`, `feature_size` for the mel bins). Settings the extractors here do not
    reproduce are refused: random dither, and padding with anything but silence."""
    kind = preprocessor.get("feature_extractor_type")
    family = _PREPROCESSOR_TYPES.get(kind)
    if family is None:
        raise ValueError(f"preprocessor config: feature_extractor_type {kind!r} is not supported "
                         f"({', '.join(_PREPROCESSOR_TYPES)})")
    if preprocessor.get("dither", 0.0):
        raise ValueError(f"preprocessor config: dither {preprocessor['dither']!r} is not supported: it adds random "
                         "noise, which no engine input could reproduce")
    if preprocessor.get("padding_value", 0.0):
        raise ValueError(f"preprocessor config: padding_value {preprocessor['padding_value']!r} is not supported: "
                         "the clip is padded with silence (0.0)")
    config = {"feature_extractor": family}
    if "feature_size" in preprocessor:
        config["num_mel_bins"] = preprocessor["feature_size"]
    keys = _FAMILY_KEYS[family]
    config.update({key: preprocessor[key] for key in keys if key in preprocessor and key != "num_mel_bins"})
    extractor_for(config)  # refuses a bad value here, where the file is named, not at the first request
    return config
