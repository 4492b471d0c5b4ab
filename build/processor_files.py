"""A checkpoint's processor settings, by part: transformers 5 saves a multimodal processor's parts in one
`processor_config.json` (`image_processor`, `feature_extractor`, `video_processor` entries: Gemma 4's,
Qwen3-ASR's), where older checkpoints ship one `preprocessor_config.json` (an image processor's or a
feature extractor's). A Gemma 4 folder may have both, the older file holding the image processor: each
component's stage reads its own part, never the other's."""

from __future__ import annotations

import json
from pathlib import Path

# the key that says which part a preprocessor_config.json is
_TYPE_KEYS = {"image_processor": "image_processor_type", "feature_extractor": "feature_extractor_type"}


def processor_part(folder, part: str) -> tuple[dict, Path] | None:
    """(settings, the file they came from) of `part` ("image_processor" or "feature_extractor"): the
    entry of processor_config.json, else preprocessor_config.json unless it names itself the other part;
    None where the folder has neither."""
    folder = Path(folder).expanduser()
    combined = folder / "processor_config.json"
    if combined.is_file():
        entry = json.loads(combined.read_text()).get(part)
        if isinstance(entry, dict):
            return entry, combined
    single = folder / "preprocessor_config.json"
    if single.is_file():
        settings = json.loads(single.read_text())
        other = [key for name, key in _TYPE_KEYS.items() if name != part]
        if not any(key in settings for key in other):
            return settings, single
    return None
