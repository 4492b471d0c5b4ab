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
from trt_llm.schemas.graph_spec import FEATURES


@dataclass
class Prefilled:
    logits: np.ndarray  # [B, 1, V] at each row's last computed token (its prompt's last, once complete)
    reused: np.ndarray  # [B] int32 the prompt tokens each row held before this pass (the pass's past lengths)
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
    with stage("prefill"):
        if int((past + lengths.max()).max()) <= cache.capacity:
            logits, features = _pass(model, sequences, cache, lora, past, lengths)
        else:
            # ONNX Runtime's attention writes a row's whole padded chunk after its cached tokens: a long
            # reused prefix beside a long fresh prompt would overrun the row, so such a batch
            # prefills row by row (each row computes what it computes in the batch).
            parts = [_pass(model, sequences[i:i + 1], cache.window(i, i + 1),
                           {name: array[i:i + 1] for name, array in lora.items()}, past[i:i + 1], lengths[i:i + 1])
                     for i in range(len(sequences))]
            logits = np.concatenate([part[0] for part in parts])
            features = None
            if parts[0][1] is not None:
                features = np.zeros((len(parts), int(lengths.max()), parts[0][1].shape[-1]), parts[0][1].dtype)
                for i, (_, part) in enumerate(parts):
                    features[i, : part.shape[1]] = part[0]
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
    return Prefilled(logits, past, lengths, features, complete)


def _pass(model: Model, sequences: list[Sequence], cache, lora: dict, past: np.ndarray, lengths: np.ndarray):
    """One engine pass over the prompts' tokens after `past`: (logits [B, 1, V], features or None)."""
    batch, width = len(sequences), int(lengths.max())
    token_ids = np.zeros((batch, width), dtype=np.int64)
    for row, s in enumerate(sequences):
        token_ids[row, : lengths[row]] = s.prompt_ids[past[row]: past[row] + lengths[row]]
    embeds = model.embedding[token_ids]
    media = model.media_inputs(sequences, embeds, past, lengths)  # image rows at their tokens
    step = Step(embeds, model.positions(sequences, past, width), past, lengths, np.maximum(lengths - 1, 0)[:, None],
                np.empty((batch, 1, model.vocab_size), dtype=np.float32), *model.eagle_io(batch, width))
    step.inputs.update(media)
    model.engine.run(step, cache, lora)
    return step.logits, step.outputs.get(FEATURES)
