"""One request's token state while it runs, and how a token joins it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from trt_llm.runtime.sampling.sampler import log_softmax_topn, token_logprob

if TYPE_CHECKING:
    from trt_llm.runtime.cache.reuse import ContextPlan

END_OF_SEQUENCE = "end-of-sequence"
MAX_LENGTH = "max-length"
STOP_WORDS = "stop-words"
ABORTED = "aborted"
# Its deadline (a request's `timeout`) passed: its answer so far, or none if it never had a row.
TIMEOUT = "timeout"
# The request's constraint stopped it: the grammar library gave up mid-answer (Sequence.error says
# why). Not end-of-sequence: the answer so far does not complete the constraint.
CONSTRAINT_FAILED = "error"


class TokenCounts:
    """A sequence's token counts for the sampler's penalties, kept as its tokens join (never recounted):
    the distinct ids of its prompt and generated tokens (transformers' repetition penalty) and how
    often each id was generated (OpenAI's presence and frequency penalties). Sparse: arrays of the
    ids seen so far, grown by doubling, so a step reads them without a pass over the vocabulary."""

    def __init__(self, prompt_ids, generated=()):
        seen = np.unique(np.asarray(prompt_ids, dtype=np.int64))
        self._seen_set = set(seen.tolist())
        self._seen = np.empty(max(16, 2 * len(seen)), dtype=np.int64)
        self._seen[: len(seen)] = seen
        self._n_seen = len(seen)
        self._slot: dict[int, int] = {}  # generated id -> its index in _ids / _counts
        self._ids = np.empty(16, dtype=np.int64)
        self._counts = np.empty(16, dtype=np.int32)
        for token in generated:
            self.add(token)

    def add(self, token: int) -> None:
        """One more generated token."""
        token = int(token)
        if token not in self._seen_set:
            self._seen_set.add(token)
            self._seen = _push(self._seen, self._n_seen, token)
            self._n_seen += 1
        slot = self._slot.get(token)
        if slot is None:
            slot = self._slot[token] = len(self._slot)
            self._ids = _push(self._ids, slot, token)
            self._counts = _push(self._counts, slot, 0)
        self._counts[slot] += 1

    @property
    def seen(self) -> np.ndarray:
        """The distinct ids of the prompt and the generated tokens, int64 [n] (a view: read only)."""
        return self._seen[: self._n_seen]

    @property
    def generated(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct generated ids int64 [m], how often each was generated int32 [m]) (views)."""
        m = len(self._slot)
        return self._ids[:m], self._counts[:m]


def _push(array: np.ndarray, index: int, value) -> np.ndarray:
    """array[index] = value, the array doubled first when full; returns the (maybe new) array."""
    if index >= len(array):
        grown = np.empty(2 * len(array), dtype=array.dtype)
        grown[: len(array)] = array
        array = grown
    array[index] = value
    return array


@dataclass
class Sequence:
    prompt_ids: list[int]
    max_new_tokens: int  # already clamped to the KV capacity
    detokenizer: object | None = None  # an IncrementalDetokenizer when stop strings are watched
    constraint: object | None = None  # a grammar.Constraint for structured output (response_format)
    context: ContextPlan | None = None  # what it may restore from the context cache (EngineCore.plan)
    reused_tokens: int = 0  # prompt tokens restored from it instead of computed
    prefilled: int | None = None  # prompt tokens in its row of the cache (None: its prefill has not begun)
    media: object | None = None  # a sequence_media.SequenceMedia: its image / audio rows, mRoPE positions
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # with CONSTRAINT_FAILED: why (the constraint's field first)
    first_token_time: float | None = None
    # With log-probabilities on: per step, the top-K (ids, logprobs) and the sampled token's logprob.
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    speculation: "SpeculationCounts | None" = None  # what speculation did for it (a drafting strategy's)
    _counts: TokenCounts | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.generated)

    @property
    def counts(self) -> TokenCounts:
        """Its token counts for the sampler's penalties: made from its tokens when first asked for
        (a request with penalties, at its first sampled token), then kept by append_token."""
        if self._counts is None:
            self._counts = TokenCounts(self.prompt_ids, self.generated)
        return self._counts


@dataclass
class SpeculationCounts:
    """A request's verification passes with a proposal, the tokens proposed, the ones taken and the tokens
    those passes emitted (taken + each pass's bonus, less where it finished)."""

    passes: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0

    def add(self, proposed: int, accepted: int, emitted: int) -> None:
        self.passes, self.proposed = self.passes + 1, self.proposed + proposed
        self.accepted, self.emitted = self.accepted + accepted, self.emitted + emitted


def count_speculation(s: Sequence, proposed: int, accepted: int, emitted: int) -> None:
    if s.speculation is None:
        s.speculation = SpeculationCounts()
    s.speculation.add(proposed, accepted, emitted)


def append_token(eos: set[int], s: Sequence, token: int, now: float) -> bool:
    """Append one generated token; True when that finishes the sequence (and says why)."""
    s.generated.append(token)
    if s._counts is not None:
        s._counts.add(token)
    if s.constraint is not None:
        s.constraint.accept(token)
    if s.first_token_time is None:
        s.first_token_time = now
    # Checked first: a grammar the library gave up on allows only end-of-sequence, which is no answer's
    # end (a transcription's token rules never fail: they have no `failed`).
    failed = getattr(s.constraint, "failed", None)
    if failed:
        kept = len(s.generated) - (token in eos)  # the end-of-sequence it forced is not the answer's
        if s.detokenizer is not None and token not in eos:
            s.detokenizer.add(token)  # the answer so far is kept whole (a stop string now changes nothing)
        s.finish_reason = CONSTRAINT_FAILED
        s.error = f"{failed}; the answer stops after {kept} token{'' if kept == 1 else 's'}"
    elif token in eos:
        s.finish_reason = END_OF_SEQUENCE
    elif s.detokenizer is not None and s.detokenizer.add(token):
        s.finish_reason = STOP_WORDS
    elif len(s.generated) >= s.max_new_tokens:
        s.finish_reason = MAX_LENGTH
    return s.finish_reason is not None


def record_logprobs(rows: list[Sequence], logits: np.ndarray, sampled: np.ndarray, k: int) -> None:
    """Per row: the top k tokens and the sampled one, log-softmax at temperature 1 over the model's
    own logits [n, V] (before logit bias)."""
    values, ids = log_softmax_topn(logits, k)
    chosen = token_logprob(logits, sampled)
    for s, row_ids, row_values, value in zip(rows, ids.tolist(), values.tolist(), chosen.tolist()):
        s.top_logprobs.append((row_ids, row_values))
        s.token_logprobs.append(value)


def record_step(s: Sequence, logits: np.ndarray, token: int, k: int) -> None:
    """Log-probabilities of one row's step (logits [V])."""
    record_logprobs([s], logits[None], np.array([token], dtype=np.int64), k)
