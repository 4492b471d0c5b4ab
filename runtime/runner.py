"""Run a loaded input file on an engine directory: batches in file order, one response per request.

A request that cannot run fails alone, with finish_reason "error" and its reason; its batch-mates
and the other batches still run.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

from trt_llm.runtime.detokenizer import IncrementalDetokenizer
from trt_llm.runtime.eagle import SpecConfig, SpecStats, check_spec, generate_eagle, load_draft_engine
from trt_llm.runtime.spec_config import resolve_spec
from trt_llm.runtime.engine_dir import EngineDir, loading
from trt_llm.runtime.generate import Model, Sequence, generate
from trt_llm.runtime.lora import LoraAdapter, LoraError, batch_inputs, load_adapter
from trt_llm.runtime.prefix_cache import PrefixCache
from trt_llm.runtime.profiler import Profiler
from trt_llm.runtime.prompt import Prompt, PromptError, PromptFormatter
from trt_llm.runtime.sampler import Sampler, SamplingParams
from trt_llm.runtime.token_bytes import TokenBytes
from trt_llm.runtime.tokenizer import Tokenizer
from trt_llm.schemas.input_file import InputSettings, LoadedInput, Request, RequestError
from trt_llm.schemas.output_file import LogprobCandidate, OutputFile, Response

log = logging.getLogger(__name__)


class RunError(ValueError):
    """The run as a whole cannot go on (settings the engine cannot serve)."""


@dataclass
class Prepared:
    index: int
    request: Request
    prompt: Prompt
    sequence: Sequence
    params: SamplingParams
    system_ids: list[int] | None  # the templated system prompt's tokens, when they prefix the prompt
    adapter: LoraAdapter | None = None
    seed: int | None = None  # this request's own sampling stream (request_seed)
    num_logprobs: int = 0  # K as its batch resolves it (batch-uniform, like the reference)
    save_group: bool = False  # its batch saves system prompts (batch-wide, like the reference)


def request_seed(seed: int | None, index: int) -> int | None:
    # One stream per request, derived from the file's seed and the request's index, so a request's
    # samples do not depend on its batch-mates or on the batch size.
    return None if seed is None else (seed * 1_000_003 + index) % (2**63)


class Runner:
    def __init__(self, engine_dir: EngineDir, threads: int = 0, prefix_cache: PrefixCache | None = None,
                 profiler: Profiler | None = None, spec: SpecConfig | None = None, spec_decode: bool = True,
                 scheduling: str = "static"):
        from safetensors.numpy import load_file

        from trt_llm.runtime.engines import open_engine

        self.engine_dir = engine_dir
        dims = engine_dir.dims
        embedding_path = engine_dir.component_path("llm", "embedding")
        with loading("embedding", embedding_path):
            embedding = load_file(str(embedding_path))["embedding"]
            if embedding.shape != (dims["vocab_size"], dims["hidden_size"]):
                raise ValueError(f"shape {list(embedding.shape)}, the manifest says "
                                 f"[{dims['vocab_size']}, {dims['hidden_size']}]")
        eagle = engine_dir.manifest["model"].get("eagle") or {}
        # Under speculation the base and the draft sessions alternate: neither may spin (measured on
        # 2 cores: EAGLE3 0.53x -> 1.07x vanilla). Vanilla decoding spins briefly (OrtEngine.SPIN_US).
        with loading("engine", engine_dir.component_path("llm", "engine")):
            engine = open_engine(engine_dir, threads, spinning=not (eagle and spec_decode))
        self.model = Model(engine, embedding, dims, engine_dir.eos_token_ids,
                           engine_dir.limits["max_kv_cache_capacity"], eagle.get("feature_width", 0))
        self.draft = None
        if eagle and spec_decode:
            with loading("EAGLE draft", engine_dir.path / "draft"):
                self.draft = load_draft_engine(engine_dir, threads, embedding)
        if self.draft is not None and spec is None:  # the tree the engine's build recorded for its backend
            spec = resolve_spec(engine_dir.manifest["components"]["draft"], engine_dir.manifest["backend"])
        self.spec = check_spec(spec, engine_dir) if self.draft else None
        self.spec_stats = SpecStats()
        with loading("tokenizer", engine_dir.tokenizer_dir):
            self.tokenizer = Tokenizer.from_dir(engine_dir.tokenizer_dir)
        self.token_bytes = TokenBytes(self.tokenizer, vocab_size=dims["vocab_size"])
        self.limits = engine_dir.limits
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(engine_dir.identity)
        self.prefix_stats = {"hits": 0, "saved": 0, "fallbacks": 0}
        self.profiler = profiler
        self.scheduling = scheduling
        self.lora_layout = engine_dir.manifest.get("lora")
        self._adapters: dict[tuple[str, str], LoraAdapter | LoraError] = {}  # read once per path

    def run(self, loaded: LoadedInput, settings: InputSettings,
            finished: list[Response] | None = None) -> OutputFile:
        """The output file of `loaded`. `finished`, when given, receives each batch's responses as
        the batch completes, so an interrupted run can still write them (interrupted_output)."""
        if settings.batch_size > self.limits["max_batch_size"]:
            raise RunError(f"batch_size {settings.batch_size} exceeds the engine's max_batch_size "
                           f"{self.limits['max_batch_size']}")
        formatter = PromptFormatter(self.tokenizer, settings.apply_chat_template,
                                    settings.add_generation_prompt, settings.enable_thinking)
        responses = [] if finished is None else finished
        if self.scheduling == "continuous":
            if self.draft is None:
                from trt_llm.runtime.continuous import run_continuous

                run_continuous(self, loaded, settings, formatter, responses)
                return OutputFile(input_file=loaded.source, responses=sorted(responses, key=lambda r: r.request_idx))
            log.warning("--scheduling continuous runs vanilla decoding in this version; with the engine's "
                        "EAGLE draft the requests run in static batches (--no-spec-decode for continuous)")
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
                if isinstance(slot, RequestError):
                    results[index] = self.error(index, batch_idx, slot.message, slot.raw_messages())
                    continue
                try:
                    prepared.append(self.prepare(index, slot, settings, formatter))
                except (PromptError, ValueError) as error:
                    results[index] = self.error(index, batch_idx, str(error), loaded.messages(index))

        if prepared:
            num_logprobs = apply_batch_rules(prepared, settings)
            for p in prepared:
                self.attach_prefix(p)
            try:
                sampler = Sampler([p.params for p in prepared], [p.seed for p in prepared])
                lora_inputs = None
                if self.lora_layout:
                    lora_inputs = batch_inputs([p.adapter for p in prepared], self.lora_layout,
                                               self.model.embedding.dtype)
                sequences = [p.sequence for p in prepared]
                # Batch-wide, like the reference: one request asking for vanilla decoding gets it
                # for its whole batch.
                if self.draft is not None and not any(p.request.disable_spec_decode for p in prepared):
                    generate_eagle(self.model, self.draft, sequences, sampler, self.spec, num_logprobs,
                                   self.profiler, lora_inputs, self.spec_stats)
                else:
                    generate(self.model, sequences, sampler, num_logprobs, self.profiler, lora_inputs)
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

    def error(self, index: int, batch_idx: int, message: str, messages) -> Response:
        return _error(index, batch_idx, message, messages)

    def finish(self, p: Prepared, batch_idx: int, started: float, messages) -> Response:
        """The response of a finished request (its saved system prompt goes into the cache)."""
        if p.sequence.saved is not None:
            self.prefix_cache.put(p.request.lora_name, p.sequence.saved)
            self.prefix_stats["saved"] += 1
        response = self._response(p, batch_idx, started, messages)
        if self.profiler:
            self.profiler.ttft_ms[p.index] = response.time_to_first_token_ms
        return response

    def prepare(self, index: int, request: Request, settings: InputSettings,
                formatter: PromptFormatter) -> Prepared:
        """A validated request -> what the engine runs: its prompt tokens, limits and sampling."""
        where = f"requests[{index}]"
        adapter = None
        if request.lora_name is not None:
            adapter = self._adapter(where, request.lora_name, settings.available_lora_weights[request.lora_name])
        try:
            prompt = formatter.format(request.messages)
        except PromptError as error:
            raise PromptError(f"{where}.{error}") from None
        prompt_len, max_input = len(prompt.token_ids), self.limits["max_input_len"]
        if prompt_len > max_input:
            raise ValueError(f"{where}: prompt is {prompt_len} tokens, longer than the engine's "
                             f"max_input_len {max_input}")
        if prompt_len == 0:
            raise ValueError(f"{where}: the prompt is empty after formatting")
        capacity = self.limits["max_kv_cache_capacity"]
        max_new = min(settings.max_generate_length, capacity - prompt_len)
        if max_new < settings.max_generate_length:
            log.warning("%s: max_generate_length %d clamped to %d by the KV cache capacity %d "
                        "(prompt %d tokens)", where, settings.max_generate_length, max_new, capacity, prompt_len)
        bias = request.resolved_logit_bias(settings)
        vocab = self.model.dims["vocab_size"]
        outside = [token for token in bias if token >= vocab]
        if outside:
            raise ValueError(f"{where}.logit_bias: token id {outside[0]} is outside the vocabulary "
                             f"(size {vocab})")
        params = SamplingParams(settings.temperature, settings.top_k, settings.top_p, bias or None)
        detokenizer = IncrementalDetokenizer(self.token_bytes, request.stop_list())
        return Prepared(index, request, prompt, Sequence(prompt.token_ids, max_new, detokenizer), params,
                        self._system_ids(where, prompt), adapter, request_seed(settings.seed, index))

    def _adapter(self, where: str, name: str, path: str) -> LoraAdapter:
        if not self.lora_layout:
            raise ValueError(f"{where}.lora_name: this engine was built without LoRA inputs "
                             "(set lora: {max_rank: N} in the build config)")
        key = (name, path)
        if key not in self._adapters:
            try:
                self._adapters[key] = load_adapter(name, path, self.lora_layout, self.model.embedding.dtype)
            except LoraError as error:
                self._adapters[key] = error
        adapter = self._adapters[key]
        if isinstance(adapter, LoraError):
            raise ValueError(f"{where}.lora_name: {adapter}")
        return adapter

    def _system_ids(self, where: str, prompt: Prompt) -> list[int] | None:
        if not prompt.system_text:
            return None
        ids = self.tokenizer.encode(prompt.system_text, add_special_tokens=False)
        if prompt.token_ids[: len(ids)] != ids:
            # The template (or the tokenizer) merged across the system/user boundary: this prompt
            # cannot reuse a system-prompt KV and gets a full prefill.
            if not self.prefix_stats["fallbacks"]:
                log.warning("%s: the prompt's tokens do not start with its system prompt's tokens; "
                            "the system-prompt KV cache falls back to full prefills for such prompts", where)
            self.prefix_stats["fallbacks"] += 1
            return None
        return ids

    def attach_prefix(self, p: Prepared) -> None:
        """Reuse a saved system prompt for `p`, or save its own when its batch asks (p.save_group)."""
        # At least one prompt token must be prefilled: it gives the first logits.
        if not p.system_ids or len(p.system_ids) >= len(p.sequence.prompt_ids):
            return
        entry = self.prefix_cache.get(p.request.lora_name, p.system_ids)
        if entry is not None:
            p.sequence.reused = entry
            self.prefix_stats["hits"] += 1
        elif p.save_group:
            p.sequence.save_prefix = len(p.system_ids)

    def _response(self, p: Prepared, batch_idx: int, started: float, messages) -> Response:
        s = p.sequence
        logprobs = sampled_tokens = None
        if s.top_logprobs:
            logprobs = [[self._candidate(t, v) for t, v in zip(ids, values)] for ids, values in s.top_logprobs]
            sampled_tokens = [self._candidate(t, v) for t, v in zip(s.generated, s.token_logprobs)]
        return Response(
            request_idx=p.index, batch_idx=batch_idx,
            # The text is the generated tokens' bytes (special tokens skipped, the stop string and
            # what follows cut off), decoded as UTF-8 with invalid bytes as U+FFFD.
            output_text=s.detokenizer.finish(),
            finish_reason=s.finish_reason, messages=messages, logprobs=logprobs,
            sampled_tokens=sampled_tokens,
            formatted_system_prompt=p.prompt.system_text, formatted_complete_request=p.prompt.text,
            prompt_tokens=len(s.prompt_ids), generated_tokens=len(s.generated),
            reused_tokens=len(s.reused.token_ids) if s.reused is not None else 0,
            output_token_ids=s.generated,
            time_to_first_token_ms=round((s.first_token_time - started) * 1000, 3),
        )

    def _candidate(self, token_id: int, logprob: float) -> LogprobCandidate:
        return LogprobCandidate(token_id=token_id, token=self.token_bytes.text_of(token_id),
                                bytes=list(self.token_bytes.bytes_of(token_id)), logprob=logprob)


def _error(index: int, batch_idx: int, message: str, messages) -> Response:
    log.error("%s", message)
    return error_response(index, batch_idx, message, messages)


def error_response(index: int, batch_idx: int, message: str, messages) -> Response:
    return Response(request_idx=index, batch_idx=batch_idx, output_text="", finish_reason="error",
                    error=message, messages=messages if isinstance(messages, list) else [])


def interrupted_output(loaded: LoadedInput, settings: InputSettings, finished: list[Response],
                       why: str) -> OutputFile:
    """The output of a run stopped by a signal: every finished response, and the others failed
    with `why`, so that nothing that was computed is lost."""
    done = {response.request_idx: response for response in finished}
    responses = [done.get(index) or error_response(index, index % settings.batch_size, f"requests[{index}]: {why}",
                                                   loaded.messages(index))
                 for index in range(len(loaded.raw_requests))]
    return OutputFile(input_file=loaded.source, responses=responses)


def apply_batch_rules(batch: list[Prepared], settings: InputSettings) -> int:
    """The reference's batch-wide rules on the requests of one batch; returns the batch's K.

    Batch-uniform: the batch computes the largest num_logprobs any request asked for, and every
    request in it gets that K. Batch-wide: one request asking to save system prompts makes the
    whole batch save them."""
    k = max(p.request.resolved_num_logprobs(settings) for p in batch)
    save = any(p.request.save_system_prompt_kv_cache for p in batch)
    for p in batch:
        p.num_logprobs, p.save_group = k, save
    return k

