#!/usr/bin/env python
"""Gemma 4's shared-cache layers on the cpu backend: their presents bound to the source layer's buffer
(updated in place) against left unbound (ONNX Runtime then allocates each and copies the whole past into
it, every step), in one interleaved run on one engine.

    python benchmarks/gemma4_shared_cache.py            # 3,000 tokens in the cache, batch 1 and 2, 5 rounds
    python benchmarks/gemma4_shared_cache.py --smoke    # 200 tokens, 1 round: the plumbing

The checkpoint: a random Gemma4ForCausalLM at Gemma-4-E2B's widths (hidden 1536, 8 heads, 1 kv head,
head_dim 256 / global 512, window 512, MLP 6144, double-wide on the shared layers, per-layer inputs of
256) with 6 layers [s, s, f, s, s, f] of which the last 3 read layers 1 and 2's caches (E2B: 20 of 35),
and the tests' tiny tokenizer's vocabulary (a 262k LM head would hide the attention's share of a
step). Written once under --work-dir with its engine (fp32, capacity 4,096).

Two ONNX Runtime sessions of the same engine, 2 threads each: "in place" as the runtime binds it, and
"copied" with the shared outputs left unbound. Per round and batch size, each greedy-decodes --new
tokens after a prompt of --context random tokens (the order alternates every round); the decode steps'
times come from the engine core's profiler (stage decode_step). Both must give the same tokens.
Writes gemma4_shared_cache.json into --out-dir and prints medians with min / max.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def checkpoint(folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, Gemma4TextConfig, GenerationConfig

    import assets
    import family_assets

    tokenizer = assets._build_tokenizer()
    config = Gemma4TextConfig(
        vocab_size=assets.VOCAB_SIZE, vocab_size_per_layer_input=assets.VOCAB_SIZE, hidden_size=1536,
        intermediate_size=6144, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        global_head_dim=512, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        sliding_window=512, hidden_size_per_layer_input=256, num_kv_shared_layers=3, use_double_wide_mlp=True,
        final_logit_softcapping=30.0, max_position_embeddings=8192, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    family_assets.gemma4_nontrivial(model)
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=0, do_sample=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def engine(model: Path, folder: Path, capacity: int) -> Path:
    if (folder / "manifest.json").is_file():
        return folder
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    return build_engine(BuildConfig(model=str(model), output_dir=str(folder), max_batch_size=4,
                                    max_input_len=capacity, max_kv_cache_capacity=capacity), progress=False)


def models(engine_dir_path: Path):
    from trt_llm.runtime.app.evaluate import open_model
    from trt_llm.runtime.engine_dir import EngineDir

    engine_dir = EngineDir.open(engine_dir_path)
    in_place, copied = open_model(engine_dir, threads=2), open_model(engine_dir, threads=2)
    assert in_place.engine._shared, "the engine's graph has no shared outputs"
    copied.engine._shared = {}  # the readers' presents unbound: ONNX Runtime's own buffers, filled by copying
    return {"in place": in_place, "copied": copied}


def decode(model, batch: int, context: int, new: int, seed: int) -> tuple[list[float], list[list[int]]]:
    import numpy as np

    from trt_llm.runtime.engine.generate import generate
    from trt_llm.runtime.engine.profiler import Profiler
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

    rng = np.random.default_rng(seed)
    sequences = [Sequence(rng.integers(3, model.vocab_size, context).tolist(), new) for _ in range(batch)]
    profiler = Profiler()
    generate(model, sequences, Sampler([SamplingParams(temperature=0.0)] * batch), profiler=profiler)
    return profiler.stages["decode_step"], [s.generated for s in sequences]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "out" / "bench" / "gemma4-e2b-widths-6l")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "out" / "bench")
    parser.add_argument("--context", type=int, default=3000)
    parser.add_argument("--new", type=int, default=17)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.context, args.rounds, args.new = 200, 1, 5
    model_dir = checkpoint(args.work_dir / "checkpoint")
    settings = models(engine(model_dir, args.work_dir / "engine", 4096))
    times: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        for batch in args.batches:
            order = list(settings) if round_ % 2 == 0 else list(settings)[::-1]
            tokens = {}
            for name in order:
                steps, tokens[name] = decode(settings[name], batch, args.context, args.new, seed=round_)
                times.setdefault((name, batch), []).extend(steps)
            assert tokens["in place"] == tokens["copied"], "the two bindings gave different tokens"
    import onnxruntime

    result = {"machine": _cpu(), "onnxruntime": onnxruntime.__version__,
              "threads": 2, "context": args.context, "new_tokens": args.new, "rounds": args.rounds, "steps_ms": {}}
    print(f"decode step (ms) after {args.context} tokens; medians [min, max] over {args.rounds} rounds")
    for batch in args.batches:
        row = []
        for name in settings:
            values = times[(name, batch)]
            result["steps_ms"][f"{name}, batch {batch}"] = {"median": statistics.median(values), "min": min(values),
                                                             "max": max(values), "count": len(values)}
            row.append(f"{name}: {statistics.median(values):.1f} [{min(values):.1f}, {max(values):.1f}]")
        ratio = statistics.median(times[("copied", batch)]) / statistics.median(times[("in place", batch)])
        result["steps_ms"][f"copied / in place, batch {batch}"] = ratio
        print(f"batch {batch}: " + "; ".join(row) + f"; copied / in place {ratio:.2f}x")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gemma4_shared_cache.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
