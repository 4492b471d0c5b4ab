#!/usr/bin/env python
"""A Gemma 4 text decoder at Gemma-4-E2B's widths (random weights, a few layers): trt-llm fp32 and int4
against Hugging Face transformers (fp32, sdpa, greedy `generate`), batch 1 and 4, in one interleaved run.

    python benchmarks/gemma4_decoder.py            # 5 layers, a 1,024-token prompt, 64 new, batch 1 and 4, 3 rounds
    python benchmarks/gemma4_decoder.py --smoke    # the same checkpoint and engines, a 48-token prompt, 8 new,
                                                   # batch 1 and 2, 1 round, transformers with both caches

The checkpoint is Gemma4ForCausalLM with E2B's text config (hidden 1536, 8 query heads, 1 KV head, head_dim
256 on sliding layers and global_head_dim 512 on global ones, window 512, MLP 6144 and double-wide on the
KV-sharing layers, per-layer inputs of 256 a layer, final soft-cap 30, attention_k_eq_v off, the rope of
transformers' Gemma4TextConfig defaults (sliding: default, theta 1e4; global: proportional, a quarter of the
head, theta 1e6), tied LM head) but --layers layers (default 5: sliding, sliding, global, sliding, global,
the last two reading the caches of layers 1 and 2: num_kv_shared_layers 2). E2B's own block [s,s,s,s,f]
cannot share with 5 layers: its shared global layer would have no global layer before it to read
(transformers refuses such a config). The vocabulary is the gemma3 tokenizer's (npm; tests/assets.py): it
has 262,145 tokens (262,144 and <image_soft_token>), one past E2B's 262,144, so both tables are padded to
262,208 rows as tests/family_assets.py pads them. Random weights as tests/family_assets.py makes the
"gemma4" checkpoints (norms off 1, layer scalars in [0.5, 1.5], the tables' pad rows random) and the token
embedding scaled by 0.1 (std 0.002; see gemma3_decoder.py: at 0.02 the last prompt token's embedding
dominates and a random model repeats it forever, so every engine agrees trivially). Made once under
--work-dir (`gemma4-e2b-widths-<layers>l/checkpoint`, the engines beside it; delete the folder to start again).

Engines, each in its own worker process (sidebyside/worker.py), --threads threads each (default 2):

  * trt-llm fp32 and int4 (`trt-llm-build`, cpu backend = ONNX Runtime; int4 weights in blocks of 32, its
    embedding and per-layer table stored in the build's default for int4, recorded in the results), run
    through the real runtime (runtime/engine/generate.py, greedy);
  * transformers: Gemma4ForCausalLM, fp32, sdpa attention, torch threads = --threads, greedy `generate` with
    --hf-cache (dynamic or static; the smoke mode runs both, as two engines, so that the faster is kept).
    transformers has no CPU int4 of its own; torchao 0.18's int4 weight-only on CPU was tried (below) and is
    not at its best, so int4 is compared against transformers fp32.

After an untimed warm-up of every engine and batch size (whose tokens are the checks), --rounds rounds in
which every engine runs every batch size in turn (the engine order rotated every round), exactly
--new-tokens tokens a row: time to first token (the prompt's prefill, longer than the window) and decode
tok/s = B x (N - 1) / (first token to last). Before each timed run it waits up to --wait-idle seconds for
other processes to use < 0.3 cores and records what they used. Checked: trt-llm fp32's first
--check-tokens greedy tokens against transformers' (batch 1, and each row of the largest batch), every
engine's first row of the largest batch against its batch 1, every timed run's tokens against its warm-up.

Writes gemma4_decoder.json and gemma4_decoder.md into --out-dir (default out/bench) and prints the table.
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
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from sidebyside import worker  # noqa: E402
from sidebyside.artifacts import Context  # noqa: E402
from sidebyside.measure import CLEAN_LOAD, LoadMeter, cpu_name, lock_work_dir, log, pin_threads  # noqa: E402
from sidebyside.peers import hf, ours  # noqa: E402
from sidebyside.prompts import exact_prompts  # noqa: E402

S, F = "sliding_attention", "full_attention"
# google/gemma-4-E2B's text config (docs/plans/gemma4.md), all but its 35 layers and 20 shared ones; rope:
# Gemma4TextConfig's defaults (not passed). max_position_embeddings 4,096 (E2B: 131,072): the rotary tables'
# rows, more than the run's 1,088 positions
E2B = dict(hidden_size=1536, num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
           sliding_window=512, intermediate_size=6144, use_double_wide_mlp=True, hidden_size_per_layer_input=256,
           final_logit_softcapping=30.0, attention_k_eq_v=False, tie_word_embeddings=True, rms_norm_eps=1e-6,
           hidden_activation="gelu_pytorch_tanh", initializer_range=0.02, max_position_embeddings=4096)
EMBED_SCALE = 0.1  # see the docstring
INT4 = {"weights": "int4", "group_size": 32}
ENGINE_LIMITS = dict(prompt=1024, new=64, batch=4)  # the engines are built for the full run (smoke reuses them)
OURS_FP32, OURS_INT4 = "trt-llm fp32", "trt-llm int4"
HF_NAME = "transformers fp32 ({} cache)"
# measured once with --smoke (2026-12-06, results/2026-12-06/gemma4_decoder_smoke.md): the faster one
HF_CACHE_KEPT = "dynamic"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=5, help="decoder layers (default 5: s,s,f,s,f, the last two shared)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length (default 1024, twice the window)")
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--hf-cache", default=HF_CACHE_KEPT, help="transformers' cache: dynamic, static or both")
    p.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared between engines")
    p.add_argument("--wait-idle", type=float, default=10.0, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--rebuild", action="store_true", help="rebuild (and re-time) every engine")
    p.add_argument("--profile", action="store_true", help="instead of the run: ONNX Runtime's profile of trt-llm fp32 "
                   "(batch 1, the prompt's prefill and 16 decode steps; the engine built by a run before)")
    p.add_argument("--smoke", action="store_true", help="a 48-token prompt, 8 new tokens, batch 1 and 2, 1 round, "
                   "transformers with both caches; the same checkpoint and engines as the full run")
    args = p.parse_args(argv)
    if args.smoke:
        for name, value in dict(rounds=1, prompt_tokens=48, new_tokens=8, batch_sizes="1,2", check_tokens=8,
                                hf_cache="both", wait_idle=0.0).items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",")})
    args.check_tokens = min(args.check_tokens, args.new_tokens)
    if args.hf_cache not in ("dynamic", "static", "both"):
        p.error("--hf-cache: dynamic, static or both")
    args.hf_caches = ["dynamic", "static"] if args.hf_cache == "both" else [args.hf_cache]
    args.work_dir = args.work_dir.expanduser().resolve()
    return args


def layer_types(layers: int) -> list[str]:
    """E2B's block is [s,s,s,s,f]; with few layers and 2 shared, both kinds need an owner before the shared
    ones: [s,s,f] then alternate s,f, the last layer global (transformers forces that)."""
    types = [S, S, F] + [S if i % 2 == 0 else F for i in range(layers - 3)]
    types[-1] = F
    return types[:layers]


def checkpoint(args) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    import family_assets

    types = layer_types(args.layers)
    folder = args.work_dir / f"gemma4-e2b-widths-{args.layers}l"
    final = folder / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    if not (final / "config.json").is_file():
        log(f"random Gemma 4 checkpoint ({args.layers} layers: {types}, 2 shared) -> {final}")
        randomise = family_assets.gemma4_nontrivial

        def nontrivial_and_scaled(model):  # the tied embedding scaled in place: no second copy of 1.6 GB
            import torch

            randomise(model)
            with torch.no_grad():
                model.model.embed_tokens.weight.mul_(EMBED_SCALE)

        family_assets.gemma4_nontrivial = nontrivial_and_scaled
        tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=folder))
        try:
            # vocab_size: the asset's padding of the tokenizer (262,208); the per-layer table the same
            family_assets.make_family_model("gemma4_e2b", tmp, args.work_dir, **{
                **E2B, "num_hidden_layers": args.layers, "layer_types": types, "num_kv_shared_layers": 2,
                "vocab_size_per_layer_input": 262_208})
            os.rename(tmp, final)
        finally:
            family_assets.gemma4_nontrivial = randomise
            shutil.rmtree(tmp, ignore_errors=True)
    return final


class OursRunner(ours.Runner):
    """The engine opened from its manifest (layer specs, the per-layer table memory-mapped): what trt-llm-run
    does; peers/ours.py's runner predates both."""

    def __init__(self, path: Path, threads: int, capacity: int):
        from trt_llm.runtime.app.evaluate import open_model
        from trt_llm.runtime.engine_dir import EngineDir

        self.model = open_model(EngineDir.open(path), threads)
        self.model.eos = set()  # every row makes exactly n tokens


