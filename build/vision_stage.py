"""The export of a vision-language model's vision tower: the engine's `vision/` component.

    vision/model.onnx                the tower's graph (build/models/qwen_vl_vision.py), any number
                                     and size of images
    vision/config.json               what the runtime needs to feed it and place its rows
    vision/preprocessor_config.json  the checkpoint's image processor settings

The tower stays in floating point whatever `quantization:` says (its matmuls are a small part of a
request's time and the most sensitive to rounding); `vision:` sets the image token limits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Qwen-VL's image processor settings where a checkpoint ships none (transformers' class defaults are
# Qwen2-VL's, patch 14; Qwen3-VL uses 16 with mean/std 0.5).
DEFAULT_PREPROCESSOR = {
    "qwen2_5_vl": {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "min_pixels": 3136, "max_pixels": 12845056},
    "qwen3_vl": {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
}


def export_vision_component(checkpoint, config, directory: Path, dtype: torch.dtype) -> dict:
    """Write the vision component of `checkpoint` into `directory`; returns its manifest entry."""
    from trt_llm.build.export import export_vision
    from trt_llm.build.models.qwen_vl_vision import VisionGraph

    directory.mkdir(parents=True, exist_ok=True)
    hf = checkpoint.model
    graph = VisionGraph(hf.model.visual, dtype)
    export_vision(graph, directory / "model.onnx", dtype)
    settings = {
        "family": checkpoint.family.name,
        "windowed": graph.windowed,
        "patch_size": graph.patch_embed.patch_size,
        "temporal_patch_size": graph.patch_embed.temporal_patch_size,
        "in_channels": graph.patch_embed.in_channels,
        "merge_size": graph.merge,
        "window_size": graph.window_size,
        "grid_per_side": graph.grid_per_side,
        "out_hidden_size": hf.config.vision_config.out_hidden_size,
        "deepstack_layers": len(graph.deepstack_layers),
        "image_token_id": hf.config.image_token_id,
        "video_token_id": getattr(hf.config, "video_token_id", None),
        "vision_start_token_id": hf.config.vision_start_token_id,
        **config.vision.model_dump(),
    }
    (directory / "config.json").write_text(json.dumps(settings, indent=1) + "\n")
    preprocessor = _preprocessor_config(checkpoint)
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1) + "\n")
    return {"graph": "vision/model.onnx", "config": "vision/config.json",
            "preprocessor": "vision/preprocessor_config.json"}


def _preprocessor_config(checkpoint) -> dict:
    """The checkpoint folder's preprocessor_config.json, else the family's defaults."""
    path = Path(checkpoint.source).expanduser() / "preprocessor_config.json"
    if path.is_file():
        return json.loads(path.read_text())
    return dict(DEFAULT_PREPROCESSOR[checkpoint.family.name])
