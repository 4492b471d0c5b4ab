"""The step-level engine: requests join and leave a running batch between steps.

    core = EngineCore(model, max_rows=4)                   # vanilla decoding; or strategy=Eagle(...)
    core.add_request(EngineRequest(...))                   # waits until a row of the KV pool is free
    while core.has_unfinished():
        for done in core.step():                           # one pass: a prefill chunk of the rows still
            ...                                            # prefilling, a decode step of the others, or both

The KV pool is one cache set (runtime/cache/) of `max_rows` rows, allocated once (it grows only when
a request needs more slots than any before it). Running requests hold the rows 0 .. n-1: the rows
past their prefill first, then the rows still prefilling; a finished row leaves and the rows behind
it move up, a new request takes the next free row. A step is a prefill pass of the prefilling rows
(run on their rows alone, so their batch-mates' decoding is not padded to a prompt's width; a long
prompt in chunks: `prefill_chunk`, and while others decode the budget of engine/budget.py), a decode
step of the others, which the decoding strategy (runtime/decoding/) defines, or, under a latency
target, both in one pass. Each row computes what it computes in a static batch, so its tokens do not
depend on who joins or leaves around it. Admitted rows first restore their longest cached prefix
from the context cache, and their computed blocks go into it (runtime/cache/reuse.py).

Admission (`Scheduler`): "continuous" admits the next waiting request as soon as a row frees, by
priority (higher first) and arrival within a priority; "static" admits a whole group of requests
only when the pool is empty, which is the reference's batches of `batch_size` in file order (it reads
no priority). Policies of the continuous core (runtime/engine/preemption.py): a request waiting for
a row pauses the lowest-priority running one below it; a request past its deadline ends with
finish_reason "timeout" (its partial answer, or none while it waits).
"""

from __future__ import annotations

import bisect
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.sampling.grammar import mask_logits
from trt_llm.runtime.cache import reuse
from trt_llm.runtime.cache.reuse import ContextPlan, ContextRequest
from trt_llm.runtime.engine.budget import PrefillBudget
from trt_llm.runtime.engine.model import Model
from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams
from trt_llm.runtime.engine import preemption
from trt_llm.runtime.engine.sequence import ABORTED, Sequence, append_token, record_logprobs


@dataclass(eq=False)
class EngineRequest:
    """One request as the engine runs it: its token state and how to sample it."""
    id: object
    sequence: Sequence
    params: SamplingParams
    seed: int | None = None
    num_logprobs: int = 0
    adapter: object | None = None  # a runtime.lora.LoraAdapter, or None for the base model
    # Its context policies (None: it neither restores nor commits): the core makes its plan from them
    context: ContextRequest | None = None
    group: int = 0  # static scheduling: requests of one group are admitted together
    speculate: bool = True  # under EAGLE: False verifies the root alone (vanilla's tokens, one per step)
    row: int = -1  # the sampler's row of this request (add_request sets it)
    priority: int = 0  # continuous admission: higher first; a waiting one may pause a lower running one
    deadline: float | None = None  # time.perf_counter() at which it ends with finish_reason "timeout"
    arrival: int = -1  # its order of arrival (add_request sets it): first come, first served within a priority
    paused: bool = False  # it left its row for a higher-priority request and waits to resume
    client: str | None = None  # who sent it (the server: its API key's digest): fair share within a priority

    @property
    def resuming(self) -> bool:
        """Paused mid-decode: it resumes as a decoding row (one paused mid-prompt starts it again)."""
        return self.paused and bool(self.sequence.generated)


