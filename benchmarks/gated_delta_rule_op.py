#!/usr/bin/env python
"""The gated delta rule op (plugins/gated_delta_rule.py) on ONNX Runtime: its standard-op forms at
Qwen3.5-0.8B's widths (linear_num_key_heads = linear_num_value_heads = 16, head dims 128), one op.

    python benchmarks/gated_delta_rule_op.py           # 2 threads: a few minutes
    python benchmarks/gated_delta_rule_op.py --smoke   # tiny widths, seconds: checks the plumbing

Forms: `recurrent` (the rule token by token in an ONNX Loop over S), `chunked` (the node's function
body: chunks of 64 in a Loop over S / 64, each chunk's whole work in the Loop's body, the UT
transform's inverse by block doubling; ONNX Runtime inlines the function itself), `lowered` (what
lower_for_onnxruntime writes: If(S == 1) the single step, else the chunked form). At S = 1, 64,
512, 2000 and batch 1 and 4 (every row full). Each setting runs the forms in turn, repetition after
repetition, after an untimed warm-up; medians in ms. Every form is checked against the torch op
before it is timed.

Peak memory: the `lowered` form at B = 8 and 1, S = 4000, each in a fresh subprocess (its own ONNX
Runtime session, the CPU memory arena on, one call), as the process's VmHWM (/proc/self/status) in
MB, the inputs (made there too) included; `--peak-batch 0` skips it.

Also the inverse's accuracy: (I + N)^-1 for a chunk of 64 alike keys (each key the first one plus
noise of `--spread`, beta 1, no decay: the hard case, where the delta rule rewrites one direction over
and over), by block doubling and by the Neumann product (I - N)(I + N^2)(I + N^4)..., in float32,
against float64's triangular solve: the largest error relative to the inverse's largest entry.
Writes gated_delta_rule_op.json into --out-dir and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trt_llm.plugins import gated_delta_rule as gdr  # noqa: E402

FORMS = ("recurrent", "chunked", "lowered")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--smoke", action="store_true", help="2 heads of 16, S up to 70, 2 repetitions")
    p.add_argument("--spread", type=float, default=0.1, help="the alike keys' noise (accuracy part)")
    p.add_argument("--peak-batch", type=int, nargs="*", default=None, help="batches of the peak memory part")
    p.add_argument("--peak-seq", type=int, default=None, help="tokens of the peak memory part")
    p.add_argument("--peak-one", nargs=3, metavar=("FORM", "B", "S"), help=argparse.SUPPRESS)  # the subprocess
    args = p.parse_args(argv)
    args.heads, args.dim = (2, 16) if args.smoke else (16, 128)
    args.lengths = (1, 5, 70) if args.smoke else (1, 64, 512, 2000)
    if args.smoke and args.reps == p.get_default("reps"):
        args.reps = 2
    if args.peak_batch is None:
        args.peak_batch = [2, 1] if args.smoke else [8, 1]
    args.peak_batch = [b for b in args.peak_batch if b > 0]
    if args.peak_seq is None:
        args.peak_seq = 70 if args.smoke else 4000
    return args


def session(form: str, threads: int) -> ort.InferenceSession:
    """One GatedDeltaRule node whose function is `form`, float32 activations."""
    types = [TensorProto.FLOAT] * 6 + [TensorProto.INT64]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(gdr.INPUTS, types)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in gdr.OUTPUTS]
    node = helper.make_node(gdr.OP_NAME, gdr.INPUTS, gdr.OUTPUTS, domain=gdr.DOMAIN, name="gdr",
                            plugin_namespace=gdr.PLUGIN_NAMESPACE)
    model = helper.make_model(helper.make_graph([node], "gdr", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(gdr.DOMAIN, 1)],
                              functions=[gdr.forms()[form]])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = True
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def example(batch: int, seq: int, heads: int, dim: int, seed: int = 0) -> list[torch.Tensor]:
    """Inputs as Qwen3.5 makes them: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, seq, heads, dim, generator=gen) for _ in range(3))
    g = -torch.nn.functional.softplus(torch.randn(batch, seq, heads, generator=gen)) * 0.1
    beta = torch.sigmoid(torch.randn(batch, seq, heads, generator=gen))
    state = torch.randn(batch, heads, dim, dim, generator=gen) * 0.1
    return [q, k, v, g, beta, state, torch.full((batch,), seq, dtype=torch.int64)]


def neumann_inverse(strict: torch.Tensor) -> torch.Tensor:
    """(I + strict)^-1 as the product of (I + M^(2^k)), M = -strict, for C <= 64."""
    m = -strict
    result = torch.eye(strict.shape[-1], dtype=strict.dtype) + m
    for _ in range(5):
        m = m @ m
        result = result @ (torch.eye(strict.shape[-1], dtype=strict.dtype) + m)
    return result


