"""POST /v1/embeddings (OpenAI's), on the engine's final_hidden_states (runtime/requests/embeddings.py).

    body      {model, input: str | [str] | [int] | [[int]], encoding_format: "float" | "base64",
               dimensions (only the model's hidden size: a decoder's vector is not trained to be cut, as
               OpenAI's v3 models' are, so another value is refused), pooling: "last" | "mean" (ours; default
               the checkpoint's sentence-transformers config, else last), user (ignored)}
    response  {object: "list", data: [{object: "embedding", index, embedding}], model, usage: {prompt_tokens,
               total_tokens}}; base64: each vector's float32 bytes, little-endian, as OpenAI's

Texts are tokenized as a completion's prompt is (the tokenizer's special tokens, no chat template). At most
runtime/requests/embeddings.MAX_TEXTS texts a request, each at most the engine's max_input_len tokens:
anything else is a 400 naming the field. The passes run on the engine thread, one between two engine
steps (server/engine.py's Work), never beside another pass on the same session.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trt_llm.runtime.requests.embeddings import MAX_TEXTS, Embedder, EmbeddingError
from trt_llm.schemas.input_file import MAX_TEXT_BYTES
from trt_llm.server.app import HttpError
from trt_llm.server.engine import EngineStopped, Work

ROUTE = "/v1/embeddings"


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    input: Any = Field(description=f"a text, a list of texts (at most {MAX_TEXTS}), a list of token ids, or a list "
                                   "of such lists")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="only the model's hidden size")
    pooling: Literal["last", "mean"] | None = Field(None, description="extension: last (token) or mean; default: the "
                                                                "checkpoint's sentence-transformers config, else last")
    user: str | None = None


def prompts_of(value: Any, tokenize) -> list[list[int]]:
    """The token ids of each text of `input`, or HttpError 400 naming what is wrong with it."""
    def bad(message: str, where: str = "input"):
        return HttpError(400, f"{where}: {message}", "input")

    def ids(item) -> bool:
        return isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)

    if isinstance(value, str):
        value = [value]
    elif ids(value) and value:  # one tokenized text
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad("expected a non-empty string, list of strings, list of token ids or list of such lists")
    if len(value) > MAX_TEXTS:
        raise bad(f"{len(value)} texts, at most {MAX_TEXTS} a request")
    if not all(isinstance(p, str) for p in value) and not all(ids(p) for p in value):
        raise bad("texts and token id lists mixed in one request (or an item neither)")
    prompts = []
    for i, item in enumerate(value):
        where = f"input[{i}]" if len(value) > 1 else "input"
        if isinstance(item, str):
            if not item:
                raise bad("an empty string", where)
            try:
                size = len(item.encode("utf-8"))
            except UnicodeEncodeError as error:  # a lone surrogate from a "\ud800" JSON escape
                raise bad(f"not valid Unicode text (unpaired surrogate at position {error.start})", where) from None
            if size > MAX_TEXT_BYTES:
                raise bad(f"over {MAX_TEXT_BYTES} bytes", where)
            prompts.append(tokenize(item))
        elif ids(item):
            prompts.append(list(item))
        else:
            raise bad("expected a string or a list of token ids", where)
    return prompts


def add_embeddings(app: FastAPI, runner, engine, config, metrics) -> None:
    """The route, on the server's engine (a ServingEngine) and its loaded runner."""
    embedder = Embedder.of(runner)
    hidden = runner.model.dims["hidden_size"]

    @app.post(ROUTE)
    async def embeddings(body: EmbeddingRequest):
        if body.model != config.model_name:
            if body.model in config.lora:
                raise HttpError(400, f"model: {body.model!r} is a LoRA adapter; embeddings come from the base model "
                                     f"({config.model_name!r})", "model")
            raise HttpError(404, f"model {body.model!r} is not served here (GET /v1/models lists them)", "model",
                            "model_not_found")
        if embedder.why_not:
            raise HttpError(400, f"model: {embedder.why_not}", "model")
        if body.dimensions is not None and body.dimensions != hidden:
            raise HttpError(400, f"dimensions: this model's embeddings have {hidden} dimensions (a decoder's "
                                 f"vector is not trained to be cut); send {hidden} or none", "dimensions")
        # Tokenizing thousands of texts takes a while: off the event loop.
        prompts = await run_in_threadpool(prompts_of, body.input, runner.tokenizer.encode)
        try:
            embedder.check(prompts)
        except EmbeddingError as error:
            raise HttpError(400, str(error), str(error).partition(":")[0].split("[")[0]) from None
        loop = asyncio.get_running_loop()
        work = Work(embedder.passes(prompts, body.pooling), loop, loop.create_future())
        try:
            engine.run_passes(work)
        except EngineStopped as error:
            raise HttpError(503, str(error), code="shutting_down") from None
        try:
            vectors = await asyncio.wait_for(work.future, config.request_timeout_s)
        except TimeoutError:  # the engine thread drops it at its next pass (the future is cancelled)
            raise HttpError(504, f"the request took longer than {config.request_timeout_s:g} s (--request-timeout)",
                            code="timeout") from None
        except EmbeddingError as error:
            raise HttpError(400, str(error)) from None
        except EngineStopped as error:
            raise HttpError(503, str(error), code="shutting_down") from None
        tokens = sum(len(p) for p in prompts)
        metrics.prompt_tokens.inc(tokens)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": body.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _encoded(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()
