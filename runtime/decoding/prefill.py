"""The first pass of newly admitted requests: their prompts, right-padded, on their rows of the pool.

Shared by every decoding strategy. A row with a cached prefix (runtime/cache/reuse.py) starts from
that prefix's keys and values and prefills only the rest (a prefill on a non-empty cache); its
prompt's blocks (and a system prompt it keeps) go into the context cache afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.cache import reuse
from trt_llm.runtime.cache.context_cache import ContextCache
from trt_llm.runtime.engine.model import Model
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.engine.step import Step


@dataclass
class Prefilled:
    logits: np.ndarray  # [B, 1, V] at each row's last computed token (its prompt's last, once complete)
    computed: np.ndarray  # [B] int32 tokens the pass computed
    features: np.ndarray | None  # an EAGLE base's features [B, S, F] at every computed token
    complete: int = 0  # the first `complete` rows are through their prompts (the rest continue later)


def start_rows(sequences: list[Sequence], cache, context: ContextCache | None) -> None:
    """The rows of `sequences` (cache: their window of the pool) that have not begun: each restores
    its longest cached prefix, and an encoder-decoder's row its clip's keys and values."""
    for row, s in enumerate(sequences):
        if s.prefilled is not None:
            continue
        s.reused_tokens = reuse.restore(context, cache, row, s) if context is not None else 0
        s.prefilled = s.reused_tokens
        if s.media is not None and s.media.cross is not None:
            cache.write_row(row, s.media.cross)


def prefill(model: Model, sequences: list[Sequence], cache, lora: dict, stage, profiler,
            context: ContextCache | None, counts: np.ndarray) -> Prefilled:
    """One pass over the next counts[i] prompt tokens of each started row (cache: the rows of
    `sequences`, in order; a count of 0 is an idle row); context: the context cache the rows commit
    their computed prompt blocks to (runtime/cache/reuse.py)."""
    past = np.array([s.prefilled for s in sequences], dtype=np.int32)
    lengths = np.asarray(counts, dtype=np.int32)
    tokens = [s.prompt_ids[p: p + n] for s, p, n in zip(sequences, past.tolist(), lengths.tolist())]
    with stage("prefill"):
        if int((past + lengths.max()).max()) <= cache.capacity:
            logits, features = _pass(model, sequences, tokens, cache, lora, past)
        else:
            # ONNX Runtime's attention writes a row's whole padded chunk after its cached tokens: a long
            # reused prefix beside a long fresh prompt would overrun the row, so such a batch
            # prefills row by row (each row computes what it computes in the batch). An idle row (a
            # count of 0: its last token waits for the row before it) has no pass of its own: a pass of
            # no tokens has no last token to take logits at; its logits and features stay zeros, unread.
            parts = {i: _pass(model, sequences[i:i + 1], tokens[i:i + 1], cache.window(i, i + 1),
                              {name: array[i:i + 1] for name, array in lora.items()}, past[i:i + 1])
                     for i in range(len(sequences)) if lengths[i]}
            logits = np.zeros((len(sequences), 1, model.vocab_size), dtype=np.float32)
            features = None
            for i, (row_logits, row_features) in parts.items():
                logits[i] = row_logits[0]
                if row_features is not None:
                    if features is None:
                        features = np.zeros((len(sequences), int(lengths.max()), row_features.shape[-1]),
                                            row_features.dtype)
                    features[i, : row_features.shape[1]] = row_features[0]
    complete = _advance(sequences, past, lengths, cache, context, profiler)
    return Prefilled(logits, lengths, features, complete)


def mixed(model: Model, decoding: list[Sequence], prefilling: list[Sequence], counts: np.ndarray, cache,
          lora: dict, stage, profiler, context: ContextCache | None) -> tuple[np.ndarray, int]:
    """One pass that is both a decode step of `decoding` (the first rows of `cache`, one new token
    each) and a prefill pass of the next counts[i] prompt tokens of `prefilling` (the rows after
    them): the weights are read once for both. Returns the logits [B, 1, V] (a decode row's at its
    token, a prefilling row's at its last computed one) and how many prefilling rows completed."""
    past = np.array([s.length - 1 for s in decoding] + [s.prefilled for s in prefilling], dtype=np.int32)
    tokens = [[s.generated[-1]] for s in decoding]
    tokens += [s.prompt_ids[s.prefilled: s.prefilled + int(n)] for s, n in zip(prefilling, counts)]
    with stage("mixed_step"):
        logits, _ = _pass(model, decoding + prefilling, tokens, cache, lora, past)
    if profiler:
        profiler.count("decode_tokens", len(decoding))
    rows = len(decoding)
    complete = _advance(prefilling, past[rows:], np.asarray(counts, dtype=np.int32),
                        cache.window(rows, rows + len(prefilling)), context, profiler)
    return logits, complete


def _advance(sequences: list[Sequence], past: np.ndarray, lengths: np.ndarray, cache, context, profiler) -> int:
    """After a pass over lengths[i] more prompt tokens of each row: count them, commit the rows'
    computed blocks; returns how many of the first rows are through their prompts."""
    if profiler:
        profiler.count("prefill_computed_tokens", int(lengths.sum()))
        # A row's first pass starts where its restored prefix ends.
        profiler.count("prefill_reused_tokens", sum(s.reused_tokens for s, p in zip(sequences, past) if p == s.reused_tokens))
    complete = 0
    for row, s in enumerate(sequences):
        s.prefilled += int(lengths[row])
        if context is not None and lengths[row]:
            reuse.commit(context, cache, row, s, s.prefilled)
        complete += complete == row and s.prefilled == len(s.prompt_ids)
    return complete


def _pass(model: Model, sequences: list[Sequence], tokens: list[list[int]], cache, lora: dict, past: np.ndarray):
    """One engine pass over each row's `tokens` after its `past` ones: (logits [B, 1, V] at each
    row's last token, features or None)."""
    lengths = np.array([len(row) for row in tokens], dtype=np.int32)
    batch, width = len(sequences), int(lengths.max())
    token_ids = np.zeros((batch, width), dtype=np.int64)
    for row, ids in enumerate(tokens):
        token_ids[row, : len(ids)] = ids
    embeds, extras = model.embed(token_ids)
    media = model.media_inputs(sequences, embeds, past, lengths)  # image rows at their tokens
    step = Step(embeds, model.positions(sequences, past, width), past, lengths, np.maximum(lengths - 1, 0)[:, None],
                np.empty((batch, 1, model.vocab_size), dtype=np.float32), *model.eagle_io(batch, width))
    step.inputs.update(extras)
    step.inputs.update(media)
    model.engine.run(step, cache, lora)
    return step.logits, step.outputs.get(model.feature_output)


def recompute(model: Model, sequence: Sequence, cache, lora: dict, chunk: int | None) -> None:
    """Compute the cache of a decoding row (`cache`: its one-row window of the pool) again over all
    its tokens but the last (the next decode step's input), in passes of at most `chunk` tokens.

    LongRoPE: a row whose next token takes it past the original context turns by the long factors
    from then on, and transformers' Phi-3 drops its cache at that token and computes the whole
    sequence again with them (model.positions picks them by the row's length)."""
    tokens = (sequence.prompt_ids + sequence.generated)[:-1]
    chunk = chunk or len(tokens)
    for start in range(0, len(tokens), chunk):
        _pass(model, [sequence], [tokens[start: start + chunk]], cache, lora, np.array([start], dtype=np.int32))
