#!/usr/bin/env python
"""Our attention kernel (trt_llm.cpu::CachedAttention, runtime/backends/cpu_kernels/attention.c) against
ONNX Runtime's GroupQueryAttention, the node it stands in for, one layer at SmolLM2-135M's widths (9 query
heads, 3 kv heads, head size 64), in one interleaved run.

    python benchmarks/attention_op.py                 # 2 threads, 7 rounds: about a minute
    python benchmarks/attention_op.py --smoke         # 1 round, short: checks the plumbing
    python benchmarks/attention_op.py --baseline OTHER.so  # also our op on another build of the library

Settings: decode (1 new token) after 100, 600 and 1,500 cached ones at batch 1, after 600 at batch 4; a
verification pass of 9 tokens after 600 (prompt lookup's widest) at batch 1 and 4, and in one row of 4 whose
others decode (a static batch where lookup speculates for its last row); prefill of 64, 512 and 2,048 tokens
on an empty cache. The cache is bound in place (past and present one buffer), as the runtime binds it.
--layers N gives each op N caches, called in turn as a model's layers are (a call's time is the mean of a
layer's): at 1, the default, the cache stays in the CPU's caches from call to call; at a model's 30 it does
not, as in a decode step at a long context. Each round times every setting on both ops in turn (each:
repeated for --seconds, the mean of a call); the medians over the rounds and the per-round ratios are
reported, with the spread. Both ops are first checked to agree (outputs within 2e-6). Writes
attention_op.json into --out-dir and prints a table.
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

from sidebyside.op_timing import (  # noqa: E402
    baseline_cells, baseline_header, comparison, library_file, over_baseline, quiet_options, rounds, run_record)
from test_cpu_attention import feeds, gqa_model  # noqa: E402  (the node as our lowering writes it)

from trt_llm.runtime.backends import cpu_kernels  # noqa: E402

HEADS, KV_HEADS, HEAD = 9, 3, 64
CAPACITY = 2048
SETTINGS = [  # (name, past, new tokens (a row's, or each row's), batch)
    ("decode after 100", 100, 1, 1), ("decode after 600", 600, 1, 1), ("decode after 1500", 1500, 1, 1),
    ("decode after 600, batch 4", 600, 1, 4), ("9-token pass after 600", 600, 9, 1),
    ("9-token pass beside 3 decode rows, after 600", 600, [1, 1, 1, 9], 4),
    ("9-token pass after 600, batch 4", 600, 9, 4), ("prefill 64", 0, 64, 1), ("prefill 512", 0, 512, 1),
    ("prefill 2048", 0, 2048, 1)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.3, help="each timing: calls repeated for this long")
    p.add_argument("--layers", type=int, default=1, help="caches an op cycles through, as a model's layers")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--baseline", type=library_file, help="another build of our kernels' library, timed beside ours")
    args = p.parse_args(argv)
    if args.layers < 1:
        p.error(f"--layers must be at least 1, got {args.layers}")
    if args.smoke:
        args.rounds, args.seconds = 1, 0.02
    return args


def session(ours: bool, threads: int, library: Path | None = None) -> ort.InferenceSession:
    """GroupQueryAttention, or our op (on `library`, another build of it, where given)."""
    options = quiet_options(threads)
    graph = gqa_model(HEADS, KV_HEADS, HEAD, CAPACITY, HEAD).SerializeToString()
    if ours:
        graph = cpu_kernels.adopt(graph, options, REPO)
        if b"CachedAttention" not in graph:
            sys.exit(f"our kernel is not used here: {cpu_kernels.describe()}")
        if library is not None:
            options = quiet_options(threads)
            options.register_custom_ops_library(str(library))
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


class Layers:
    """Bound calls of one op, one a layer: a call runs each in turn and returns the first's output."""

    def __init__(self, bound: list):
        self.bound = bound

    def __call__(self) -> np.ndarray:
        return [b() for b in self.bound][0]


class Bound:
    """One op on one setting's inputs, the cache bound as past and present at once."""

    def __init__(self, s: ort.InferenceSession, f: dict):
        self.held = {n: f[n].copy() for n in ("past_key", "past_value")}  # (the OrtValues do not keep them alive)
        self.binding = s.io_binding()
        self.binding.bind_output("out")
        for name, value in f.items():
            if name not in self.held:
                self.binding.bind_cpu_input(name, value)
        for name, present in (("past_key", "present_key"), ("past_value", "present_value")):
            value = ort.OrtValue.ortvalue_from_numpy(self.held[name])
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(present, value)
        self.session = s

    def __call__(self) -> np.ndarray:
        self.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy()  # (the output only: the caches stay where they are)


def main(argv=None) -> int:
    args = parse_args(argv)
    sessions = {"GroupQueryAttention": session(False, args.threads), "CachedAttention": session(True, args.threads)}
    if args.baseline:
        sessions["baseline"] = session(True, args.threads, args.baseline)
    rng = np.random.default_rng(0)
    calls = {}
    for name, past, new, batch in SETTINGS:
        news = new if isinstance(new, list) else [new] * batch
        f = feeds(rng, HEADS, KV_HEADS, HEAD, CAPACITY, HEAD, [past] * batch, news, max(news))
        calls[name] = {op: Layers([Bound(s, f) for _ in range(args.layers)]) for op, s in sessions.items()}
        outputs = {op: call() for op, call in calls[name].items()}
        valid = (np.arange(max(news))[None] < np.array(news)[:, None])[..., None]  # (GQA leaves padded tokens as is)
        theirs, ours = outputs["GroupQueryAttention"] * valid, outputs["CachedAttention"] * valid
        if np.abs(theirs - ours).max() > 2e-6:
            sys.exit(f"{name}: the ops disagree by {np.abs(theirs - ours).max():.2e}")
    times = {setting: {op: [t / args.layers for t in ts] for op, ts in ops.items()}  # (a layer's time)
             for setting, ops in rounds(calls, args.rounds, args.seconds).items()}
    rows = []
    for name in calls:
        gqa, ours = times[name]["GroupQueryAttention"], times[name]["CachedAttention"]
        rows.append({"setting": name, **comparison("gqa", gqa, ours)})
        if args.baseline:
            rows[-1].update(over_baseline(times[name]["baseline"], ours))
    result = {**run_record(args, cpu_kernels.describe(), ort.__version__),
              "widths": {"heads": HEADS, "kv_heads": KV_HEADS, "head": HEAD}, "rows": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "attention_op.json").write_text(json.dumps(result, indent=1))
    extra = baseline_header(args.baseline)
    print(f"| setting | GroupQueryAttention us | CachedAttention us | speed-up, median (min-max) |{extra[0]}\n"
          f"|---|---:|---:|---:|{extra[1]}")
    for row in rows:
        print(f"| {row['setting']} | {row['gqa_us']:.0f} | {row['ours_us']:.0f} | "
              f"{row['speedup_median']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}) |{baseline_cells(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