class HfRunner(hf.Runner):
    """peers/hf.py's runner with sdpa attention asked for and the cache of TRTLLM_BENCH_HF_CACHE."""

    def __init__(self, path: Path, threads: int, capacity: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        self.cache = os.environ["TRTLLM_BENCH_HF_CACHE"]
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
        if self.cache == "static":
            self.model.generation_config.cache_implementation = "static"


class Worker(worker.Worker):
    """sidebyside's worker process, started through this file (--worker) so that it runs the runners above."""

    def __init__(self, engine: str, path: Path, threads: int, capacity: int, hf_cache: str = ""):
        env = {**os.environ, "TRTLLM_BENCH_HF_CACHE": hf_cache,
               "PYTHONPATH": os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)}
        self.engine, self.loaded_rss_mb = engine, None
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", engine, str(path), "--threads", str(threads),
                                      "--capacity", str(capacity)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def interleaved(args, engines: dict, prompts: list[list[int]], meter: LoadMeter) -> dict:
    """Warm-up (the checked tokens), then the rounds; engines: name -> (worker key, path, hf cache)."""
    n, batches, capacity = args.new_tokens, args.batch_sizes, args.prompt_tokens + args.new_tokens
    workers = {}
    try:
        for name, (key, path, cache) in engines.items():  # one at a time: each load's peak on its own
            workers[name] = Worker(key, path, args.threads, capacity, cache)
            workers[name].wait_ready()
        log(f"warm-up and check ({args.check_tokens} tokens)")
        warm = {(name, b): workers[name].run(prompts[:b], args.check_tokens)["tokens"]
                for b in batches for name in engines}
        runs = {(name, b): [] for name in engines for b in batches}
        budget = args.wait_idle * 12
        names = list(engines)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for b in batches:
                for name in order:
                    waited = time.perf_counter()
                    meter.wait_idle(min(args.wait_idle, budget))
                    budget -= time.perf_counter() - waited
                    before = meter.snapshot()
                    result = workers[name].run(prompts[:b], n)
                    same = [t[:args.check_tokens] for t in result["tokens"]] == warm[(name, b)]
                    runs[(name, b)].append(dict(ttft_s=result["ttft_s"], decode_tok_s=b * (n - 1) / result["decode_s"],
                                                other_cores=meter.other_cores(before, meter.snapshot()),
                                                same_tokens_as_warmup=same))
            log(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{name} b{b} {x[-1]['ttft_s'] * 1e3:.0f} ms / {x[-1]['decode_tok_s']:.1f} tok/s"
                for (name, b), x in runs.items() if x))
        loaded = {name: w.loaded_rss_mb for name, w in workers.items()}
        peaks = {name: w.close() for name, w in workers.items()}
        workers.clear()
    finally:
        for w in workers.values():
            w.kill()
    return dict(warm=warm, runs=runs, loaded=loaded, peaks=peaks)


