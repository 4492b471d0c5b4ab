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
    logits: np.ndarray  # [B, 1, V] at each prompt's last token
    reused: np.ndarray  # [B] int32 tokens restored from the context cache (the pass's past lengths)
    computed: np.ndarray  # [B] int32 tokens the pass computed
    features: np.ndarray | None  # an EAGLE base's features [B, S, F] at every computed token


def prefill(model: Model, sequences: list[Sequence], cache, lora: dict, stage, profiler,
            context: ContextCache | None = None) -> Prefilled:
    """cache: the rows of `sequences`, in order (a window of the pool); context: the context cache
    its rows restore their prefixes from and commit their prompts to (runtime/cache/reuse.py)."""
    if context is not None:
        for row, s in enumerate(sequences):
            s.reused_tokens = reuse.restore(context, cache, row, s)
    past = np.array([s.reused_tokens for s in sequences], dtype=np.int32)
    for row, s in enumerate(sequences):
        if s.media is not None and s.media.cross is not None:  # an encoder-decoder: the clip's keys and values
            cache.write_row(row, s.media.cross)
    lengths = np.array([len(s.prompt_ids) for s in sequences], dtype=np.int32) - past
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
        profiler.count("prefill_reused_tokens", int(past.sum()))
    if context is not None:
        for row, s in enumerate(sequences):
            reuse.commit(context, cache, row, s, len(s.prompt_ids))
    return Prefilled(logits, past, lengths, features)


def _pass(model: Model, sequences: list[Sequence], cache, lora: dict, past: np.ndarray, lengths: np.ndarray):
    """One engine pass over the prompts' tokens after `past`: (logits [B, 1, V], features or None)."""
    batch, width = len(sequences), int(lengths.max())
    token_ids = np.zeros((batch, width), dtype=np.int64)
    for row, s in enumerate(sequences):
        token_ids[row, : lengths[row]] = s.prompt_ids[past[row]:]
    embeds = model.embedding[token_ids]
    media = model.media_inputs(sequences, embeds, past, lengths)  # image rows at their tokens
    step = Step(embeds, model.positions(sequences, past, width), past, lengths, (lengths - 1)[:, None],
                np.empty((batch, 1, model.vocab_size), dtype=np.float32), *model.eagle_io(batch, width))
    step.inputs.update(media)
    model.engine.run(step, cache, lora)
    return step.logits, step.outputs.get(FEATURES)
