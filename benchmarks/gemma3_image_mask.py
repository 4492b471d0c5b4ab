#!/usr/bin/env python
"""What Gemma 3's image mask costs on the cpu backend: the same random Gemma 3 decoder built as a
Gemma3ForConditionalGeneration (its attention takes the tree_mask that lets an image's tokens see each
other both ways: ONNX Runtime runs the op's function body, its GroupQueryAttention being causal-only)
and as a Gemma3ForCausalLM (GroupQueryAttention), in one interleaved run.

    python benchmarks/gemma3_image_mask.py [--layers 6] [--prompt 1000] [--new 33] [--rounds 3]

Gemma-3-1B's text widths (hidden 1152, MLP 6912, 4 query heads, 1 KV head of 256, window 512, the
262,144-token vocabulary, tied head) with --layers layers (five sliding to one global), random weights,
a tiny random SigLIP beside it; a text prompt of --prompt tokens (the mask's cost, not the tower's).
Per engine and round: the time to the first token (max_generate_length 1) and the decode rate
((new - 1) tokens over the time past the first). 2 threads. No weights are downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def checkpoints(work: Path, layers: int) -> tuple[Path, Path]:
    """(the VLM, the same text decoder as a causal LM), written once under `work`."""
    import torch
    from transformers import (AutoTokenizer, Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration,
                              Gemma3TextConfig, GenerationConfig)

    import assets

    vlm, text = work / "vlm", work / "text"
    if (vlm / "config.json").exists() and (text / "config.json").exists():
        return vlm, text
    tokenizer = AutoTokenizer.from_pretrained(assets.npm_tokenizer_dir("gemma3", Path("~/.cache/trt-llm-tests").expanduser()))
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    text_config = Gemma3TextConfig(vocab_size=262_208, hidden_size=1152, intermediate_size=6912, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                   sliding_window=512, layer_types=types, max_position_embeddings=4096,
                                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                                   initializer_range=0.02, tie_word_embeddings=True)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=896,
                  patch_size=14)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text_config.to_dict(), vision_config=vision,
                                                        mm_tokens_per_image=256)).eval()
    with torch.no_grad():  # a random model that makes varied tokens (see gemma3_decoder.py)
        model.model.language_model.embed_tokens.weight.mul_(0.1)
    generation = GenerationConfig(eos_token_id=[1, 106], pad_token_id=0, do_sample=False)
    model.generation_config = generation
    model.save_pretrained(vlm)
    tokenizer.save_pretrained(vlm)
    causal = Gemma3ForCausalLM(text_config).eval()
    causal.model.load_state_dict(model.model.language_model.state_dict())
    causal.generation_config = generation
    causal.save_pretrained(text)
    tokenizer.save_pretrained(text)
    return vlm, text


def engine(checkpoint: Path) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = checkpoint.parent / f"{checkpoint.name}-engine"
    if not (out / "manifest.json").exists():
        build_engine(BuildConfig(model=str(checkpoint), output_dir=str(out), max_batch_size=1, max_input_len=2048,
                                 max_kv_cache_capacity=2048), progress=False)
    return out


def timed(runner, path: Path, new: int) -> tuple[float, list[int]]:
    from trt_llm.schemas.input_file import load_input_file

    loaded = load_input_file(path)
    loaded.settings.max_generate_length = new
    started = time.perf_counter()
    response = runner.run(loaded, loaded.settings).responses[0]
    return time.perf_counter() - started, response.output_token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--new", type=int, default=33)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=Path("out/bench/gemma3-image-mask"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner

    args.work_dir.mkdir(parents=True, exist_ok=True)
    vlm, text = checkpoints(args.work_dir, args.layers)
    engines = {"masked (VLM)": engine(vlm), "causal (text)": engine(text)}
    request = args.work_dir / "input.json"
    request.write_text(json.dumps({"temperature": 0.0, "requests": [
        {"messages": [{"role": "user", "content": "word " * (args.prompt - 10)}]}]}))
    runners = {name: Runner(EngineDir.open(path), threads=2) for name, path in engines.items()}
    results = {name: {"ttft_ms": [], "decode_tok_s": []} for name in runners}
    tokens = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up and checks
        order = list(runners) if round_ % 2 else list(runners)[::-1]
        for name in order:
            first, _ = timed(runners[name], request, 1)
            whole, ids = timed(runners[name], request, args.new)
            tokens[name] = ids
            if round_:
                results[name]["ttft_ms"].append(first * 1000)
                results[name]["decode_tok_s"].append((len(ids) - 1) / max(whole - first, 1e-9))
    same = len(set(map(tuple, tokens.values()))) == 1
    summary = {name: {key: statistics.median(values) for key, values in r.items()} | {"runs": r}
               for name, r in results.items()}
    import platform

    import onnxruntime

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    report = {"machine": {"cpu": cpu, "cores": __import__("os").cpu_count(), "onnxruntime": onnxruntime.__version__,
                          "python": platform.python_version()},
              "layers": args.layers, "prompt_tokens": args.prompt, "new_tokens": args.new, "threads": 2,
              "same_tokens": same, "results": summary,
              "ratio_masked_over_causal": {key: summary["masked (VLM)"][key] / summary["causal (text)"][key]
                                           for key in ("ttft_ms", "decode_tok_s")}}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
