"""Vanilla decoding of one batch: a ragged prefill, then one token per active row per step."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from trt_llm.runtime.sampler import Sampler, log_softmax_topn, token_logprob
from trt_llm.runtime.threads import leaves_cores_to_the_engine
from trt_llm.schemas.graph_spec import FEATURES, TREE_MASK

END_OF_SEQUENCE = "end-of-sequence"
MAX_LENGTH = "max-length"
STOP_WORDS = "stop-words"


@dataclass
class Sequence:
    """One request's token state while its batch runs."""

    prompt_ids: list[int]
    max_new_tokens: int  # already clamped to the KV capacity
    detokenizer: object | None = None  # an IncrementalDetokenizer when stop strings are watched
    reused: object | None = None  # a prefix_cache.Entry whose KV is restored instead of prefilled
    save_prefix: int = 0  # after prefill, keep the KV of this many leading prompt tokens
    saved: object | None = None  # ... here, as a prefix_cache.Entry
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    first_token_time: float | None = None
    # With log-probabilities on: per step, the top-K (ids, logprobs) and the sampled token's logprob.
    top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.generated)


class Model:
    """What the decode loop needs from an engine directory: the engine, the embedding, the dims."""

    def __init__(self, engine, embedding: np.ndarray, dims: dict, eos_token_ids: list[int],
                 max_positions: int | None = None, feature_width: int = 0):
        self.engine = engine
        self.embedding = embedding
        self.dims = dims
        self.eos = set(eos_token_ids)
        self.max_positions = max_positions  # rows of the rotary tables
        self.feature_width = feature_width  # > 0: an EAGLE base (tree_mask in, hidden_states out)

    def eagle_io(self, batch: int, seq: int) -> tuple[dict, dict]:
        """An EAGLE base's extra inputs/outputs for plain causal steps (the features are unused)."""
        if not self.feature_width:
            return {}, {}
        mask = np.broadcast_to(np.tril(np.ones((seq, seq), dtype=bool)), (batch, seq, seq)).copy()
        return {TREE_MASK: mask}, {FEATURES: np.empty((batch, seq, self.feature_width), self.embedding.dtype)}

    def new_cache(self, batch: int, capacity: int):
        # The engine owns its cache's memory (host arrays for ONNX Runtime, device buffers for TensorRT).
        return self.engine.new_cache(batch, capacity)


@leaves_cores_to_the_engine
def generate(model: Model, sequences: list[Sequence], sampler: Sampler, num_logprobs: int = 0,
             profiler=None, lora_inputs: dict[str, np.ndarray] | None = None) -> None:
    """Run `sequences` (one batch) to completion, filling in `generated` and `finish_reason`.

    num_logprobs: K > 0 records, per step, the K most likely tokens and the sampled token with their
    log-softmax at temperature 1 over the model's own logits (before logit bias).
    profiler: a runtime.profiler.Profiler that times the stages and counts tokens, or None.
    lora_inputs: the engine's LoRA inputs, one row per sequence (runtime.lora.batch_inputs).
    """
    extra = lora_inputs or {}
    stage = profiler.stage if profiler else (lambda name: nullcontext())
    # Size the cache for this batch's longest need, not the engine's maximum: less memory, and the
    # attention only ever spans what is used.
    capacity = max(len(s.prompt_ids) + s.max_new_tokens for s in sequences)
    cache = model.new_cache(len(sequences), capacity)
    vocab = model.dims["vocab_size"]
    active = list(range(len(sequences)))  # original row of each cache row, ascending

    logits, _, _, _ = prefill(model, sequences, cache, extra, stage, profiler)

    while True:
        with stage("sample"):
            step_logits = torch.from_numpy(logits[:, 0])
            sampled = sampler.sample(step_logits, active)
            tokens = sampled.tolist()
            if num_logprobs:
                record_logprobs([sequences[r] for r in active], step_logits, sampled, num_logprobs)
        now = time.perf_counter()
        still = [row for row, token in zip(active, tokens) if not append_token(model, sequences[row], token, now)]
        if not still:
            return
        if still != active:
            cache.keep_rows([active.index(r) for r in still], [sequences[r].length - 1 for r in still])
            active = still
            logits = np.empty((len(active), 1, vocab), dtype=np.float32)
            extra = {name: np.ascontiguousarray(array[active]) for name, array in (lora_inputs or {}).items()}
        # Decode step: the last sampled token of each active row, at its position.
        last = np.array([sequences[r].generated[-1] for r in active], dtype=np.int64)
        past = np.array([sequences[r].length - 1 for r in active], dtype=np.int32)
        with stage("decode_step"):
            model.engine.run(model.embedding[last][:, None], past[:, None], past,
                             np.ones(len(active), np.int32), np.zeros((len(active), 1), np.int32), cache,
                             logits, extra, *model.eagle_io(len(active), 1))
        if profiler:
            profiler.count("decode_tokens", len(active))


