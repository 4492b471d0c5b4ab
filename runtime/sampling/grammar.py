"""Guided decoding: a request's constraint as a token mask at every step (llguidance).

One compile path for every mode (`Grammars.guided(mode, value)`): the input file's
`guided_decoding` (`json_schema`, `json_object`, `regex`, `choice`, `ebnf`), the server's and the
input file's `response_format` (`constraint`, mapped onto json_schema / json_object) and the
server's forced tool calls (an `ebnf` grammar, server/tool_grammar.py) all become a grammar text
for llguidance, compiled once per text and cached (an LRU): a request gets a copy of the cached,
never-used matcher (its state is its own), which costs microseconds where compiling costs a
millisecond or more (the tokenizer's view is built once per engine, ~1 s for a 150k vocabulary).

Fail closed: a schema keyword the compiler cannot enforce (`if`/`then`, `dependentRequired`, ...),
a regex or grammar that does not parse makes the request fail, the message naming the field,
never a silently looser output. A failure is cached like a success. So does a grammar no answer can
start (a schema that is only a reference to itself): each compiled grammar's first mask is computed
once, at compile time. Where the library gives up in the middle of an answer (a lexer or parser past
its limits: `a{1000000}`, a grammar that can never end), it allows only end-of-sequence from then
on: `Constraint.failed` says so, and the request ends with that reason (sequence.append_token:
finish reason "error" with the answer so far), never as a complete answer.

Per request, a `Constraint` holds the grammar's state: before each sampled token the sampler's
logits are masked to the tokens the grammar allows (`mask_logits`), and every appended token
advances it (`accept`, called by sequence.append_token). Once the grammar is complete it allows
only end-of-sequence. The log-probabilities a request asks for stay the model's own (before the
mask, as they are before logit bias). Under EAGLE each verified token is masked in turn along the
accepted path, so speculation gives the same constrained tokens as vanilla decoding.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

# Compact-but-readable JSON (", " and ": ", as json.dumps and the chat templates' tojson write it), no
# free whitespace: a model cannot pad forever.
COMPILE_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MODES = ("json_schema", "json_object", "regex", "choice", "ebnf")
CACHE_SIZE = 256  # compiled grammars kept per engine (a matcher of a small grammar is kilobytes)


class GrammarError(ValueError):
    """A constraint the grammar library cannot enforce; the message starts with the field it names
    (say `regex: ...`)."""


# The library's stop reasons that are not a message of their own, in our words.
_STOP_REASONS = {"NoExtensionBias": "no answer can satisfy it (no token can come next and it is not complete)"}


def gave_up(error: str) -> str:
    """One line for why the library gave up (its error text is followed by a dump of its state)."""
    first = error.strip().splitlines()[0].strip() if error.strip() else "no reason given"
    return _STOP_REASONS.get(first, first)


def json_lark(schema: dict) -> str:
    """A Lark rule body holding a JSON Schema (`%json {...}`), written with COMPILE_OPTIONS."""
    return "%json " + json.dumps({**schema, "x-guidance": COMPILE_OPTIONS})


def grammar_text(mode: str, value: Any) -> str:
    """The llguidance grammar of one guided-decoding mode. Raises GrammarError for a value of the
    wrong shape (the schema models check it first; this guards library callers)."""
    import llguidance

    Matcher = llguidance.LLMatcher
    if mode == "json_object":
        mode, value = "json_schema", {"type": "object"}
    if mode == "json_schema":
        if not isinstance(value, dict):
            raise GrammarError("json_schema: expected a JSON Schema object")
        try:
            return Matcher.grammar_from_json_schema(json.dumps(value), overrides=COMPILE_OPTIONS)
        except ValueError as error:
            raise GrammarError(f"json_schema: {error}") from None
    if mode == "regex":
        if not isinstance(value, str) or not value:
            raise GrammarError("regex: expected a non-empty string")
        return Matcher.grammar_from_regex(value)
    if mode == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise GrammarError("choice: expected a non-empty array of non-empty strings")
        # A JSON string is a Lark string literal (llguidance reads its escapes).
        return Matcher.grammar_from_lark("start: " + " | ".join(json.dumps(v) for v in dict.fromkeys(value)))
    if mode == "ebnf":
        if not isinstance(value, str) or not value.strip():
            raise GrammarError("ebnf: expected a non-empty grammar")
        try:  # llguidance's Lark syntax as is; a llama.cpp GBNF grammar (`root ::= ...`) is converted
            return llguidance.grammar_from("ebnf", value)
        except ValueError as error:
            raise GrammarError(f"ebnf: {error}") from None
    raise GrammarError(f"{mode}: not a guided-decoding mode (expected one of {', '.join(MODES)})")


class Grammars:
    """Compiles constraints for one engine's tokenizer (llguidance, imported when first used), and
    keeps the compiled ones by their grammar text."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = CACHE_SIZE):
        self._tokenizer, self._vocab_size, self._eos = tokenizer, vocab_size, list(eos_token_ids)
        self._ll = None
        self._lock = threading.Lock()  # the server prepares requests on a thread pool
        self._cache: OrderedDict[str, Any] = OrderedDict()  # grammar text -> fresh matcher or error text
        self.cache_size = cache_size
        self.stats = {"compiled": 0, "hits": 0}

    def _llguidance_tokenizer(self):
        if self._ll is None:
            import llguidance  # an ImportError is the caller's to word (prepare.py: that request fails)

            backend = self._tokenizer.backend_tokenizer
            # EOS: the model's own end-of-sequence ids; the grammar ends on any of them.
            self._ll = llguidance.LLTokenizer(backend.to_str(), n_vocab=self._vocab_size,
                                              eos_token=self._eos[0] if len(self._eos) == 1 else self._eos)
        return self._ll

    def constraint(self, response_format: dict[str, Any]) -> "Constraint | None":
        """OpenAI's response_format: None for {"type": "text"}; else json_object or json_schema's
        schema through `guided`. Raises GrammarError naming the field (`json_schema.schema: ...`)."""
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return self.guided("json_object", True, field="type")
        if kind == "json_schema":
            spec = response_format.get("json_schema") or {}
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise GrammarError("json_schema.schema: expected a JSON Schema object")
            return self.guided("json_schema", schema, field="json_schema.schema")
        raise GrammarError(f"type: {kind!r} is not text, json_object or json_schema")

    def guided(self, mode: str, value: Any, field: str | None = None) -> "Constraint":
        """A fresh constraint of one mode (MODES). Raises GrammarError whose message starts with
        `field` (default: the mode's name)."""
        field = field or mode
        with self._lock:
            tokenizer = self._llguidance_tokenizer()
            try:
                text = grammar_text(mode, value)
            except GrammarError as error:
                raise GrammarError(f"{field}{str(error)[len(mode):]}") from None
            compiled = self._compiled(text, tokenizer)
        if isinstance(compiled, str):  # a schema the compiler cannot enforce, a pattern that does not parse
            what = "cannot be enforced" if mode in ("json_schema", "json_object") else "does not compile"
            raise GrammarError(f"{field}: {what}: {compiled}")
        return Constraint(compiled.deep_copy(), self._vocab_size, field)

    def _compiled(self, text: str, tokenizer):
        """The cached matcher of a grammar text (never advanced: each request copies it), or the
        error it failed with. Called under the lock."""
        if text in self._cache:
            self._cache.move_to_end(text)
            self.stats["hits"] += 1
            return self._cache[text]
        import llguidance

        self.stats["compiled"] += 1
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        compiled = matcher.get_error() if matcher.is_error() else self._first_mask_error(matcher)
        self._cache[text] = compiled
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return compiled

    def _first_mask_error(self, matcher):
        """The matcher, or why no answer can begin (its first mask, computed on a copy: a grammar
        the library gives up on before the first token fails its requests at preparation)."""
        import llguidance.numpy

        probe = matcher.deep_copy()
        llguidance.numpy.fill_next_token_bitmask(probe, np.zeros((1, (self._vocab_size + 31) // 32), np.int32))
        return gave_up(probe.get_error()) if probe.is_error() else matcher

    def literal(self, text: str) -> str:
        """A Lark terminal that matches `text` as the tokenizer writes it: the special token's name
        (`<tool_call>`) when the vocabulary holds the text as one token llguidance treats as special
        (it matches no spelled-out bytes), else the quoted string."""
        with self._lock:
            tokenizer = self._llguidance_tokenizer()
        ids = tokenizer.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]) and text.startswith("<") and text.endswith(">"):
            return text
        return json.dumps(text)


class Constraint:
    """One request's grammar state. field: the constraint's name in the request (`regex`,
    `json_schema.schema`), for the message when the library gives up on it."""

    def __init__(self, matcher, vocab_size: int, field: str = "constraint"):
        self._matcher, self._vocab_size, self.field = matcher, vocab_size, field
        self._bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar accepts next."""
        import llguidance.numpy

        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask)
        return _unpacked(self._bitmask[0], self._vocab_size)

    def accept(self, token: int) -> None:
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)

    @property
    def failed(self) -> str | None:
        """None while the grammar holds; else one line naming the field and why the library gave up
        (it then allows only end-of-sequence, which would end a cut answer as a complete one)."""
        if not self._matcher.is_error():
            return None
        return f"{self.field}: the grammar library gave up on it: {gave_up(self._matcher.get_error())}"


def _unpacked(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab_size].view(bool)


_executor = None


def _batched_masks(constraints: list[Constraint]) -> np.ndarray:
    """bool [n, V]: the allowed tokens of several llguidance constraints, computed in parallel by
    llguidance's executor (one call, its threads) rather than one after another."""
    global _executor
    import llguidance
    import llguidance.numpy

    if _executor is None:
        _executor = llguidance.LLExecutor()
    vocab = constraints[0]._vocab_size
    bitmask = np.full((len(constraints), (vocab + 31) // 32), -1, dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask_par(_executor, [(c._matcher, i) for i, c in enumerate(constraints)],
                                                 bitmask)
    return np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab].view(bool)


def mask_logits(logits: np.ndarray, constraints: list) -> np.ndarray:
    """logits [n, V] (a numpy array) with each constrained row's disallowed tokens at -inf; the same
    array when no row is constrained, else a copy (the caller's logits stay the model's own).
    A constraint is a `Constraint` or any object with `allowed()` (a transcription's token rules)."""
    if not any(c is not None for c in constraints):
        return logits
    masked = np.array(logits, copy=True, order="C")
    grammar_rows = [row for row, c in enumerate(constraints) if isinstance(c, Constraint)]
    batched = set(grammar_rows) if len(grammar_rows) > 1 else set()
    if batched:  # one np.where over the rows: about half the time of a boolean assignment per row
        allowed = _batched_masks([constraints[row] for row in grammar_rows])
        vocab = allowed.shape[1]
        masked[grammar_rows, :vocab] = np.where(allowed, masked[grammar_rows, :vocab], -np.inf)
    for row, constraint in enumerate(constraints):
        if constraint is not None and row not in batched:
            allowed = constraint.allowed()
            masked[row, : len(allowed)][~allowed] = -np.inf
    return masked
