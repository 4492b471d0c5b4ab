"""One request's token state while it runs, and how a token joins it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_llm.runtime.sampling.sampler import log_softmax_topn, token_logprob

END_OF_SEQUENCE = "end-of-sequence"
MAX_LENGTH = "max-length"
STOP_WORDS = "stop-words"
ABORTED = "aborted"


@dataclass
class Sequence:
    prompt_ids: list[int]
    max_new_tokens: int  # already clamped to the KV capacity
    detokenizer: object | None = None  # an IncrementalDetokenizer when stop strings are watched
    constraint: object | None = None  # a grammar.Constraint for structured output (response_format)
    context: object | None = None  # a cache.reuse.ContextPlan: what it may restore from the context cache
    reused_tokens: int = 0  # prompt tokens restored from it instead of computed
    prefilled: int | None = None  # prompt tokens in its row of the cache (None: its prefill has not begun)
    media: object | None = None  # a sequence_media.SequenceMedia: its image / audio rows, mRoPE positions
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    first_token_time: float | None = None
    # With log-probabilities on: per step, the top-K (ids, logprobs) and the sampled token's logprob.
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.generated)


def append_token(eos: set[int], s: Sequence, token: int, now: float) -> bool:
    """Append one generated token; True when that finishes the sequence (and says why)."""
    s.generated.append(token)
    if s.constraint is not None:
        s.constraint.accept(token)
    if s.first_token_time is None:
        s.first_token_time = now
    if token in eos:
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
