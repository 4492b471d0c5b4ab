"""Write (or ``--check``) the committed JSON Schema files in ``schemas/json/``.

    python -m trt_llm.schemas.generate          # rewrite the files
    python -m trt_llm.schemas.generate --check  # exit 1 naming each file that drifted

The output is deterministic (sorted keys, indent 2, trailing newline) so a diff means a real change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from .build_config import BuildConfig
from .input_file import InputFile
from .output_file import OutputFile
from .profile import Profile

JSON_DIR = Path(__file__).resolve().parent / "json"

# file name -> (model, mode). Inputs are described as accepted ("validation"); the output file as
# written ("serialization").
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "build_config.schema.json": (BuildConfig, "validation"),
    "input_file.schema.json": (InputFile, "validation"),
    "output_file.schema.json": (OutputFile, "serialization"),
    "profile.schema.json": (Profile, "serialization"),
}


def render(model: type[BaseModel], mode: str) -> str:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              **model.model_json_schema(mode=mode)}
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_files() -> dict[str, str]:
    return {name: render(model, mode) for name, (model, mode) in SCHEMAS.items()}


def drifted(directory: Path = JSON_DIR) -> list[str]:
    """Names of schema files that are missing or differ from the models."""
    out = []
    for name, text in expected_files().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trt_llm.schemas.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on drift")
    parser.add_argument("--dir", type=Path, default=JSON_DIR, help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)

    if args.check:
        bad = drifted(args.dir)
        for name in bad:
            print(f"{args.dir / name}: out of date with the models; run python -m trt_llm.schemas.generate",
                  file=sys.stderr)
        return 1 if bad else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, text in expected_files().items():
        (args.dir / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
