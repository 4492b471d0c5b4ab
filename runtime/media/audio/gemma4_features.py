"""Gemma 4's log-mel features in numpy (transformers 5.25's Gemma4AudioFeatureExtractor, the oracle of
tests/test_gemma4_audio_parts.py: within 1e-4), the `gemma4` family of runtime/media/audio/features.py.

Not Whisper's: the clip (cut to `max_length` samples, 30 s, as the processor's call cuts it) gets
frame_length // 2 zeros in front ("semicausal": the first frame centred on t = 0) and none behind;
a frame of frame_length samples (20 ms: 320) every hop (10 ms: 160), an optional preemphasis, a
periodic Hann window, |rfft| of fft_length (the next power of two, 512; twice with fft_overdrive)
-- the magnitude, not the power -- an HTK mel filterbank without normalisation (min_frequency to
max_frequency), the natural log of it + mel_floor, and an optional per-bin mean and deviation.

Only the frames whose whole window is the clip's count (transformers' mask; it also frames the
zeros it pads a batch with, then zeroes those rows): (n + frame_length // 2 - frame_length - 1) //
hop + 1 of a clip of n samples, 0 under 161 samples, 2,999 for 30 s. Those are all this extractor
returns, [frames, mel bins] float32.

Precision: transformers computes in numpy too, in float32 up to the FFT (the float32 waveform it casts
to, its float32 window, numpy's float32 rfft) and in float64 from the mel filterbank on; so does this,
which costs nothing and gives its values to the last bits. In float64 throughout the two would differ
by the float32 FFT's rounding: up to 1.6e-4 on real speech, in the quiet high bands near the floor.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

KEYS = ("num_mel_bins", "sampling_rate", "frame_length_ms", "hop_length_ms", "min_frequency", "max_frequency",
        "preemphasis", "preemphasis_htk_flavor", "fft_overdrive", "input_scale_factor", "mel_floor",
        "per_bin_mean", "per_bin_stddev", "max_length")
MAX_LENGTH = 480_000  # samples: the cut of Gemma4AudioFeatureExtractor.__call__'s default (30 s at 16 kHz)


def _htk_mel(hertz):
    return 2595.0 * np.log10(1.0 + np.asarray(hertz, dtype=np.float64) / 700.0)


def _htk_hertz(mels):
    return 700.0 * (10.0 ** (np.asarray(mels, dtype=np.float64) / 2595.0) - 1.0)


@functools.lru_cache(maxsize=8)
def htk_filter_bank(num_frequency_bins: int, num_mel_bins: int, min_frequency: float, max_frequency: float,
                    sampling_rate: int) -> np.ndarray:
    """[num_frequency_bins, num_mel_bins] float64, read-only: triangles between centres evenly spaced in
    HTK mels, peak 1, unnormalised (transformers' mel_filter_bank(norm=None, mel_scale="htk"))."""
    edges = _htk_hertz(np.linspace(_htk_mel(min_frequency), _htk_mel(max_frequency), num_mel_bins + 2))
    bins = np.linspace(0, sampling_rate // 2, num_frequency_bins)[:, None]
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    filters = np.maximum(0.0, np.minimum((bins - lower) / (centre - lower), (upper - bins) / (upper - centre)))
    filters.flags.writeable = False
    return filters


def _number(key: str, value, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (positive and value <= 0):
        raise ValueError(f"audio config: {key} must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Gemma4Features:
    """Gemma4AudioFeatureExtractor's log-mel spectrogram (its defaults; the keys of KEYS, `num_mel_bins`
    for its `feature_size`)."""

    num_mel_bins: int = 128
    sampling_rate: int = 16000
    frame_length_ms: float = 20.0
    hop_length_ms: float = 10.0
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    preemphasis: float = 0.0
    preemphasis_htk_flavor: bool = True
    fft_overdrive: bool = False
    input_scale_factor: float = 1.0
    mel_floor: float = 1e-3
    per_bin_mean: tuple | None = field(default=None)
    per_bin_stddev: tuple | None = field(default=None)
    max_length: int = MAX_LENGTH

    def __post_init__(self):
        for key in ("num_mel_bins", "sampling_rate", "max_length"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"audio config: {key} must be a positive integer, got {value!r}")
        for key in ("frame_length_ms", "hop_length_ms", "mel_floor", "input_scale_factor"):
            _number(key, getattr(self, key), positive=True)
        for key in ("min_frequency", "max_frequency", "preemphasis"):
            _number(key, getattr(self, key))
        if not 0 <= self.min_frequency < self.max_frequency <= self.sampling_rate / 2:
            raise ValueError(f"audio config: min_frequency {self.min_frequency} and max_frequency {self.max_frequency} "
                             f"must rise within 0..{self.sampling_rate / 2:g} Hz")
        for key in ("preemphasis_htk_flavor", "fft_overdrive"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"audio config: {key} must be true or false, got {getattr(self, key)!r}")
        for key in ("per_bin_mean", "per_bin_stddev"):
            value = getattr(self, key)
            if value is None:
                continue
            # (transformers saves them as it holds them, [1, 1, mel bins]: nested lists)
            flat = np.asarray(value, dtype=object).reshape(-1) if isinstance(value, (list, tuple)) else None
            if flat is None or len(flat) != self.num_mel_bins:
                raise ValueError(f"audio config: {key} must be a list of num_mel_bins ({self.num_mel_bins}) numbers")
            object.__setattr__(self, key, tuple(_number(key, v, positive=key == "per_bin_stddev") for v in flat))
        if self.hop_length < 1 or self.frame_length < 2:
            raise ValueError(f"audio config: frame_length_ms {self.frame_length_ms} / hop_length_ms "
                             f"{self.hop_length_ms} make no frame at {self.sampling_rate} Hz")

    # transformers' int(round(...)): Python's round, half to even, as numpy's
    @property
    def frame_length(self) -> int:
        return int(round(self.sampling_rate * self.frame_length_ms / 1000.0))

    @property
    def hop_length(self) -> int:
        return int(round(self.sampling_rate * self.hop_length_ms / 1000.0))

    @property
    def fft_length(self) -> int:
        return 2 ** math.ceil(math.log2(self.frame_length)) * (2 if self.fft_overdrive else 1)

    def num_frames(self, num_samples: int) -> int:
        """The frames whose window holds only the clip's samples (cut to max_length first, as the features
        are): transformers' input_features_mask.sum(), Gemma4Processor._compute_audio_num_tokens' mel frames."""
        kept = min(int(num_samples), self.max_length)
        return max(0, (kept + self.frame_length // 2 - self.frame_length - 1) // self.hop_length + 1)

    def __call__(self, audio):
        # (features.py imports this module for its `gemma4` family)
        from trt_llm.runtime.media.audio.features import AudioFeatures, _waveform

        samples = _waveform(audio)[:self.max_length]  # float32
        valid = self.num_frames(len(samples))
        if valid == 0:
            raise ValueError(f"audio features: {len(samples)} samples make no gemma4 frame; a frame needs "
                             f"{self.frame_length - self.frame_length // 2 + 1} samples")
        if self.input_scale_factor != 1.0:
            samples = samples * np.float32(self.input_scale_factor)
        padded = np.concatenate([np.zeros(self.frame_length // 2, np.float32), samples])
        # one sample more than the frame: the preemphasis reads the sample before each
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.frame_length + 1)[::self.hop_length][:valid]
        if self.preemphasis > 0.0:
            if self.preemphasis_htk_flavor:
                frames = np.concatenate([frames[:, :1] * np.float32(1.0 - self.preemphasis),
                                         frames[:, 1:-1] - np.float32(self.preemphasis) * frames[:, :-2]], axis=-1)
            else:
                frames = frames[:, 1:] - np.float32(self.preemphasis) * frames[:, :-1]
        else:
            frames = frames[:, :-1]
        window = np.hanning(self.frame_length + 1)[:-1].astype(np.float32)  # periodic Hann, float32 as transformers
        filters = htk_filter_bank(self.fft_length // 2 + 1, self.num_mel_bins, self.min_frequency, self.max_frequency,
                                  self.sampling_rate)
        magnitude = np.abs(np.fft.rfft(frames * window, n=self.fft_length, axis=-1))  # float32
        log_mel = np.log(magnitude @ filters + self.mel_floor)  # float64 from here
        if self.per_bin_mean is not None:
            log_mel = log_mel - np.asarray(self.per_bin_mean)
        if self.per_bin_stddev is not None:
            log_mel = log_mel / np.asarray(self.per_bin_stddev)
        return AudioFeatures(log_mel.astype(np.float32), valid)


def from_config(config: dict) -> Gemma4Features:
    """The extractor of an engine's audio config (KEYS; others ignored). transformers' own
    `frame_length` / `hop_length` / `fft_length` entries are not read: it recomputes them from the
    milliseconds on load, and so does this."""
    return Gemma4Features(**{key: config[key] for key in KEYS if key in config})
