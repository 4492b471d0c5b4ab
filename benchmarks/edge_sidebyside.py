#!/usr/bin/env python
"""Edge runtimes side by side (issue 33): trt-llm fp32 and int4 against llama.cpp on the same GGUF file and
ONNX Runtime GenAI, in one interleaved run: cold first token, peak memory of that cold run, decode b1 / b8.

    python benchmarks/edge_sidebyside.py               # SmolLM2-135M, 2 threads, 3 rounds, N=64, prompt 64
    python benchmarks/edge_sidebyside.py --smoke       # a tiny random Llama, seconds: checks the plumbing

Engines (sidebyside/peers/): trt-llm fp32 (`ours`, the fp32 HF folder), trt-llm int4 built from the Q4_0
GGUF (`ours-int4`), trt-llm int4 in GenAI's layout from the HF folder (`ours-int4-g32`: blocks of 32, an
int4 LM head), llama.cpp on the F32 GGUF (`llamacpp`) and on that very Q4_0 GGUF (`llamacpp-q4_0`),
GenAI fp32 (`genai`) and int4 (`genai-int4`); an engine whose package is missing is skipped with the reason.
Per round, every engine in turn:

1. Cold: a fresh process does what a user does for one chat request (cold_start.PROMPT) up to its first
   token. trt-llm: the real `trt-llm-run` CLI on a one-request input file (max_generate_length 1,
   --threads T), its profile's `startup.to_first_token_ms`. Peers: sidebyside/cold_run.py (imports the
   library, loads the model, applies the model's chat template, generates one token), timed on the same
   clock (the process's start in /proc/self/stat). Peak memory = ru_maxrss of that process, which starts
   from a small launcher (sidebyside/rusage_run.py) so that none of this benchmark's memory is inherited.
   "Cold" is a fresh process; the OS file cache is warm (an untimed cold run of every engine comes first).
2. Decode tok/s at batch 1 and 8 in each engine's long-lived worker (sidebyside/worker.py): exactly N new
   tokens per row, greedy, no EOS stop, the same token ids for every engine (sidebyside/prompts.py),
   tok/s = B x (N - 1) / (first token -> last). llama-cpp-python runs one sequence at a time: its b8 is n/a.

Reported (medians over the rounds): a Markdown table (engine, precision, cold first token ms, peak MB of
the cold run, decode b1 / b8, size on disk) and the issue's targets for trt-llm-int4 against llama.cpp-Q4_0
(peak <= 1.5x, cold first token <= 2x, decode b1 >= 1.0x) and ort-genai-int4 (decode b1 and b8 >= 1.2x),
with the fp32 ratios beside them for information. Writes edge_sidebyside.json and .md into --out-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cold_start  # noqa: E402  (the cold request's message, the profile's load stages)
import decode_speed  # noqa: E402  (the checkpoint, cpu name, versions)
from sidebyside.artifacts import Context, prepare_engines  # noqa: E402
from sidebyside.measure import (  # noqa: E402
    CLEAN_LOAD, LoadMeter, engine_list, lock_work_dir, log, pin_threads, run_timed, smoke_defaults)
from sidebyside.prompts import exact_prompts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COLD_RUN = Path(__file__).resolve().parent / "sidebyside" / "cold_run.py"
ENGINES = ("ours", "ours-int4", "ours-int4-g32", "llamacpp", "llamacpp-q4_0", "genai", "genai-int4")
# How each engine's cold run is made: the trt-llm-run CLI, or cold_run.py with this library.
COLD_KIND = {"ours": "trt-llm-run", "ours-int4": "trt-llm-run", "ours-int4-g32": "trt-llm-run", "llamacpp": "llamacpp",
             "llamacpp-q4_0": "llamacpp", "genai": "genai", "genai-int4": "genai"}
# (engine, peer, metric, comparison, target): ratio = engine / peer; target None = for information.
# "decode bmax" is the largest batch (8; 2 with --smoke).
TARGETS = [
    ("trt-llm-int4", "llama.cpp-Q4_0", "peak_mb", "<=", 1.5),
    ("trt-llm-int4", "llama.cpp-Q4_0", "cold_ms", "<=", 2.0),
    ("trt-llm-int4", "llama.cpp-Q4_0", "decode b1", ">=", 1.0),
    ("trt-llm-int4", "ort-genai-int4", "decode b1", ">=", 1.2),
    ("trt-llm-int4", "ort-genai-int4", "decode bmax", ">=", 1.2),
    # GenAI's own int4 layout (blocks of 32, an int4 LM head) built by us from the same HF folder.
    ("trt-llm-int4-g32", "ort-genai-int4", "decode b1", ">=", 1.2),
    ("trt-llm-int4-g32", "ort-genai-int4", "decode bmax", ">=", 1.2),
    ("trt-llm", "llama.cpp", "peak_mb", "<=", None),
    ("trt-llm", "llama.cpp", "cold_ms", "<=", None),
    ("trt-llm", "llama.cpp", "decode b1", ">=", None),
    ("trt-llm", "ort-genai", "decode b1", ">=", None),
    ("trt-llm", "ort-genai", "decode bmax", ">=", None),
    ("trt-llm-int4", "ort-genai-int4", "peak_mb", "<=", None),
    ("trt-llm-int4", "ort-genai-int4", "cold_ms", "<=", None),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--prompt-length", type=int, default=64, help="tokens of each decode prompt (default 64)")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--wait-idle", type=float, default=20.0, help="wait up to this long for a quiet machine per run")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--hf-dir", type=Path, default=None)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny random Llama, prompt 24, b1 and b2, N=4, 1 round")
    args = p.parse_args(argv)
    args.batch_sizes = [1, 2] if args.smoke else [1, 8]
    # The engines' limits are quantized_speed.py's, so that both share the cached builds.
    args.max_input = 64 if args.smoke else 512
    if args.smoke:
        smoke_defaults(p, args, {"rounds": 1, "new_tokens": 4, "prompt_length": 24, "wait_idle": 0.0})
    args.engines = engine_list(p, args.engines, ENGINES)
    if args.rounds < 1 or args.new_tokens < 2 or args.prompt_length < 1:
        p.error("--rounds >= 1, --new-tokens >= 2 (decode is timed after the first token), --prompt-length >= 1")
    return args


# --- the cold run --------------------------------------------------------------------------------

class ColdRunFailed(RuntimeError):
    pass


def trt_llm_run() -> list[str]:
    script = Path(sys.executable).with_name("trt-llm-run")
    found = str(script) if script.is_file() else shutil.which("trt-llm-run")
    return [found] if found else [sys.executable, "-m", "trt_llm.runtime.app.run_cli"]


def installed_env() -> dict:
    """The environment of a cold run as an installed package sees it: Python's bytecode cache on. pip
    writes every wheel's .pyc at install, so the peers' modules load compiled; a shell with
    PYTHONDONTWRITEBYTECODE (as these sandboxes set) would make an editable trt-llm compile its ~60
    modules from source in every run (measured: ~60 ms of a cold start). The warm-up run writes them."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cold_run(key: str, artifact: Path, threads: int, capacity: int, tmp: Path) -> dict:
    """One fresh process to the first token of one chat request: first-token ms from its start, its peak RSS."""
    kind = COLD_KIND[key]
    log_path = tmp / f"{key}.log"
    if kind == "trt-llm-run":
        body = {"batch_size": 1, "temperature": 0.0, "max_generate_length": 1,
                "requests": [{"messages": [{"role": "user", "content": cold_start.PROMPT}]}]}
        (tmp / "in.json").write_text(json.dumps(body))
        for name in ("out.json", "profile.json"):
            (tmp / name).unlink(missing_ok=True)
        cmd = [*trt_llm_run(), str(tmp / "in.json"), "--engine-dir", str(artifact), "-o", str(tmp / "out.json"),
               "--profile-output", str(tmp / "profile.json"), "--threads", str(threads)]
    else:
        (tmp / "cold.json").unlink(missing_ok=True)
        cmd = [sys.executable, str(COLD_RUN), kind, str(artifact), str(tmp / "cold.json"), "--threads", str(threads),
               "--capacity", str(capacity), "--message", cold_start.PROMPT]
    done = run_timed(cmd, log_path, env=installed_env())
    if done["returncode"] != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:] if log_path.is_file() else []
        code = done["returncode"]
        if code < 0:  # e.g. SIGILL: a llama.cpp build using AMX where the VM hides it (benchmarks/README.md)
            import signal

            code = f"killed by {signal.Signals(-code).name}"
        raise ColdRunFailed(f"exit {code}: " + " | ".join(tail))
    run = {"peak_mb": done["peak_rss_mb"], "wall_s": done["seconds"]}
    if kind == "trt-llm-run":
        profile = json.loads((tmp / "profile.json").read_text())
        response = json.loads((tmp / "out.json").read_text())["responses"][0]
        stages = profile["stages"]
        run.update(cold_ms=profile["startup"]["to_first_token_ms"], before_run_ms=profile["startup"]["before_run_ms"],
                   load_ms=sum(stages[s]["total_ms"] for s in cold_start.LOAD_STAGES[:-1] if s in stages),
                   self_peak_mb=profile["peak_memory_mb"], prompt_tokens=response["prompt_tokens"],
                   token=(response["output_token_ids"] or [None])[0], text=response["output_text"],
                   finish_reason=response["finish_reason"])
    else:
        result = json.loads((tmp / "cold.json").read_text())
        run.update(cold_ms=result["to_first_token_ms"], before_run_ms=result["before_run_ms"],
                   load_ms=result["load_ms"], self_peak_mb=result["vmhwm_mb"], prompt_tokens=result["prompt_tokens"],
                   token=result["token"], text=result["text"], finish_reason=result["finish_reason"])
    return run


