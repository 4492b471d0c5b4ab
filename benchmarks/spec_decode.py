"""EAGLE3 speculative decoding against this project's own vanilla decoding, side by side in one run.

SmolLM2-135M-Instruct with a fitted draft (python -m trt_llm.build.train_draft), greedy, on the cpu
backend: mean accepted length per verification pass and decode tokens/s, vanilla and speculative
alternating (the machine is shared and noisy: read the ratios), at batch 1 and batch 4.

    python benchmarks/spec_decode.py --base HF_DIR --draft DRAFT_DIR [--threads 2] [--rounds 3]
        [--draft-top-k 4 --draft-steps 4 --verify-tree-size 8] [--draft-quantization auto] [--json out.json]
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
    from trt_llm.build.draft_prompts import MAX_PROMPTS, prompt_set

    seen = set(prompt_set(MAX_PROMPTS)) & set(prompts)
    if seen:
        raise SystemExit(f"benchmark prompts the draft may have been trained on: {sorted(seen)}")


def build(base: Path, draft: Path, work_dir: Path, quantization: str) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = work_dir / f"engine-smollm2-eagle3-{quantization}"
    config = BuildConfig(model=str(base), output_dir=str(out), max_batch_size=4, max_input_len=512,
                         max_kv_cache_capacity=1024, draft={"model": str(draft), "quantization": quantization})
    manifest = out / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["build_config"] == config.model_dump()):
        build_engine(config, progress=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--draft-top-k", type=int, default=4)
    parser.add_argument("--draft-steps", type=int, default=4)
    parser.add_argument("--verify-tree-size", type=int, default=8)
    parser.add_argument("--draft-quantization", default="auto", choices=["auto", "none", "int8", "int4"],
                        help="the draft's weights in the engine (build config draft.quantization)")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from trt_llm.runtime.eagle import SpecConfig
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    check_unseen(PROMPTS)
    engine_dir = EngineDir.open(build(args.base, args.draft, args.work_dir, args.draft_quantization))
    spec = SpecConfig(args.draft_top_k, args.draft_steps, args.verify_tree_size)
    runners = {"vanilla": Runner(engine_dir, args.threads, spec_decode=False),
               "eagle3": Runner(engine_dir, args.threads, spec=spec)}
    results = {}
    for batch in (1, 4):
        data = {"temperature": 0.0, "batch_size": batch, "max_generate_length": args.new_tokens,
                "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}
        loaded = parse_input_dict(data)
        speeds = {name: [] for name in runners}
        tokens = {}
        for _ in range(args.rounds):
            for name, runner in runners.items():
                before = (runner.spec_stats.rounds, runner.spec_stats.emitted)
                start = time.perf_counter()
                responses = runner.run(loaded, loaded.settings).responses
                elapsed = time.perf_counter() - start
                generated = sum(r.generated_tokens for r in responses)
                speeds[name].append(generated / elapsed)
                tokens[name] = [r.output_token_ids for r in responses]
                if name == "eagle3":
                    rounds = runner.spec_stats.rounds - before[0]
                    emitted = runner.spec_stats.emitted - before[1]
                    accepted = emitted / rounds if rounds else 0.0
        results[f"batch{batch}"] = {
            "vanilla_tok_s": {"best": max(speeds["vanilla"]), "median": statistics.median(speeds["vanilla"])},
            "eagle3_tok_s": {"best": max(speeds["eagle3"]), "median": statistics.median(speeds["eagle3"])},
            "speedup_median": statistics.median(speeds["eagle3"]) / statistics.median(speeds["vanilla"]),
            "mean_accepted_length": accepted,
            "identical_tokens": tokens["vanilla"] == tokens["eagle3"],
        }
    report = {"threads": args.threads, "tree": vars(spec) if hasattr(spec, "__dict__") else str(spec),
              "draft_quantization": engine_dir.manifest["components"]["draft"]["quantization"],
              "new_tokens": args.new_tokens, "results": results}
    print(json.dumps(report, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
