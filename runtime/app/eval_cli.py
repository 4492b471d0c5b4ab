"""`trt-llm-eval TEXT --engine-dir DIR [--reference-dir REF]`: perplexity of an engine on a text file,
and against a reference engine (the fp32 build of the same model, say) the KL divergence, top-1
agreement and log-probability gaps per token (runtime/app/evaluate.py). A JSON report on standard output
or -o FILE.

Exit status: 0 done; 2 the text, an engine directory or a flag is unusable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from trt_llm.common.cli_args import OneLineParser, capped_threads, positive_int
from trt_llm.common.files import OutputPathError, prepare_output_file, write_atomically

PROG = "trt-llm-eval"
EXIT_UNUSABLE = 2


MIN_CONTEXT = 3  # a chunk's second half must hold a token predicted from a position of that half


def context_tokens(value: str) -> int:
    number = positive_int(value)
    if number < MIN_CONTEXT:
        raise argparse.ArgumentTypeError(f"{number} is below {MIN_CONTEXT} (the second half of each chunk is scored: "
                                         f"a chunk of {number} has no token to score)")
    return number


def parse_args(argv):
    p = OneLineParser(prog=PROG, description="Perplexity and, against a reference engine, KL divergence.")
    p.add_argument("text", type=Path, help="a UTF-8 text file")
    p.add_argument("--engine-dir", required=True, help="the engine to evaluate")
    p.add_argument("--reference-dir", help="an engine of the same model and tokenizer to compare with")
    p.add_argument("--context", type=context_tokens, default=512,
                   help="tokens per chunk (default 512, at most the engines' max_input_len); the second half "
                        "of each chunk is scored")
    p.add_argument("--max-tokens", type=positive_int, help="use only the text's first N tokens")
    p.add_argument("--threads", type=positive_int, help="CPU threads (default: all physical cores)")
    p.add_argument("-o", "--output", type=Path, help="write the JSON report here (default: standard output)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from trt_llm.runtime.engine_dir import EngineDir, EngineDirError
    from trt_llm.runtime.app.evaluate import chunks, evaluate, open_model
    from trt_llm.runtime.text.tokenizer import Tokenizer

    try:
        if args.output is not None:
            prepare_output_file(args.output, "-o")
        try:
            text = args.text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{args.text}: unreadable: {error}") from None
        engines = [EngineDir.open(args.engine_dir)] + ([EngineDir.open(args.reference_dir)] if args.reference_dir else [])
        for engine in engines:
            if engine.family.task != "chat":
                raise ValueError(f"{engine.path}: a Whisper engine's decoder reads a clip's encoding; perplexity "
                                 "on a text needs a decoder-only model")
            limit = min(engine.limits["max_input_len"], engine.limits["max_kv_cache_capacity"])
            if args.context > limit:
                raise ValueError(f"--context {args.context} exceeds {engine.path}'s max_input_len {limit}")
        tokenizer = Tokenizer.from_dir(engines[0].tokenizer_dir)
        token_ids = tokenizer.encode(text, add_special_tokens=False)[: args.max_tokens]
        if len(engines) == 2 and Tokenizer.from_dir(engines[1].tokenizer_dir).encode(text, add_special_tokens=False)[
                : args.max_tokens] != token_ids:
            raise ValueError("the two engines tokenize the text differently: they are not the same model")
        threads = capped_threads(args.threads) or 0
        models = [open_model(engine, threads) for engine in engines]
    except (EngineDirError, OutputPathError, ValueError) as error:
        return _unusable(str(error))
    total = len(chunks(token_ids, args.context))
    if total == 0:
        return _unusable(f"{args.text}: {len(token_ids)} tokens, fewer than one chunk of --context {args.context}")
    with tqdm(total=total, desc="chunks", unit="chunk", file=sys.stderr, disable=None) as bar:
        report = evaluate(models[0], token_ids, args.context, models[1] if len(models) == 2 else None,
                          progress=lambda done: bar.update(done - bar.n))
    body = {"text": str(args.text), "engine": str(engines[0].path),
            "reference": str(engines[1].path) if len(engines) == 2 else None, "context": args.context,
            **dataclasses.asdict(report)}
    out = json.dumps(body, indent=2) + "\n"
    if args.output is not None:
        write_atomically(args.output, out)
    else:
        sys.stdout.write(out)
    return 0


def _unusable(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
