"""The export of an audio model's encoder: the engine's `audio/` component.

    audio/model.onnx                 the encoder's graph (the exporter its family's face names)
    audio/config.json                what the runtime needs to feed it: the feature extractor
                                     (runtime/media/audio/features.py's keys), the encoder's window, the
                                     clip limits of `audio:` and the family's own entries
    audio/preprocessor_config.json   the checkpoint's feature extractor settings, as transformers has them

The manifest's entry names the component's runtime adapter (trt_llm/families/adapters.py), which
feeds the graph and says what comes out of it:
- rows (Qwen2-Audio, Qwen3-ASR): the tower and projector give each clip's rows, which the decoder
  reads at the clip's audio placeholder tokens (trt_llm/families/qwen2_audio/audio_tower.py,
  trt_llm/families/qwen3_asr/audio_tower.py);
- cross-attention (Whisper): the encoder gives each decoder layer's cross-attention keys and
  values, computed once per request (trt_llm/families/whisper/graphs.py).

Qwen2-Audio's and Qwen3-ASR's encoders stay in floating point whatever `quantization:` says, as the
vision tower does. Whisper's follows it: the bundle hands its linear factory to the family's
`export_audio` (trt_llm/families/whisper/graphs.py: the encoder's linears and the cross k / v projections
quantized, its convolutions float), as CTranslate2's int8 quantizes the encoder too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# WhisperFeatureExtractor's settings where a checkpoint ships no preprocessor_config.json (the
# published Qwen2-Audio and Whisper files; large-v3 and Qwen2-Audio use 128 mel bins).
WHISPER_PREPROCESSOR = {"feature_extractor_type": "WhisperFeatureExtractor", "sampling_rate": 16000,
                        "hop_length": 160, "n_fft": 400, "chunk_length": 30, "padding_value": 0.0}


def export_audio_component(checkpoint, config, directory: Path, dtype: torch.dtype, make_linear=None) -> dict:
    """Write the audio component of `checkpoint` into `directory`; returns its manifest entry.
    make_linear: the build's linear factory for a family whose encoder is quantized (Whisper); None: float."""
    from importlib import import_module

    from trt_llm.runtime.media.audio.features import config_from_preprocessor

    directory.mkdir(parents=True, exist_ok=True)
    module = import_module(checkpoint.family.audio.exporter)
    extra = {} if make_linear is None else {"make_linear": make_linear}
    family_settings = module.export_audio(checkpoint.model, directory / "model.onnx", dtype, **extra)
    preprocessor = _preprocessor_config(checkpoint, family_settings["num_mel_bins"])
    settings = {"family": checkpoint.family.name, **family_settings, **config_from_preprocessor(preprocessor),
                **config.audio.model_dump()}
    (directory / "config.json").write_text(json.dumps(settings, indent=1) + "\n")
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1) + "\n")
    return {"graph": "audio/model.onnx", "config": "audio/config.json", "adapter": checkpoint.family.audio.adapter,
            "preprocessor": "audio/preprocessor_config.json"}


def _preprocessor_config(checkpoint, num_mel_bins: int) -> dict:
    """The checkpoint's feature extractor settings (build/processor_files.py: the feature extractor's entry of
    its processor_config.json, where transformers 5 saves a processor's parts: Qwen3-ASR's, Gemma 4's,
    else its preprocessor_config.json), else WhisperFeatureExtractor's settings with the encoder's mel bins."""
    from trt_llm.build.processor_files import processor_part

    found = processor_part(checkpoint.source, "feature_extractor")
    if found is None:
        return {**WHISPER_PREPROCESSOR, "feature_size": num_mel_bins}
    preprocessor, path = found
    if preprocessor.get("feature_size", num_mel_bins) != num_mel_bins:
        raise ValueError(f"{path}: feature_size {preprocessor['feature_size']} is not the audio encoder's "
                         f"num_mel_bins {num_mel_bins}")
    return preprocessor
