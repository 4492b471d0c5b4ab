"""The audio component at run time: clips -> what the decoder reads of them.

A clip's bytes are decoded to 16 kHz mono (runtime/media/audio/decode.py), cut into log-mel features by the
extractor the component's config names (runtime/media/audio/features.py) and encoded; the encodings are
kept under a hash of the file's bytes (runtime/media/encoder_cache.py). The family's adapter
(trt_llm/families/adapters.py, named by the manifest) makes the graph's inputs and says what comes out:

- rows (Qwen2-Audio, Qwen3-ASR): one graph run over every clip of a request not seen before gives
  each clip's rows, written at its audio placeholder tokens like an image's (runtime/media/audio/prompt.py);
  Qwen3-ASR's adapter cuts the clips into chunks of 100 frames, Qwen2-Audio's gives a 30 s window per clip;
- cross-attention (Whisper): the graph gives each decoder layer's cross-attention keys and values
  for the clip, which the decoder attends to at every step.

Limits (the build's `audio:` section): a clip of fewer than min_mel_frames or more than
max_mel_frames frames, or longer than the encoder's window, is refused, as is a request with more
than max_clips clips; a refused clip costs no encoder time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.media.audio.decode import AudioError, decode_audio
from trt_llm.runtime.media.audio.features import extractor_for
from trt_llm.families.adapters import adapter
from trt_llm.runtime.media.encoder_cache import EncoderCache, content_key
from trt_llm.runtime.media.encoder_session import encoder_session

CACHE_CLIPS = 32  # encoded clips kept (a Whisper clip's keys and values: some 18 MB for tiny in fp32)


@dataclass(frozen=True)
class PendingClip:
    """A decoded clip before encoding: its content key, features and length."""
    key: str
    name: str
    features: np.ndarray  # [mel bins, window frames] (whisper), [mel bins, chunks * 100] (qwen3_asr), [frames, mel bins] (parakeet)
    frames: int  # the mel frames that hold the clip
    seconds: float


@dataclass(frozen=True)
class EncodedClip:
    """rows: `embeds` [tokens, H] for the decoder's audio tokens; cross_attention: `cross` (key,
    value) [H, frames, D] per decoder layer."""
    embeds: np.ndarray | None = None
    cross: list[tuple[np.ndarray, np.ndarray]] | None = None
    deepstack = None  # SequenceMedia's interface: audio rows have no early-layer features
    both_ways = False  # nor do a clip's tokens see each other both ways (Gemma 4: images' do, clips' not)

    @property
    def tokens(self) -> int:
        return 0 if self.embeds is None else self.embeds.shape[0]


class AudioEncoder:
    def __init__(self, engine_dir, threads: int = 0):
        self.settings = json.loads(engine_dir.component_path("audio", "config").read_text())
        s = self.settings
        self.extractor = extractor_for(s)
        self.window_frames = s["window_frames"]
        self.max_frames = min(s["max_mel_frames"], self.window_frames)
        self.min_frames, self.max_clips = s["min_mel_frames"], s["max_clips"]
        self.audio_token_id = s.get("audio_token_id")  # rows: the placeholder the template writes
        # The family's encoder inputs and token counts (trt_llm/families/adapters.py): Qwen2-Audio's one
        # 30 s window per clip, Qwen3-ASR's chunks of 100 frames, Whisper's window for cross-attention.
        self.adapter = adapter(engine_dir.adapter_name("audio"), s)
        self.session = encoder_session(engine_dir, "audio", threads)
        self.cache = EncoderCache(CACHE_CLIPS)
        self.profiler = None  # a runtime.profiler.Profiler: clips, audio seconds, the encoder's time

    @property
    def cross_attention(self) -> bool:
        """Whisper's: a clip is the decoder's cross inputs, not rows at its placeholder tokens."""
        return self.adapter.cross_attention

    @property
    def max_seconds(self) -> float:
        return self.max_frames * self.extractor.hop_length / self.extractor.sampling_rate

    def pending(self, data: bytes, name: str) -> PendingClip:
        """A clip's file bytes, decoded and cut into features; AudioError names it when it cannot be,
        or when it is outside the engine's limits (a too long clip before its samples are decoded)."""
        waveform = decode_audio(data, name, self.extractor.sampling_rate, max_seconds=self.max_seconds)
        return self.pending_waveform(waveform, content_key(data), name)

    def pending_waveform(self, waveform: np.ndarray, key: str, name: str) -> PendingClip:
        """pending() of a decoded clip (key: its file's content hash)."""
        frames = self.extractor.num_frames(len(waveform))
        seconds = len(waveform) / self.extractor.sampling_rate
        if frames > self.max_frames:
            raise AudioError(f"audio {name}: {frames} mel frames ({seconds:.2f} s), more than the engine's limit of "
                             f"{self.max_frames} ({self.max_seconds:g} s)")
        if frames < self.min_frames:
            raise AudioError(f"audio {name}: {frames} mel frames ({seconds:.2f} s), fewer than the engine's "
                             f"min_mel_frames {self.min_frames}")
        return PendingClip(key, name, self.extractor(waveform).features, frames, seconds)

    def tokens_of(self, clip: PendingClip) -> int:
        """The audio tokens a clip takes in the prompt (rows encoders only)."""
        return self.adapter.token_count(clip.frames)

    def encode(self, clips: list[PendingClip], cached: bool = True) -> list[EncodedClip]:
        """cached=False: not kept (a long recording's windows, each read by its own decodes only: kept,
        they would hold the whole recording's keys and values)."""
        started = time.perf_counter()
        encoded, missing = self.cache.encode(clips, self._run) if cached else (self._run(clips), clips)
        if self.profiler:
            if missing:
                self.profiler.stages["audio_encode"].append((time.perf_counter() - started) * 1000)
                self.profiler.add_seconds("audio_encoded_seconds", sum(c.seconds for c in missing))
            self.profiler.count("clips", len(clips))
            self.profiler.add_seconds("audio_seconds", sum(c.seconds for c in clips))
        return encoded

    def _run(self, clips: list[PendingClip]) -> list[EncodedClip]:
        frames = [clip.frames for clip in clips]
        outputs = self.session.run(self.adapter.feeds([clip.features for clip in clips], frames,
                                                      self.session.input_dtype("input_features")))
        if self.cross_attention:  # cross_key_i, cross_value_i per decoder layer
            pairs = list(zip(outputs[0::2], outputs[1::2]))
            return [EncodedClip(cross=[(key[i], value[i]) for key, value in pairs]) for i in range(len(clips))]
        bounds = np.cumsum([0] + [self.adapter.token_count(n) for n in frames])
        return [EncodedClip(embeds=outputs[0][start:stop]) for start, stop in zip(bounds[:-1], bounds[1:])]
