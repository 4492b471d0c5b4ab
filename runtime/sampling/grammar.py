"""Structured output: a request's `response_format` as a token mask at every step (llguidance).

`json_object` admits any JSON object; `json_schema` admits exactly the documents its schema
validates. The schema compiler fails closed: a keyword it cannot enforce (`if`/`then`,
`dependentRequired`, ...) makes the request fail with its name, never a silently looser output.

Per request, a `Constraint` holds the grammar's state: before each sampled token the sampler's
logits are masked to the tokens the grammar allows (`mask_logits`), and every appended token
advances it (`accept`, called by sequence.append_token). Once the document is complete the grammar
allows only end-of-sequence. The log-probabilities a request asks for stay the model's own
(before the mask, as they are before logit bias). Under EAGLE each verified token is masked in turn
along the accepted path, so speculation gives the same constrained tokens as vanilla decoding.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

# Compact-but-readable JSON (", " and ": "), no free whitespace: a model cannot pad forever.
COMPILE_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A response_format the grammar library cannot enforce (or is not installed for)."""


class Grammars:
    """Compiles response formats for one engine's tokenizer (llguidance, imported when first used)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        self._tokenizer, self._vocab_size, self._eos = tokenizer, vocab_size, list(eos_token_ids)
        self._ll = None

    def _llguidance_tokenizer(self):
        if self._ll is None:
            try:
                import llguidance
            except ImportError:
                raise GrammarError("type: structured output needs llguidance (pip install llguidance, or the "
                                   "server extra)") from None
            backend = self._tokenizer.backend_tokenizer
            # EOS: the model's own end-of-sequence ids; the grammar ends on any of them.
            self._ll = llguidance.LLTokenizer(backend.to_str(), n_vocab=self._vocab_size,
                                              eos_token=self._eos[0] if len(self._eos) == 1 else self._eos)
        return self._ll

    def constraint(self, response_format: dict[str, Any]) -> "Constraint | None":
        """None for {"type": "text"}; raises GrammarError naming what cannot be enforced."""
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            schema: dict = {"type": "object"}
        elif kind == "json_schema":
            spec = response_format.get("json_schema") or {}
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise GrammarError("json_schema.schema: expected a JSON Schema object")
        else:
            raise GrammarError(f"type: {kind!r} is not text, json_object or json_schema")
        import llguidance

        tokenizer = self._llguidance_tokenizer()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=COMPILE_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"json_schema.schema: {error}") from None
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise GrammarError(f"json_schema.schema: cannot be enforced: {messages[0]}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"json_schema.schema: cannot be enforced: {matcher.get_error()}")
        return Constraint(matcher, self._vocab_size)


class Constraint:
    """One request's grammar state."""

    def __init__(self, matcher, vocab_size: int):
        self._matcher, self._vocab_size = matcher, vocab_size
        self._bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar accepts next."""
        import llguidance.numpy

        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask)
        return np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self._vocab_size].astype(bool)

    def accept(self, token: int) -> None:
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)

    @property
    def failed(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


def mask_logits(logits: np.ndarray, constraints: list["Constraint | None"]) -> np.ndarray:
    """logits [n, V] (a numpy array) with each constrained row's disallowed tokens at -inf; the same
    array when no row is constrained, else a copy (the caller's logits stay the model's own)."""
    if not any(constraints):
        return logits
    masked = np.array(logits, copy=True, order="C")
    for row, constraint in enumerate(constraints):
        if constraint is not None:
            allowed = constraint.allowed()
            masked[row, : len(allowed)][~allowed] = -np.inf
    return masked
