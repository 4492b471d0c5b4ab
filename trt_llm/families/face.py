"""A model family's declared face: what the build, the manifest, the runtime and the server know of
it, in one frozen record per HF architecture. Torch-free: the runtime reads it too.

The face names code, it does not import it: the decoder's graph module and each encoder's exporter
are the build's (torch), imported by the build only; each component's runtime adapter is a name in
`trt_llm.families.adapters`, which the manifest records and the runtime looks up.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType


@dataclass(frozen=True)
class Component:
    """An encoder beside the decoder (a vision tower, an audio encoder)."""
    exporter: str  # the build's module (import path) whose export writes the component's graph
    adapter: str  # its runtime adapter's name in trt_llm.families.adapters.ADAPTERS


@dataclass(frozen=True)
class Family:
    name: str  # the manifest's model.family
    architecture: str  # the HF class the manifest names (a GGUF's config lists none)
    decoder: str  # the build's module (import path) that builds the decoder's graph
    # What the decoder's requests are: "chat" (a chat template's prompt) or "transcription" (an
    # encoder-decoder's prompt of task tokens over a clip: Whisper).
    task: str = "chat"
    # How the speech routes (/v1/audio/*) drive this family: "windowed" (Whisper: the long-form window
    # loop), "chat" (Qwen3-ASR: a chat request holding the clip), None (no speech routes).
    transcription: str | None = None
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before rotary (Qwen3, Gemma 3)
    # Gemma 2 / 3: norms scale by (1 + weight), four per layer (the attention's and the MLP's outputs
    # are normalised before the residual add), and the embedding is scaled by sqrt(hidden).
    gemma: bool = False
    # A vision-language decoder's positions: mRoPE [3, B, S], "sections" (Qwen2.5-VL's consecutive
    # chunks) or "interleaved" (Qwen3-VL's); None: one position per token.
    mrope: str | None = None
    # Gemma 3: the soft tokens of one image attend to each other both ways in the decoder (the prompt's
    # attention is causal elsewhere): its graph takes a mask of which new tokens each new token sees.
    bidirectional_images: bool = False
    # Its checkpoints may ship a multi-token-prediction head (`mtp.*` tensors: Qwen3.5's), which the
    # build makes the draft with `mtp: true` (build/mtp/)
    mtp: bool = False
    vision: Component | None = None
    audio: Component | None = None
    # An encoder-decoder (Whisper): its decoder module exports the llm/ graph itself (export_llm), a
    # decoder with cross-attention over the audio encoder's keys and values; no LoRA, draft or quantization.
    encoder_decoder: bool = False
    # The build's check of its (text decoder's) config, "module:function" (build/config_checks.py): a
    # family with layers of its own names one in its package
    checks: str = "trt_llm.build.config_checks:attention_layers"

    @property
    def multimodal(self) -> bool:
        """Loaded as the whole multimodal model (the decoder is its language model)."""
        return self.vision is not None or self.audio is not None

    def load(self) -> ModuleType:
        """The decoder's graph module (torch: the build's only)."""
        return import_module(self.decoder)
