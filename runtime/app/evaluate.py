"""How good an engine's next-token distributions are on a text: perplexity, and against a reference
engine the KL divergence, top-1 agreement and log-probability gaps (llama.cpp's `perplexity
--kl-divergence` is the model).

The text's tokens are cut into chunks of `context` tokens; each chunk runs as one prefill with
logits at every position, and, as llama.cpp does, only the second half of each chunk is scored (every
scored token sees at least context/2 tokens before it). Two engines see exactly the same chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.engine.model import Model, model_of
from trt_llm.runtime.engine.step import Step


def open_model(engine_dir, threads: int = 0) -> Model:
    from trt_llm.runtime.backends.embedding import engine_embedding, engine_per_layer_table
    from trt_llm.runtime.backends.engines import open_engine
    from trt_llm.runtime.requests.lora import batch_inputs

    embedding = engine_embedding(engine_dir)
    model = model_of(engine_dir, open_engine(engine_dir, threads), embedding, engine_per_layer_table(engine_dir))
    layout = engine_dir.manifest.get("lora")
    # An engine built with LoRA inputs takes them on every call: the base model's (no adapter).
    model.base_lora = batch_inputs([None], layout, embedding.dtype) if layout else None
    return model


def chunks(token_ids: list[int], context: int) -> list[list[int]]:
    """Consecutive chunks of `context` tokens (the last, shorter one is dropped, as llama.cpp does)."""
    return [token_ids[i:i + context] for i in range(0, len(token_ids) - context + 1, context)]


def chunk_log_softmax(model: Model, chunk: list[int]) -> np.ndarray:
    """log-softmax [len(chunk), V] of the model's logits at every position of one chunk."""
    n = len(chunk)
    cache = model.new_cache(1, n)
    past = np.zeros(1, np.int32)
    embeds, extras = model.embed(np.array([chunk]))
    step = Step(embeds, model.positions([None], past, n), past, np.array([n], np.int32),
                np.arange(n, dtype=np.int32)[None], np.empty((1, n, model.vocab_size), np.float32),
                *model.eagle_io(1, n))
    step.inputs.update(extras)
    step.inputs.update(model.media_inputs([None], step.inputs_embeds, past, np.array([n])))
    model.engine.run(step, cache, getattr(model, "base_lora", None))
    logits = step.logits[0].astype(np.float64)
    peak = logits.max(-1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))


@dataclass
class Report:
    tokens_scored: int
    perplexity: float
    reference_perplexity: float | None = None
    kl_mean: float | None = None
    kl_median: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    top1_agreement: float | None = None
    logprob_gap_mean: float | None = None  # |log p(actual token)| difference, per scored token
    logprob_gap_max: float | None = None


def evaluate(model: Model, token_ids: list[int], context: int, reference: Model | None = None,
             progress=None) -> Report:
    """progress: a callable taking the number of chunks done so far (e.g. a tqdm update), or None."""
    parts = chunks(token_ids, context)
    if not parts:
        raise ValueError(f"the text has {len(token_ids)} tokens, fewer than one chunk of {context}")
    first = context // 2
    nll, ref_nll, kls, gaps, agree = [], [], [], [], 0
    for done, chunk in enumerate(parts, 1):
        targets = np.array(chunk[first + 1:])
        rows = chunk_log_softmax(model, chunk)[first:-1]  # row i predicts chunk[i + 1]
        actual = rows[np.arange(len(targets)), targets]
        nll += (-actual).tolist()
        if reference is not None:
            ref_rows = chunk_log_softmax(reference, chunk)[first:-1]
            ref_actual = ref_rows[np.arange(len(targets)), targets]
            ref_nll += (-ref_actual).tolist()
            kls += (np.exp(ref_rows) * (ref_rows - rows)).sum(-1).tolist()  # KL(reference || model)
            gaps += np.abs(actual - ref_actual).tolist()
            agree += int((rows.argmax(-1) == ref_rows.argmax(-1)).sum())
        if progress is not None:
            progress(done)
    report = Report(tokens_scored=len(nll), perplexity=math.exp(float(np.mean(nll))))
    if reference is not None:
        kl = np.array(kls)
        report.reference_perplexity = math.exp(float(np.mean(ref_nll)))
        report.kl_mean, report.kl_median = float(kl.mean()), float(np.median(kl))
        report.kl_p99, report.kl_max = float(np.percentile(kl, 99)), float(kl.max())
        report.top1_agreement = agree / len(nll)
        report.logprob_gap_mean, report.logprob_gap_max = float(np.mean(gaps)), float(np.max(gaps))
    return report
