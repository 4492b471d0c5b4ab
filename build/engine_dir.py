"""Write the engine directory's non-graph parts: manifest, embedding table, tokenizer, configs.

    ENGINE_DIR/
      manifest.json         format version, backend, build config, model dims, components, tool versions
      llm/                  model.onnx (+ .data), the backend's engine, config.json, embedding.safetensors
      tokenizer/            tokenizer files, chat template, generation_config.json
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from safetensors.torch import save_file

from trt_llm.build.checkpoint import Checkpoint, eos_token_ids

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def tool_versions() -> dict[str, str]:
    versions = {}
    for package in ("trt-llm", "torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_tokenizer(checkpoint: Checkpoint, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint.tokenizer.save_pretrained(directory)
    checkpoint.generation_config.to_json_file(directory / "generation_config.json")


def write_embedding(checkpoint: Checkpoint, path: Path, dtype) -> None:
    # The runtime does the embedding lookup itself (so image/audio rows can be inserted later).
    table = checkpoint.model.get_input_embeddings().weight.detach().to(dtype).contiguous()
    save_file({"embedding": table}, str(path))


def write_manifest(engine_dir: Path, *, build_config: dict, checkpoint: Checkpoint, dims: dict,
                   components: dict, lora_layout: dict | None = None, eagle: dict | None = None) -> dict:
    manifest = {
        "format_version": FORMAT_VERSION,
        "backend": build_config["backend"],
        "build_config": build_config,
        "model": {
            "source": checkpoint.source,
            "family": checkpoint.family.name,
            "architecture": (checkpoint.model.config.architectures or [None])[0],
            "dtype": build_config["dtype"],
            "dims": dims,
            "eos_token_ids": eos_token_ids(checkpoint),
            "eagle": eagle,
        },
        "limits": {
            "max_batch_size": build_config["max_batch_size"],
            "max_input_len": build_config["max_input_len"],
            "max_kv_cache_capacity": build_config["max_kv_cache_capacity"],
        },
        "components": components,
        "lora": lora_layout,
        "tool_versions": tool_versions(),
    }
    (engine_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
