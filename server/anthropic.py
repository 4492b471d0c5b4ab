"""POST /v1/messages: Anthropic's Messages API on the chat route's pipeline.

A body (validated here, pydantic) becomes the `ChatCompletionRequest` the OpenAI route would get for
the same conversation (`to_chat`), and from there takes exactly that route's path (app.py's `_submit`:
the model check, `convert`, the tool-call parser, the preparer, the serving engine; its `_Answer`:
the reasoning split and the tool-call parser, update by update). Only the shapes differ:

- in: `system` is a system turn; a user turn's `tool_result` blocks are `tool` turns (in place, so
  text after them follows them); an assistant turn's `thinking` is its `reasoning_content`, its
  `tool_use` blocks its `tool_calls` (the input as the arguments' JSON); an `image` block's source (base64,
  or a url: a data: URL or a file under --allowed-local-media-path, as the chat route's image_url) an
  image part; `tools` are functions (`input_schema` their parameters); `tool_choice` auto / none / any
  / tool is the chat route's auto / none / required / a named function (`disable_parallel_tool_use`
  its parallel_tool_calls: false); `thinking` enabled or adaptive switches the chat template's
  thinking on (the budget is checked as Anthropic checks it, not enforced: max_tokens bounds it);
  `cache_control` is accepted and ignored (the server reuses every conversation's earlier turns
  itself); `metadata` and `service_tier` describe the caller and are ignored.
- out: a message whose content blocks are the answer's `thinking` (signature ""), `text` and
  `tool_use` (ids `toolu_...`), in the order the model wrote them; stop_reason tool_use, max_tokens,
  stop_sequence (with the sequence) or end_turn; usage input_tokens (the whole prompt) and
  output_tokens. Streamed, Anthropic's events: message_start, then each block as content_block_start,
  its deltas (text_delta, thinking_delta, input_json_delta), content_block_stop (a ping after the
  first block's start), then message_delta (stop_reason, usage) and message_stop. The whole message
  is its stream's events assembled: both are made by the same `anthropic_answer.Blocks`.
- errors: `{"type": "error", "error": {"type", "message"}}` with the status the server answers
  (`AnthropicErrors` rewrites every OpenAI-shaped error on this route, the key check's and the body
  limit's included); the message starts with the field, by this body's names. An error after the
  stream began is an `error` event.

Refused with a 400 naming the field, never dropped: unknown fields and block types (document,
redacted_thinking, server tools), an image in a tool_result, a final assistant turn (a prefill that
the answer would continue: the chat template starts a new turn instead).
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from trt_llm.server.anthropic_answer import AnthropicMessage, sse
from trt_llm.server.anthropic_convert import Origins, to_chat
from trt_llm.server.anthropic_protocol import MessagesRequest, validation_message
from trt_llm.server.convert import BadRequest

ROUTE = "/v1/messages"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error"}


def error_type(status: int) -> str:
    """Anthropic's error.type for a status (its published table; other 4xx are invalid requests)."""
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def add_messages(app: FastAPI, runner, config, submit, next_update) -> None:
    """Register the route and its error shape. submit: app.py's `_submit(body)`, a chat body's job
    and tool parser; next_update: its `_next(job, request)`, with the server's timeout and disconnect
    handling. Call it after the limits' middleware is added: `AnthropicErrors` must wrap them."""
    from trt_llm.server.app import ClientGone, HttpError, _Answer, client_gone

    engine = app.state.engine

    @app.post(ROUTE)
    async def messages(request: Request):
        try:
            data = json.loads(await request.body())
        except ValueError as error:
            raise HttpError(400, f"the body is not valid JSON: {error}") from None
        try:
            body = MessagesRequest.model_validate(data)
            chat, origins = to_chat(body, config.media_root)
        except ValidationError as error:
            raise HttpError(400, validation_message(error)) from None
        except BadRequest as error:
            raise HttpError(error.status, str(error)) from None
        try:
            job, tool_parser = await submit(chat)
        except HttpError as error:
            raise HttpError(error.status, _renamed(error, body, origins), code=error.code,
                            headers=error.headers) from None
        message = AnthropicMessage(_Answer(chat, job, runner, config.model_name, tool_parser), body.model, body.show_thinking)
        if body.stream:
            return StreamingResponse(_stream(job, message, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            finished = False
            while not finished:
                update = await next_update(job, request)
                message.add(update)
                finished = update.finished
        except ClientGone:
            return client_gone(ROUTE, message.answer.tokens)
        return message.whole()

    async def _stream(job, message: AnthropicMessage, request: Request):
        finished = False
        try:
            yield sse(*message.start())
            while not finished:
                try:
                    update = await next_update(job, request)
                except ClientGone:
                    return
                except HttpError as error:  # past its timeout, or the engine failed: say so, then end
                    yield sse("error", error_body(error.status, error.message))
                    finished = True
                    return
                finished = update.finished
                for event in message.add(update):
                    yield sse(*event)
            for event in message.end():
                yield sse(*event)
        finally:
            if not finished:  # the client went away mid-stream: free its row now
                engine.abort(job)
                client_gone(ROUTE, message.answer.tokens)

    app.add_middleware(AnthropicErrors)
    _publish_schema(app)


def _publish_schema(app: FastAPI) -> None:
    """The body's JSON Schema in the app's OpenAPI document (the route reads its body itself, so that
    its errors are this API's): the models under components as Anthropic<Name>, beside the OpenAI
    bodies' models of the same names."""
    made = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = made()
        body = MessagesRequest.model_json_schema(ref_template="#/components/schemas/Anthropic{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update({f"Anthropic{name}": spec for name, spec in body.pop("$defs", {}).items()})
        components["AnthropicMessagesRequest"] = body
        schema["paths"][ROUTE]["post"]["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/AnthropicMessagesRequest"}}}}
        return schema

    app.openapi = openapi


def _renamed(error, body: MessagesRequest, origins: Origins) -> str:
    """An error of the chat route in this body's names: its messages' indexes, and tool_choice as
    Anthropic spells it."""
    message = origins.rename(error.message)
    choice = body.tool_choice
    if error.param and error.param.startswith("tool_choice") and choice is not None and choice.type in ("any", "tool"):
        field = "tool_choice.name" if error.param.endswith("name") else "tool_choice"
        reason = message.split(": ", 1)[-1]
        message = f"{field}: type {choice.type!r} (the chat route's tool_choice " \
                  f"{'required' if choice.type == 'any' else 'function'}) is refused: {reason}"
    return message


class AnthropicErrors:
    """Every error answered on this route in Anthropic's shape: the OpenAI-shaped body the rest of
    the server writes ({"error": {"message", ...}}), from a route, the key check or the body limit,
    becomes {"type": "error", "error": {"type", "message"}} with the same status."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != ROUTE:
            return await self.app(scope, receive, send)
        held: dict = {}
        chunks: list[bytes] = []

        async def rewritten(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"] = message
                return
            if "start" not in held or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            start = held.pop("start")
            try:
                openai = json.loads(body)["error"]
                body = json.dumps(error_body(start["status"], openai["message"]), ensure_ascii=False).encode()
            except (ValueError, KeyError, TypeError):  # not an OpenAI error (a client gone's empty answer)
                pass
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        return await self.app(scope, receive, rewritten)
