#!/usr/bin/env python
"""Quantized engines side by side: trt-llm fp32 / int8 / int4 against ONNX Runtime GenAI int4 and
llama.cpp Q4_0, in one interleaved run (issue 17's speed targets).

    python benchmarks/quantized_speed.py              # 2 threads, 3 rounds, N=64, prompts 64 and 512, b1 and b8
    python benchmarks/quantized_speed.py --smoke      # a tiny random Llama, seconds: checks the plumbing

The engines (sidebyside/peers/): trt-llm fp32 (`ours`), int8 (`ours-int8`: round to nearest, one
scale per column), int4 on llama.cpp's Q4_0 weights (`ours-int4`: built from the Q4_0 GGUF that
llama.cpp-Q4_0 runs, its blocks kept), int4 with the default groups of 128 (`ours-int4-g128`), int4 in GenAI's layout (`ours-int4-g32`: blocks of 32, an
int4 LM head, from the same HF folder),
GenAI's builder `-p int4` (`genai-int4`) and llama.cpp on the Q4_0 file (`llamacpp-q4_0`, one
sequence at a time). Every engine runs in its own process, loaded once, with the same thread
count; each setting (prompt length, batch) runs every engine in turn, then the next round, after an
untimed warm-up. Greedy, exactly N new tokens per row. Reported: decode tok/s and time to first
token (medians), the ratios the issue names, size on disk, peak RSS. Writes quantized_speed.json
and .md into --out-dir (default out/bench) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode_speed  # noqa: E402  (the checkpoint conversion, cpu name, versions)
from sidebyside.artifacts import Context, prepare_engines  # noqa: E402
from sidebyside.measure import CLEAN_LOAD, LoadMeter, log, pin_threads  # noqa: E402
from sidebyside.prompts import exact_prompts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENGINES = ("ours", "ours-int8", "ours-int4", "ours-int4-g128", "ours-int4-g32", "genai-int4", "llamacpp-q4_0")
# (numerator, denominator, what is compared, the target)
RATIOS = [
    ("trt-llm-int4", "ort-genai-int4", "decode", 1.2),
    ("trt-llm-int4-g32", "ort-genai-int4", "decode", 1.2),
    ("trt-llm-int4", "llama.cpp-Q4_0", "decode", 1.3),
    ("trt-llm-int4", "trt-llm", "decode", 2.5),
    ("trt-llm-int8", "trt-llm", "decode", 1.8),
    ("trt-llm-int4-g128", "trt-llm", "decode", None),
    ("trt-llm-int4", "trt-llm", "prefill", 1.0),
    ("trt-llm-int4-g128", "trt-llm", "prefill", 1.0),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--prompt-lengths", default="64,512")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--wait-idle", type=float, default=20.0, help="wait up to this long for a quiet machine per run")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--hf-dir", type=Path, default=None)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny random Llama, prompts 24 and 40, b1 and b2, N=4, 1 round")
    args = p.parse_args(argv)
    if args.smoke:
        for name, value in {"rounds": 1, "new_tokens": 4, "batch_sizes": "1,2", "prompt_lengths": "24,40",
                            "wait_idle": 0.0}.items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",")})
    args.prompt_lengths = sorted({int(n) for n in str(args.prompt_lengths).split(",")})
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if set(args.engines) - set(ENGINES):
        p.error(f"unknown engines: {', '.join(sorted(set(args.engines) - set(ENGINES)))}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    args.work_dir = args.work_dir.expanduser().resolve() / ("smoke" if args.smoke else "")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    from sidebyside.worker import Worker, drop_unready

    model_dir = decode_speed.hf_dir(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n, max_batch = args.new_tokens, max(args.batch_sizes)
    prompts = {length: exact_prompts(tokenizer, length, max_batch) for length in args.prompt_lengths}
    ctx = Context(hf_dir=model_dir, work_dir=args.work_dir / model_dir.name, threads=args.threads,
                  max_batch=max_batch, max_input=max(args.prompt_lengths),
                  capacity=max(1024, max(args.prompt_lengths) + n), rebuild=args.rebuild)

    notes, warnings = [], []
    engines = prepare_engines(args.engines, ctx, notes, log)

    workers = {name: Worker(e["key"], Path(e["artifact"]), args.threads, ctx.capacity) for name, e in engines.items()}
    results: dict[tuple, list] = {}
    meter = LoadMeter()
    try:
        drop_unready(workers, warnings)
        plan = [(name, length, b) for length in args.prompt_lengths for b in args.batch_sizes for name in workers
                if b == 1 or engines[name]["batched"]]
        log(f"warm-up ({len(plan)} settings)")
        for name, length, b in plan:
            workers[name].run(prompts[length][:b], min(n, 8))
        for r in range(args.rounds):
            for name, length, b in plan:
                idle = meter.wait_idle(args.wait_idle)
                if idle is not None and idle >= CLEAN_LOAD:
                    log(f"round {r + 1} {name} p{length} b{b}: other processes use {idle:.1f} cores; running anyway")
                result = workers[name].run(prompts[length][:b], n)
                results.setdefault((name, length, b), []).append(
                    {"ttft_s": result["ttft_s"], "decode_tok_s": b * (n - 1) / result["decode_s"]})
            log(f"round {r + 1}/{args.rounds} done")
        for name, worker in list(workers.items()):
            engines[name]["peak_rss_mb"] = worker.close()
            workers.pop(name)
    finally:
        for worker in workers.values():
            worker.kill()

    table = {}
    for (name, length, b), runs in results.items():
        table.setdefault(name, {})[f"p{length} b{b}"] = {
            "decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in runs), 2),
            "ttft_ms": round(1000 * statistics.median(r["ttft_s"] for r in runs), 1)}
    ratios = []
    for top, bottom, what, target in RATIOS:
        for setting in sorted({s for e in table.values() for s in e}, key=lambda s: (int(s.split()[0][1:]), s)):
            a, z = table.get(top, {}).get(setting), table.get(bottom, {}).get(setting)
            if a is None or z is None:
                continue
            value = (a["decode_tok_s"] / z["decode_tok_s"] if what == "decode" else z["ttft_ms"] / a["ttft_ms"])
            if what == "prefill" and not setting.startswith("p512"):
                continue
            ratios.append({"engine": top, "peer": bottom, "what": what, "setting": setting, "ratio": round(value, 2),
                           "target": target, "met": None if target is None else value >= target})
    report = {"machine": {"cpu": decode_speed.cpu_name(), "threads": args.threads},
              "versions": decode_speed.versions(args.engines), "new_tokens": n, "rounds": args.rounds,
              "engines": engines, "table": table, "ratios": ratios, "notes": notes, "warnings": warnings,
              "seconds": round(time.perf_counter() - started, 1)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "quantized_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = render(report)
    (args.out_dir / "quantized_speed.md").write_text(markdown)
    print(markdown)
    return 0


def render(report: dict) -> str:
    settings = sorted({s for e in report["table"].values() for s in e}, key=lambda s: (int(s.split()[0][1:]), s))
    lines = [f"# Quantized engines, {report['machine']['threads']} threads, {report['machine']['cpu']}", "",
             f"N = {report['new_tokens']} new tokens, median of {report['rounds']} interleaved rounds.", "",
             "| engine | precision | disk MB | peak RSS MB | " + " | ".join(f"{s} tok/s" for s in settings)
             + " | p512 b1 TTFT ms |", "|---" * (5 + len(settings)) + "|"]
    for name, entry in report["engines"].items():
        row = report["table"].get(name, {})
        cells = [f"{row[s]['decode_tok_s']:.1f}" if s in row else "-" for s in settings]
        ttft = row.get("p512 b1", {}).get("ttft_ms")
        lines.append(f"| {name} | {entry['precision']} | {entry['disk_mb']:.0f} | {entry.get('peak_rss_mb') or 0:.0f} | "
                     + " | ".join(cells) + f" | {ttft if ttft is not None else '-'} |")
    lines += ["", "| ratio | setting | value | target |", "|---|---|---|---|"]
    for r in report["ratios"]:
        target = "" if r["target"] is None else f">= {r['target']}" + (" met" if r["met"] else " NOT met")
        lines.append(f"| {r['engine']} / {r['peer']} ({r['what']}) | {r['setting']} | {r['ratio']:.2f}x | {target} |")
    lines += [""] + [f"- {note}" for note in report["notes"] + report["warnings"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
