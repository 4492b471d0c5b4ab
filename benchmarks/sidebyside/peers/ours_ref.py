"""trt-llm at another commit (--ours-ref DIR: a source checkout, e.g. `git worktree add /tmp/ref <commit>`),
built and run exactly as `ours` is, beside the current tree in the same interleaved run: a change's
before and after in one measurement.

The checkout is imported through a small package folder of symlinks laid out as its pyproject.toml
maps it (trt_llm.runtime -> runtime/, ...), put first on PYTHONPATH for its build and its worker, so
the installed (current) trt_llm stays out of the way."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from ..artifacts import Artifact, Context, cached_build, source_hash
from ..measure import run_timed
from . import ours

NAME = "trt-llm (ref)"
BATCHED = True
ENV = "TRT_LLM_BENCH_REF"  # decode_speed.py --ours-ref sets it


def _source() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value).resolve() if value else None


def missing(ctx: Context) -> str | None:
    source = _source()
    if source is None:
        return "no reference checkout (decode_speed.py --ours-ref DIR)"
    if not (source / "pyproject.toml").is_file():
        return f"{source} is not a trt-llm checkout"
    return None


def commit() -> str:
    done = subprocess.run(["git", "-C", str(_source()), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


def worker_pythonpath() -> str:
    """The package folder of the checkout, made once per checkout."""
    source = _source()
    shim = Path(os.environ.get("TMPDIR", "/tmp")) / f"trt-llm-ref-{commit()}"
    package_dirs = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    (shim / "trt_llm").mkdir(parents=True, exist_ok=True)
    for package, folder in package_dirs.items():
        if package == "trt_llm":
            for item in (source / folder).iterdir():
                link = shim / "trt_llm" / item.name
                if not link.exists():
                    link.symlink_to(item)
        else:
            link = shim / "trt_llm" / package.split(".", 1)[1]
            if not link.exists():
                link.symlink_to(source / folder)
    return str(shim)


def prepare(ctx: Context) -> Artifact:
    import yaml

    out = ctx.work_dir / f"trt-llm-ref-engine-{commit()}"
    config = {"model": str(ctx.hf_dir), "output_dir": str(out), "backend": "cpu", "dtype": "fp32",
              "max_batch_size": ctx.max_batch, "max_input_len": ctx.max_input,
              "max_kv_cache_capacity": ctx.capacity}
    config_path = ctx.work_dir / "trt-llm-ref-build.yaml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (worker_pythonpath(), os.environ.get("PYTHONPATH"))
                                                       if p)}

    def build():
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        return run_timed([sys.executable, "-m", "trt_llm.build.cli", str(config_path), "--quiet"],
                         ctx.work_dir / "trt-llm-ref-engine.log", env=env)

    info = cached_build(ctx, f"trt-llm-ref-engine-{commit()}", out,
                        {"config": config, "builder": source_hash(_source() / "build", _source() / "plugins")},
                        build, f"trt-llm-build at {commit()} (cpu backend, fp32)")
    return Artifact(path=out, precision="fp32", build=info)


Runner = ours.Runner  # the same calls; ours.Runner finds them where either version keeps them