# --- engines -------------------------------------------------------------------------------------

def measure(args, ctx: Context, engines: dict, prompts: list[list[int]], warnings: list[str]) -> tuple[dict, dict]:
    """The interleaved rounds: per round, every engine's cold run, then its decode runs. Returns the cold
    runs and the decode runs ({name: [run]}, {(name, batch): [tok/s]})."""
    from sidebyside.worker import Worker, drop_unready

    n = args.new_tokens
    cold: dict[str, list] = {name: [] for name in engines}
    decode: dict[tuple, list] = {}
    workers = {name: Worker(e["key"], Path(e["artifact"]), args.threads, ctx.capacity) for name, e in engines.items()}
    meter = LoadMeter()
    failed: set[str] = set()

    def quiet(what: str) -> None:
        idle = meter.wait_idle(args.wait_idle)
        if idle is not None and idle >= CLEAN_LOAD:
            log(f"{what}: other processes use {idle:.1f} cores; running anyway")

    try:
        drop_unready(workers, warnings, " for decoding")
        settings = [(name, b) for name in engines for b in args.batch_sizes
                    if name in workers and (b == 1 or engines[name]["batched"])]
        with tempfile.TemporaryDirectory(prefix="edge-sidebyside-") as tmp:
            log(f"warm-up: one cold run per engine, {len(settings)} decode settings")
            for name, entry in engines.items():
                try:
                    cold_run(entry["key"], Path(entry["artifact"]), args.threads, ctx.capacity, Path(tmp))
                except ColdRunFailed as error:
                    warnings.append(f"{name}: the cold run failed ({error}); no cold numbers")
                    failed.add(name)
            for name, b in settings:
                workers[name].run(prompts[:b], min(n, 8))
            for r in range(args.rounds):
                for name, entry in engines.items():
                    if name not in failed:
                        quiet(f"round {r + 1} {name} cold")
                        try:
                            run = cold_run(entry["key"], Path(entry["artifact"]), args.threads, ctx.capacity,
                                           Path(tmp))
                        except ColdRunFailed as error:
                            warnings.append(f"{name}: a cold run failed in round {r + 1} ({error})")
                        else:
                            cold[name].append(run)
                            log(f"round {r + 1} {name}: first token {run['cold_ms']:.0f} ms, "
                                f"peak {run['peak_mb']:.0f} MB")
                    for b in [b for m, b in settings if m == name]:
                        quiet(f"round {r + 1} {name} b{b}")
                        result = workers[name].run(prompts[:b], n)
                        decode.setdefault((name, b), []).append(b * (n - 1) / result["decode_s"])
                log(f"round {r + 1}/{args.rounds} done")
        for name, worker in list(workers.items()):
            engines[name]["worker_peak_rss_mb"] = worker.close()
            workers.pop(name)
    finally:
        for worker in workers.values():
            worker.kill()
    return cold, decode


