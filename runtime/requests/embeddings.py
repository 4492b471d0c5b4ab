"""Embeddings (issue 46 item 4): a prompt's vector is the decoder graph's final_hidden_states (the final
norm's output, schemas/graph_spec.FINAL_HIDDEN) at its last token ("last", as vLLM pools a decoder and
Qwen3-Embedding is meant to be used) or averaged over its tokens ("mean"), L2-normalised, in float32.

Prefill passes only, over the engine's own graph: prompts sorted by length and taken max_batch_size at a
time, each pass on a cache of the call's own (dropped after it: no decoding, nothing kept in the pool or
the context cache). The caller serialises calls with the engine's other work (the server runs a pass
between two engine steps, server/engine.py; trt-llm-run before its generation batches).

The default pooling is the checkpoint's sentence-transformers config where it ships one (modules.json +
1_Pooling/config.json: pooling_mode_lasttoken or pooling_mode_mean_tokens), which the build writes into
the engine's tokenizer folder as pooling.json (build/pooling.py); else "last".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from trt_llm.schemas.graph_spec import FINAL_HIDDEN

POOLINGS = ("last", "mean")
DEFAULT_POOLING = "last"
POOLING_FILE = "pooling.json"  # in the engine's tokenizer folder: {"pooling": "last" | "mean", "source": ...}
# Texts one call takes (OpenAI's /v1/embeddings takes 2,048 inputs a request).
MAX_TEXTS = 2048


class EmbeddingError(ValueError):
    """A request this engine cannot embed; the message names the field and the limit."""


def engine_pooling(engine_dir) -> str:
    """The engine's default pooling: its pooling.json's (the checkpoint's sentence-transformers config),
    else "last"."""
    path = engine_dir.tokenizer_dir / POOLING_FILE
    if not path.is_file():
        return DEFAULT_POOLING
    try:
        pooling = json.loads(path.read_text(encoding="utf-8")).get("pooling")
    except (OSError, ValueError, AttributeError):
        pooling = None
    return pooling if pooling in POOLINGS else DEFAULT_POOLING


def pool(hidden: np.ndarray, length: int, pooling: str) -> np.ndarray:
    """hidden [S, H] of one right-padded row whose first `length` tokens are the prompt -> its unit vector
    [H] float32 (a zero vector stays zero)."""
    rows = hidden[:length].astype(np.float32)
    vector = rows[-1] if pooling == "last" else rows.mean(axis=0)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


@dataclass
class Embedder:
    """The prefill-only passes of a loaded engine (runtime/requests/loaded_engine.LoadedEngine)."""
    model: object  # runtime/engine/model.Model
    max_batch: int
    max_input_len: int
    lora_layout: dict | None
    default_pooling: str
    why_not: str | None  # why this engine makes no embeddings (None: it does)

    @classmethod
    def of(cls, loaded) -> "Embedder":
        why = None
        if loaded.family.task == "transcription":
            why = "a Whisper engine transcribes speech; it makes no text embeddings"
        elif not loaded.model.engine.provides(FINAL_HIDDEN):
            why = ("this engine's graph has no final_hidden_states output (an engine built before embeddings, or "
                   "Gemma 4 with shared key/value layers): rebuild it with this trt-llm-build")
        limits = loaded.limits
        return cls(loaded.model, limits["max_batch_size"], limits["max_input_len"], loaded.lora_layout,
                   engine_pooling(loaded.engine_dir), why)

    def check(self, prompts: list[list[int]], field: str = "input") -> None:
        """Refuse, in one line naming the field, what embed() cannot take."""
        if self.why_not:
            raise EmbeddingError(self.why_not)
        if not prompts:
            raise EmbeddingError(f"{field}: no texts to embed")
        if len(prompts) > MAX_TEXTS:
            raise EmbeddingError(f"{field}: {len(prompts)} texts, at most {MAX_TEXTS} a request")
        vocab = self.model.vocab_size
        for i, ids in enumerate(prompts):
            where = f"{field}[{i}]" if len(prompts) > 1 else field
            if not ids:
                raise EmbeddingError(f"{where}: empty (no tokens to embed)")
            if len(ids) > self.max_input_len:
                raise EmbeddingError(f"{where}: {len(ids)} tokens, over the engine's max_input_len {self.max_input_len}")
            if min(ids) < 0 or max(ids) >= vocab:
                raise EmbeddingError(f"{where}: token ids must be in [0, {vocab - 1}]")

    def passes(self, prompts: list[list[int]], pooling: str | None = None):
        """Yield after each engine pass; the generator's return value is the vectors [N, H] float32, in
        the prompts' order (the server runs one pass between two engine steps)."""
        pooling = pooling or self.default_pooling
        if pooling not in POOLINGS:
            raise EmbeddingError(f"pooling: {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.check(prompts)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # like lengths share a pass
        rows = min(self.max_batch, len(prompts))
        longest = len(prompts[order[0]])
        cache = self.model.new_cache(rows, longest, longest)
        vectors = np.zeros((len(prompts), self.model.dims["hidden_size"]), np.float32)
        try:
            for start in range(0, len(order), rows):
                chosen = order[start: start + rows]
                window = cache if len(chosen) == rows else cache.window(0, len(chosen))
                hidden = self._pass([prompts[i] for i in chosen], window)
                for row, i in enumerate(chosen):
                    vectors[i] = pool(hidden[row], len(prompts[i]), pooling)
                yield
        finally:
            if hasattr(cache, "free"):  # device memory (TensorRT), now rather than when collected
                cache.free()
        return vectors

    def embed(self, prompts: list[list[int]], pooling: str | None = None) -> np.ndarray:
        """All passes at once: the vectors [N, H] float32."""
        passes = self.passes(prompts, pooling)
        while True:
            try:
                next(passes)
            except StopIteration as done:
                return done.value

    def _pass(self, prompts: list[list[int]], cache) -> np.ndarray:
        """One prefill pass of right-padded prompts from position 0: final_hidden_states [B, S, H]."""
        from trt_llm.runtime.engine.step import Step

        model = self.model
        lengths = np.array([len(ids) for ids in prompts], dtype=np.int32)
        batch, width = len(prompts), int(lengths.max())
        token_ids = np.zeros((batch, width), dtype=np.int64)
        for row, ids in enumerate(prompts):
            token_ids[row, : len(ids)] = ids
        past = np.zeros(batch, dtype=np.int32)
        embeds, extras = model.embed(token_ids)
        sequences = [None] * batch  # text only: no image rows, a causal mask, zero deepstack
        extras.update(model.media_inputs(sequences, embeds, past, lengths))
        eagle_inputs, eagle_outputs = model.eagle_io(batch, width)  # an EAGLE base's tree_mask and features
        hidden = np.empty((batch, width, model.dims["hidden_size"]), model.embedding.dtype)
        # The LM head runs at each row's last token only (logits are a required output).
        step = Step(embeds, model.positions(sequences, past, width), past, lengths, np.maximum(lengths - 1, 0)[:, None],
                    np.empty((batch, 1, model.vocab_size), dtype=np.float32),
                    {**eagle_inputs, **extras}, {**eagle_outputs, FINAL_HIDDEN: hidden})
        lora = {}
        if self.lora_layout:  # the base model: zero adapters on every row
            from trt_llm.runtime.requests.lora import batch_inputs

            lora = batch_inputs([None] * batch, self.lora_layout, model.embedding.dtype)
        model.engine.run(step, cache, lora)
        return hidden


def answer_embeddings(loaded_engine, loaded, settings) -> dict:
    """The responses of an input file's requests of task embed (schemas/input_file.Request), by request
    index: each one's vector, or its error alone (a text over max_input_len, an engine without the output);
    batched by pooling, max_batch_size prompts a pass. `loaded_engine`: the Runner (a LoadedEngine)."""
    from trt_llm.schemas.input_file import RequestError
    from trt_llm.schemas.output_file import Response

    asked = [(i, slot) for i, slot in enumerate(loaded.requests)
             if not isinstance(slot, RequestError) and slot.task == "embed"]
    if not asked:
        return {}
    embedder = Embedder.of(loaded_engine)
    answers, by_pooling = {}, {}
    for index, request in asked:
        batch_idx = index % settings.batch_size
        try:
            if embedder.why_not:
                raise EmbeddingError(f"task: {embedder.why_not}")
            prompt = loaded_engine.tokenizer.encode(request.embedding_text())
            embedder.check([prompt], "messages")
        except EmbeddingError as error:
            answers[index] = loaded_engine.error(index, batch_idx, f"requests[{index}].{error}", loaded.messages(index))
            continue
        by_pooling.setdefault(request.pooling or embedder.default_pooling, []).append((index, prompt))
    for pooling, items in by_pooling.items():
        try:
            vectors = embedder.embed([prompt for _, prompt in items], pooling)
        except Exception as error:  # noqa: BLE001 - the engine failed: these requests fail, the run goes on
            for index, _ in items:
                answers[index] = loaded_engine.error(index, index % settings.batch_size,
                                                     f"requests[{index}]: embedding failed: {error}",
                                                     loaded.messages(index))
            continue
        for (index, prompt), vector in zip(items, vectors):
            answers[index] = Response(request_idx=index, batch_idx=index % settings.batch_size, output_text="",
                                      finish_reason="end-of-sequence", messages=loaded.messages(index),
                                      prompt_tokens=len(prompt), embedding=vector.tolist())
    return answers
