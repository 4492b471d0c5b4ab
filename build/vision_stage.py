"""The export of a vision-language model's vision tower: the engine's `vision/` component.

    vision/model.onnx                the tower's graph (the exporter its family's face names), any
                                     number and size of images
    vision/config.json               what the runtime needs to feed it and place its rows
    vision/preprocessor_config.json  the checkpoint's image processor settings

The tower stays in floating point whatever `quantization:` says (its matmuls are a small part of a
request's time and the most sensitive to rounding); `vision:` sets the image token limits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def export_vision_component(checkpoint, config, directory: Path, dtype: torch.dtype) -> dict:
    """Write the vision component of `checkpoint` into `directory`; returns its manifest entry. The
    family's exporter (its face's vision.exporter) writes the graph and gives its config entries."""
    from importlib import import_module

    directory.mkdir(parents=True, exist_ok=True)
    module = import_module(checkpoint.family.vision.exporter)
    family_settings = module.export_vision(checkpoint.model, directory / "model.onnx", dtype)
    settings = {"family": checkpoint.family.name, **family_settings, **config.vision.model_dump()}
    (directory / "config.json").write_text(json.dumps(settings, indent=1) + "\n")
    preprocessor = _preprocessor_config(checkpoint, module.DEFAULT_PREPROCESSOR)
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1) + "\n")
    return {"graph": "vision/model.onnx", "config": "vision/config.json", "adapter": checkpoint.family.vision.adapter,
            "preprocessor": "vision/preprocessor_config.json"}


def _preprocessor_config(checkpoint, defaults: dict) -> dict:
    """The checkpoint's image processor settings (build/processor_files.py: the image processor's entry of
    its processor_config.json, else its preprocessor_config.json), else the family's defaults."""
    from trt_llm.build.processor_files import processor_part

    found = processor_part(checkpoint.source, "image_processor")
    return found[0] if found is not None else dict(defaults[checkpoint.family.name])
