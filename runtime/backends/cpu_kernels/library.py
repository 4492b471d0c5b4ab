"""Our kernels' shared library: compiled from the C files beside this one into a per-user cache.

Compiled once per source, header and compiler (the key names the folder), by `cc` (or $CC) with no
-march: the VNNI path is chosen at run time by the CPU's flags (function target attributes), so one
library serves every x86-64 host, and other hosts get the plain C path. A build is written whole
(a temporary file renamed) under a lock, so two processes building at once leave one good library.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from trt_llm.runtime.backends.cpu_kernels import headers

FOLDER = Path(__file__).parent
NAME = "libtrt_llm_cpu.so"
FLAGS = ("-O3", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter")
CACHE_ENV = "TRT_LLM_KERNEL_CACHE"


class LibraryUnavailable(RuntimeError):
    pass


def cache_folder() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trt-llm" / "cpu-kernels"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def library(download: bool = False) -> Path:
    """The library for this source, compiled first where the cache has none (download: fetch the
    header if it is not cached yet; the runtime never does). Raises LibraryUnavailable with why."""
    folder = cache_folder()
    try:
        header = headers.header(folder / "include", download=download)
    except headers.HeaderUnavailable as error:
        raise LibraryUnavailable(str(error)) from None
    cc = compiler()
    if cc is None:
        raise LibraryUnavailable("no C compiler (cc, gcc or clang; or $CC)")
    sources = sorted(FOLDER.glob("*.c"))
    parts = [f.read_bytes() for f in (*sources, *sorted(FOLDER.glob("*.h")))]
    key = hashlib.sha256(b"\0".join([*parts, header.read_bytes(), cc.encode(), " ".join(FLAGS).encode()]))
    path = folder / key.hexdigest()[:16] / NAME
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():  # another process built it while this one waited
            return path
        partial = path.with_name(f".{NAME}.{os.getpid()}")
        command = [cc, *FLAGS, f"-I{header.parent}", "-o", str(partial), *map(str, sources), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            lines = result.stderr.strip().splitlines() or ["(no output)"]
            message = next((line for line in lines if "error" in line), lines[0])
            raise LibraryUnavailable(f"{' '.join(command)} failed: {message}")
        os.replace(partial, path)
    return path
