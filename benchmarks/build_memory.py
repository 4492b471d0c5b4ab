"""Peak memory of `trt-llm-build` on a mixture of experts against the size of the engine it writes
(issue 29: "peak memory of building the MoE at those widths stays within 1.5x the size of the
written engine").

    python benchmarks/build_memory.py                   # Qwen3-30B-A3B widths, 2 layers: int4 and int8
    python benchmarks/build_memory.py --layers 4 --weights int4,none
    python benchmarks/build_memory.py --smoke           # tiny widths: the plumbing, in seconds

The checkpoint is random, at Qwen3-30B-A3B's widths (hidden 2048, 128 experts of width 768, top 8,
32 heads of 128 with 4 KV heads, its 151,936-token vocabulary), saved by transformers in bf16 in
2 GB shards, one tensor per expert and projection as the published checkpoint has them; it is made
once under --work-dir. Each build runs in its own process; its resident memory (with children) is
sampled every 0.1 s. The engine's size is the bytes of its directory. Writes build_memory.json and
build_memory.md into --out-dir.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

WIDTHS = dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
              num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, vocab_size=151936)
SMOKE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, vocab_size=151936)


def make_checkpoint(directory: Path, layers: int, widths: dict) -> Path:
    if (directory / "config.json").is_file():
        return directory
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig

    import assets

    tokenizer = AutoTokenizer.from_pretrained(assets.npm_tokenizer_dir("qwen3", Path.home() / ".cache/trt-llm-tests"))
    config = Qwen3MoeConfig(num_hidden_layers=layers, max_position_embeddings=4096, norm_topk_prob=True,
                            tie_word_embeddings=False, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                            **widths)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.save_pretrained(directory, max_shard_size="2GB")
    tokenizer.save_pretrained(directory)
    return directory


def peak_rss(command: list[str]) -> tuple[int, float, int]:
    """(peak resident bytes of the process and its children, wall seconds, exit status)."""
    import psutil

    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watched, peak = psutil.Process(process.pid), [0]

    def sample():
        while process.poll() is None:
            try:
                rss = watched.memory_info().rss + sum(c.memory_info().rss for c in watched.children(recursive=True))
            except psutil.Error:
                break
            peak[0] = max(peak[0], rss)
            time.sleep(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, stderr = process.communicate()
    thread.join()
    if process.returncode:
        print(stderr[-3000:], file=sys.stderr)
    return peak[0], time.perf_counter() - start, process.returncode


def size_of(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--weights", default="int4,int8", help="comma-separated: int4, int8, none")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench/moe-build")
    parser.add_argument("--out-dir", type=Path, default=Path("out/bench"))
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    widths = SMOKE if args.smoke else WIDTHS
    name = f"qwen3moe-{'smoke' if args.smoke else '30b-a3b-widths'}-{args.layers}l"
    checkpoint = make_checkpoint(args.work_dir / name, args.layers, widths)
    rows = []
    for weights in args.weights.split(","):
        engine = args.work_dir / f"{name}-{weights}"
        config = args.work_dir / f"{name}-{weights}.yaml"
        config.write_text(json.dumps({"model": str(checkpoint), "output_dir": str(engine), "backend": "cpu",
                                      "dtype": "fp32", "max_batch_size": 1, "max_input_len": 256,
                                      "max_kv_cache_capacity": 512, "quantization": {"weights": weights}}))
        peak, wall, status = peak_rss([sys.executable, "-m", "trt_llm.build.cli", "--quiet", str(config)])
        if status:
            return status
        engine_bytes = size_of(engine)
        rows.append({"weights": weights, "peak_rss_bytes": peak, "engine_bytes": engine_bytes,
                     "ratio": peak / engine_bytes, "wall_s": wall})
        print(f"{weights}: peak {peak / 1e9:.2f} GB, engine {engine_bytes / 1e9:.2f} GB, "
              f"{peak / engine_bytes:.2f}x, {wall:.0f} s", flush=True)
    checkpoint_bytes = size_of(checkpoint)
    report = {"checkpoint": name, "checkpoint_bytes": checkpoint_bytes, "layers": args.layers, "widths": widths,
              "builds": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "build_memory.json").write_text(json.dumps(report, indent=2))
    lines = [f"trt-llm-build peak memory, {name} (checkpoint {checkpoint_bytes / 1e9:.2f} GB in bf16)", "",
             "| weights | peak RSS | engine | peak / engine | wall |", "|---|---|---|---|---|"]
    lines += [f"| {r['weights']} | {r['peak_rss_bytes'] / 1e9:.2f} GB | {r['engine_bytes'] / 1e9:.2f} GB | "
              f"{r['ratio']:.2f}x | {r['wall_s']:.0f} s |" for r in rows]
    (args.out_dir / "build_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
