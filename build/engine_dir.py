"""The engine directory and the portable bundle: their layout and manifest, written and read.

    ENGINE_DIR/
      manifest.json         kind "engine", format version, backend, build config, model dims,
                            components, limits, tool versions
      llm/                  model.onnx (+ .data), the backend's engine, config.json, embedding.safetensors
                            (a quantized cpu engine: its optimised graph alone, with every weight; a GGUF's
                            tied head also the embedding: build/tied_embedding.py)
      draft/                EAGLE3 draft: model.onnx (+ .data), its engine, tensors.safetensors
      tokenizer/            tokenizer files, chat template, generation_config.json

A bundle (`trt-llm-build --export-only`) is the same folder before compilation: kind "bundle",
backend null, no engine files. `trt-llm-compile` turns it into an engine directory on the device,
so this module imports neither transformers nor the checkpoint loaders.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from trt_llm.schemas.manifest import FORMAT_VERSION, ManifestError, validate_manifest

MANIFEST = "manifest.json"
BUNDLE, ENGINE = "bundle", "engine"
TOOLS = ("trt-llm", "torch", "transformers", "onnx", "onnxscript", "onnxruntime")


class BundleError(ValueError):
    """A folder that is not a usable bundle; the message says what is wrong and what to do."""


def tool_versions() -> dict[str, str]:
    """Versions of the installed tools (read from package metadata, nothing is imported)."""
    versions = {}
    for package in TOOLS:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_manifest(directory: Path, manifest: dict) -> dict:
    """Write `manifest` after validating it with the runtime's own model (schemas/manifest.py): a
    build never writes what the runtime would refuse."""
    validate_manifest(manifest, f"{directory}/{MANIFEST} (as built)")
    (Path(directory) / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_bundle(directory: str | Path) -> dict:
    """The manifest of the bundle in `directory`, after checking it is one and its files are there."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise BundleError(f"bundle {str(directory)!r}: no such directory")
    if not path.is_file():
        raise BundleError(f"bundle {str(directory)!r}: no {MANIFEST} (write one with trt-llm-build CONFIG --export-only)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{path}: unreadable manifest: {error}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: unreadable manifest: not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path}: format version {manifest.get('format_version')!r}, this version reads "
                          f"{FORMAT_VERSION}; export the bundle again with this version of trt-llm-build")
    kind = manifest.get("kind", ENGINE)
    if kind != BUNDLE:
        raise BundleError(f"{directory}: an engine directory already compiled for {manifest.get('backend')!r}, not a "
                          "bundle; trt-llm-compile takes the folder that trt-llm-build --export-only writes")
    try:
        validate_manifest(manifest, str(path))  # the runtime's model: every section and path it reads
    except ManifestError as error:
        raise BundleError(str(error)) from None
    components = manifest["components"]
    files = [(name, key, value) for name, entry in components.items() if isinstance(entry, dict)
             for key, value in entry.items() if key in ("graph", "embedding", "config", "tensors", "dir")]
    for name, key, relative in files:
        target = directory / relative
        if not (target.is_dir() if key == "dir" else target.is_file()):
            raise BundleError(f"{directory}: missing {relative} ({name} {key}); the bundle is incomplete")
        if key == "graph" and not target.with_name(target.name + ".data").is_file():
            raise BundleError(f"{directory}: missing {relative}.data ({name} weights); the bundle is incomplete")
    return manifest
