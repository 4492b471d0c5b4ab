#!/usr/bin/env python
"""Our matmul kernel (trt_llm.cpu::MatMulBlocks8, runtime/backends/cpu_kernels/blocks.c) against ONNX
Runtime's MatMulNBits at accuracy level 4, the node it stands in for, at SmolLM2-135M's widths, in one
interleaved run, at the pass widths a run uses: a decode step (1 row), prompt lookup's and EAGLE's
verification passes (2 to 9), a batch of 4 rows, and prefills (64, 512).

    python benchmarks/matmul_op.py                    # 2 threads, 7 rounds: about two minutes
    python benchmarks/matmul_op.py --smoke            # 1 round, short: checks the plumbing
    python benchmarks/matmul_op.py --baseline OTHER.so  # also our op on another build of the library
                                                         # (a kernel change against the one before)

Matrices: the MLP's gate and up projections, 576 -> 3072 at 4 bits (int4's layers, a GGUF's blocks of 32,
fp16 scales), and the LM head, 576 -> 49,152 at 8 bits (int4 engines keep it at 8). Each round times every
setting on both ops in turn (each: repeated for --seconds, the mean of a call); the medians over the rounds
and the per-round ratios are reported, with the spread, and the rate in multiply-adds a second. Both ops
are first checked to compute the same product, within 1e-3 of the output's largest value (at 512 rows
MatMulNBits strays from the method by hand, tests/test_cpu_kernels.py's by_hand, by about 5e-4 of it, where
ours stays within 2e-7). Writes matmul_op.json into --out-dir and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from sidebyside.op_timing import (  # noqa: E402
    baseline_cells, baseline_header, comparison, library_file, over_baseline, quiet_options, rounds, run_record)
from test_cpu_kernels import matmul_nbits  # noqa: E402  (the node as our lowering writes it)

from trt_llm.runtime.backends import cpu_kernels  # noqa: E402

MATRICES = [("gate+up, 4 bits", 576, 3072, 4), ("LM head, 8 bits", 576, 49152, 8)]  # (name, K, N, bits)
ROWS = [1, 2, 4, 9, 64, 512]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.3, help="each timing: calls repeated for this long")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--baseline", type=library_file, help="another build of our kernels' library, timed beside ours")
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.seconds = 1, 0.02
    return args


def sessions(K: int, N: int, bits: int, threads: int, baseline: Path | None = None) -> dict[str, ort.InferenceSession]:
    rng = np.random.default_rng(K + N + bits)
    weights = rng.integers(0, 256, (N, K // 32, 16 if bits == 4 else 32), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, N * K // 32).astype(np.float16).astype(np.float32)  # a GGUF's: fp16
    graph = matmul_nbits(K, N, bits, weights, scales).SerializeToString()
    made = {}
    for op in ("MatMulNBits", "MatMulBlocks8"):
        options = quiet_options(threads)
        if op == "MatMulBlocks8":
            adopted = cpu_kernels.adopt(graph, options, REPO)
            if b"MatMulBlocks8" not in adopted:
                sys.exit(f"our kernel is not used here: {cpu_kernels.describe()}")
            made[op] = ort.InferenceSession(adopted, options, providers=["CPUExecutionProvider"])
            if baseline is not None:  # the same graph on the other library
                options = quiet_options(threads)
                options.register_custom_ops_library(str(baseline))
                made["baseline"] = ort.InferenceSession(adopted, options, providers=["CPUExecutionProvider"])
        else:
            made[op] = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    return made


def main(argv=None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(0)
    calls, work = {}, {}
    for name, K, N, bits in MATRICES:
        made = sessions(K, N, bits, args.threads, args.baseline)
        for m in ROWS:
            a = rng.standard_normal((m, K)).astype(np.float32)
            setting = f"{name}, {m} row{'s' if m > 1 else ''}"
            calls[setting] = {op: (lambda s=s, a=a: s.run(None, {"A": a})[0]) for op, s in made.items()}
            work[setting] = m * K * N
            outputs = {op: call() for op, call in calls[setting].items()}
            theirs, ours = outputs["MatMulNBits"], outputs["MatMulBlocks8"]
            if np.abs(theirs - ours).max() > 1e-3 * np.abs(theirs).max():
                sys.exit(f"{setting}: the ops disagree by {np.abs(theirs - ours).max():.2e}")
    times = rounds(calls, args.rounds, args.seconds)
    rows = []
    for setting in calls:
        theirs, ours = times[setting]["MatMulNBits"], times[setting]["MatMulBlocks8"]
        rows.append({"setting": setting, **comparison("matmulnbits", theirs, ours),
                     "ours_gmac_s": work[setting] / statistics.median(ours) / 1e9})
        if args.baseline:
            rows[-1].update(over_baseline(times[setting]["baseline"], ours))
    result = {**run_record(args, cpu_kernels.describe(), ort.__version__), "rows": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "matmul_op.json").write_text(json.dumps(result, indent=1))
    extra = baseline_header(args.baseline)
    print(f"| setting | MatMulNBits us | MatMulBlocks8 us | ours, GMAC/s | speed-up, median (min-max) |{extra[0]}\n"
          f"|---|---:|---:|---:|---:|{extra[1]}")
    for row in rows:
        print(f"| {row['setting']} | {row['matmulnbits_us']:.0f} | {row['ours_us']:.0f} | {row['ours_gmac_s']:.0f} | "
              f"{row['speedup_median']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}) |{baseline_cells(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