def summarize(runs: list[dict]) -> dict:
    """Medians and spread over every round (the ratios are the answer to a shared machine: each round's
    engines ran back to back), and the same over the clean ones."""
    clean = [x for x in runs if x["other_cores"] is None or x["other_cores"] < CLEAN_LOAD]
    ttft = [x["ttft_s"] * 1e3 for x in runs]
    decode = [x["decode_tok_s"] for x in runs]
    return dict(ttft_ms_median=statistics.median(ttft), ttft_ms_min=min(ttft), ttft_ms_max=max(ttft),
                decode_tok_s_median=statistics.median(decode), decode_tok_s_min=min(decode),
                decode_tok_s_max=max(decode), clean_runs=len(clean),
                other_cores_median=statistics.median([x["other_cores"] or 0.0 for x in runs]),
                other_cores_max=max(x["other_cores"] or 0.0 for x in runs), runs=runs)


def round_ratios(runs: dict, ours_name: str, peer: str, b: int) -> dict:
    """Per round, ours against the peer's run of the same round: (peer TTFT / ours TTFT, ours decode /
    peer decode), so > 1 is trt-llm faster; median and spread."""
    pairs = list(zip(runs[(ours_name, b)], runs[(peer, b)]))
    prefill = [p["ttft_s"] / o["ttft_s"] for o, p in pairs]
    decode = [o["decode_tok_s"] / p["decode_tok_s"] for o, p in pairs]
    return dict(prefill_median=statistics.median(prefill), prefill_min=min(prefill), prefill_max=max(prefill),
                decode_median=statistics.median(decode), decode_min=min(decode), decode_max=max(decode))


