"""An image processor config's values, checked: each a clear ValueError naming the key
(`image processor config: <key> must be ...`) where a preprocessor_config.json holds the wrong kind."""

from __future__ import annotations

import math


def number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"image processor config: {key} must be a number, got {value!r}")
    return float(value)


def positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"image processor config: {key} must be a positive integer, got {value!r}")
    return value


def flag(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"image processor config: {key} must be true or false, got {value!r}")
    return value


def per_channel(key: str, value) -> tuple[float, float, float]:
    """One number for R, G and B, or three."""
    values = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or len(values) != 3:
        raise ValueError(f"image processor config: {key} must be a number or three (R, G, B), got {value!r}")
    return tuple(number(key, v) for v in values)
