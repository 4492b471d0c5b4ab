"""The OpenAI-compatible HTTP app: routes, errors in OpenAI's shape, streaming, auth and limits.

    GET  /health                 liveness (no key needed)
    GET  /v1/models              the served model and its LoRA adapters
    POST /v1/chat/completions    chat (the chat template applies), streamed with SSE on request
    POST /v1/completions         a raw prompt
    POST /v1/audio/transcriptions  speech to text on a Whisper engine (server/transcriptions.py)
    POST /v1/embeddings          the final norm's hidden states, pooled and L2-normalised (server/embeddings.py)
    POST /v1/messages            Anthropic's Messages API on the chat path (server/anthropic.py; its errors
                                 in Anthropic's shape)
    GET  /metrics                Prometheus text format

Every refusal is an OpenAI error object ({"error": {"message", "type", "param", "code"}}) with a 4xx
status: 400 a body that does not validate (the message names the field), 401 a missing or wrong
key, 404 an unknown model, 413 a body over the limit, 429 a full queue (with Retry-After), 504 a
request past its timeout. A 5xx means the engine itself failed. A client that leaves before its
answer has its request aborted, one warning line in the log, and 499 in /metrics (nothing is sent).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from trt_llm.runtime.text.prompt import PromptError, PromptFormatter
from trt_llm.runtime.requests.prepare import apply_batch_rules
from trt_llm.runtime.engine.sequence import MAX_LENGTH, TIMEOUT
from trt_llm.server.convert import BadRequest, convert, force_tool_calls
from trt_llm.server.clients import CLIENT
from trt_llm.server.engine import EngineStopped, Job, QueueFull, ServingEngine, Update
from trt_llm.runtime.engine import DEFAULT_PREFILL_CHUNK
from trt_llm.server.metrics import Metrics
from trt_llm.server.tool_calls import make_parser, tool_parser_for
from trt_llm.runtime.text.reasoning import ReasoningSplitter
from trt_llm.schemas._errors import describe, did_you_mean, show
from trt_llm.server.protocol import (PART_TYPES, TOOL_CHOICE_TAGS, UNION_FIELDS, ChatCompletionRequest,
                                     CompletionRequest)

log = logging.getLogger(__name__)

# The routes /metrics counts answers of (trt_llm_requests, by route and status), whatever answered:
# the route, a refused body (400), the key check (401) or the size limit (413).
COUNTED_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/audio/transcriptions", "/v1/messages",
                  "/v1/embeddings")
CLIENT_GONE = 499  # the status counted for a client that left before its answer (nginx's "client closed request")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error",
               504: "timeout_error"}


@dataclass
class ServerConfig:
    model_name: str
    lora: dict[str, str] = field(default_factory=dict)  # served adapter name -> its folder
    api_keys: tuple[str, ...] = ()  # none: no key needed
    max_body_bytes: int = 4 << 20
    max_upload_bytes: int = 25 << 20  # a speech upload's file (--max-upload-mb; server/uploads.py)
    max_audio_seconds: float = 1800.0  # a speech upload's duration (--max-audio-seconds; server/audio_budget.py)
    audio_decode_budget: int = 256 << 20  # bytes the speech decodes take together (--audio-decode-budget)
    max_rows: int = 8  # requests decoding together (at most the engine's max_batch_size)
    max_waiting: int = 256  # requests queued for a row before 429
    request_timeout_s: float | None = None
    media_root: Path | None = None  # --allowed-local-media-path
    cors_origins: tuple[str, ...] = ()
    save_prefixes: bool = True  # reuse: each conversation's earlier turns (context reuse) and system prompts
    kv_cache_budget: int = 1 << 30  # bytes of reused keys and values
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK  # prompt tokens a pass (runtime/engine/engine_core.py)
    latency_target: float | None = None  # streams' time between tokens while prompts go in, in decode steps
    max_num_batched_tokens: int | None = None  # the tokens a pass takes, prompt and decode (None: no limit)
    reserved_rows: tuple[tuple[int, int], ...] = ()  # (priority, rows kept free for it and above)
    tool_call_parser: str = "auto"  # auto (from the chat template), hermes or none (server/tool_calls.py)


class ClientGone(Exception):
    """The client disconnected before its answer; its job is already aborted."""


def client_gone(route: str, tokens: int) -> Response:
    """One line in the log for a client that left (its job aborted); the answer nobody reads."""
    log.warning("%s: the client disconnected before its answer; the request was aborted after %d generated "
                "tokens", route, tokens)
    return Response(status_code=CLIENT_GONE)


class HttpError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(runner, config: ServerConfig) -> FastAPI:
    """runner: a runtime.runner.Runner on the engine directory (its model, draft, tokenizer)."""
    metrics = Metrics()
    metrics.watch_context_cache(runner.prefix_cache)
    metrics.watch_speculation(runner)
    # A chat client resends the whole conversation each turn: the turns before it are restored.
    runner.context_reuse = config.save_prefixes
    engine = ServingEngine(runner, config.max_rows, config.max_waiting, metrics, config.save_prefixes,
                           config.max_num_batched_tokens, dict(config.reserved_rows))
    metrics.watch_memory(engine)
    metrics.watch_scheduling(engine)

    @asynccontextmanager
    async def lifespan(_app):
        engine.start()
        yield
        engine.close()

    app = FastAPI(title="trt-llm", version="1", summary="OpenAI-compatible chat and completions", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.config = engine, metrics, config
    capacity = runner.limits["max_kv_cache_capacity"]
    metrics.watch_fleet(engine, config.max_rows, capacity, runner.prefix_cache.block_tokens)  # vllm: names

    @app.exception_handler(HttpError)
    async def _http_error(_request, error: HttpError):
        return error_response(error.status, error.message, error.param, error.code, error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(_request, error: StarletteHTTPException):
        # FastAPI's own refusals (a body it cannot parse, an unknown route or method) in OpenAI's shape.
        message = error.detail if isinstance(error.detail, str) else json.dumps(error.detail)
        return error_response(error.status_code, message, headers=getattr(error, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, error: RequestValidationError):
        return error_response(400, *_validation_message(error.errors()))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        created = int(runner.engine_dir.path.stat().st_mtime)
        data = [{"id": config.model_name, "object": "model", "created": created, "owned_by": "trt-llm"}]
        data += [{"id": name, "object": "model", "created": created, "owned_by": "trt-llm",
                  "parent": config.model_name} for name in config.lora]
        return {"object": "list", "data": data}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _complete(body, request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _complete(body, request, "/v1/completions")

    async def _complete(body, request: Request, route: str):
        job, tool_parser = await _submit(body)
        answer = _Answer(body, job, runner, config.model_name, tool_parser)
        if body.stream:
            return StreamingResponse(_stream(job, answer, request, route), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            await _wait(job, request, answer)
        except ClientGone:
            return client_gone(route, answer.tokens)
        return answer.whole()

    async def _submit(body) -> tuple[Job, str | None]:
        """The job, and the parser of its answer's tool calls (None: no calls are parsed)."""
        if body.model != config.model_name and body.model not in config.lora:
            raise HttpError(404, f"model {body.model!r} is not served here (GET /v1/models lists them)", "model",
                            "model_not_found")
        try:
            converted = convert(body, config.lora, capacity, config.media_root)
            tool_parser = None
            if converted.tool_calls:
                tool_parser = tool_parser_for(runner.tokenizer._template(converted.request.tools),
                                              config.tool_call_parser)
                if tool_parser is None:
                    why = ("--tool-call-parser none" if config.tool_call_parser == "none" else
                           "this model's chat template has no tool-call format this server parses "
                           "(--tool-call-parser hermes parses Hermes' <tool_call> format, llama3_json Llama 3's "
                           "JSON)")
                    param = "tool_choice" if converted.forced else "tools"  # required / named: no call syntax to force
                    raise BadRequest(f"{param}: tool calls are off here: {why}; send tool_choice 'none' or no tools",
                                     param=param)
                if converted.forced:  # a grammar over the parser's call syntax (server/tool_grammar.py)
                    converted.request = force_tool_calls(converted, body, runner.preparer.grammars, tool_parser)
            # Image sources are already checked and resolved (convert.media_source: data URLs, or files
            # inside --allowed-local-media-path).
            formatter = PromptFormatter(runner.tokenizer, converted.chat, True, converted.settings.enable_thinking,
                                        images=runner.vision is not None, audio=runner.audio is not None)
            # Tokenizing a long prompt takes milliseconds: off the event loop.
            prepared = await run_in_threadpool(runner.preparer.prepare, 0, converted.request, converted.settings,
                                               formatter, "request", body.new_tokens is not None)
        except BadRequest as error:
            raise HttpError(error.status, str(error), error.param, error.code) from None
        except (PromptError, ValueError) as error:
            raise HttpError(400, *_preparation_message(str(error))) from None
        job = _enqueue(prepared, converted.settings)
        job.forced_calls = converted.forced is not None  # its grammar is the server's (_constraint_failed)
        return job, tool_parser

    def _enqueue(prepared, settings) -> Job:
        """A prepared request as a job on the serving engine (429 when its queue is full, 503 while it
        stops); every route submits through here."""
        apply_batch_rules([prepared], settings)  # a batch of one: its own K and speculation
        job = Job(prepared, asyncio.get_running_loop(), client=CLIENT.get())
        if prepared.adapter is not None:  # KV events name an adapter's blocks by the name it is served as
            runner.prefix_cache.adapter_names[prepared.adapter.digest] = prepared.adapter.name
        try:
            engine.submit(job)
        except QueueFull as error:
            metrics.rejections.labels(reason="queue_full").inc()
            wait = engine.retry_after()  # from the rate requests finish at
            raise HttpError(429, f"the server is busy: {error}; retry in {wait} s", code="queue_full",
                            headers={"Retry-After": str(wait)}) from None
        except EngineStopped as error:
            raise HttpError(503, str(error), code="shutting_down") from None
        metrics.prompt_tokens.inc(len(prepared.sequence.prompt_ids))
        return job

    async def _next(job: Job, request: Request) -> Update:
        """The job's next update; aborts it when the client left or its time is up (both checked at
        least every 0.25 s, whether or not tokens keep coming)."""
        deadline = job.submitted + config.request_timeout_s if config.request_timeout_s else None
        while True:
            now = time.perf_counter()
            if deadline is not None and now > deadline:
                engine.abort(job)
                raise HttpError(504, f"the request took longer than {config.request_timeout_s:g} s "
                                     "(--request-timeout)", code="timeout")
            if now - job.checked > 0.25:
                job.checked = now
                if await request.is_disconnected():
                    engine.abort(job)
                    raise ClientGone
            try:
                update = await asyncio.wait_for(job.updates.get(), timeout=0.25)
            except TimeoutError:
                continue
            if update.error:
                raise HttpError(503, update.error, code="engine_failed")
            if update.finished and job.prepared.sequence.error:
                raise _constraint_failed(job)
            return update

    async def _wait(job: Job, request: Request, answer: "_Answer") -> None:
        while True:
            update = await _next(job, request)
            answer.add(update)
            if update.finished:
                return

    async def _stream(job: Job, answer: "_Answer", request: Request, route: str):
        finished = False
        try:
            yield _sse(answer.chunk(Update([], ""), first=True))
            while not finished:
                try:
                    update = await _next(job, request)
                except ClientGone:
                    return
                except HttpError as error:  # past its timeout, its constraint failed, the engine failed: say so
                    yield _sse({"error": {"message": error.message, "type": ERROR_TYPES.get(error.status),
                                          "param": error.param, "code": error.code}})
                    finished = True
                    break
                span = answer.add(update)
                finished = update.finished
                for chunk in answer.chunks(update, span):
                    yield _sse(chunk)
            if answer.include_usage:
                yield _sse(answer.usage_chunk())
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away mid-stream: free its row now
                engine.abort(job)
                client_gone(route, answer.tokens)

    from trt_llm.server.transcriptions import add_transcriptions  # it imports this module's HttpError

    add_transcriptions(app, runner, metrics, config, _enqueue, _next)
    from trt_llm.server.embeddings import add_embeddings  # it imports this module's HttpError

    add_embeddings(app, runner, engine, config, metrics)
    from trt_llm.server.kv_events import add_kv_events

    app.state.kv_events = add_kv_events(app, runner.prefix_cache)  # GET /v1/kv_events
    _add_limits(app, config, metrics)
    from trt_llm.server.anthropic import add_messages  # after the limits: its error shape wraps theirs

    add_messages(app, runner, config, _submit, _next)
    return app


