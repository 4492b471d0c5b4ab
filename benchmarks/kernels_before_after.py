#!/usr/bin/env python
"""One cpu engine's decode on two builds of our kernels' library (runtime/backends/cpu_kernels), side by side
in one process: the library this checkout compiles against another build of it (--baseline: the sources of
an earlier commit compiled with library.FLAGS), the runs interleaved round by round.

    python benchmarks/kernels_before_after.py --engine DIR --baseline OLD.so [--threads 2] [--rounds 3]

Each round, on each library: greedy requests of P prompt tokens at batch B, once with 1 new token and once
with N + 1; the decode rate is B N over the difference of the two times (the prefill cancels out). The
settings: prompts of 64 and 1,000 tokens (the context a decode step's attention reads), batch 1 and 4.
Both libraries must give the same tokens (the kernels' arithmetic is meant not to change between them);
the run stops where they do not. Writes kernels_before_after.json into --out-dir and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from sidebyside.measure import cpu_name, git_head  # noqa: E402
from sidebyside.op_timing import library_file  # noqa: E402

SETTINGS = [(64, 1), (1000, 1), (1000, 4)]  # (prompt tokens, batch)
SWAPS = {"SwiGLU": "swap_swiglu"}  # ops added since the first library this compares, and the swaps that make them


def engine_dir(text: str):
    """--engine's value: an engine directory (argparse says why in one line where it is not one)."""
    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError

    try:
        return EngineDir.open(Path(text))
    except EngineDirError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", type=engine_dir, required=True, help="a cpu engine directory (trt-llm-build's output)")
    p.add_argument("--baseline", type=library_file, required=True, help="another build of our kernels' library")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    return p.parse_args(argv)


def open_on(engine, library: Path, threads: int):
    """The engine's model (engine: an EngineDir), its session on `library` (cpu_kernels' choice of library made
    for it). An op an older library lacks (its name not in the file) keeps ONNX Runtime's nodes."""
    from trt_llm.runtime.app.evaluate import open_model
    from trt_llm.runtime.backends import cpu_kernels
    from trt_llm.runtime.backends.cpu_kernels import rewrite

    lacks = [op for op in SWAPS if op.encode() not in library.read_bytes()]
    kept = {op: getattr(rewrite, SWAPS[op]) for op in lacks}
    chosen = cpu_kernels._choice
    cpu_kernels._choice = lambda: (library, "chosen by the benchmark")
    for op in lacks:
        setattr(rewrite, SWAPS[op], lambda model, *rest: 0)
    try:
        model = open_model(engine, threads)
    finally:
        cpu_kernels._choice = chosen
        for op, swap in kept.items():
            setattr(rewrite, SWAPS[op], swap)
    model.eos = set()  # (exactly N new tokens a row)
    return model


def timed_run(model, prompt_tokens: int, batch: int, new: int) -> tuple[float, list[list[int]]]:
    from trt_llm.runtime.engine.generate import generate
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

    sequences = [Sequence([(i * 7919 + row * 13) % 40000 + 100 for i in range(prompt_tokens)], new)
                 for row in range(batch)]
    started = time.perf_counter()
    generate(model, sequences, Sampler([SamplingParams(temperature=0.0)] * batch))
    return time.perf_counter() - started, [list(s.generated) for s in sequences]


def main(argv=None) -> int:
    from trt_llm.runtime.backends import cpu_kernels
    from trt_llm.runtime.backends.cpu_kernels.library import library

    args = parse_args(argv)
    libraries = {"ours": library(), "baseline": args.baseline}
    models = {name: open_on(args.engine, path, args.threads) for name, path in libraries.items()}
    rows = []
    for prompt_tokens, batch in SETTINGS:
        rates = {name: [] for name in models}
        for _ in range(args.rounds):
            tokens = {}
            for name, model in models.items():
                first, _ = timed_run(model, prompt_tokens, batch, 1)
                whole, tokens[name] = timed_run(model, prompt_tokens, batch, args.new_tokens + 1)
                rates[name].append(batch * args.new_tokens / (whole - first))
            if tokens["ours"] != tokens["baseline"]:
                sys.exit(f"prompt {prompt_tokens}, batch {batch}: the libraries gave different tokens")
        ratios = [o / b for o, b in zip(rates["ours"], rates["baseline"])]
        rows.append({"prompt_tokens": prompt_tokens, "batch": batch,
                     **{f"{name}_tok_s": statistics.median(r) for name, r in rates.items()},
                     **{f"{name}_tok_s_all": r for name, r in rates.items()},
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(f"prompt {prompt_tokens}, batch {batch} done", file=sys.stderr)
    result = {"command": " ".join(sys.argv), "git_head": git_head(), "cpu": cpu_name(), "threads": args.threads,
              "rounds": args.rounds, "new_tokens": args.new_tokens, "engine": str(args.engine.path),
              "kernels": cpu_kernels.describe(), "libraries": {k: str(v) for k, v in libraries.items()},
              "tokens_identical": True, "rows": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "kernels_before_after.json").write_text(json.dumps(result, indent=1))
    print("| prompt tokens | batch | baseline decode tok/s | ours decode tok/s | ours over baseline, median (min-max) |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['prompt_tokens']} | {r['batch']} | {r['baseline_tok_s']:.1f} | {r['ours_tok_s']:.1f} | "
              f"{r['ratio_median']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
