"""What each engine loads (an engine directory, a GenAI model folder, a GGUF file), built once and cached.

A build runs as its own process (the command a user would type), timed by wall clock, with its peak RSS;
the time is stored beside the result and reported again while the cache is valid. A stamp records what
the result was built from; when that changes (or with --rebuild) it is built again.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path


class BuildFailed(RuntimeError):
    pass


@dataclass
class Context:
    """What the engines are prepared from."""

    hf_dir: Path
    work_dir: Path  # artifacts of this checkpoint live here
    threads: int
    max_batch: int
    max_input: int  # the longest prompt
    capacity: int  # prompt + generated tokens
    rebuild: bool = False
    # A ready Q4_0 GGUF of this model (sidebyside/qwen_coder_gguf.py: llama.cpp's own requantization), which
    # llama.cpp-Q4_0 and trt-llm-int4 then run; None: gguf_convert.py writes one from hf_dir (Llama only).
    gguf: Path | None = None


@dataclass
class Artifact:
    path: Path  # what the engine's runner loads
    precision: str  # of the weights as the engine computes with them: fp32, Q4_1, ...
    build: dict | None = None  # seconds, peak_rss_mb, cached, built_at, what; None: nothing to build
    notes: list[str] = field(default_factory=list)


def cached_build(ctx: Context, name: str, out: Path, key: dict, build, what: str) -> dict:
    """Reuse `out` when its stamp matches `key`; otherwise run build() -> run_timed's dict and stamp it."""
    stamp_path = ctx.work_dir / f"{name}.stamp.json"
    key = json.loads(json.dumps(key, default=str))
    if not ctx.rebuild and out.exists() and stamp_path.is_file():
        try:
            stamp = json.loads(stamp_path.read_text())
        except ValueError:
            stamp = {}
        if stamp.get("key") == key and "build" in stamp:
            return {**stamp["build"], "cached": True}
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    stamp_path.unlink(missing_ok=True)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    from .measure import log

    log(f"{what} -> {out}")
    done = build()
    if done["returncode"] != 0 or not out.exists():
        log_path = ctx.work_dir / f"{name}.log"
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.is_file() else ""
        raise BuildFailed(f"{what} failed (exit {done['returncode']}); see {log_path}\n{tail}")
    info = {"seconds": done["seconds"], "peak_rss_mb": done["peak_rss_mb"],
            "built_at": time.strftime("%Y-%m-%d %H:%M:%S"), "what": what}
    stamp_path.write_text(json.dumps({"key": key, "build": info}, indent=2) + "\n")
    log(f"  done in {done['seconds']:.1f} s, peak RSS {done['peak_rss_mb']:.0f} MB")
    return {**info, "cached": False}


def source_hash(*paths: Path) -> str:
    """A hash of source files (a change means a rebuild)."""
    import hashlib

    digest = hashlib.sha256()
    for root in paths:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for file in files:
            name = file.relative_to(root) if root.is_dir() else file.name
            digest.update(str(name).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def size_mb(path: Path) -> float:
    """On disk: a file, or the files of a folder (an engine directory's tokenizer included)."""
    path = Path(path)
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6


def prepare_engines(keys: list[str], ctx: Context, notes: list[str], log) -> dict:
    """{report name: its entry} of the engines `keys` (sidebyside/peers/), each built once (cached); an
    engine whose package is missing or whose build fails is left out with a note saying why (ours'
    failure is raised: without it there is nothing to compare)."""
    from . import peers

    engines = {}
    for key in keys:
        module = peers.load(key)
        reason = module.missing(ctx)
        if reason is None:
            try:
                artifact = module.prepare(ctx)
            except Exception as error:
                if key == "ours":
                    raise
                reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            else:
                engines[module.NAME] = {"key": key, "batched": module.BATCHED,
                                        "batch_note": getattr(module, "BATCH_NOTE", None),
                                        "precision": artifact.precision, "artifact": str(artifact.path),
                                        "disk_mb": round(size_mb(artifact.path), 1), "build": artifact.build}
                notes += [f"{module.NAME}: {note}" for note in artifact.notes]
        if reason is not None:
            notes.append(f"{module.NAME} skipped: {reason}")
            log(notes[-1])
    return engines