def token_checks(warm: dict, batches: list[int], peer: str) -> list[str]:
    lines, top = [], max(batches)
    rows = warm[(OURS_FP32, top)]
    lines.append(f"trt-llm fp32's checked tokens at batch {top}: {len({t for row in rows for t in row})} distinct "
                 f"in {sum(map(len, rows))}")
    for b in batches:
        for other in [name for (name, bb) in warm if bb == b and name != OURS_FP32]:
            misses = [first_mismatch(x, y) for x, y in zip(warm[(OURS_FP32, b)], warm[(other, b)])]
            same = sum(m is None for m in misses)
            lines.append(f"b{b}: trt-llm fp32 against {other}: {same}/{len(misses)} rows identical over "
                         f"{len(warm[(other, b)][0])} tokens" + ("" if same == len(misses) else
                                                                 f" (first mismatch per row: {misses})"))
    if top > 1:
        for (name, b), rows in warm.items():
            if b == top:
                m = first_mismatch(rows[0], warm[(name, 1)][0])
                lines.append(f"b{top}: {name}'s first row against its batch 1: "
                             + ("identical" if m is None else f"differs from token {m}"))
    return lines


def build_what(config: dict) -> str:
    """trt-llm-build's flags as one short line."""
    quantization = config.get("quantization")
    return (f"trt-llm-build backend {config['backend']}, dtype {config['dtype']}, max_batch_size {config['max_batch_size']}, "
            f"max_input_len {config['max_input_len']}, max_kv_cache_capacity {config['max_kv_cache_capacity']}"
            + (f", quantization {quantization}" if quantization else ""))