def prefill(model: Model, sequences: list[Sequence], cache, extra: dict, stage, profiler):
    """The batch's first pass: right-padded prompts, logits at each prompt's last token.

    A row with a reused prefix starts from that prefix's KV and prefills only the rest (a prefill on a
    non-empty cache); a row asked to save its prefix gets a snapshot of it afterwards. Returns
    (logits [B, 1, V], reused per row, prefilled per row, an EAGLE base's features [B, S, F] or None).
    """
    batch = len(sequences)
    past = np.array([_restore(cache, row, s.reused) for row, s in enumerate(sequences)], dtype=np.int32)
    lengths = np.array([len(s.prompt_ids) for s in sequences], dtype=np.int32) - past
    width = int(lengths.max())
    token_ids = np.zeros((batch, width), dtype=np.int64)
    for row, s in enumerate(sequences):
        token_ids[row, : lengths[row]] = s.prompt_ids[past[row]:]
    positions = past[:, None] + np.arange(width, dtype=np.int32)[None, :]
    logits = np.empty((batch, 1, model.dims["vocab_size"]), dtype=np.float32)
    step_inputs, step_outputs = model.eagle_io(batch, width)
    with stage("prefill"):
        model.engine.run(model.embedding[token_ids], positions, past, lengths, (lengths - 1)[:, None], cache,
                         logits, extra, step_inputs, step_outputs)
    if profiler:
        profiler.count("prefill_computed_tokens", int(lengths.sum()))
        profiler.count("prefill_reused_tokens", int(past.sum()))
    for row, s in enumerate(sequences):
        if s.save_prefix:
            s.saved = _snapshot(cache, row, s.prompt_ids[: s.save_prefix])
    return logits, past, lengths, step_outputs.get(FEATURES)


def append_token(model: Model, s: Sequence, token: int, now: float) -> bool:
    """Append one generated token; True when that finishes the sequence (and says why)."""
    s.generated.append(token)
    if s.first_token_time is None:
        s.first_token_time = now
    if token in model.eos:
        s.finish_reason = END_OF_SEQUENCE
    elif s.detokenizer is not None and s.detokenizer.add(token):
        s.finish_reason = STOP_WORDS
    elif len(s.generated) >= s.max_new_tokens:
        s.finish_reason = MAX_LENGTH
    return s.finish_reason is not None


def record_logprobs(rows: list[Sequence], logits: torch.Tensor, sampled: torch.Tensor, k: int) -> None:
    values, ids = log_softmax_topn(logits, k)
    chosen = token_logprob(logits, sampled)
    for s, row_ids, row_values, value in zip(rows, ids.tolist(), values.tolist(), chosen.tolist()):
        s.top_logprobs.append((row_ids, row_values))
        s.token_logprobs.append(value)


def record_step(s: Sequence, logits: torch.Tensor, token: int, k: int) -> None:
    """Log-probabilities of one row's step (logits [V]): the top k and the sampled token."""
    record_logprobs([s], logits[None], torch.tensor([token]), k)


def _restore(cache, row: int, entry) -> int:
    """Copy a saved prefix's KV into `row`; returns how many tokens it covers."""
    if entry is None:
        return 0
    cache.write_prefix(row, entry.keys, entry.values)
    return len(entry.token_ids)


def _snapshot(cache, row: int, token_ids: list[int]):
    from trt_llm.runtime.prefix_cache import Entry

    keys, values = cache.read_prefix(row, len(token_ids))
    return Entry(tuple(token_ids), keys, values)
