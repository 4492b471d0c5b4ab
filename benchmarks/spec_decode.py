"""EAGLE3 speculative decoding against this project's own vanilla decoding, side by side in one run.

SmolLM2-135M-Instruct with a fitted draft (python -m trt_llm.draft_training.train_draft), greedy, on the cpu
backend: mean accepted length per verification pass and decode tokens/s, vanilla and speculative
alternating (the machine is shared and noisy: read the ratios), at batch 1 and batch 4.

    python benchmarks/spec_decode.py --base HF_DIR --draft DRAFT_DIR [--threads 2] [--rounds 3]
        [--tree 3,2,4 --tree 4,4,8 ...] [--draft-quantization auto] [--quantization int4] [--json out.json]

Each --tree is draft top-k, draft steps, verify tree size; every tree runs in the same rounds as
vanilla, so one run shows the trade-off: a wider tree accepts more tokens a pass, and costs more to
verify (on a CPU, compute-bound beyond a few tokens). --quantization builds the base quantized
(build config quantization:, e.g. int4), against its own vanilla decoding: cheaper verification
may let a bigger tree pay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

# None of these is among the prompts the draft trainer uses (checked at start-up), nor close to one:
# acceptance on the draft's own training prompts would flatter it.
PROMPTS = [
    "Explain how a refrigerator keeps food cold.", "Write a limerick about a forgetful wizard.",
    "What should I pack for a weekend trip to the beach?", "Why do cats purr?",
    "Describe a day in the life of a lighthouse keeper.", "Explain the rules of basketball.",
    "What are good habits for a healthy morning routine?", "What is the best way to learn to juggle?",
]


def check_unseen(prompts: list[str]) -> None:
    from trt_llm.draft_training.prompts import MAX_PROMPTS, prompt_set

    seen = set(prompt_set(MAX_PROMPTS)) & set(prompts)
    if seen:
        raise SystemExit(f"benchmark prompts the draft may have been trained on: {sorted(seen)}")


def build(base: Path, draft: Path, work_dir: Path, quantization: str, base_quantization: str = "none") -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    suffix = "" if base_quantization == "none" else f"-base-{base_quantization}"
    out = work_dir / f"engine-smollm2-eagle3-{quantization}{suffix}"
    config = BuildConfig(model=str(base), output_dir=str(out), max_batch_size=4, max_input_len=512,
                         max_kv_cache_capacity=1024, draft={"model": str(draft), "quantization": quantization},
                         quantization=base_quantization)
    manifest = out / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["build_config"] == config.model_dump()):
        build_engine(config, progress=False)
    return out


def parse_tree(text: str) -> tuple[int, int, int]:
    try:
        top_k, steps, verify = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree {text!r}: expected K,STEPS,VERIFY (three integers)") from None
    return top_k, steps, verify


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--tree", action="append", type=parse_tree, metavar="K,STEPS,VERIFY",
                        help="draft top-k, draft steps, verify tree size (repeatable; default 3,2,4 and 4,4,8)")
    parser.add_argument("--draft-quantization", default="auto", choices=["auto", "none", "int8", "int4"],
                        help="the draft's weights in the engine (build config draft.quantization)")
    parser.add_argument("--quantization", default="none", choices=["none", "int8", "int4"],
                        help="the base's weights (build config quantization:)")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from trt_llm.runtime.decoding.spec_config import SpecConfig
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    check_unseen(PROMPTS)
    engine_dir = EngineDir.open(build(args.base, args.draft, args.work_dir, args.draft_quantization,
                                           args.quantization))
    trees = args.tree or [(3, 2, 4), (4, 4, 8)]
    runners = {"vanilla": Runner(engine_dir, args.threads, spec_decode=False)}
    for tree in trees:
        runners["eagle3 %d,%d,%d" % tree] = Runner(engine_dir, args.threads, spec=SpecConfig(*tree))
    results = {}
    for batch in (1, 4):
        data = {"temperature": 0.0, "batch_size": batch, "max_generate_length": args.new_tokens,
                "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}
        loaded = parse_input_dict(data)
        speeds = {name: [] for name in runners}
        tokens, accepted = {}, {}
        for _ in range(args.rounds):  # interleaved: the machine's load moves every setting alike
            for name, runner in runners.items():
                before = (runner.spec_stats.rounds, runner.spec_stats.emitted)
                start = time.perf_counter()
                responses = runner.run(loaded, loaded.settings).responses
                elapsed = time.perf_counter() - start
                speeds[name].append(sum(r.generated_tokens for r in responses) / elapsed)
                tokens[name] = [r.output_token_ids for r in responses]
                rounds = runner.spec_stats.rounds - before[0]
                if rounds:
                    accepted[name] = (runner.spec_stats.emitted - before[1]) / rounds
        vanilla = statistics.median(speeds["vanilla"])
        results[f"batch{batch}"] = {"vanilla_tok_s": {"best": max(speeds["vanilla"]), "median": vanilla}}
        for name in runners:
            if name == "vanilla":
                continue
            results[f"batch{batch}"][name] = {
                "tok_s": {"best": max(speeds[name]), "median": statistics.median(speeds[name])},
                "speedup_median": statistics.median(speeds[name]) / vanilla,
                "mean_accepted_length": accepted[name],
                "identical_tokens": tokens[name] == tokens["vanilla"],
            }
    report = {"threads": args.threads, "trees": ["top-k %d, steps %d, verify %d" % tree for tree in trees],
              "draft_quantization": engine_dir.manifest["components"]["draft"]["quantization"],
              "base_quantization": engine_dir.manifest["model"].get("quantization"),
              "new_tokens": args.new_tokens, "results": results}
    print(json.dumps(report, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