def _constraint_failed(job: Job) -> "HttpError":
    """A request whose constraint the grammar library gave up on mid-answer (sequence.append_token):
    a 400 naming the constraint, never a cut answer ending as "stop". A forced call's grammar is the
    server's, made from the tools' parameters: the message says so, in these words."""
    request, why = job.prepared.request, job.prepared.sequence.error
    if getattr(job, "forced_calls", False):
        reason = why.partition(": ")[2]
        return HttpError(400, f"tools: the grammar that makes the answer calls of these tools failed: {reason} "
                              "(simpler parameters schemas, or tool_choice auto)", "tools", "constraint_failed")
    field = "response_format" if request.response_format is not None else "guided_decoding"
    return HttpError(400, f"{field}.{why}", f"{field}.{why.partition(':')[0]}", "constraint_failed")


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _preparation_message(message: str) -> tuple[str, str | None]:
    """The preparer names the field after "request." (runtime/requests/prepare.py): the message without that
    prefix and the field as OpenAI's error.param."""
    message = message.removeprefix("request.").removeprefix("request: ")
    field, sep, _ = message.partition(":")
    return message, field if sep and " " not in field else None


def _validation_message(errors) -> tuple[str, str | None]:
    """A body that does not validate: the message names each field and what is wrong with it (the
    first three), and error.param is the first field, as OpenAI's errors do."""
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        return f"the body is not valid JSON: {first.get('msg')}", None
    # A misspelt key first: it is why a field is missing.
    errors = sorted(errors, key=lambda e: e.get("type") != "extra_forbidden")
    missing = {tuple(_location(e)[:-1]): [] for e in errors}
    for e in errors:
        if e.get("type") == "missing":
            missing[tuple(_location(e)[:-1])].append(str(_location(e)[-1]))
    shown = []
    for e in errors[:3]:
        location = _location(e)
        shown.append(f"{'.'.join(map(str, location)) or 'body'}: {_describe(e, missing.get(tuple(location[:-1]), []))}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    param = ".".join(map(str, _location(errors[0]))) or None
    return "; ".join(shown) + more, param


def _location(error) -> list:
    """The error's field path in the body: without FastAPI's "body", the tags pydantic adds for a
    union's branch (protocol._either's "str" / "parts", a content part's type) or a dict's key; a
    part's missing or unknown type is its "type" field."""
    loc = list(error.get("loc", ()))
    if loc[:1] == ["body"]:
        loc = loc[1:]
    out = []
    for i, part in enumerate(loc):
        before = loc[i - 1] if i else None
        if part in ("str", "parts") and before in UNION_FIELDS:
            continue
        if part in TOOL_CHOICE_TAGS and before == "tool_choice":
            continue
        if i > 1 and loc[i - 2] == "parts" and isinstance(before, int) and isinstance(part, str) and i < len(loc) - 1:
            continue  # the content part's own tag ("input_audio"), followed by its real field
        if part == "[key]":
            continue
        out.append(part)
    if error.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        out.append(str((error.get("ctx") or {}).get("discriminator", "type")).strip("'"))
    return out


def _describe(error, missing_siblings: list[str]) -> str:
    kind, ctx, value = error.get("type"), error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        return f"unknown or unsupported parameter{did_you_mean(str(_location(error)[-1]), missing_siblings)}"
    if kind == "literal_error":
        return f"{show(value)} is not supported; use {_choices(ctx.get('expected', ''))}"
    if kind == "union_tag_invalid":  # a content part's type (the one discriminated union)
        tag = ctx.get("tag", "")
        return f"{show(tag)} is not supported; use {_or(PART_TYPES)}"
    if kind == "union_tag_not_found":
        return f"required field missing ({_or(PART_TYPES)})"
    if kind == "str_or_list_type":
        return f"{error.get('msg')}, got {show(value)}"
    if kind == "value_error":
        return str(error.get("msg", "")).removeprefix("Value error, ")
    return describe(error)


def _choices(expected: str) -> str:
    """pydantic's "'a', 'b' or 'c'" as "a, b or c"."""
    return expected.replace("'", "")


def _or(names) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


class _Answer:
    """One request's answer as it grows: the whole response, or its stream of chunks. A chat answer's
    text goes through the reasoning split (runtime/text/reasoning.py, when the prompt's template has a
    thinking block) and then the tool-call parser (server/tool_calls.py, when tools may be called),
    update by update, streamed or not: the whole answer is exactly its chunks joined."""

    def __init__(self, body, job: Job, runner, model_name: str, tool_parser: str | None = None):
        self.body, self.job, self.token_bytes, self.model = body, job, runner.token_bytes, model_name
        self.chat = isinstance(body, ChatCompletionRequest)
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text = ""
        self.tokens = 0  # tokens received so far
        self.with_logprobs = body.logprobs is not None and body.logprobs is not False
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self._offset = 0  # completions' text_offset of the next token
        mode = job.prepared.prompt.reasoning if self.chat else None
        self.splitter = ReasoningSplitter(mode) if mode is not None else None
        self.parser = make_parser(tool_parser, body.parallel_tool_calls) if self.chat and tool_parser else None
        self.reasoning, self.content, self.tool_calls = "", "", []
        self._delta = ("", "", [])  # the last update's reasoning, content and new calls

    @property
    def sequence(self):
        return self.job.prepared.sequence

    def add(self, update: Update) -> tuple[int, int]:
        """Take an update; returns the range of token indexes it brought."""
        self.text += update.text
        start = self.tokens
        self.tokens += len(update.token_ids)
        if self.chat:
            self._delta = self._parse(update.text, update.finished)
        return start, self.tokens

    def _parse(self, text: str, finished: bool):
        reasoning, content = ("", text) if self.splitter is None else self.splitter.feed(text)
        if finished and self.splitter is not None:
            more_reasoning, more_content = self.splitter.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        calls = []
        if self.parser is not None:
            content, calls = self.parser.feed(content)
            if finished:
                more, later = self.parser.finish()
                content, calls = content + more, calls + later
        self.reasoning += reasoning
        self.content += content
        self.tool_calls += calls
        return reasoning, content, calls

    def whole(self) -> dict:
        s = self.sequence
        logprobs = self._logprobs(0, len(s.generated))
        if self.chat:
            message = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
            if self.splitter is not None:
                message["reasoning_content"] = self.reasoning if self.splitter.block else None
            if self.tool_calls:
                message["tool_calls"] = [call.openai() for call in self.tool_calls]
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": self._finish_reason()}
        else:
            choice = {"index": 0, "text": self.text, "logprobs": logprobs, "finish_reason": self._finish_reason()}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self._usage()}

    def chunks(self, update: Update, span: tuple[int, int]) -> list[dict]:
        """The chunks an update makes (none while its text is held back): a chat answer's reasoning
        and content delta, then each new call as OpenAI streams one (its index, id and name, then
        its arguments); the logprobs ride on the first, the finish reason on the last."""
        with_logprobs = bool(update.token_ids) and self.with_logprobs
        if not self.chat:
            return [self.chunk(update, span)] if update.text or with_logprobs or update.finished else []
        reasoning, content, calls = self._delta
        deltas = []
        if reasoning or content:
            deltas.append({"reasoning_content": reasoning} if reasoning else {})
            if content:
                deltas[-1]["content"] = content
        for call in calls:
            deltas.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments}}]})
        if not deltas and (with_logprobs or update.finished):
            deltas.append({})
        out = []
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            finish = self._finish_reason() if update.finished and last else None
            logprobs = self._logprobs(*span) if i == 0 and span[1] > span[0] else None
            out.append(self._chunk({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}))
        return out

    def chunk(self, update: Update, span: tuple[int, int] | None = None, first: bool = False) -> dict:
        finish = self._finish_reason() if update.finished else None
        logprobs = self._logprobs(*span) if span and span[1] > span[0] else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": update.text} if update.text else {})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": update.text, "logprobs": logprobs, "finish_reason": finish}
        return self._chunk(choice)

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": self._usage()}

    def _finish_reason(self) -> str:
        if self.tool_calls:
            return "tool_calls"
        if self.sequence.finish_reason == TIMEOUT:  # its body's timeout passed: the answer so far (ours)
            return "timeout"
        return "length" if self.sequence.finish_reason == MAX_LENGTH else "stop"

    def _usage(self) -> dict:
        s = self.sequence
        reused = s.reused_tokens
        prompt, completion = len(s.prompt_ids), len(s.generated)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": reused}}

    def _logprobs(self, start: int, stop: int):
        if not self.with_logprobs:
            return None
        s, tb = self.sequence, self.token_bytes
        rows = zip(s.generated[start:stop], s.token_logprobs[start:stop], s.top_logprobs[start:stop])
        if self.chat:
            k = self.body.top_logprobs or 0
            return {"content": [
                {"token": tb.text_of(t), "logprob": lp, "bytes": list(tb.bytes_of(t)),
                 "top_logprobs": [{"token": tb.text_of(c), "logprob": v, "bytes": list(tb.bytes_of(c))}
                                  for c, v in zip(top_ids[:k], top_values[:k])]}
                for t, lp, (top_ids, top_values) in rows]}
        k = self.body.logprobs
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp, (top_ids, top_values) in rows:
            out["tokens"].append(tb.text_of(t))
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({tb.text_of(c): v for c, v in zip(top_ids[:k], top_values[:k])})
            out["text_offset"].append(self._offset)
            self._offset += len(tb.text_of(t))
        return out