class Scheduler:
    """Waiting and running requests, and who may take a free row of the pool."""

    def __init__(self, max_rows: int, policy: str = "continuous"):
        if policy not in ("continuous", "static"):
            raise ValueError(f"scheduling: {policy!r} is not a policy; choose continuous or static")
        self.max_rows, self.policy = max_rows, policy
        # In admission order: (priority descending, arrival) under continuous, arrival under static
        self.waiting: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self._arrivals = 0
        self._admissions = 0
        self._served: dict[str, int] = {}  # a client -> when one of its requests was last admitted
        # Priority classes' reserved rows (continuous): a priority -> rows kept free for requests at or above it
        self.reserved: dict[int, int] = {}

    def enqueue(self, request: EngineRequest) -> None:
        """`request` waits for a row: a new one (it gets its arrival) or a paused one (it keeps its own)."""
        if request.arrival < 0:
            request.arrival, self._arrivals = self._arrivals, self._arrivals + 1
        if self.policy == "static":
            self.waiting.append(request)
        else:
            bisect.insort(self.waiting, request, key=lambda r: (-r.priority, r.arrival))

    def admit(self, prefilling: int = 0) -> list[EngineRequest]:
        """The waiting requests that start now (moved to running): paused ones first, which resume
        among the decoding rows, so they wait while rows are still prefilling (`prefilling`) (the
        rows decoding come first in the pool; a prompt's prefill takes a few passes at most)."""
        admitted = []
        if self.policy == "static":
            if self.running or not self.waiting:
                return []
            group = self.waiting[0].group
            while self.waiting and self.waiting[0].group == group and len(admitted) < self.max_rows:
                admitted.append(self.waiting.pop(0))
        else:
            while (self.waiting and len(self.running) + len(admitted) < self.max_rows
                   and self._room_for(self.waiting[0].priority, self.running + admitted)):
                index = self._next()
                if self.waiting[index].resuming and prefilling:
                    break
                admitted.append(self.waiting.pop(index))
            admitted.sort(key=lambda r: not r.resuming)  # (stable)
        self.running += admitted
        return admitted

    def _room_for(self, priority: int, taken: list) -> bool:
        """Whether a request of `priority` may take a free row beside the `taken` ones: the rows reserved
        for the classes above it that their own requests do not fill stay free for them."""
        held = sum(max(0, rows - sum(r.priority >= floor for r in taken))
                   for floor, rows in self.reserved.items() if priority < floor)
        return self.max_rows - len(taken) > held

    def _next(self) -> int:
        """The waiting request admitted next: of the highest priority waiting, a paused one (the first),
        else the one of the client served longest ago (round robin between clients: one client's burst
        does not hold another's requests back), the first to arrive of that client's."""
        head = self.waiting[0]
        if head.paused or head.client is None:
            return 0
        best, best_key = 0, None
        for index, r in enumerate(self.waiting):
            if r.priority != head.priority:
                break  # (sorted: the class is the queue's first requests)
            if r.paused:
                return index
            key = self._served.get(r.client, -1)
            if best_key is None or key < best_key:
                best, best_key = index, key
        if len(self._served) > 4096:  # (clients long gone: forgotten, they count as never served)
            self._served.clear()
        self._served[self.waiting[best].client] = self._admissions
        self._admissions += 1
        return best


