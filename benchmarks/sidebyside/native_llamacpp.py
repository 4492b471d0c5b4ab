"""Native llama.cpp, built from source once and cached: the benchmark's anchor (issue 44 item 6).

    python benchmarks/sidebyside/native_llamacpp.py [--version 0.3.36] [--cache-dir DIR]   # build, print the stamp

The source is the llama.cpp tree that llama-cpp-python's sdist vendors (vendor/llama.cpp), fetched from
PyPI (`pip download llama-cpp-python==V --no-binary :all: --no-deps`), so nothing but PyPI is needed.
It is built with llama.cpp's own defaults (Release, GGML_NATIVE on: -march=native, OpenMP, llamafile
kernels, CPU repacking) and nothing switched on or off but the build type, the commit name (the sdist has
no .git; its CHANGELOG names the llama.cpp commit) and the targets: llama-bench and llama-quantize only
(the default configure fetches nothing: the OpenMP download is Windows-only, BoringSSL / LibreSSL are off,
the web UI's download is the server's target, not built). `llama-bench` does not print
llama_print_system_info's line, so a 5-line C program linked to the built libllama prints it.

Everything lands in DIR/llama.cpp-V/ (DIR: ~/.cache/trt-llm-bench); stamp.json records the version, the
commit, compiler, CMake flags, the CPU backend's compile flags, system info and the build's wall time.
A valid stamp means no rebuild.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "0.3.36"  # the version issue 44 measured
TARGETS = ("llama-bench", "llama-quantize")
CACHE = Path.home() / ".cache" / "trt-llm-bench"
SYSINFO_C = '#include "llama.h"\n#include <stdio.h>\nint main(void) { puts(llama_print_system_info()); return 0; }\n'


class NativeBuildFailed(RuntimeError):
    pass


def _run(cmd: list[str], log_path: Path, cwd: Path | None = None) -> None:
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        log.flush()
        done = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise NativeBuildFailed(f"{cmd[0]} {cmd[1]} failed (exit {done.returncode}); see {log_path}\n{tail}")


def fetch_sdist(version: str, into: Path, log_path: Path) -> tuple[str, Path, str | None]:
    """(version got, the sdist, a note): the asked version, else the newest PyPI has, said so."""
    into.mkdir(parents=True, exist_ok=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if found:
        return found[0].name[len("llama_cpp_python-"):-len(".tar.gz")], found[0], None
    base = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            "-d", str(into)]
    note = None
    try:
        _run([*base, f"llama-cpp-python=={version}"], log_path)
    except NativeBuildFailed:
        note = f"llama-cpp-python {version} is not on PyPI here: the newest sdist was used"
        _run([*base, "llama-cpp-python"], log_path)
    sdist = sorted(into.glob("llama_cpp_python-*.tar.gz"))[-1]
    return sdist.name[len("llama_cpp_python-"):-len(".tar.gz")], sdist, note


def vendored_commit(sdist_root: Path) -> str:
    """The llama.cpp commit the sdist vendors: its CHANGELOG's first 'update llama.cpp to ...@SHA' line."""
    changelog = sdist_root / "CHANGELOG.md"
    if changelog.is_file():
        found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", changelog.read_text(errors="replace"))
        if found:
            return found.group(1)
    return "unknown"


def _cache_entries(build: Path) -> dict:
    """The CMake cache's GGML_* / LLAMA_* / CMAKE_BUILD_TYPE / compiler entries: the flags as configured."""
    entries = {}
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"^((?:GGML|LLAMA)_[A-Z0-9_]+|CMAKE_BUILD_TYPE|CMAKE_C_COMPILER|CMAKE_CXX_COMPILER):\w+=(.*)$",
                     line)
        if m:
            entries[m.group(1)] = m.group(2)
    return entries


def _cpu_compile_flags(build: Path) -> str | None:
    """The flags ggml's CPU backend is compiled with (-march=native with GGML_NATIVE)."""
    for flags in build.rglob("ggml-cpu.dir/flags.make"):
        text = flags.read_text()
        parts = [m.group(1).strip() for m in re.finditer(r"^C_(?:FLAGS|DEFINES) = (.*)$", text, re.M)]
        return " ".join(parts)
    return None


