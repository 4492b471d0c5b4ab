"""Turn pydantic ValidationErrors into one-line messages a user can act on.

Every message names the field path (``requests[2].messages[0].role``), the offending value and
the limit, so the models only declare their constraints once (as Field constraints, which also
end up in the JSON Schema) and the wording lives here.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

# Fields whose dict keys are user data (token ids, adapter names): rendered as ``name['key']``.
DICT_FIELDS = frozenset({"logit_bias", "available_lora_weights"})

# Fields typed as a union with a callable discriminator: pydantic puts the chosen tag right
# after the field name in ``loc``; it is not part of the user's document, so it is dropped.
# Likewise the content item's own tag ("image") that follows ``content`` -> "parts" -> index.
TAGGED_UNION_FIELDS = frozenset({"content", "stop"})

# What one element of a sized collection is called, by field name (default: "items").
_UNITS = {"messages": "messages", "content": "content items", "requests": "requests"}


def _parts(loc: Iterable[Any]) -> list[tuple[str, Any]]:
    """``loc`` as ("field" | "index" | "key", value) pairs, without union tags or ``[key]``."""
    loc = list(loc)
    out: list[tuple[str, Any]] = []
    for i, part in enumerate(loc):
        prev = loc[i - 1] if i else None
        prev2 = loc[i - 2] if i > 1 else None
        last = i == len(loc) - 1
        if part == "[key]" and last:
            continue  # marks "the key itself is bad"; the key is already in the path
        if prev in DICT_FIELDS:
            out.append(("key", part))
        elif prev in TAGGED_UNION_FIELDS and isinstance(part, str):
            continue  # "str"/"parts" tag of a tagged union
        elif prev2 == "parts" and isinstance(prev, int) and isinstance(part, str) and not last:
            continue  # the content item's discriminator ("image"), followed by the real field
        elif isinstance(part, int):
            out.append(("index", part))
        else:
            out.append(("field", part))
    return out


def path_of(loc: Iterable[Any], prefix: str = "") -> str:
    """Render a pydantic ``loc`` as ``a.b[0]['key']`` after ``prefix``."""
    out = prefix
    for kind, part in _parts(loc):
        if kind == "index":
            out += f"[{part}]"
        elif kind == "key":
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _field_name(loc: Iterable[Any]) -> str:
    """The last model field in ``loc`` (the one whose limits apply)."""
    fields = [part for kind, part in _parts(loc) if kind == "field"]
    return str(fields[-1]) if fields else ""


def show(value: Any, limit: int = 40) -> str:
    """A short, JSON-flavoured rendering of a user value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        r = repr(value)
        return r if len(r) <= limit else r[: limit - 4] + "...'"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _choices(expected: str) -> str:
    # pydantic renders Literal choices as "'a', 'b' or 'c'"; we want "a, b, c".
    found = re.findall(r"'([^']*)'", expected)
    return ", ".join(found) if found else expected


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
}

_BOUNDS = {"greater_than_equal": ("ge", "is less than the minimum"),
           "greater_than": ("gt", "must be greater than"),
           "less_than_equal": ("le", "is greater than the maximum"),
           "less_than": ("lt", "must be less than")}


def describe(err: Mapping[str, Any], ranges: Mapping[str, str] = {}) -> str:
    """The message part after ``path: `` for one pydantic error dict."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    field = _field_name(err["loc"])
    if kind == "missing":
        return "required field missing"
    if kind == "literal_error":
        return f"{show(value)} is not allowed; choose one of {_choices(ctx.get('expected', ''))}"
    if kind == "union_tag_invalid":
        return f"type {show(ctx.get('tag'))} is not allowed; choose one of {_choices(ctx.get('expected_tags', ''))}"
    if kind == "union_tag_not_found":
        return f"missing {ctx.get('discriminator', 'tag')}"
    if kind in ("too_long", "too_short"):
        # The count comes from the value itself: pydantic's context has carried it in some
        # versions and not in others (2.14 dropped it for dicts).
        actual = len(value) if hasattr(value, "__len__") else ctx.get("actual_length")
        unit = "entries" if ctx.get("field_type") == "Dictionary" else _UNITS.get(field, "items")
        if kind == "too_long":
            return f"{actual} {unit}, at most {ctx.get('max_length')} allowed"
        if not actual:
            return f"empty, at least {ctx.get('min_length')} required"
        return f"{actual} {unit}, at least {ctx.get('min_length')} required"
    if kind == "string_too_short":
        return f"{len(value)} characters, at least {ctx.get('min_length')} required" if value else "empty string not allowed"
    if kind == "string_too_long":
        return f"{len(value)} characters, at most {ctx.get('max_length')} allowed"
    if kind in _BOUNDS:
        if field in ranges:  # name both ends, whichever was crossed
            return f"{show(value)} is outside {ranges[field]}"
        key, words = _BOUNDS[kind]
        return f"{show(value)} {words} {ctx.get(key)}"
    if kind == "finite_number":
        extra = f"; must be in {ranges[field]}" if field in ranges else ""
        return f"{show(value)} is not a finite number{extra}"
    if kind in ("content_type", "stop_type"):
        return f"{err['msg']}, got {show(value)}"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {show(value)}"
    # Custom errors (PydanticCustomError in the models) already carry a complete message.
    return err["msg"]


def format_errors(exc: ValidationError, prefix: str = "", ranges: Mapping[str, str] = {},
                  allowed_keys: Iterable[str] = ()) -> list[str]:
    """One message per error: ``<path>: <what is wrong, with value and limit>``.

    ``allowed_keys`` is used for ``extra="forbid"`` models to list what would have been valid.
    """
    messages = []
    for err in exc.errors(include_url=False):
        if err["type"] == "extra_forbidden":
            key = err["loc"][-1]
            parent = path_of(err["loc"][:-1], prefix)
            allowed = sorted(_keys_at(allowed_keys, err["loc"][:-1]))
            messages.append(f"{parent + ': ' if parent else ''}unknown key {key!r}"
                            f"{did_you_mean(str(key), allowed)}: allowed keys are {', '.join(allowed)}")
            continue
        path = path_of(err["loc"], prefix) or "(top level)"
        messages.append(f"{path}: {describe(err, ranges)}")
    return messages


def _keys_at(allowed_keys, loc: tuple) -> Iterable[str]:
    """The keys allowed at `loc`: `allowed_keys` itself, or, given a pydantic model class, the fields
    of the (nested) model found at `loc` (an unknown key under `draft:` lists the draft's keys)."""
    if not (isinstance(allowed_keys, type) and issubclass(allowed_keys, BaseModel)):
        return allowed_keys
    model = allowed_keys
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        nested = field and next((t for t in _types_in(field.annotation)
                                 if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if nested is None:
            return model.model_fields
        model = nested
    return model.model_fields


def _types_in(annotation) -> list:
    args = typing.get_args(annotation)
    return [annotation] if not args else [t for a in args for t in _types_in(a)]


def did_you_mean(key: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def json_type(value: Any) -> str:
    """JSON's name for a decoded value's type, for "expected X, got Y" messages."""
    for py, name in ((bool, "a boolean"), (str, "a string"), ((int, float), "a number"),
                     (list, "an array"), (dict, "an object")):
        if isinstance(value, py):
            return name
    return "null" if value is None else type(value).__name__


__all__ = ["format_errors", "describe", "path_of", "show", "did_you_mean", "json_type"]
