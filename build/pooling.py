"""A checkpoint's sentence-transformers pooling (modules.json naming a Pooling module, whose folder's
config.json says its mode) -> the engine's tokenizer/pooling.json, the default pooling of its embeddings
(runtime/requests/embeddings.py). Only the modes the runtime pools by are recorded: last token and mean;
another (CLS, max, weighted mean) is left out with a warning, and the runtime's default ("last") applies.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

POOLING_FILE = "pooling.json"  # (runtime/requests/embeddings.POOLING_FILE: the runtime imports nothing of build/)
MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}
OTHER_MODES = ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
               "pooling_mode_weightedmean_tokens")


def checkpoint_pooling(source: str | Path) -> str | None:
    """The pooling a checkpoint folder's sentence-transformers config asks for, or None (no config, or a
    mode the runtime does not pool by)."""
    folder = Path(source)
    modules = folder / "modules.json"
    if not folder.is_dir() or not modules.is_file():
        return None
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
        entry = next(e for e in entries if str(e.get("type", "")).endswith(".Pooling"))
        config = json.loads((folder / entry.get("path", "") / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, AttributeError, TypeError) as error:
        log.warning("%s: its sentence-transformers pooling config cannot be read (%s); embeddings pool by the "
                    "last token", modules, error)
        return None
    chosen = [mode for key, mode in MODES.items() if config.get(key)]
    others = [key for key in OTHER_MODES if config.get(key)]
    if len(chosen) != 1 or others:
        log.warning("%s: pooling %s is not one the runtime pools by (pooling_mode_lasttoken or "
                    "pooling_mode_mean_tokens alone); embeddings pool by the last token unless a request says",
                    modules, ", ".join([k for k in MODES if config.get(k)] + others) or "none")
        return None
    return chosen[0]


def write_pooling(source: str | Path, tokenizer_dir: Path) -> str | None:
    """Write tokenizer_dir/pooling.json where the checkpoint at `source` has a pooling config; returns it."""
    pooling = checkpoint_pooling(source)
    if pooling is not None:
        (Path(tokenizer_dir) / POOLING_FILE).write_text(
            json.dumps({"pooling": pooling, "source": "sentence-transformers modules.json"}) + "\n")
    return pooling