# --- report --------------------------------------------------------------------------------------

def summarize(args, engines: dict, cold: dict, decode: dict, warnings: list[str]) -> tuple[dict, list]:
    """Medians per engine, the cold runs' sanity checks, and the target ratios."""
    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 2) if values else None

    big = max(args.batch_sizes)
    table = {}
    for name, entry in engines.items():
        runs = cold[name]
        row = {"precision": entry["precision"], "disk_mb": entry["disk_mb"],
               **{k: med([r[k] for r in runs]) for k in ("cold_ms", "peak_mb", "before_run_ms", "load_ms",
                                                         "self_peak_mb")},
               "prompt_tokens": runs[0]["prompt_tokens"] if runs else None,
               "first_text": runs[0]["text"] if runs else None}
        for b in args.batch_sizes:
            label = "decode b1" if b == 1 else "decode bmax"
            row[label] = med(decode.get((name, b), []))
            if row[label] is None and b > 1 and not entry["batched"]:
                row[label + " note"] = entry["batch_note"] or "runs one sequence at a time"
        table[name] = row
    counts = {name: row["prompt_tokens"] for name, row in table.items() if row["prompt_tokens"] is not None}
    if len(set(counts.values())) > 1:
        # Same message, different prompts: the templates render it differently (e.g. trt-llm-run passes
        # enable_thinking false, which some templates answer with an empty think block); first tokens may differ.
        warnings.append(f"the cold request's chat-formatted prompt has different token counts: {counts}")
    ratios = []
    for top, bottom, metric, op, target in TARGETS:
        a, z = table.get(top, {}).get(metric), table.get(bottom, {}).get(metric)
        if a is None or z is None or z == 0:
            continue
        value = a / z
        ratios.append({"engine": top, "peer": bottom, "metric": metric.replace("bmax", f"b{big}"), "ratio":
                       round(value, 2), "op": op, "target": target,
                       "met": None if target is None else (value <= target if op == "<=" else value >= target)})
    return table, ratios


