"""`trt-llm-run --scheduling continuous`: an input file on the step-level engine (engine_core.py).

Up to `batch_size` requests are in flight; the next one in file order is admitted as soon as a row
frees, instead of waiting for its whole static batch to finish. Results are the static run's, request
by request: the reference's batch-wide rules are resolved per request from the static batch it would
have run in (its `batch_idx`, the largest `num_logprobs` of that batch, whether that batch saves
system prompts, whether it speculates), and each row computes what it computes in a static batch.
With an EAGLE draft every row speculates, but a request whose static batch disabled speculation
verifies its root alone (vanilla's one token a step; the tokens are the same either way).

A request's `priority` orders the file (higher first, file order within a priority: all arrive at
once, so none needs to pause another) and its `timeout` counts from the run's start: past it the
request ends with finish_reason "timeout", its answer so far (runtime/engine/preemption.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from trt_llm.runtime.text.prompt import PromptError
from trt_llm.runtime.requests.prepare import apply_batch_rules
from trt_llm.runtime.engine.threads import leaves_cores_to_the_engine
from trt_llm.schemas.input_file import RequestError

log = logging.getLogger(__name__)


@leaves_cores_to_the_engine
def run_continuous(runner, loaded, settings, formatter, responses: list) -> None:
    """Append every request's response to `responses` as it finishes (in finishing order)."""
    run_started = time.perf_counter()
    size = settings.batch_size
    pending: deque = deque()
    for index, slot in enumerate(loaded.requests):
        messages = loaded.messages(index)
        if index in runner.answered:  # an embedding request (runner.run answered it)
            responses.append(runner.answered[index])
            continue
        if isinstance(slot, RequestError):
            responses.append(runner.error(index, index % size, slot.message, messages))
            continue
        try:
            pending.append((runner.prepare(index, slot, settings, formatter), messages))
        except (PromptError, ValueError) as error:
            responses.append(runner.error(index, index % size, str(error), messages))
        except Exception as error:  # whatever a request asks for, the others still run
            from trt_llm.runtime.requests.runner import unprepared

            responses.append(runner.error(index, index % size, unprepared(index, error), messages))
    static_batches: dict[int, list] = {}
    for p, _ in pending:
        static_batches.setdefault(p.index // size, []).append(p)
    for batch in static_batches.values():
        apply_batch_rules(batch, settings)
    # Whisper requests decoded window by window: their windows batched together, before the rest
    windowed = [(p, messages) for p, messages in pending if p.transcription is not None]
    if windowed:
        pending = deque(item for item in pending if item[0].transcription is None)
        started = time.perf_counter()
        try:
            runner.transcribe([p for p, _ in windowed], size)
            responses += [runner.finish(p, p.index % size, started, messages) for p, messages in windowed]
        except Exception as error:  # the engine failed: these requests fail, the run goes on
            log.error("transcribing requests %s failed: %s", [p.index for p, _ in windowed], error)
            responses += [runner.error(p.index, p.index % size, f"batch failed: {error}", messages)
                          for p, messages in windowed]

    pending = deque(sorted(pending, key=lambda item: -item[0].request.priority))  # (stable: file order within)
    # The pool holds the rows the file can fill (a file of one request: one row, not batch_size).
    rows = max(1, min(size, len(pending)))
    core = runner.engine_core(rows, "continuous")
    in_flight: dict[int, tuple] = {}  # request index -> (prepared, messages, admitted at)
    while pending or core.has_unfinished():
        # Top up the free rows just before they are taken (a request's prefix is looked up when it is
        # admitted, so it finds what the requests before it committed).
        while pending and len(core.scheduler.running) + len(core.scheduler.waiting) < size:
            prepared, messages = pending.popleft()
            in_flight[prepared.index] = (prepared, messages, time.perf_counter())
            request = runner.engine_request(prepared)
            request.priority = prepared.request.priority
            if prepared.request.timeout is not None:
                request.deadline = run_started + prepared.request.timeout
            core.add_request(request)
        try:
            finished = core.step()
        except Exception as error:  # the engine failed: its running requests fail, the run goes on
            log.error("a step failed with requests %s in flight: %s", sorted(in_flight), error)
            log.info("the step's traceback:", exc_info=True)
            for index, (_, messages, _) in sorted(in_flight.items()):
                responses.append(runner.error(index, index % size, f"batch failed: {error}", messages))
            in_flight.clear()
            core = runner.engine_core(rows, "continuous")
            continue
        for request in finished:
            prepared, messages, admitted = in_flight.pop(request.id)
            responses.append(runner.finish(prepared, prepared.index % size, admitted, messages))

