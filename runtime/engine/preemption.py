"""The continuous core's policies beyond first come, first served: deadlines and preemption by pause.

Deadline: a request past its `deadline` ends at the next step boundary with finish_reason "timeout":
a running one with its answer so far, a waiting one (never admitted, or paused) with what it has,
without taking a row.

Pause: when a request waits and no row is free, the lowest-priority running row (the latest arrival
among equals) below its priority leaves the batch. Nothing of its request changes: its Sequence
keeps its tokens, sampler row and seeded generator (EngineRequest.row is not released), penalty
counts, stop-string detokenizer, grammar state and log-probabilities; only its row of the KV pool is
given up. A decoding row that commits its generated tokens puts its blocks in the context cache as
it leaves (EngineCore._leave). It waits again at its own priority and arrival, and when a row is free
it resumes as a decoding row (`resume`): its row holds its prompt and generated tokens but the last
again, restored from the context cache as far as it holds them and computed by prefill passes for
the rest, and the next decode step feeds its last token, as it would have had it never left. A row
paused mid-prompt starts its prompt again (its computed blocks restore where they were committed).

Only rows of vanilla decoding and prompt lookup on attention caches are paused (`preemptible`; prompt
lookup's row state, its n-gram index, is rebuilt from the row's tokens as it resumes: the strategy's
`resumed`): an EAGLE / MTP draft keeps a cache of its own per row that the core cannot rebuild, a
recurrent layer's state (Qwen3.5, LFM2) is not recomputed by a plain prefill here, and an
encoder-decoder row holds its clip's cross keys. There higher priorities are still admitted first, and
nothing is paused.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from trt_llm.runtime.cache import reuse
from trt_llm.runtime.engine.sequence import TIMEOUT


def expire(core) -> list:
    """The requests past their deadlines, ended (finish_reason "timeout") and out of the core."""
    scheduler, now = core.scheduler, time.perf_counter()
    late = [r for r in scheduler.waiting if r.deadline is not None and now >= r.deadline]
    for r in late:
        scheduler.waiting.remove(r)
        r.sequence.finish_reason, r.paused = TIMEOUT, False
        core._release(r)
    rows = [i for i, r in enumerate(scheduler.running) if r.deadline is not None and now >= r.deadline]
    gone = [scheduler.running[i] for i in rows]
    for r in gone:
        r.sequence.finish_reason = TIMEOUT
    if rows:
        core._leave(rows)
    core.timeouts += len(late) + len(gone)
    return late + gone


def preemptible(core) -> bool:
    from trt_llm.runtime.decoding.lookup import PromptLookup
    from trt_llm.runtime.decoding.vanilla import Vanilla

    return (core.scheduler.policy == "continuous" and type(core.strategy) in (Vanilla, PromptLookup)
            and not (core.cache is not None and core.cache.recurrent)
            and not any(r.sequence.media is not None and r.sequence.media.cross is not None
                        for r in core.scheduler.running))


def preempt(core) -> None:
    """Pause the running rows the waiting requests of a higher priority need (none free)."""
    scheduler = core.scheduler
    if not scheduler.waiting or len(scheduler.running) < scheduler.max_rows or not preemptible(core):
        return
    running = scheduler.running
    lowest = sorted(range(len(running)), key=lambda i: (running[i].priority, -running[i].arrival))
    free, victims = scheduler.max_rows - len(running), []
    for request in scheduler.waiting:  # in admission order
        if free:
            free -= 1
        elif lowest and running[lowest[0]].priority < request.priority:
            victims.append(lowest.pop(0))
        else:
            break
    if not victims:
        return
    paused = [running[i] for i in victims]
    decoding = len(running) - core._prefilling
    for i in victims:
        if i >= decoding:  # mid-prompt: it starts its prompt again (restoring what it committed)
            s = running[i].sequence
            s.prefilled, s.reused_tokens = None, 0
            if s.context is not None:
                s.context.committed = 0
    core._leave(sorted(victims), pause=True)
    for r in paused:
        r.paused = True
        scheduler.enqueue(r)
    core.pauses += len(paused)


def resume(core, index: int, request) -> None:
    """Running row `index` (empty) holds again what paused `request` held: its prompt and generated
    tokens but the last, restored from the context cache as far as it can, the rest prefilled."""
    from trt_llm.runtime.decoding.prefill import _pass  # a pass over given tokens at given positions

    s = request.sequence
    request.paused = False
    if not s.generated:  # paused mid-prompt: an admission like any other
        return
    tokens = s.prompt_ids + s.generated[:-1]
    restored = 0
    if core.context is not None and s.context is not None:
        # restore() reads a prompt and restores at most all its tokens but the last: here the row's tokens
        restored = reuse.restore(core.context, core.cache, index, SimpleNamespace(
            prompt_ids=tokens + s.generated[-1:], context=s.context))
    chunk = min(core.prefill_chunk or len(tokens), core.max_batched_tokens or len(tokens))
    window, lora = core.cache.window(index, index + 1), core.lora_rows(index, index + 1)
    with core.stage("resume"):
        for start in range(restored, len(tokens), chunk):
            _pass(core.model, [s], [tokens[start: start + chunk]], window, lora, np.array([start], dtype=np.int32))
    if core.profiler:
        core.profiler.count("prefill_computed_tokens", len(tokens) - restored)
        core.profiler.count("prefill_reused_tokens", restored)
    if hasattr(core.strategy, "resumed"):  # a strategy's per-row state, for a row it never prefilled
        core.strategy.resumed(index, s)
