"""Vanilla decoding: every step, one token for every running row."""

from __future__ import annotations

import time

import numpy as np

from trt_llm.runtime.engine.step import Step


class Vanilla:
    extra_slots = 0
    replays_context = False  # (reuse.ContextPlan.replay: an EAGLE draft's catch-up)

    def __init__(self):
        self._logits: np.ndarray | None = None  # reused while the batch stays the same size
        self.engine_seconds = 0.0  # the last step's engine call (prompt lookup's pass cost reads it)

    def reserve(self, core, need: int) -> None:
        pass

    def prefill(self, core, rows, start: int) -> list[int]:
        done = core.prefill(rows, start)
        return core.sample(rows[: done.complete], done.logits[: done.complete, 0], first=start)

    def step(self, core) -> list[int]:
        running, model = core.decoding, core.model
        last = np.array([r.sequence.generated[-1] for r in running], dtype=np.int64)
        past = np.array([r.sequence.length - 1 for r in running], dtype=np.int32)
        if self._logits is None or len(self._logits) != len(running):
            self._logits = np.empty((len(running), 1, model.vocab_size), dtype=np.float32)
        embeds, extras = model.embed(last[:, None])
        step = Step.decode(embeds, past, self._logits)
        step.inputs, step.outputs = model.eagle_io(len(running), 1)
        step.inputs.update(extras)
        if model.positions_vary:
            step.position_ids = model.positions([r.sequence for r in running], past, 1)
        step.inputs.update(model.decode_extras(len(running)))
        with core.stage("decode_step"):
            started = time.perf_counter()
            model.engine.run(step, core.cache, core.lora_inputs)
            self.engine_seconds = time.perf_counter() - started
        if core.profiler:
            core.profiler.count("decode_tokens", len(running))
        return core.sample(running, self._logits[:, 0], first=0)

    def mixed_step(self, core, decoding: int) -> list[int] | None:
        """A decode step of the rows 0 .. decoding - 1 and the next prefill chunk of the rows after
        them, in one pass (EngineCore.mixed); None when it cannot be one."""
        result = core.mixed(decoding)
        if result is None:
            return None
        logits, complete = result
        rows = decoding + complete
        return core.sample(core.scheduler.running[:rows], logits[:rows, 0], first=0)

    def cached(self, core, index: int) -> int:
        return core.scheduler.running[index].sequence.length - 1  # all but the last token, not yet fed

    def leave(self, keep: list[int]) -> None:
        pass
