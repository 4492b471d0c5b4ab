"""The model families the build supports: a registry from the checkpoint's HF architecture to the
module that builds its graph, with the family's options.

Adding a Llama-shaped family (the same layers, maybe q/k norm) is one line in REGISTRY; a family of
another shape is a new module beside llama.py, built from layers.py, that exposes DecoderGraph and
ModelDims, and its line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class ModelFamily:
    name: str
    architecture: str  # the HF class the manifest names (a GGUF's config lists none)
    module: str  # build/models/<module>.py builds the graph
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before rotary (Qwen3, Gemma 3)
    # Gemma 2 / 3: norms scale by (1 + weight), four per layer (the attention's and the MLP's outputs
    # are normalised before the residual add), and the embedding is scaled by sqrt(hidden).
    gemma: bool = False
    # Vision-language models: the text decoder takes mRoPE positions [3, B, S] ("sections": Qwen2.5-VL's
    # consecutive chunks; "interleaved": Qwen3-VL's), and the checkpoint has a vision tower
    # (build/models/qwen_vl_vision.py) that becomes the engine's vision/ component.
    mrope: str | None = None
    # Audio-LLMs: the module of build/models/ whose graph is the checkpoint's audio tower (and
    # projector), the engine's audio/ component (build/audio_stage.py); its rows go in at the audio
    # placeholder tokens.
    audio: str | None = None
    # An encoder-decoder (Whisper): its module exports the llm/ graph itself (export_llm), a decoder
    # with cross-attention over the audio encoder's keys and values; no LoRA, draft or quantization.
    encoder_decoder: bool = False

    @property
    def vision(self) -> bool:
        return self.mrope is not None

    @property
    def multimodal(self) -> bool:
        """Loaded as the whole multimodal model (the decoder is its language model)."""
        return self.vision or self.audio is not None

    def load(self) -> ModuleType:
        from importlib import import_module

        return import_module(f"trt_llm.build.models.{self.module}")


REGISTRY: dict[str, ModelFamily] = {family.architecture: family for family in (
    ModelFamily("llama", "LlamaForCausalLM", "llama"),
    ModelFamily("qwen2", "Qwen2ForCausalLM", "llama"),
    ModelFamily("qwen3", "Qwen3ForCausalLM", "llama", qk_norm=True),
    ModelFamily("mistral", "MistralForCausalLM", "llama"),
    ModelFamily("ministral", "MinistralForCausalLM", "llama"),
    ModelFamily("phi3", "Phi3ForCausalLM", "llama"),
    ModelFamily("gemma2", "Gemma2ForCausalLM", "llama", gemma=True),
    ModelFamily("gemma3_text", "Gemma3ForCausalLM", "llama", qk_norm=True, gemma=True),
    # A Gemma 3 vision-language checkpoint: its text decoder (the vision tower is not built)
    ModelFamily("gemma3", "Gemma3ForConditionalGeneration", "llama", qk_norm=True, gemma=True),
    ModelFamily("qwen3_moe", "Qwen3MoeForCausalLM", "llama", qk_norm=True),
    ModelFamily("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "llama", mrope="sections"),
    ModelFamily("qwen3_vl", "Qwen3VLForConditionalGeneration", "llama", qk_norm=True, mrope="interleaved"),
    ModelFamily("qwen2_audio", "Qwen2AudioForConditionalGeneration", "llama", audio="qwen2_audio"),
    # Qwen3-ASR: a Qwen3 decoder (q/k norms) reading its audio encoder's rows (build/models/qwen3_asr.py)
    ModelFamily("qwen3_asr", "Qwen3ASRForConditionalGeneration", "llama", qk_norm=True, audio="qwen3_asr"),
    # A hybrid: Gated DeltaNet layers (recurrent states) and gated full attention (build/models/qwen3_5.py)
    ModelFamily("qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5", qk_norm=True),
    ModelFamily("qwen3_next", "Qwen3NextForCausalLM", "qwen3_5", qk_norm=True),  # the same, with experts
    # A Qwen3.5 vision-language checkpoint (how Qwen3.5 is published): its text decoder (the vision
    # tower is not built)
    ModelFamily("qwen3_5_vl", "Qwen3_5ForConditionalGeneration", "qwen3_5", qk_norm=True),
    # A hybrid of short gated convolutions (recurrent states) and attention (build/models/lfm2.py)
    ModelFamily("lfm2", "Lfm2ForCausalLM", "lfm2", qk_norm=True),
    ModelFamily("whisper", "WhisperForConditionalGeneration", "whisper", audio="whisper", encoder_decoder=True),
)}


class UnsupportedArchitecture(ValueError):
    pass


def family_for(config) -> ModelFamily:
    """The family of a HF config, by its `architectures` entry (or, without one, its model type)."""
    architectures = list(getattr(config, "architectures", None) or [])
    for architecture in architectures:
        if architecture in REGISTRY:
            return REGISTRY[architecture]
    # A config saved without `architectures` (a GGUF's) still names its model type.
    by_type = {family.name: family for family in REGISTRY.values()}
    if not architectures and getattr(config, "model_type", None) in by_type:
        return by_type[config.model_type]
    found = ", ".join(architectures) or f"model_type {getattr(config, 'model_type', None)!r}"
    raise UnsupportedArchitecture(f"unsupported architecture {found}; supported: {', '.join(sorted(REGISTRY))}")
