"""Run a loaded input file on an engine directory (the file driver over runtime/requests/loaded_engine.py):
batches in file order, one response per request.

A request that cannot run fails alone, with finish_reason "error" and its reason; its batch-mates
and the other batches still run. Each batch runs on an EngineCore (runtime/engine/engine_core.py) with the
static policy; `--scheduling continuous` feeds one EngineCore the whole file (runtime/requests/continuous.py).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

from trt_llm.runtime.cache.context_cache import ContextCache
from trt_llm.runtime.decoding.spec_config import SpecConfig
from trt_llm.runtime.engine.engine_core import EngineCore
from trt_llm.runtime.engine.profiler import Profiler
from trt_llm.runtime.engine.threads import leaves_cores_to_the_engine
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.decoding.choice import SpeculationError
from trt_llm.runtime.requests.loaded_engine import LoadedEngine
from trt_llm.runtime.requests.prepare import Prepared, apply_batch_rules
from trt_llm.runtime.requests.responses import interrupted_output
from trt_llm.runtime.text.prompt import PromptError
from trt_llm.schemas.input_file import InputSettings, LoadedInput, RequestError
from trt_llm.schemas.output_file import OutputFile, Response

__all__ = ["LoadedEngine", "Runner", "RunError", "apply_batch_rules", "interrupted_output"]

log = logging.getLogger(__name__)


class RunError(ValueError):
    """The run as a whole cannot go on (settings the engine cannot serve)."""


class Runner(LoadedEngine):
    """The file driver: an input file's requests on the loaded engine, in static batches of
    batch_size in file order, or fed to one continuous engine core (`scheduling`)."""

    def __init__(self, engine_dir: EngineDir, threads: int = 0, prefix_cache: ContextCache | None = None,
                 profiler: Profiler | None = None, spec: SpecConfig | None = None, spec_decode: bool = True,
                 scheduling: str = "static", context_reuse: bool = False, prefill_chunk: int | None = None,
                 latency_target: float | None = None, speculation: str | None = None,
                 max_batched_tokens: int | None = None):
        """See LoadedEngine (runtime/requests/loaded_engine.py); scheduling: "static" or "continuous"."""
        super().__init__(engine_dir, threads, prefix_cache, profiler, spec, spec_decode, context_reuse,
                         prefill_chunk, latency_target, speculation, max_batched_tokens)
        self.scheduling = scheduling
        self.answered: dict[int, Response] = {}  # the run's embedding requests, answered before the rest

    def run(self, loaded: LoadedInput, settings: InputSettings,
            finished: list[Response] | None = None) -> OutputFile:
        """The output file of `loaded`. `finished`, when given, receives each batch's responses as
        the batch completes, so an interrupted run can still write them (interrupted_output)."""
        if settings.batch_size > self.limits["max_batch_size"]:
            raise RunError(f"batch_size {settings.batch_size} exceeds the engine's max_batch_size "
                           f"{self.limits['max_batch_size']}")
        try:  # the file's strategy, where the command line names none
            self.strategy_name(settings.speculation)
        except SpeculationError as error:
            raise RunError(str(error)) from None
        self.file_speculation = settings.speculation
        self.run_started = time.perf_counter()  # requests' timeouts count from here
        formatter = self.formatter(settings, loaded.source)
        from trt_llm.runtime.requests.embeddings import answer_embeddings

        self.answered = answer_embeddings(self, loaded, settings)  # (task embed: no generation)
        responses = [] if finished is None else finished
        if self.scheduling == "continuous":
            from trt_llm.runtime.requests.continuous import run_continuous

            run_continuous(self, loaded, settings, formatter, responses)
            return OutputFile(input_file=loaded.source, responses=sorted(responses, key=lambda r: r.request_idx))
        slots = loaded.requests
        batches = range(0, len(slots), settings.batch_size)
        for number, batch_start in enumerate(batches, 1):
            batch = slots[batch_start: batch_start + settings.batch_size]
            started = time.perf_counter()
            done = self._run_batch(batch, batch_start, loaded, settings, formatter)
            responses += done
            log.info("batch %d of %d: requests %d-%d, %d tokens generated in %.2f s%s", number, len(batches),
                     batch_start, batch_start + len(batch) - 1, sum(r.generated_tokens for r in done),
                     time.perf_counter() - started,
                     f", {sum(r.finish_reason == 'error' for r in done)} failed"
                     if any(r.finish_reason == "error" for r in done) else "")
        return OutputFile(input_file=loaded.source, responses=responses)

    def _run_batch(self, batch, batch_start, loaded, settings, formatter) -> list[Response]:
        started = time.perf_counter()
        results: dict[int, Response] = {}
        prepared: list[Prepared] = []
        with (self.profiler.stage("prepare") if self.profiler else nullcontext()):
            for batch_idx, slot in enumerate(batch):
                index = batch_start + batch_idx
                if index in self.answered:
                    results[index] = self.answered[index]
                    continue
                if isinstance(slot, RequestError):
                    results[index] = self.error(index, batch_idx, slot.message, slot.raw_messages())
                    continue
                try:
                    prepared.append(self.prepare(index, slot, settings, formatter))
                except (PromptError, ValueError) as error:
                    results[index] = self.error(index, batch_idx, str(error), loaded.messages(index))
                except Exception as error:  # whatever a request asks for, the others still run
                    results[index] = self.error(index, batch_idx, unprepared(index, error), loaded.messages(index))

        if prepared:
            apply_batch_rules(prepared, settings)
            try:
                # Batch-wide, like the reference: one request asking for vanilla decoding gets it
                # for its whole batch.
                whole = [p for p in prepared if p.transcription is None]
                if whole:
                    core = self.engine_core(len(whole), "static", speculate=prepared[0].speculate)
                    for p in whole:
                        request = self.engine_request(p)
                        if p.request.timeout is not None:  # (a static batch reads no priority)
                            request.deadline = self.run_started + p.request.timeout
                        core.add_request(request)
                    _run_to_completion(core)
                self.transcribe([p for p in prepared if p.transcription is not None], len(batch))
            except Exception as error:  # the engine failed: this batch's requests fail, the run goes on
                # One line; the traceback only with -v (it is for us, the message is for the user).
                log.error("batch starting at request %d failed: %s", batch_start, error)
                log.info("the batch's traceback:", exc_info=True)
                for p in prepared:
                    results[p.index] = self.error(p.index, p.index - batch_start, f"batch failed: {error}",
                                                  loaded.messages(p.index))
            else:
                for p in prepared:
                    results[p.index] = self.finish(p, p.index - batch_start, started, loaded.messages(p.index))
        return [results[i] for i in sorted(results)]


def unprepared(index: int, error: Exception) -> str:
    """The message of a request whose preparation failed unexpectedly (a bug, a broken install): one
    line; the traceback only with -v."""
    log.info("requests[%d]: the preparation's traceback:", index, exc_info=error)
    return f"requests[{index}]: could not be prepared: {type(error).__name__}: {error}"


@leaves_cores_to_the_engine
def _run_to_completion(core: EngineCore) -> None:
    core.run_to_completion()
