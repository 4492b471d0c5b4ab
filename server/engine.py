"""In-flight batching for the server: one EngineCore (continuous policy) on a thread of its own.

Requests arrive from the event loop (`submit`), join the running batch between steps, and every step
reports each request's new tokens back to its asyncio queue; a request that is cancelled (its client
went away, its timeout passed) is aborted at the next step boundary and its row freed at once. The
engine thread is the only one that touches the core, the caches and the sampler.

Scheduling (runtime/engine/preemption.py): a body's `priority` orders the core's waiting requests and
lets one pause a lower running row; its `timeout` is a deadline from submission, past which the core
ends it with finish_reason "timeout". At most `max_waiting` requests wait for a row (QueueFull: 429,
with a Retry-After from the rate requests finish at, `retry_after`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from trt_llm.runtime.engine.engine_core import EngineRequest
from trt_llm.runtime.engine.sequence import TIMEOUT
from trt_llm.runtime.requests.prepare import Prepared
from trt_llm.runtime.engine.threads import single_threaded_host_math

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """More requests are waiting than the server takes (answered 429)."""


class EngineStopped(RuntimeError):
    """The engine thread was stopped (answered 503)."""


@dataclass
class Update:
    """What a step did for one request: its new tokens and the new final text."""
    token_ids: list[int]
    text: str
    finished: bool = False
    error: str | None = None


@dataclass(eq=False)
class Job:
    prepared: Prepared
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.perf_counter)
    id: int = field(default_factory=itertools.count().__next__)
    reported: int = 0  # tokens handed out so far
    last_report: float | None = None
    checked: float = field(default_factory=time.perf_counter)  # when the client was last seen connected
    client: str | None = None  # who sent it (server/clients.py): fair share between API keys

    def send(self, update: Update) -> None:
        try:
            self.loop.call_soon_threadsafe(self.updates.put_nowait, update)
        except RuntimeError:  # its event loop is closed: nobody is waiting for this request any more
            pass


@dataclass(eq=False)
class Work:
    """Engine work beside the core's requests (embeddings, server/embeddings.py): `passes` a generator that
    runs one engine pass a next() and returns its result; the engine thread runs one pass between two
    steps, so streams keep their pace and the engine is never run from two threads."""
    passes: object
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def settle(self, result=None, error: BaseException | None = None) -> None:
        def set_it():
            if self.future.done():  # (cancelled: its client left)
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        try:
            self.loop.call_soon_threadsafe(set_it)
        except RuntimeError:  # its event loop is closed: nobody waits for it
            pass


class ServingEngine:
    def __init__(self, runner, max_rows: int, max_waiting: int, metrics, save_prefixes: bool = True,
                 max_batched_tokens: int | None = None, reserved_rows: dict[int, int] | None = None):
        """runner: a runtime.requests.runner.Runner (the model, its draft, the preparer, the context
        cache, whose context_reuse makes each conversation's next turn restore the turns before it);
        save_prefixes: a request's system prompt is also kept for the next one that starts with it."""
        self.runner, self.max_rows, self.max_waiting = runner, max_rows, max_waiting
        self.max_batched_tokens = max_batched_tokens  # a pass's prompt and decode tokens (--max-num-batched-tokens)
        self.reserved_rows = dict(reserved_rows or {})  # a priority -> rows kept for it and above (--reserve-rows)
        self.metrics = metrics
        self.save_prefixes = save_prefixes
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._jobs: dict[int, Job] = {}  # in the core (engine thread only)
        self._work: list[Work] = []  # embeddings in progress, first first (engine thread only)
        self._pending: dict[int, int] = {}  # submitted and not yet admitted to a row (for 429s) -> its priority
        self.paused: dict[int, int] = {}  # paused rows waiting to resume -> their priorities (engine thread's)
        self._finished = deque(maxlen=256)  # when requests finished (perf_counter): the rate for Retry-After
        self._lock = threading.Lock()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.core = None  # the engine thread's EngineCore (read by /metrics: its KV pool's bytes)
        self.start()

    def start(self) -> None:
        """Run the engine thread (again, after close(): an app's lifespan may be run more than once)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="trt-llm-engine", daemon=True)
        self._thread.start()

    # -- the event loop's side --------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self._stop:
            raise EngineStopped("the server is shutting down")
        with self._lock:
            if len(self._pending) >= self.max_waiting:
                raise QueueFull(f"{len(self._pending)} requests are waiting (the server queues {self.max_waiting})")
            self._pending[job.id] = job.prepared.request.priority
            self.metrics.queue_depth.set(len(self._pending))
        self._inbox.put(("add", job))
        self._wake.set()

    def waiting(self) -> Counter:
        """Requests waiting for a row by priority: submitted and not yet admitted, and paused ones."""
        with self._lock:
            counts = Counter(self._pending.values())
        counts.update(dict(self.paused).values())
        return counts

    def retry_after(self) -> int:
        """Seconds a refused client should wait (Retry-After): how long the engine takes to finish as
        many requests as are waiting, at the rate it finished them over the last minute; at least 1."""
        now, finished = time.perf_counter(), list(self._finished)
        recent = [t for t in finished if now - t < 60.0]
        if len(recent) < 2:
            return 1
        rate = len(recent) / max(now - recent[0], 1e-3)  # requests a second
        return max(1, min(600, math.ceil(len(self._pending) / rate)))

    def run_passes(self, work: Work) -> None:
        """Queue `work` on the engine thread; its future holds the result."""
        if self._stop:
            raise EngineStopped("the server is shutting down")
        self._inbox.put(("work", work))
        self._wake.set()

    def abort(self, job: Job) -> None:
        self._inbox.put(("abort", job))
        self._wake.set()

    def close(self) -> None:
        """Stop the engine thread; requests still in it get an error update."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        why = "the server shut down before this request finished"
        self._fail_all(why)
        while True:  # submitted, never taken in
            try:
                action, job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if action == "add":
                job.send(Update([], "", finished=True, error=why))
                self._not_pending([job.id])
            elif action == "work":
                job.settle(error=EngineStopped(why))
        for work in self._work:
            work.settle(error=EngineStopped(why))
        self._work.clear()

    # -- the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        core = self.core = self._core()
        with single_threaded_host_math():
            while not self._stop:
                try:
                    self._drain(core)
                    if self._work:
                        self._one_pass()
                    if not core.has_unfinished():
                        if self._work:
                            continue
                        self._wake.wait(timeout=1.0)
                        self._wake.clear()
                        continue
                    finished = core.step()
                    in_rows = [*core.scheduler.running, *finished]
                    self._not_pending([r.id for r in in_rows])
                    done = {r.id for r in finished}
                    for request in in_rows:
                        self._report(request, request.id in done)
                    self.metrics.rows_in_flight.set(len(core.scheduler.running))
                    self.paused = {r.id: r.priority for r in core.scheduler.waiting if r.paused}
                except Exception as error:  # noqa: BLE001 - the engine failed: its requests fail, serving goes on
                    log.error("a step failed with %d requests in flight: %s", len(self._jobs), error)
                    log.info("the step's traceback:", exc_info=True)
                    self._fail_all(f"the engine failed: {error}")
                    core = self.core = self._core()

    def _core(self):
        core = self.runner.engine_core(self.max_rows, "continuous")
        core.max_batched_tokens = self.max_batched_tokens
        core.scheduler.reserved = self.reserved_rows
        return core

    def _one_pass(self) -> None:
        """The first work's next engine pass; its result or its error (its alone) when it is done."""
        work = self._work[0]
        if work.future.cancelled():  # its client is no longer waiting (--request-timeout)
            work.passes.close()
            self._work.pop(0)
            return
        try:
            next(work.passes)
            return
        except StopIteration as done:
            work.settle(done.value)
        except Exception as error:  # noqa: BLE001 - this work fails, serving goes on
            work.settle(error=error)
        self._work.pop(0)

    def _fail_all(self, why: str) -> None:
        for job in self._jobs.values():
            job.send(Update([], "", finished=True, error=why))
        self._not_pending(list(self._jobs))
        self._jobs.clear()

    def _not_pending(self, ids) -> None:
        with self._lock:
            for i in ids:
                self._pending.pop(i, None)
            self.metrics.queue_depth.set(len(self._pending))

    def _drain(self, core) -> None:
        while True:
            try:
                action, job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if action == "work":
                self._work.append(job)
            elif action == "add":
                p = job.prepared
                p.save_group = self.save_prefixes  # the server's policy, not a batch's
                self._jobs[job.id] = job
                request = self.runner.engine_request(p)
                request.id, request.priority, request.client = job.id, p.request.priority, job.client
                if p.request.timeout is not None:
                    request.deadline = job.submitted + p.request.timeout
                core.add_request(request)
            elif job.id in self._jobs:  # an abort of a request still waiting or running
                core.abort(job.id)
                del self._jobs[job.id]
                self._not_pending([job.id])
                self.metrics.aborted.inc()
                self.metrics.rows_in_flight.set(len(core.scheduler.running))

    def _report(self, request: EngineRequest, finished: bool) -> None:
        job = self._jobs.get(request.id)
        if job is None:
            return
        s = request.sequence
        new = s.generated[job.reported:]
        if not new and not finished:
            return
        now = time.perf_counter()
        if job.reported == 0 and new:
            self.metrics.time_to_first_token.observe(now - job.submitted)
            self.metrics.cached_tokens.inc(s.reused_tokens)
        elif new and job.last_report is not None:
            for _ in new:  # an EAGLE round yields several: each gets its share of the interval
                self.metrics.inter_token_latency.observe((now - job.last_report) / len(new))
        job.reported, job.last_report = len(s.generated), now
        self.metrics.generation_tokens.inc(len(new))
        if finished:
            s.detokenizer.finish()
            del self._jobs[request.id]
            self._finished.append(now)
            if s.finish_reason == TIMEOUT:
                self.metrics.rejections.labels(reason="timeout").inc()
        job.send(Update(list(new), s.detokenizer.delta(), finished=finished))