def ensure(version: str = VERSION, cache_dir: Path = CACHE, rebuild: bool = False, log=print) -> dict:
    """The built tools and their stamp (built now, or found cached)."""
    root = Path(cache_dir).expanduser() / f"llama.cpp-{version}"
    stamp_path = root / "stamp.json"
    if not rebuild and stamp_path.is_file():
        stamp = json.loads(stamp_path.read_text())
        if all(Path(p).is_file() for p in stamp["tools"].values()):
            return {**stamp, "cached": True}
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "build.log"
    log_path.write_text("")
    started = time.perf_counter()
    log(f"llama.cpp: fetching llama-cpp-python {version}'s sdist from PyPI")
    got, sdist, note = fetch_sdist(version, root / "sdist", log_path)
    src = root / "src"
    if src.exists():
        shutil.rmtree(src)
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    sdist_root = next(src.iterdir())
    tree = sdist_root / "vendor" / "llama.cpp"
    commit = vendored_commit(sdist_root)
    fetched = time.perf_counter()
    build = root / "build"
    if build.exists():
        shutil.rmtree(build)
    cmake_args = ["-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_BUILD_COMMIT={commit}"]
    log(f"llama.cpp {commit}: cmake configure ({' '.join(cmake_args)}), build {', '.join(TARGETS)} -j 2")
    _run(["cmake", "-S", str(tree), "-B", str(build), *cmake_args], log_path)
    _run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", "2"], log_path)
    bin_dir = build / "bin"
    # llama_print_system_info's line, from the very libllama llama-bench links.
    lib = next((p.parent for p in build.rglob("libllama.so*")), None)
    sysinfo = root / "sysinfo"
    link = ["-L", str(lib), f"-Wl,-rpath,{lib}", "-lllama"] if lib else []
    (root / "sysinfo.c").write_text(SYSINFO_C)
    if lib:
        ggml_libs = sorted({p.parent for p in build.rglob("libggml*.so*")})
        for folder in ggml_libs:
            link += ["-L", str(folder), f"-Wl,-rpath,{folder}"]
        _run(["gcc", str(root / "sysinfo.c"), "-I", str(tree / "include"), "-I", str(tree / "ggml" / "include"),
              "-o", str(sysinfo), *link, "-lggml", "-lggml-base"], log_path)
    seconds = time.perf_counter() - started
    compiler = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    stamp = {
        "llama_cpp_python_version": got, "asked_version": version, "note": note, "sdist": str(sdist),
        "llama_cpp_commit": commit, "cmake_args": cmake_args, "targets": list(TARGETS), "compiler": compiler,
        "cmake": subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "cmake_cache": _cache_entries(build), "cpu_backend_flags": _cpu_compile_flags(build),
        "system_info": (subprocess.run([str(sysinfo)], capture_output=True, text=True).stdout.strip()
                        if sysinfo.is_file() else None),
        "tools": {t: str(bin_dir / t) for t in TARGETS},
        "build_seconds": round(seconds, 1), "fetch_seconds": round(fetched - started, 1),
        "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"llama.cpp built in {seconds:.0f} s (fetch {fetched - started:.0f} s): {stamp['system_info']}")
    return {**stamp, "cached": False}


def binding_paths(stamp: dict) -> tuple[Path, Path] | None:
    """(the sdist's llama_cpp package folder's parent, the folder of the built libllama.so), or None.

    llama-cpp-python is ctypes over libllama: its Python code from the same sdist, pointed at this build
    by LLAMA_CPP_LIB_PATH, is the binding as pip would install it, minus a second compile (minutes on 2
    cores) and with the very native code llama-bench runs: the two differ by the binding alone."""
    root = Path(stamp["sdist"]).parent.parent
    package = next((p.parent.parent for p in (root / "src").glob("*/llama_cpp/__init__.py")), None)
    lib = next((p.parent for p in (root / "build").rglob("libllama.so")), None)
    return (package, lib) if package and lib else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default=VERSION)
    p.add_argument("--cache-dir", type=Path, default=CACHE)
    p.add_argument("--rebuild", action="store_true")
    args = p.parse_args(argv)
    try:
        stamp = ensure(args.version, args.cache_dir, args.rebuild, log=lambda m: print(m, file=sys.stderr))
    except NativeBuildFailed as error:
        print(f"native_llamacpp: {error}", file=sys.stderr)
        return 1
    print(json.dumps(stamp, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