def fmt_range(median, low, high, digits=0):
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def markdown(result: dict) -> str:
    lines = [f"Gemma 4 decoder at Gemma-4-E2B's widths, {result['layers']} layers ({', '.join(t[0] for t in result['layer_types'])}; "
             f"the last two read layers {result['kv_sources'][-2:]}'s caches), window {result['widths']['sliding_window']}, "
             f"random weights; prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new, {result['threads']} threads "
             f"each, {result['rounds']} interleaved rounds; median (min-max) over the rounds", "",
             f"{result['cpu']}; " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), "",
             f"| batch | engine | TTFT ms | decode tok/s | prefill trt-llm / {result['hf_caches'][0]} | decode trt-llm / {result['hf_caches'][0]} | other cores (median, max) | clean runs |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["results"]:
        ratio = result["ratios"].get(f"{row['engine']} b{row['batch']}")
        cells = ("", "") if ratio is None else (
            fmt_range(ratio["prefill_median"], ratio["prefill_min"], ratio["prefill_max"], 2) + "x",
            fmt_range(ratio["decode_median"], ratio["decode_min"], ratio["decode_max"], 2) + "x")
        lines.append(f"| {row['batch']} | {row['engine']} | {fmt_range(row['ttft_ms_median'], row['ttft_ms_min'], row['ttft_ms_max'])} "
                     f"| {fmt_range(row['decode_tok_s_median'], row['decode_tok_s_min'], row['decode_tok_s_max'], 2)} "
                     f"| {cells[0]} | {cells[1]} | {row['other_cores_median']:.2f}, {row['other_cores_max']:.2f} "
                     f"| {row['clean_runs']}/{len(row['runs'])} |")
    lines += ["", "> 1: trt-llm is faster; each ratio is taken per round (the two engines' runs of the same round), "
              "then its median (min-max). TTFT = the prompt's prefill and the first token; decode tok/s = B x (N - 1) / "
              f"(first token to last). Other cores: CPU other processes used during the run; clean: < {CLEAN_LOAD}.", "",
              "| engine | build | build s | build peak RSS MB | on disk MB | worker loaded / peak RSS MB |",
              "|---|---|---:|---:|---:|---:|"]
    for e in result["engines"]:
        build = e["build"] or {}
        seconds = f"{build['seconds']:.0f}" if build.get("seconds") else "-"
        lines.append(f"| {e['engine']} | {e['what']} | {seconds}{' (cached)' if build.get('cached') else ''} "
                     f"| {build.get('peak_rss_mb') or 0:.0f} | {e['disk_mb']:.0f} | {e['loaded_rss_mb'] or 0:.0f} / "
                     f"{e['peak_rss_mb'] or 0:.0f} |")
    lines += ["", "Checks:"] + [f"- {c}" for c in result["checks"]] + [f"- note: {x}" for x in result["notes"]]
    lines += ["", f"Total time: {result['total_s']:.0f} s", ""]
    return "\n".join(lines)