def inverse_accuracy(spread: float, dim: int, seed: int = 0) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(1, dim, generator=gen)
    keys = base + spread * torch.randn(gdr.CHUNK, dim, generator=gen)
    keys = keys / keys.norm(dim=-1, keepdim=True)
    strict = (keys @ keys.T).tril(-1).double()  # beta 1, no decay
    exact = torch.linalg.solve_triangular(torch.eye(gdr.CHUNK, dtype=torch.float64) + strict,
                                          torch.eye(gdr.CHUNK, dtype=torch.float64), upper=False, unitriangular=True)
    scale = float(exact.abs().max())
    return {name: float((fn(strict.float()).double() - exact).abs().max()) / scale
            for name, fn in (("doubling", gdr.unit_lower_inverse), ("neumann", neumann_inverse))}


def peak_one(form: str, batch: int, seq: int, args) -> dict[str, float]:
    """In this (fresh) process: one call of `form`; VmHWM in MB and the call's seconds."""
    s = session(form, args.threads)
    feed = dict(zip(gdr.INPUTS, (t.numpy() for t in example(batch, seq, args.heads, args.dim))))
    start = time.perf_counter()
    s.run(None, feed)
    seconds = time.perf_counter() - start
    status = Path("/proc/self/status").read_text().splitlines()
    kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return {"peak_mb": kb / 1024, "s": seconds}


def peak_memory(form: str, batch: int, seq: int, args) -> dict[str, float]:
    """peak_one in a subprocess: the peak is the process's, so every measurement needs its own."""
    command = [sys.executable, __file__, "--peak-one", form, str(batch), str(seq), "--threads", str(args.threads)]
    if args.smoke:
        command.append("--smoke")
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.peak_one:
        form, batch, seq = args.peak_one
        print(json.dumps(peak_one(form, int(batch), int(seq), args)))
        return 0
    torch.set_num_threads(args.threads)
    report = {"heads": args.heads, "head_dim": args.dim, "threads": args.threads, "reps": args.reps,
              "onnxruntime": ort.__version__, "cpu": platform.processor() or platform.machine()}
    accuracy = {spread: inverse_accuracy(spread, args.dim) for spread in (1.0, args.spread, 0.01)}
    report["inverse_relative_error_float32"] = {str(s): a for s, a in accuracy.items()}
    for spread, errors in accuracy.items():
        print(f"inverse of 64 alike keys (noise {spread}): " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))

    peaks = {}
    for batch in args.peak_batch:
        peaks[f"B={batch} S={args.peak_seq}"] = peak = peak_memory("lowered", batch, args.peak_seq, args)
        print(f"peak memory, lowered, B={batch} S={args.peak_seq}: {peak['peak_mb']:.0f} MB ({peak['s']:.2f} s)",
              flush=True)
    report["lowered_peak_memory"] = peaks

    sessions = {form: session(form, args.threads) for form in FORMS}
    table = {}
    for batch in (1, 4):
        for seq in args.lengths:
            x = example(batch, seq, args.heads, args.dim)
            feed = dict(zip(gdr.INPUTS, (t.numpy() for t in x)))
            expected = gdr.chunked(*x) if seq > 64 else gdr.gated_delta_rule(*x)
            for form, s in sessions.items():
                got = s.run(None, feed)
                for g, e in zip(got, expected):
                    error = float(np.abs(g - e.numpy()).max() / e.abs().max())
                    if error > 1e-4:
                        raise SystemExit(f"{form} B={batch} S={seq}: off the torch op by {error:.1e}")
            times = {form: [] for form in FORMS}
            reps = args.reps if seq < 1000 else max(2, args.reps // 2)
            for _ in range(reps):
                for form, s in sessions.items():
                    start = time.perf_counter()
                    s.run(None, feed)
                    times[form].append((time.perf_counter() - start) * 1e3)
            medians = {form: statistics.median(t) for form, t in times.items()}
            table[f"B={batch} S={seq}"] = medians
            print(f"  B={batch} S={seq:5d}: " + "  ".join(f"{f} {m:9.2f}" for f, m in medians.items()), flush=True)
    report["ms_per_call"] = table
    lines = [f"{'':14s}" + "".join(f"{f:>12s}" for f in FORMS)]
    lines += [f"{setting:14s}" + "".join(f"{m:12.2f}" for m in medians.values()) for setting, medians in table.items()]
    text = "\n".join(lines)
    print("\n" + text)
    report["table"] = text
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gated_delta_rule_op.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