def _add_limits(app: FastAPI, config: ServerConfig, metrics: Metrics) -> None:
    """The API key, the body size limit and (only when asked for) CORS, as ASGI middleware, inside
    the counter of every answer."""
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"])
    app.add_middleware(BodyLimit, limit=config.max_body_bytes, own_limits=UPLOAD_ROUTES)
    from trt_llm.server.clients import ClientKey

    app.add_middleware(ClientKey)  # who sent each request: fair share between API keys (server/clients.py)
    if config.api_keys:
        app.add_middleware(ApiKey, keys=config.api_keys)
    app.add_middleware(RequestCounter, metrics=metrics)  # the last added is the outermost


class RequestCounter:
    """trt_llm_requests{route, status} for every answer of the API routes, refusals included (a body
    that does not validate, a missing key, one over the size limit), by the status sent."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in COUNTED_ROUTES:
            return await self.app(scope, receive, send)
        route = scope["path"]

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, counted)


class ApiKey:
    """`Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) on every route but /health; keys
    compared in constant time."""

    def __init__(self, app, keys: tuple[str, ...]):
        self.app, self.keys = app, [k.encode() for k in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] == "/health" or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        offered = [given.strip()] if scheme.lower() == b"bearer" else []
        if b"x-api-key" in headers:
            offered.append(headers[b"x-api-key"].strip())
        # Every key is compared (no early exit), each in constant time: the answer's timing says nothing.
        matches = [hmac.compare_digest(one, key) for one in offered for key in self.keys]
        if not any(matches):
            response = error_response(401, "a valid API key is needed: Authorization: Bearer <key> "
                                      "(or x-api-key: <key>)",
                                      code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


# Routes whose bodies are uploads, streamed to disk under their own limit (server/uploads.py).
UPLOAD_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")


class BodyLimit:
    """413 for a body over `limit` bytes, by its Content-Length or, without one, as it arrives; the
    `own_limits` routes enforce theirs themselves."""

    def __init__(self, app, limit: int, own_limits: tuple[str, ...] = ()):
        self.app, self.limit, self.own_limits = app, limit, own_limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.own_limits:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        too_large = error_response(413, f"the body is larger than {self.limit} bytes (--max-body-bytes)",
                                   code="body_too_large")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await too_large(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            return await self.app(scope, limited, send)
        except _TooLarge:
            return await too_large(scope, receive, send)


class _TooLarge(BaseException):
    """Raised from the body's receive: a BaseException, so that FastAPI's body parsing (which turns
    any Exception into "There was an error parsing the body", 400) lets it through to BodyLimit."""
