"""Read an engine directory's manifest and refuse, clearly, one this runtime cannot serve."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
RUNNABLE_BACKENDS = ("cpu", "tensorrt", "tensorrt-rtx")  # the TensorRT ones need their module and a GPU


def backend_missing(backend: str) -> str | None:
    """Why engines of `backend` cannot run on this machine, or None when they can."""
    if backend == "cpu":
        return None
    if backend in ("tensorrt", "tensorrt-rtx"):
        from trt_llm.runtime.trt_import import runtime_missing

        return runtime_missing(backend)
    return f"this runtime runs {', '.join(RUNNABLE_BACKENDS)}"


class EngineDirError(ValueError):
    pass


@dataclass
class EngineDir:
    path: Path
    manifest: dict

    @classmethod
    def open(cls, path: str | Path) -> "EngineDir":
        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise EngineDirError(f"engine directory {str(path)!r}: no manifest.json (build one with trt-llm-build)")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise EngineDirError(f"{manifest_path}: unreadable manifest: {error}") from error
        if manifest.get("kind") == "bundle":
            raise EngineDirError(f"{path}: a portable bundle, not an engine directory; compile it first: "
                                 f"trt-llm-compile {path} --backend cpu -o ENGINE_DIR")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise EngineDirError(
                f"{manifest_path}: engine format version {version!r}, this runtime reads version "
                f"{FORMAT_VERSION}; rebuild the engine with this version of trt-llm-build")
        backend = manifest.get("backend")
        why = backend_missing(backend) if isinstance(backend, str) else "no backend named"
        if why:
            raise EngineDirError(f"{manifest_path}: backend {backend!r} cannot run here: {why}")
        built_with = manifest.get("components", {}).get("llm", {}).get("tensorrt_version")
        if built_with is not None:
            from trt_llm.runtime.trt_import import import_tensorrt

            running = import_tensorrt(backend).__version__
            if running != built_with:  # plans are tied to the exact TensorRT version that built them
                raise EngineDirError(
                    f"{manifest_path}: the engine was built with {backend} {built_with}, this machine "
                    f"has {running}; rebuild it with trt-llm-build here")
        engine = cls(path, manifest)
        for name in ("engine", "embedding"):
            if not engine.component_path("llm", name).is_file():
                raise EngineDirError(f"{path}: missing {manifest['components']['llm'][name]}")
        return engine

    @property
    def identity(self) -> str:
        """Names this engine (its manifest and weights file size): keys what is cached for it."""
        import hashlib

        digest = hashlib.sha256((self.path / "manifest.json").read_bytes())
        digest.update(str(self.component_path("llm", "engine").stat().st_size).encode())
        data = self.path / (self.manifest["components"]["llm"]["graph"] + ".data")
        if data.is_file():
            digest.update(str(data.stat().st_size).encode())
        return digest.hexdigest()[:32]

    def component_path(self, component: str, key: str) -> Path:
        return self.path / self.manifest["components"][component][key]

    @property
    def dims(self) -> dict:
        return self.manifest["model"]["dims"]

    @property
    def limits(self) -> dict:
        return self.manifest["limits"]

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.manifest["model"]["eos_token_ids"])

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / self.manifest["components"]["tokenizer"]["dir"]
