"""Chat prompts written by the base model itself, for fitting a draft (Magpie-style self-synthesis).

    python -m trt_llm.draft_training.self_prompts --base HF_DIR --count N --out PROMPTS.json
        [--seed 0] [--max-tokens 64] [--temperature 1.0] [--threads 2] [--batch-size 32]

An instruction-tuned model given its chat template up to the start of a user turn (system prompt
included, as in a real chat) writes a user message: sampled at temperature 1 from its full
distribution, these are the requests it has learnt to expect, over any subject and in any form.
That variety is what a draft needs. Its held-out accuracy on free-form prompts lagged templated ones
(step-0 top-1 0.50 against 0.62 on SmolLM2) because the built-in set crosses a few templates with topics.

A sample is kept when the model ended the turn itself within --max-tokens, has at least 12
characters and no chat-template markers, and differs (case and spacing aside) from every kept one.
The output is a JSON list of strings, for train_draft's --extra-prompts. Deterministic: sample i
uses seed `seed + i`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

MIN_CHARS = 12
_MARK = "\u0000USER\u0000"


def user_turn_prefix(tokenizer) -> list[int]:
    """The token ids of the chat template up to where a user's message starts."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    return tokenizer(chat[:chat.index(_MARK)], add_special_tokens=False)["input_ids"]


def keep(text: str, seen: set[str], special: list[str]) -> bool:
    """Whether a sampled user message is a usable, new prompt (and remember it if so)."""
    key = " ".join(text.lower().split())
    if len(key) < MIN_CHARS or key in seen or any(marker in text for marker in special):
        return False
    seen.add(key)
    return True


def write_prompts(base_dir: str, count: int, seed: int = 0, max_tokens: int = 64, temperature: float = 1.0,
                  threads: int = 2, batch_size: int = 32, log=lambda message: None) -> list[str]:
    """`count` user prompts the base writes itself (see the module docstring)."""
    from transformers import AutoTokenizer

    from trt_llm.draft_training.train_draft import continue_prompts, cpu_engine_model

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    prefix = user_turn_prefix(tokenizer)
    special = [t for t in tokenizer.all_special_tokens if t]
    prompts: list[str] = []
    seen: set[str] = set()
    tried = 0
    with tempfile.TemporaryDirectory(prefix="self-prompts-") as work_dir:
        model = cpu_engine_model(base_dir, batch_size, len(prefix), len(prefix) + max_tokens, threads, Path(work_dir))
        while len(prompts) < count:
            if tried >= 4 * count:
                raise SystemExit(f"self_prompts: only {len(prompts)} usable prompts in {tried} samples "
                                 f"(wanted {count}); raise --max-tokens or check the chat template")
            todo = (count - len(prompts)) * 5 // 4 + 1  # some samples are dropped
            samples = continue_prompts(model, [prefix] * todo, max_tokens, batch_size, temperature, seed + tried)
            for sample in samples:
                if not sample["eos_end"]:  # cut off by --max-tokens: not a whole message
                    continue
                text = tokenizer.decode(sample["ids"][sample["prompt_len"]:], skip_special_tokens=True).strip()
                if keep(text, seen, special) and len(prompts) < count:
                    prompts.append(text)
            tried += todo
            log(f"self_prompts: {len(prompts)}/{count} kept from {tried} samples")
    return prompts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trt_llm.draft_training.self_prompts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model: a local Hugging Face folder with a chat template")
    parser.add_argument("--count", type=int, required=True, help="how many prompts to write")
    parser.add_argument("--out", required=True, help="the JSON file to write (a list of strings)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=64, help="longest prompt, in tokens")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    if args.count < 1 or args.max_tokens < 1 or not args.temperature > 0:
        parser.error("--count and --max-tokens must be at least 1 and --temperature above 0")
    start = time.time()
    prompts = write_prompts(args.base, args.count, args.seed, args.max_tokens, args.temperature, args.threads,
                            args.batch_size, log=lambda message: print(message, file=sys.stderr, flush=True))
    Path(args.out).write_text(json.dumps(prompts, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(prompts)} prompts to {args.out} ({time.time() - start:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