def profile(args, hf_dir: Path, prompts: list[list[int]], steps: int = 16) -> dict:
    """trt-llm fp32, batch 1: ONNX Runtime's profiler over the prompt's prefill and `steps` decode steps; kernel
    time by op type and by layer. A node's layer is the last attention node at or before it in the graph's order,
    so layer i holds its attention, output projection, MLP and per-layer input, and layer i+1's q/k/v projections
    ("inputs": layer 0's q/k/v and the per-layer inputs' projection; "other": nodes the optimised graph made or
    renamed, the LM head's among them)."""
    import collections

    import onnx

    from trt_llm.runtime.app.evaluate import open_model
    from trt_llm.runtime.backends.ort_engine import OPTIONS_ENV
    from trt_llm.runtime.engine.generate import generate
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

    engine = hf_dir.parent / "trt-llm-fp32"
    os.environ[OPTIONS_ENV] = "enable_profiling=1"
    model = open_model(EngineDir.open(engine), args.threads)
    model.eos = set()
    generate(model, [Sequence(list(prompts[0]), steps + 1)], Sampler([SamplingParams(temperature=0.0)]))
    path = model.engine.session.end_profiling()
    events = json.loads(Path(path).read_text())
    os.remove(path)
    graph = onnx.load(str(model.engine.graph_path), load_external_data=False).graph
    layer_of, seen = {}, 0
    for node in graph.node:
        seen += node.op_type == "GroupQueryAttention"
        layer_of[node.name] = f"layer {seen - 1}" if seen else "inputs"
    runs = sorted((e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"), key=lambda e: e["ts"])
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    out = {}
    for phase, first, last, per in (("prefill", runs[0], runs[0], 1), ("decode", runs[1], runs[-1], len(runs) - 1)):
        chosen = [e for e in kernels if first["ts"] <= e["ts"] <= last["ts"] + last["dur"]]
        by_op, by_layer, attention = collections.Counter(), collections.Counter(), collections.Counter()
        for e in chosen:
            name = e["name"][:-len("_kernel_time")]
            by_op[e["args"].get("op_name")] += e["dur"] / per / 1e3
            by_layer[layer_of.get(name, "other")] += e["dur"] / per / 1e3
            if e["args"].get("op_name") == "GroupQueryAttention":
                attention[layer_of.get(name, name)] += e["dur"] / per / 1e3
        out[phase] = dict(runs=per, wall_ms=sum(r["dur"] for r in runs if first["ts"] <= r["ts"] <= last["ts"]) / per / 1e3,
                          kernels_ms=sum(by_op.values()), by_op_ms=dict(by_op.most_common(10)),
                          by_layer_ms=dict(sorted(by_layer.items())), attention_ms=dict(sorted(attention.items())))
    return out


def profile_markdown(result: dict) -> str:
    lines = [f"trt-llm fp32, batch 1, a {result['prompt_tokens']}-token prompt: ONNX Runtime's profiler ({result['cpu']}, "
             f"{result['threads']} threads; other processes used {result['other_cores']:.2f} cores meanwhile, so read the shares)", ""]
    for phase, x in result["phases"].items():
        unit = "ms" if phase == "prefill" else "ms a step"
        lines += [f"{phase}: {x['wall_ms']:.0f} {unit} ({x['runs']} runs), kernels {x['kernels_ms']:.0f}", "",
                  "| by | " + " | ".join(x["by_layer_ms"]) + " |", "|---|" + "---:|" * len(x["by_layer_ms"]),
                  "| layer (kinds: " + ", ".join(result["layer_kinds"]) + ") | "
                  + " | ".join(f"{v:.1f} ({100 * v / x['kernels_ms']:.0f}%)" for v in x["by_layer_ms"].values()) + " |",
                  "", "op types: " + ", ".join(f"{k} {v:.1f}" for k, v in x["by_op_ms"].items()),
                  "", "GroupQueryAttention by layer: " + ", ".join(f"{k} {v:.2f}" for k, v in x["attention_ms"].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    from transformers import AutoConfig, AutoTokenizer

    args.work_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_work_dir(args.work_dir)  # noqa: F841 (held until exit)
    hf_dir = checkpoint(args)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    prompts = exact_prompts(tokenizer, args.prompt_tokens, max(args.batch_sizes))
    max_input = max(args.prompt_tokens, ENGINE_LIMITS["prompt"])
    ctx = Context(hf_dir=hf_dir, work_dir=hf_dir.parent, threads=args.threads,
                  max_batch=max(*args.batch_sizes, ENGINE_LIMITS["batch"]), max_input=max_input,
                  capacity=max_input + max(args.new_tokens, ENGINE_LIMITS["new"]), rebuild=args.rebuild)
    if args.profile:
        meter = LoadMeter()
        before = meter.snapshot()
        phases = profile(args, hf_dir, prompts)
        result = dict(prompt_tokens=args.prompt_tokens, threads=args.threads, cpu=cpu_name(), phases=phases,
                      layer_kinds=[f"{t[0]}{'' if m != 'reuse' else ' shared'}" for t, m in
                                   zip(layer_types(args.layers), AutoConfig.from_pretrained(hf_dir).kv_sharing_modes)],
                      other_cores=meter.other_cores(before, meter.snapshot()) or 0.0)
        text = profile_markdown(result)
        print(text)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "gemma4_decoder_profile.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out_dir / "gemma4_decoder_profile.md").write_text(text)
        return 0
    built = {OURS_FP32: ours.prepare(ctx, None, name="trt-llm-fp32", precision="fp32"),
             OURS_INT4: ours.prepare(ctx, INT4, name="trt-llm-int4", precision="int4-g32")}
    engines = {name: ("ours", artifact.path, "") for name, artifact in built.items()}
    for cache in args.hf_caches:
        engines[HF_NAME.format(cache)] = ("transformers", hf_dir, cache)
    import yaml

    build_flags = {name: yaml.safe_load((ctx.work_dir / f"{a.path.name}.yaml").read_text()) for name, a in built.items()}
    manifests = {name: json.loads((a.path / "manifest.json").read_text())["model"] for name, a in built.items()}
    quantization = {name: manifest.get("quantization") for name, manifest in manifests.items()}

    meter = LoadMeter()
    done = interleaved(args, engines, prompts, meter)
    peers = [HF_NAME.format(c) for c in args.hf_caches]
    results, ratios = [], {}
    for b in args.batch_sizes:
        for name in engines:
            results.append(dict(batch=b, engine=name, **summarize(done["runs"][(name, b)])))
            if name in built:
                for peer in peers:  # the table's: against the first (the kept cache, or dynamic in smoke)
                    ratios[f"{name} b{b}" + ("" if peer == peers[0] else f" vs {peer}")] = round_ratios(
                        done["runs"], name, peer, b)
    checks = []
    for peer in peers:
        checks += [x for x in token_checks(done["warm"], args.batch_sizes, peer) if x not in checks]
    checks += [f"{name} b{b}: a timed run's tokens differ from its warm-up run's"
               for (name, b), runs in done["runs"].items() if not all(x["same_tokens_as_warmup"] for x in runs)]
    notes = [f"{name}: quantization {quantization[name]} (the embedding and per-layer table stored as "
             f"{(quantization[name] or {}).get('embedding', 'fp32')})" for name in built]
    if len(peers) == 2:
        for b in args.batch_sizes:
            d, s = (summarize(done["runs"][(p, b)]) for p in peers)
            notes.append(f"b{b}: transformers dynamic cache {d['ttft_ms_median']:.0f} ms / {d['decode_tok_s_median']:.2f} "
                         f"tok/s, static {s['ttft_ms_median']:.0f} ms / {s['decode_tok_s_median']:.2f} tok/s")
    config = AutoConfig.from_pretrained(hf_dir)
    engine_rows = []
    for name, (_, path, cache) in engines.items():
        artifact = built.get(name)
        engine_rows.append(dict(engine=name, path=str(path), build=artifact.build if artifact else None,
                                what=build_what(build_flags[name]) if artifact else
                                f"from_pretrained(fp32, sdpa), generate({cache} cache)",
                                disk_mb=size_mb(path), loaded_rss_mb=done["loaded"].get(name),
                                peak_rss_mb=done["peaks"].get(name)))
    versions = {}
    for dist in ("onnxruntime", "torch", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    result = dict(layers=args.layers, layer_types=layer_types(args.layers), kv_sharing_modes=config.kv_sharing_modes,
                  kv_sources=[layer.get("kv_source") for layer in manifests[OURS_FP32]["layers"]],
                  widths={**E2B, "vocab_size": config.vocab_size, "vocab_size_per_layer_input": config.vocab_size_per_layer_input,
                          "embed_scale": EMBED_SCALE}, hf_dir=str(hf_dir),
                  prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, batch_sizes=args.batch_sizes,
                  threads=args.threads, rounds=args.rounds, smoke=args.smoke, hf_caches=args.hf_caches,
                  cpu=cpu_name(), logical_cores=os.cpu_count(), versions=versions, build_flags=build_flags,
                  results=results, ratios=ratios, engines=engine_rows,
                  checked_tokens={f"{name} b{b}": rows for (name, b), rows in done["warm"].items()},
                  checks=checks, notes=notes, total_s=time.perf_counter() - started,
                  finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    text = markdown(result)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "gemma4_decoder_smoke" if args.smoke else "gemma4_decoder"
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / f"{stem}.md").write_text(text)
    log(f"wrote {args.out_dir / stem}.json, .md")
    failed = any("differs" in c or "mismatch" in c for c in checks if c.startswith(("b1: trt-llm fp32 against transformers",
                                                                                     f"b{max(args.batch_sizes)}: trt-llm fp32's")))
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # one engine's process (Worker above)
        ours.Runner = OursRunner
        hf.Runner = HfRunner
        sys.exit(worker.main(sys.argv[2:]))
    sys.exit(main())
