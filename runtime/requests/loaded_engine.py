"""An engine directory loaded to serve requests, whoever drives them: the file runner (runner.py) or
the server (server/engine.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from trt_llm.runtime.backends.embedding import engine_embedding, engine_per_layer_table
from trt_llm.runtime.cache.cache_set import cache_bytes
from trt_llm.runtime.cache.context_cache import ContextCache
from trt_llm.runtime.cache.reuse import ContextRequest
from trt_llm.runtime.decoding.draft import SpecStats, check_spec, draft_kind, load_draft_engine
from trt_llm.runtime.decoding.choice import normalised, resolved
from trt_llm.runtime.decoding.eagle import Eagle
from trt_llm.runtime.decoding.lookup import LookupStats, PromptLookup
from trt_llm.runtime.decoding.pass_cost import PassCost
from trt_llm.runtime.decoding.spec_config import SpecConfig, resolve_spec
from trt_llm.runtime.decoding.vanilla import Vanilla
from trt_llm.runtime.engine.engine_core import EngineCore, EngineRequest
from trt_llm.runtime.engine.model import model_of
from trt_llm.runtime.engine.profiler import Profiler
from trt_llm.runtime.engine.threads import leaves_cores_to_the_engine
from trt_llm.runtime.engine_dir import EngineDir, loading
from trt_llm.runtime.requests.prepare import Prepared, RequestPreparer
from trt_llm.runtime.requests.responses import ResponseBuilder, logged_error
from trt_llm.runtime.text.prompt import PromptFormatter
from trt_llm.runtime.text.token_bytes import TokenBytes
from trt_llm.runtime.text.tokenizer import Tokenizer
from trt_llm.schemas.input_file import InputSettings, Request
from trt_llm.schemas.output_file import Response


class LoadedEngine:
    """An engine directory loaded to serve requests: the base model (and its EAGLE draft), the
    tokenizer, the vision and audio encoders, the context cache and the request preparation, and what
    turns a prepared request into the engine core's (`engine_core`, `engine_request`) and a finished one
    into its response (`finish`). The file runner (runner.py) and the server drive it."""

    def __init__(self, engine_dir: EngineDir, threads: int = 0, prefix_cache: ContextCache | None = None,
                 profiler: Profiler | None = None, spec: SpecConfig | None = None, spec_decode: bool = True,
                 context_reuse: bool = False, prefill_chunk: int | None = None,
                 latency_target: float | None = None, speculation: str | None = None,
                 max_batched_tokens: int | None = None):
        """speculation: the decoding strategy (runtime/decoding/choice.py: prompt-lookup, eagle, mtp,
        none; None: the engine's EAGLE draft if it has one, else none, unless an input file says
        otherwise); spec_decode False: none whatever either says. prefix_cache: the context cache
        (runtime/cache/context_cache.py; a new one of the default budget when None); context_reuse: requests restore their longest cached prefix and commit their
        tokens (their context_cache_* policies say how); without it only system prompts saved with
        save_system_prompt_kv_cache are reused. prefill_chunk: prompts are prefilled this many
        tokens a pass, and while other requests decode a pass takes at most this many prompt tokens
        in all (None: whole prompts; a sliding-window model's caches then hold its window and the
        longest prompt); latency_target: while others decode, a pass takes as many prompt tokens as
        keep their time between tokens within this many decode steps (engine/budget.py), its decode
        step in the same pass where the strategy can (None: the chunk alone). max_batched_tokens: the most
        tokens a pass takes, prompt chunks and decode rows together (engine_core.EngineCore)."""
        from trt_llm.runtime.backends.engines import open_engine

        self.engine_dir = engine_dir
        self.family = engine_dir.family  # its face: the task its requests are (trt_llm/families)
        self.profiler = profiler
        dims = engine_dir.dims
        embedding_path = engine_dir.component_path("llm", "embedding")
        with self._stage("load_embedding"), loading("embedding", embedding_path):
            embedding = engine_embedding(engine_dir)
        per_layer = None
        if engine_dir.manifest["components"]["llm"].get("per_layer_embedding"):  # (Gemma 4's, memory-mapped)
            with loading("per-layer embedding", engine_dir.component_path("llm", "per_layer_embedding")):
                per_layer = engine_per_layer_table(engine_dir)
        self.draft_kind = draft_kind(engine_dir)  # "eagle", "mtp" or None
        self.speculation_flag = normalised(speculation) if spec_decode else "none"
        spec_decode = spec_decode and self.speculation_flag in (None, self.draft_kind)  # the draft is loaded
        drafting = self.draft_kind is not None and spec_decode
        # Under speculation the base and the draft sessions alternate: neither may spin (measured on
        # 2 cores: EAGLE3 0.53x -> 1.07x vanilla). Vanilla decoding spins briefly (OrtEngine.SPIN_US).
        with self._stage("load_session"), loading("engine", engine_dir.component_path("llm", "engine")):
            engine = open_engine(engine_dir, threads, spinning=not drafting)
        self.model = model_of(engine_dir, engine, embedding, per_layer)
        self.draft = None
        if drafting:
            with loading(f"{self.draft_kind} draft", engine_dir.path / "draft"):
                self.draft = load_draft_engine(engine_dir, threads, embedding)
        if self.draft is not None and spec is None:  # the tree the engine's build recorded for its backend
            spec = resolve_spec(engine_dir.manifest["components"]["draft"], engine_dir.manifest["backend"])
        self.spec = check_spec(spec, engine_dir) if self.draft else None
        self.spec_stats, self.lookup_stats = SpecStats(), LookupStats()
        # what a wider pass costs is the engine's: learned across the runs and batches of this engine
        self.pass_cost = PassCost()
        self.file_speculation = None  # an input file's "speculation" while its run lasts (Runner.run)
        self.speculation = self.strategy_name()  # (a flag the engine cannot take is refused now)
        with self._stage("load_tokenizer"), loading("tokenizer", engine_dir.tokenizer_dir):
            self.tokenizer = Tokenizer.from_dir(engine_dir.tokenizer_dir)
        self.token_bytes = TokenBytes(self.tokenizer, vocab_size=dims["vocab_size"])
        self.limits = engine_dir.limits
        self.prefix_cache = prefix_cache if prefix_cache is not None else ContextCache(engine_dir.identity)
        self.prefix_cache.expect(engine_dir)  # a record on disk that does not fit this engine is never restored
        self.prefix_stats = self.prefix_cache.stats
        self.context_reuse = context_reuse
        self.prefill_chunk, self.latency_target = prefill_chunk, latency_target
        self.max_batched_tokens = max_batched_tokens
        self.profiler = profiler
        if profiler is not None:  # what a row of the pool holds (the profile's cache)
            itemsize = 2 if engine_dir.manifest["model"]["dtype"] in ("fp16", "bf16") else 4
            profiler.cache = cache_bytes(engine_dir.layers(), itemsize)
        self.lora_layout = engine_dir.manifest.get("lora")
        self.vision = None
        if "vision" in engine_dir.manifest["components"]:
            from trt_llm.runtime.media.vision.encoder import VisionEncoder

            with loading("vision encoder", engine_dir.path / "vision"):
                self.vision = VisionEncoder(engine_dir, threads)
            self.vision.profiler = profiler
        self.audio = None
        if "audio" in engine_dir.manifest["components"]:
            from trt_llm.runtime.media.audio.encoder import AudioEncoder

            with loading("audio encoder", engine_dir.path / "audio"):
                self.audio = AudioEncoder(engine_dir, threads)
            self.audio.profiler = profiler
        self.preparer = RequestPreparer(self.tokenizer, self.token_bytes, self.limits, dims["vocab_size"],
                                        self.lora_layout, embedding.dtype, self.prefix_stats,
                                        engine_dir.eos_token_ids, self.vision, self.audio, self.family.task)
        self.responses = ResponseBuilder(self.token_bytes)

    def strategy_name(self, file_value: str | None = None) -> str:
        """The run's decoding strategy: the --speculation flag, else the input file's, else the default
        (runtime/decoding/choice.py); SpeculationError names why where the engine cannot take it."""
        if self.family.task == "transcription":  # Whisper's decodes follow their timestamp rules: vanilla
            return "none"
        return resolved(self.speculation_flag or file_value, self.draft_kind if self.draft is not None else None)

    def engine_core(self, max_rows: int, policy: str, speculate: bool = True) -> EngineCore:
        """An EngineCore on this runner's model with the run's strategy (`strategy_name`): EAGLE with the
        engine's draft, prompt lookup, or (also where not `speculate`) vanilla decoding."""
        name = self.strategy_name(self.file_speculation) if speculate else "none"
        if self.profiler is not None and speculate:
            self.profiler.strategy = name
        if name in ("eagle", "mtp"):  # (an MTP head drafts as an EAGLE draft does: decoding/draft.py)
            # Sliding windows and recurrent layers take chains, not trees (decoding/eagle.py)
            chain = any(layer.kind in ("sliding", "recurrent") for layer in self.engine_dir.layers())
            strategy = Eagle(self.draft, self.spec, self.spec_stats, chain=chain)
        elif name == "prompt-lookup":
            strategy = PromptLookup(stats=self.lookup_stats, cost=self.pass_cost)
        else:
            strategy = Vanilla()
        sampler = None
        if self.family.task == "transcription":
            # Whisper: its windows' decodes carry their logits rules. The speech modules are imported
            # only for an engine that transcribes: a text run's cold start does not pay for them.
            from trt_llm.runtime.media.audio.whisper_sampling import WhisperSampler

            sampler = WhisperSampler()
        return EngineCore(self.model, max_rows, policy, self.lora_layout, self.profiler, strategy, sampler=sampler,
                          context=self.prefix_cache, prefill_chunk=self.prefill_chunk, step_tokens=self.prefill_chunk,
                          mixed_steps=self.latency_target is not None, latency_target=self.latency_target,
                          context_reuse=self.context_reuse, max_batched_tokens=self.max_batched_tokens)

    def _stage(self, name: str):
        return self.profiler.stage(name) if self.profiler else nullcontext()

    def formatter(self, settings: InputSettings, source: str | None = None) -> PromptFormatter:
        """The prompt formatter of a run: images and audio when the engine reads them, their relative
        paths from the input file's folder (source: its path)."""
        media_dir = Path(source).resolve().parent if source and Path(source).is_file() else None
        return PromptFormatter(self.tokenizer, settings.apply_chat_template, settings.add_generation_prompt,
                               settings.enable_thinking, images=self.vision is not None, media_dir=media_dir,
                               audio=self.audio is not None)

    def engine_request(self, p: Prepared) -> EngineRequest:
        """What the engine core runs of `p`, with its context policies (the core plans its reuse)."""
        return EngineRequest(p.index, p.sequence, p.params, p.seed, p.num_logprobs, p.adapter,
                             speculate=p.speculate, context=self.context_request(p))

    def context_request(self, p: Prepared) -> ContextRequest | None:
        """`p`'s context policies (runtime/cache/reuse.py): with context reuse, the core restores its
        longest cached prefix and commits its tokens by them; always, a system prompt saved by
        save_system_prompt_kv_cache (its batch's rule, p.save_group) is kept and reused."""
        lookup, commit = p.context_policies
        if lookup == "bypass" or self.family.task == "transcription":
            return None  # Whisper: its decoder state depends on the clip, and its prompts are a few tokens
        return ContextRequest(commit, p.adapter.digest if p.adapter is not None else None,
                              tuple(p.system_ids) if p.system_ids else None, p.save_group)

    def prepare(self, index: int, request: Request, settings: InputSettings,
                formatter: PromptFormatter) -> Prepared:
        """A validated request -> what the engine runs (runtime/requests/prepare.py)."""
        return self.preparer.prepare(index, request, settings, formatter)

    def error(self, index: int, batch_idx: int, message: str, messages) -> Response:
        return logged_error(index, batch_idx, message, messages)

    def transcribe(self, prepared: list[Prepared], max_rows: int) -> None:
        """Whisper requests decoded window by window, their windows batched together."""
        if prepared:
            from trt_llm.runtime.media.audio.longform import run_transcriptions

            leaves_cores_to_the_engine(run_transcriptions)(self, [p.transcription for p in prepared], max(1, max_rows))

    def finish(self, p: Prepared, batch_idx: int, started: float, messages) -> Response:
        """The response of a finished request."""
        if p.transcription is not None:
            from trt_llm.runtime.media.audio.answer import transcription_response

            response = transcription_response(p, self.token_bytes, batch_idx, started, messages)
        else:
            response = self.responses.response(p, batch_idx, started, messages)
        if self.profiler:
            self.profiler.ttft_ms[p.index] = response.time_to_first_token_ms
            if getattr(p.sequence, "speculation", None) is not None:
                self.profiler.speculation[p.index] = p.sequence.speculation
            self.profiler.first_token(p.sequence.first_token_time)
        return response
