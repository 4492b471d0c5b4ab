"""The machine's memory read bandwidth for T threads: a STREAM-like read kernel in C, the decode roofline's
denominator.

    python benchmarks/sidebyside/bandwidth.py [--threads 2] [--mbytes 512]

A decode step at batch 1 streams every weight once, so tok/s x bytes read per token / this bandwidth is the
fraction of the roofline an engine reaches. The kernel sums `mbytes` of 64-bit integers (integer adds
vectorize without -ffast-math; 4x the Q4_0 SmolLM2 weights, far beyond the caches) with OpenMP over T
threads, each reading a contiguous slice it first touched itself; compiled with gcc -O3 -march=native
-fopenmp, once (cached by the source's hash). Reported: the best of `repeats` passes in GB/s (1e9 bytes),
and the median, since a shared machine moves it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "trt-llm-bench"
SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t n = (size_t)atol(argv[1]) * 1024 * 1024 / sizeof(uint64_t);
    int repeats = atoi(argv[2]);
    uint64_t *a = aligned_alloc(64, n * sizeof(uint64_t));
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;  /* first touch by the thread that reads it */
    printf("{\"threads\": %d, \"bytes\": %zu, \"seconds\": [", omp_get_max_threads(), n * sizeof(uint64_t));
    uint64_t check = 0;
    for (int r = 0; r < repeats; r++) {
        uint64_t s = 0;
        double t = omp_get_wtime();
        #pragma omp parallel for schedule(static) reduction(+:s)
        for (size_t i = 0; i < n; i++) s += a[i];
        t = omp_get_wtime() - t;
        check += s;
        printf("%s%.9f", r ? ", " : "", t);
    }
    printf("], \"check\": %llu}\n", (unsigned long long)check);  /* keeps the sums live */
    return 0;
}
"""
FLAGS = ["-O3", "-march=native", "-fopenmp"]


def build(cache_dir: Path = CACHE) -> Path:
    digest = hashlib.sha256((SOURCE + " ".join(FLAGS)).encode()).hexdigest()[:12]
    exe = Path(cache_dir).expanduser() / "stream-read" / f"stream_read-{digest}"
    if not exe.is_file():
        exe.parent.mkdir(parents=True, exist_ok=True)
        src = exe.with_suffix(".c")
        src.write_text(SOURCE)
        subprocess.run(["gcc", *FLAGS, str(src), "-o", str(exe)], check=True)
    return exe


def measure(threads: int, mbytes: int = 512, repeats: int = 10, cache_dir: Path = CACHE) -> dict:
    """{gb_s (best), gb_s_median, threads, mbytes, command, compiler flags}."""
    import statistics

    exe = build(cache_dir)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [str(exe), str(mbytes), str(repeats)]
    out = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    rates = [out["bytes"] / s / 1e9 for s in out["seconds"][1:]]  # the first pass warms the pages and TLB
    return {"gb_s": round(max(rates), 2), "gb_s_median": round(statistics.median(rates), 2),
            "threads": out["threads"], "mbytes": mbytes, "repeats": len(rates),
            "command": f"OMP_NUM_THREADS={threads} {' '.join(cmd)}", "compile": f"gcc {' '.join(FLAGS)}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mbytes", type=int, default=512)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.threads, args.mbytes), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
