#!/usr/bin/env python
"""Time to first token per turn of an 8-turn conversation with context reuse against without it
(SmolLM2-135M-Instruct fp32, cpu backend), and llama.cpp on the same weights doing the same.

A chat client resends the whole conversation each turn: a ~1,000-token system prompt, then each turn
a question and the model's own answer (48 greedy tokens). trt-llm with --context-reuse restores the
turns before (the prompt's and the answer's blocks) and computes the new question; with
`context_cache_lookup_policy: bypass` it computes the whole conversation each turn. llama.cpp
(llama-cpp-python, when installed: `pip install llama-cpp-python`) keeps its context between calls
and reuses its longest common prefix, as llama-server's cache_prompt does for a slot; its bypass
resets the context first. Its weights are the same fp32 ones (an F32 GGUF written from the same
checkpoint, benchmarks/sidebyside/gguf_convert.py). Conversations alternate between the four in one
process (the machine is shared and noisy): read the ratios.

    python benchmarks/multi_turn.py [--threads 2] [--rounds 3] [--turns 8] [--json out/bench/multi_turn.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prompt_cache_ttft import build, system_prompt  # noqa: E402

QUESTIONS = ["Can I put the blue glazed bowls in the dishwasher?", "How long does delivery to Lyon take?",
             "Do you ship to Norway, and what does it cost?", "What if a cup arrives broken?",
             "Are the linen towels pre-washed?", "Can I order a set of six plates in green?",
             "How do I care for the hand-blown glasses?", "Do you have gift wrapping?",
             "Can I pick up my order at the workshop?", "What is your returns address?"]
ANSWER_TOKENS = 48


def ours_conversation(runner, system: str, turns: int, bypass: bool) -> tuple[list[float], list[int]]:
    """TTFT (ms) and restored tokens of each turn; a fresh context cache (no earlier conversation)."""
    from trt_llm.runtime.cache.context_cache import ContextCache
    from trt_llm.schemas.input_file import parse_input_dict

    runner.prefix_cache = ContextCache(runner.engine_dir.identity)
    runner.prefix_stats = runner.prefix_cache.stats
    messages, ttfts, reused = [{"role": "system", "content": system}], [], []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        data = {"temperature": 0.0, "max_generate_length": ANSWER_TOKENS, "requests": [{"messages": list(messages)}]}
        if bypass:
            data["context_cache_lookup_policy"] = "bypass"
        loaded = parse_input_dict(data)
        response = runner.run(loaded, loaded.settings).responses[0]
        ttfts.append(response.time_to_first_token_ms)
        reused.append(response.reused_tokens)
        messages.append({"role": "assistant", "content": response.output_text})
    return ttfts, reused


def llama_conversation(llm, tokenizer, system: str, turns: int, bypass: bool) -> list[float]:
    """The same conversation on llama.cpp: each turn's prompt (our chat template's text, tokenized by
    llama.cpp), TTFT = matching the cached prefix, evaluating the rest, the first token."""
    messages, ttfts = [{"role": "system", "content": system}], []
    llm.reset()
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        if bypass:
            llm.reset()
        started, answer = time.perf_counter(), []
        for token in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, reset=True):
            if not answer:
                ttfts.append((time.perf_counter() - started) * 1000)
            answer.append(token)
            if token == llm.token_eos() or len(answer) >= ANSWER_TOKENS:
                break
        messages.append({"role": "assistant", "content": llm.detokenize(answer).decode("utf-8", "replace")})
    return ttfts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--no-llamacpp", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner

    engine = EngineDir.open(build(args.work_dir))
    runner = Runner(engine, threads=args.threads, context_reuse=True)
    system = system_prompt(runner.tokenizer, args.system_tokens)
    llm = tokenizer = None
    if not args.no_llamacpp:
        try:
            from llama_cpp import Llama
        except ImportError:
            print("llama-cpp-python is not installed: llama.cpp left out", file=sys.stderr)
        else:
            from sidebyside.gguf_convert import convert
            from transformers import AutoTokenizer

            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            import assets

            gguf = args.work_dir / "SmolLM2-135M-Instruct-F32.gguf"
            if not gguf.is_file():
                convert(assets.smollm2_hf_dir(args.work_dir), gguf, "F32")
            llm = Llama(str(gguf), n_ctx=4096, n_threads=args.threads, n_batch=512, verbose=False)
            tokenizer = AutoTokenizer.from_pretrained(engine.tokenizer_dir)

    runs: dict[str, list[list[float]]] = {"ours reuse": [], "ours bypass": []}
    if llm is not None:
        runs.update({"llama.cpp reuse": [], "llama.cpp bypass": []})
    restored = []
    ours_conversation(runner, system, 2, bypass=False)  # warm-up, untimed
    for round_number in range(args.rounds):
        order = list(runs) if round_number % 2 == 0 else list(runs)[::-1]
        for name in order:
            if name.startswith("ours"):
                ttfts, reused = ours_conversation(runner, system, args.turns, bypass=name.endswith("bypass"))
                if name == "ours reuse":
                    restored = reused
            else:
                ttfts = llama_conversation(llm, tokenizer, system, args.turns, bypass=name.endswith("bypass"))
            runs[name].append(ttfts)
            print(json.dumps({"round": round_number + 1, "engine": name, "ttft_ms": [round(t, 1) for t in ttfts]}),
                  flush=True)
    median = {name: [round(statistics.median(r[t] for r in rounds), 1) for t in range(args.turns)]
              for name, rounds in runs.items()}
    ratios = {engine_name: [round(a / b, 3) for a, b in zip(median[f"{engine_name} reuse"], median[f"{engine_name} bypass"])]
              for engine_name in ("ours", "llama.cpp") if f"{engine_name} reuse" in median}
    report = {"threads": args.threads, "rounds": args.rounds, "turns": args.turns, "answer_tokens": ANSWER_TOKENS,
              "ours_restored_tokens_per_turn": restored, "median_ttft_ms": median, "reuse_over_bypass": ratios,
              "target": "turn 8 reuse / bypass <= 0.3"}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
