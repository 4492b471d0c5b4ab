#!/usr/bin/env python
"""Our gated-MLP activation (trt_llm.cpu::SwiGLU, runtime/backends/cpu_kernels/swiglu.c) against the three
nodes it stands in for (Split, QuickGelu, Mul, as ONNX Runtime runs an optimised graph), at SmolLM2-135M's
width (1,536), in one interleaved run: a decode step (1 row), a 9-token verification pass, prefills of 64 and
400 rows.

    python benchmarks/swiglu_op.py            # 2 threads, 7 rounds: about half a minute
    python benchmarks/swiglu_op.py --smoke    # 1 round, short: checks the plumbing

Each round times every setting on both graphs in turn (each: repeated for --seconds, the mean of a call, the
session's workers stopped after each run); a call includes ONNX Runtime's run from Python (a few us, the
same on both sides). Both are first checked to give the same bits. Writes swiglu_op.json into --out-dir
and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from sidebyside.op_timing import comparison, quiet_options, rounds, run_record  # noqa: E402
from test_cpu_swiglu import mlp_activation  # noqa: E402  (the nodes as an optimised graph has them)

from trt_llm.runtime.backends import cpu_kernels  # noqa: E402

WIDTH = 1536
ROWS = [1, 9, 64, 400]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.2, help="each timing: calls repeated for this long")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    args.baseline = None  # (run_record's field)
    if args.smoke:
        args.rounds, args.seconds = 1, 0.02
    return args


def session(ours: bool, threads: int) -> ort.InferenceSession:
    options = quiet_options(threads)
    graph = mlp_activation(WIDTH, fused=True).SerializeToString()
    if ours:
        graph = cpu_kernels.adopt(graph, options, REPO)
        if b"SwiGLU" not in graph:
            sys.exit(f"our kernel is not used here: {cpu_kernels.describe()}")
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    args = parse_args(argv)
    sessions = {"nodes": session(False, args.threads), "SwiGLU": session(True, args.threads)}
    rng = np.random.default_rng(0)
    calls = {}
    for rows in ROWS:
        x = rng.standard_normal((1, rows, 2 * WIDTH)).astype(np.float32)
        calls[rows] = {name: (lambda s=s, x=x: s.run(None, {"x": x})[0]) for name, s in sessions.items()}
        if not np.array_equal(calls[rows]["nodes"]().view(np.int32), calls[rows]["SwiGLU"]().view(np.int32)):
            sys.exit(f"{rows} rows: the kernel's bits differ from the nodes'")
    times = rounds(calls, args.rounds, args.seconds)
    table = [{"rows": rows, **comparison("nodes", times[rows]["nodes"], times[rows]["SwiGLU"])} for rows in ROWS]
    result = {**run_record(args, cpu_kernels.describe(), ort.__version__), "width": WIDTH, "rows": table}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "swiglu_op.json").write_text(json.dumps(result, indent=1))
    print("| rows | Split + QuickGelu + Mul us | SwiGLU us | speed-up, median (min-max) |\n|---:|---:|---:|---:|")
    for row in table:
        print(f"| {row['rows']} | {row['nodes_us']:.1f} | {row['ours_us']:.1f} | "
              f"{row['speedup_median']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