def render(report: dict) -> str:
    big = max(report["batch_sizes"])
    lines = [f"# Edge runtimes side by side, {report['machine']['threads']} threads, {report['machine']['cpu']}", "",
             f"Median of {report['rounds']} interleaved rounds. Cold: a fresh process to the first token of one chat "
             f"request ({report['cold_prompt_tokens']} prompt tokens), peak = that process's max RSS. Decode: "
             f"N = {report['new_tokens']} new tokens after a {report['prompt_length']}-token prompt.", "",
             f"| engine | precision | cold first token ms | peak MB (cold run) | decode b1 tok/s | decode b{big} tok/s "
             "| disk MB |", "|---|---|---:|---:|---:|---:|---:|"]

    def cell(value, spec):
        return "-" if value is None else format(value, spec)

    for name, row in report["table"].items():
        wide = "n/a" if row.get("decode bmax note") else cell(row.get("decode bmax"), ".1f")
        lines.append(f"| {name} | {row['precision']} | {cell(row['cold_ms'], '.0f')} | {cell(row['peak_mb'], '.0f')} "
                     f"| {cell(row.get('decode b1'), '.1f')} | {wide} | {row['disk_mb']:.0f} |")
    lines += ["", "| ratio | value | target |", "|---|---:|---|"]
    for r in report["ratios"]:
        target = "(information)" if r["target"] is None else \
            f"{r['op']} {r['target']}x: " + ("met" if r["met"] else "NOT met")
        lines.append(f"| {r['engine']} / {r['peer']} ({r['metric']}) | {r['ratio']:.2f}x | {target} |")
    notes = [f"{name} decode b{big}: n/a ({row['decode bmax note']})" for name, row in report["table"].items()
             if row.get("decode bmax note")]
    lines += [""] + [f"- {note}" for note in notes + report["notes"] + report["warnings"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    args.work_dir = args.work_dir.expanduser().resolve() / ("smoke" if args.smoke else "")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_work_dir(args.work_dir)  # noqa: F841  (held to the end)
    from transformers import AutoTokenizer

    model_dir = decode_speed.hf_dir(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = exact_prompts(tokenizer, args.prompt_length, max(args.batch_sizes))
    # The cold request's prompt as trt-llm-run forms it (the template's text, no special tokens added).
    cold_text = tokenizer.apply_chat_template([{"role": "user", "content": cold_start.PROMPT}],
                                              add_generation_prompt=True, tokenize=False)
    cold_ids = tokenizer(cold_text, add_special_tokens=False)["input_ids"]
    max_input = max(args.max_input, args.prompt_length, len(cold_ids))
    ctx = Context(hf_dir=model_dir, work_dir=args.work_dir / model_dir.name, threads=args.threads,
                  max_batch=max(args.batch_sizes), max_input=max_input,
                  capacity=max(1024, max_input + args.new_tokens), rebuild=args.rebuild)
    notes, warnings = [], []
    engines = prepare_engines(args.engines, ctx, notes, log)
    cold, decode = measure(args, ctx, engines, prompts, warnings)
    table, ratios = summarize(args, engines, cold, decode, warnings)
    report = {"machine": {"cpu": decode_speed.cpu_name(), "threads": args.threads},
              "versions": decode_speed.versions(args.engines), "rounds": args.rounds, "new_tokens": args.new_tokens,
              "prompt_length": args.prompt_length, "batch_sizes": args.batch_sizes, "capacity": ctx.capacity,
              "cold_message": cold_start.PROMPT, "cold_prompt_tokens": len(cold_ids), "engines": engines,
              "table": table, "ratios": ratios, "cold_runs": cold,
              "decode_runs": {f"{name} b{b}": runs for (name, b), runs in decode.items()},
              "notes": notes, "warnings": warnings, "seconds": round(time.perf_counter() - started, 1)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "edge_sidebyside.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = render(report)
    (args.out_dir / "edge_sidebyside.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