class EngineCore:
    def __init__(self, model: Model, max_rows: int, policy: str = "continuous", lora_layout: dict | None = None,
                 profiler=None, strategy=None, sampler: Sampler | None = None, context=None,
                 prefill_chunk: int | None = None, step_tokens: int | None = None, mixed_steps: bool = False,
                 latency_target: float | None = None, context_reuse: bool = False,
                 max_batched_tokens: int | None = None):
        """strategy: a runtime.decoding strategy (Vanilla() by default, Eagle(...) with a draft).
        sampler: one whose rows the requests already hold (EngineRequest.row), or None for a new one.
        context: the context cache (runtime/cache/context_cache.py) admitted rows restore their
        prefixes from and commit their tokens to, as each sequence's plan says (`plan`: made from a
        request's policies when it is added); context_reuse: requests restore their longest cached
        prefix and commit their tokens (without it only kept system prompts are reused);
        max_batched_tokens: the most tokens a pass takes, its prompt tokens and its decode rows'
        together (vLLM's max_num_batched_tokens; None: no limit beyond the prefill chunk's)."""
        from trt_llm.runtime.decoding.vanilla import Vanilla

        self.model = model
        self.scheduler = Scheduler(max_rows, policy)
        self.strategy = strategy if strategy is not None else Vanilla()
        self.sampler = sampler if sampler is not None else Sampler([])
        self.lora_layout = lora_layout
        self.profiler = profiler
        self.context, self.context_reuse = context, context_reuse
        self.cache = None  # the KV pool, made at the first admission
        # Chunked prefill: at most prefill_chunk prompt tokens a row a pass (None: a prompt whole, which
        # is also what a cache's widest step is then), and while other rows decode at most step_tokens
        # prefill tokens a pass for all rows together (None: no limit), fewer where a latency_target
        # (the streams' time between tokens, in decode steps) asks (engine/budget.py); mixed_steps:
        # the strategy decodes its rows in the pass that takes the next chunk, where it can.
        self.prefill_chunk, self.mixed_steps = prefill_chunk, mixed_steps
        self.budget = PrefillBudget(step_tokens, latency_target)
        self.max_batched_tokens = max_batched_tokens
        self._prefilling = 0  # the last rows of the pool, admitted and not yet through their prompts
        self._chunk_tokens = 0  # the prompt tokens the last prefill pass took
        self._prefill_turn = False  # whether the next pass is a prefill one while rows also decode
        self._own_rows: set[int] = set()  # sampler rows add_request made, released when their request leaves
        self.lora_inputs: dict[str, np.ndarray] = {}  # the running rows' LoRA inputs, row by row
        self._lora_rows: list = []  # the adapters the LoRA inputs were built for
        self.pauses = 0  # rows paused for a higher priority (runtime/engine/preemption.py)
        self.timeouts = 0  # requests ended at their deadlines

    # -- the API ----------------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        self.plan(request)
        if request.row < 0:
            request.row = self.sampler.add(request.params, request.seed)
            self._own_rows.add(request.row)
        self.scheduler.enqueue(request)

    def plan(self, request: EngineRequest) -> None:
        """The request's ContextPlan (runtime/cache/reuse.py) from its policies: what it may restore from
        the context cache and give to it. A request without policies keeps the plan it has (none)."""
        policies, s = request.context, request.sequence
        if policies is None or self.context is None:
            return
        adapter = policies.adapter
        if self.model.long_context(s, 0, 0):
            # LongRoPE: a prompt longer than the original context is all turned by the long factors,
            # so its blocks are other blocks than a short prompt's of the same tokens.
            adapter = f"{adapter}/long-rope"
        plan = ContextPlan(self.context.root(adapter), s.media.spans() if s.media is not None else (),
                           lookup=self.context_reuse, adapter=adapter)
        if self.context_reuse:
            plan.commit = "generated" if policies.commit == "including_generated_tokens" else "prefill"
            if self.strategy.replays_context:  # EAGLE: the draft catches up from a restored prefix's last block
                plan.replay = self.context.block_tokens
        # At least one prompt token must be prefilled: it gives the first logits.
        if policies.kept and len(policies.kept) < len(s.prompt_ids):
            plan.kept, plan.save_kept = policies.kept, policies.save_kept
        s.context = plan

    def _release(self, request: EngineRequest) -> None:
        if request.row in self._own_rows:
            self._own_rows.discard(request.row)
            self.sampler.release(request.row)

    def abort(self, request_id) -> EngineRequest | None:
        """Stop a request, waiting or running; it finishes with finish_reason "aborted"."""
        for request in self.scheduler.waiting:
            if request.id == request_id:
                self.scheduler.waiting.remove(request)
                request.sequence.finish_reason = ABORTED
                self._release(request)
                return request
        for index, request in enumerate(self.scheduler.running):
            if request.id == request_id:
                request.sequence.finish_reason = ABORTED
                self._leave([index])
                return request
        return None

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> list[EngineRequest]:
        """One model pass; returns the requests that finished in it: a prefill pass of the rows still
        prefilling (requests just admitted, or a long prompt's next chunk), a decode step of the rows
        past their prefill (the strategy's), or both at once. While both kinds are running, a strategy
        that can (vanilla: `mixed_step`) decodes its rows in the pass that takes the next chunk, and
        one that cannot (EAGLE's tree) takes turns with the prefill passes: a prompt that arrives while
        others decode costs them a chunk a step, never its whole prefill.

        Run the loop of steps inside runtime.threads.single_threaded_host_math() (once: it costs about
        a millisecond to enter), so that the host's small math leaves the cores to the engine."""
        expired = preemption.expire(self)
        preemption.preempt(self)
        admitted = self.scheduler.admit(self._prefilling)
        if admitted:
            self._reserve(admitted)
            self._update_lora()
            resumed = [r for r in admitted if r.resuming]
            for r in admitted:
                r.paused = False
            for r in resumed:  # they come first, after the rows decoding (Scheduler.admit)
                preemption.resume(self, self.scheduler.running.index(r), r)
            self._prefilling += len(admitted) - len(resumed)
            self._prefill_turn = True
        decoding = len(self.scheduler.running) - self._prefilling
        if self.model.long_rope is not None and decoding:
            self._long_rope_switch(decoding)
        started = time.perf_counter()
        finished = None
        if self._prefilling and decoding and self.mixed_steps and self.budget.tokens and hasattr(self.strategy, "mixed_step"):
            finished = self.strategy.mixed_step(self, decoding)  # both in one pass, where the strategy can
            if finished is not None:
                self.budget.prefilled(time.perf_counter() - started, self._chunk_tokens, mixed=True)
        if finished is None:
            if self._prefilling and (self._prefill_turn or not decoding):
                finished = self.strategy.prefill(self, self.scheduler.running[decoding:], decoding)
                self._prefill_turn = False
                if decoding:
                    self.budget.prefilled(time.perf_counter() - started, self._chunk_tokens, mixed=False)
            elif decoding:
                with self._decode_rows(decoding):
                    finished = self.strategy.step(self)
                self._prefill_turn = True
                self.budget.decoded(time.perf_counter() - started)
            else:
                return expired
        if self.context is not None and self.cache.recurrent:
            for i in range(decoding):  # a decoding row's states at the block boundaries it passes
                reuse.snapshot_decoded(self.context, self.cache, i, self.scheduler.running[i].sequence,
                                       self.strategy.cached(self, i))
        done = [self.scheduler.running[i] for i in finished]
        if finished:
            self._leave(finished)
        return expired + done

    def _long_rope_switch(self, decoding: int) -> None:
        """LongRoPE: the decoding rows whose next token takes them past the original context compute
        their caches again with the long factors first (prefill.recompute). Their blocks are no
        longer those of their context plan's root (a short prompt's), so they commit nothing more."""
        from trt_llm.runtime.decoding.prefill import recompute

        running = self.scheduler.running[:decoding]
        crossing = [i for i, r in enumerate(running) if r.sequence.length == self.model.long_rope[0] + 1]
        for i in crossing:  # once in a request's life: one row at a time
            with self.stage("long_rope_recompute"):
                recompute(self.model, running[i].sequence, self.cache.window(i, i + 1), self.lora_rows(i, i + 1),
                          self.prefill_chunk)
            if running[i].sequence.context is not None:
                running[i].sequence.context.commit = "none"

    def run_to_completion(self) -> None:
        while self.has_unfinished():
            self.step()

    # -- what strategies use ----------------------------------------------------------------------

    @property
    def decoding(self) -> list[EngineRequest]:
        """The running requests past their prefill: rows 0 .. n - 1 (the rows prefilling follow them)."""
        return self.scheduler.running[: len(self.scheduler.running) - self._prefilling]

    def stage(self, name: str):
        return self.profiler.stage(name) if self.profiler else nullcontext()

    def prefill(self, rows: list[EngineRequest], start: int):
        """A prefill pass of the prefilling `rows` (running rows start ..; runtime/decoding/prefill.py):
        each row's next chunk of its prompt (`_chunks`). Rows complete in order, so the rows done are
        always the first ones; their logits are at their prompts' last tokens. Returns the pass's
        Prefilled (`complete` of them)."""
        from trt_llm.runtime.decoding.prefill import prefill

        window, sequences, counts = self._chunks(rows, start)
        active = len(counts)
        done = prefill(self.model, sequences[:active], window.window(0, active) if active < len(rows) else window,
                       self.lora_rows(start, start + active), self.stage, self.profiler, self.context,
                       np.array(counts, dtype=np.int32))
        self._prefilling -= done.complete
        return done

    def mixed(self, decoding: int) -> tuple[np.ndarray, int] | None:
        """One pass that is the decode step of rows 0 .. decoding - 1 and the next prefill chunk of the
        rows after them (runtime/decoding/prefill.py's mixed); None when a decode row's cache has no
        room for the chunk's width (the step then runs as two passes). Returns (logits [B, 1, V] of
        the pass's rows, how many prefilling rows completed)."""
        from trt_llm.runtime.decoding.prefill import mixed

        running = self.scheduler.running
        if self.max_batched_tokens is not None and self.max_batched_tokens <= decoding:
            return None  # no prompt token fits beside the decode rows: two passes
        window, sequences, counts = self._chunks(running[decoding:], decoding, decode_rows=decoding)
        if any(r.sequence.length - 1 + max(counts) > self.cache.capacity for r in running[:decoding]):
            return None
        rows = decoding + len(counts)
        logits, complete = mixed(self.model, [r.sequence for r in running[:decoding]], sequences[: len(counts)],
                                 np.array(counts, dtype=np.int32), self.cache.window(0, rows),
                                 self.lora_rows(0, rows), self.stage, self.profiler, self.context)
        self._prefilling -= complete
        return logits, complete

    def _chunks(self, rows: list[EngineRequest], start: int, decode_rows: int = 0):
        """Start the prefilling `rows` (running rows start ..: their restored prefixes) and give each its
        next chunk: at most `prefill_chunk` prompt tokens, and while other rows decode at most the
        budget's tokens for all of them together. A row's last chunk waits for the rows before it (it
        completes with or after them), so the rows done are always the first ones. With
        max_batched_tokens, a pass's prompt tokens are at most it less its `decode_rows` (a mixed
        pass's decode tokens). Returns (their window of the pool, their sequences, the counts up to
        the last row with one)."""
        from trt_llm.runtime.decoding.prefill import start_rows

        window = self.cache.window(start, len(self.scheduler.running))
        sequences = [r.sequence for r in rows]
        start_rows(sequences, window, self.context)
        budget = self.budget.tokens if start else None  # rows before these are decoding: spare them
        if self.max_batched_tokens is not None:
            cap = self.max_batched_tokens - decode_rows
            budget = cap if budget is None else min(budget, cap)
        counts, earlier_complete = [], True
        for s in sequences:
            remaining = len(s.prompt_ids) - s.prefilled
            take = min(remaining, self.prefill_chunk or remaining, remaining if budget is None else budget)
            take = self.model.whole_images(s, s.prefilled, take)
            if self.context is not None and self.cache.recurrent:  # a pass ends where its states are snapshotted
                ahead = [p for p in reuse.snapshot_points(self.context, s) if p < s.prefilled + take]
                take = ahead[0] - s.prefilled if ahead else take
            if take == remaining and not earlier_complete:
                take -= 1  # its last token waits: a row completes only with or after the rows before it
            earlier_complete = earlier_complete and take == remaining
            counts.append(take)
            if budget is not None:
                budget = max(budget - take, 0)  # (a whole image may take more than was left)
        active = max(i + 1 for i, c in enumerate(counts) if c)  # the rows after it have no token this pass
        self._chunk_tokens = sum(counts)
        return window, sequences, counts[:active]

    def lora_rows(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The LoRA inputs of running rows start .. stop - 1."""
        if start == 0 and stop == len(self.scheduler.running):
            return self.lora_inputs
        return {name: array[start:stop] for name, array in self.lora_inputs.items()}

    @contextmanager
    def _decode_rows(self, rows: int):
        """Within: the pool's active rows are the first `rows` (those decoding), their LoRA inputs too."""
        running, lora = len(self.scheduler.running), self.lora_inputs
        self.cache.batch, self.lora_inputs = rows, self.lora_rows(0, rows)
        try:
            yield
        finally:
            self.cache.batch, self.lora_inputs = running, lora

    def sample(self, requests: list[EngineRequest], logits: np.ndarray, first: int) -> list[int]:
        """Sample one token for each of `requests` (the running rows first, first + 1, ...) from
        logits [n, V] and append it; returns the running indexes of the ones that finished."""
        with self.stage("sample"):
            allowed = mask_logits(logits, [r.sequence.constraint for r in requests])  # structured output
            sampled = self.sampler.sample(allowed, [r.row for r in requests],  # penalties read each row's counts
                                          [r.sequence.counts if self.sampler.params[r.row].penalised else None
                                           for r in requests])
            tokens = sampled.tolist()
            with_logprobs = [i for i, r in enumerate(requests) if r.num_logprobs]
            # Each request's own K: a batch-uniform K is the caller's rule to set.
            for k in sorted({requests[i].num_logprobs for i in with_logprobs}):
                picked = [i for i in with_logprobs if requests[i].num_logprobs == k]
                record_logprobs([requests[i].sequence for i in picked], logits[picked], sampled[picked], k)
        now = time.perf_counter()
        return [first + i for i, (r, token) in enumerate(zip(requests, tokens))
                if append_token(self.model.eos, r.sequence, token, now)]

    # -- the pool ---------------------------------------------------------------------------------

    def _reserve(self, admitted: list[EngineRequest]) -> None:
        running = self.scheduler.running
        need = max(len(r.sequence.prompt_ids) + r.sequence.max_new_tokens for r in admitted)
        need += self.strategy.extra_slots
        if self.cache is None:
            # The widest step a row takes: a prefill chunk (None: a whole prompt), a decode step or a tree.
            widest = max(self.prefill_chunk, self.strategy.extra_slots + 1,
                         self.model.bidirectional_block) if self.prefill_chunk else None
            self.cache = self.model.new_cache(self.scheduler.max_rows, need, widest)
        else:
            self.cache.reserve(self.scheduler.max_rows, need, self._used(running[: -len(admitted)]))
        self.cache.batch = len(running)
        self.strategy.reserve(self, need)

    def _used(self, requests: list[EngineRequest]) -> list[int]:
        """The tokens each request's row holds: a prefilling one its prompt's computed part; a decoding
        one its prompt and generated tokens but the last (not yet fed)."""
        return [r.sequence.length - 1 if r.sequence.generated else (r.sequence.prefilled or 0) for r in requests]

    def _leave(self, indexes: list[int], pause: bool = False) -> None:
        """Running rows `indexes` leave (finished or aborted; paused: they keep their sampler rows and
        their sequences, and wait again); the rows behind them move up."""
        running = self.scheduler.running
        decoding = len(running) - self._prefilling
        if self.context is not None:  # its generated tokens, for a request that continues the conversation
            for i in indexes:
                s = running[i].sequence
                if i < decoding and s.context is not None and s.context.commit == "generated":
                    reuse.commit(self.context, self.cache, i, s, self.strategy.cached(self, i),
                                 s.prompt_ids + s.generated)
        gone = set(indexes)
        keep = [i for i in range(len(running)) if i not in gone]
        self.cache.keep_rows(keep, self._used([running[i] for i in keep]))
        self.strategy.leave([i for i in keep if i < decoding])  # strategies hold the decoding rows only
        self._prefilling -= sum(i >= decoding for i in indexes)
        for i in indexes:
            if not pause:
                self._release(running[i])
        self.scheduler.running = [running[i] for i in keep]
        self._update_lora()

    def _update_lora(self) -> None:
        if not self.lora_layout:
            return
        adapters = [r.adapter for r in self.scheduler.running]
        if adapters == self._lora_rows:
            return
        from trt_llm.runtime.requests.lora import batch_inputs

        self._lora_rows = adapters
        self.lora_inputs = batch_inputs(adapters, self.lora_layout, self.model.embedding.dtype) if adapters else {}
