"""An Anthropic Messages body as the chat route's `ChatCompletionRequest` for the same conversation
(`to_chat`), and where each of its messages came from (`Origins`), so that an error the chat route
raises names this body's field."""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

from trt_llm.schemas._errors import describe
from trt_llm.server.anthropic_protocol import MessagesRequest, field_path
from trt_llm.server.convert import BadRequest, media_source
from trt_llm.server.protocol import ChatCompletionRequest


class Origins:
    """Where each chat message (and its parts, its tool calls) came from in the Anthropic body, so
    that an error the chat route raises names this body's field."""

    def __init__(self):
        self.messages: list[str] = []
        self.parts: list[dict[tuple[str, int], str]] = []

    def add(self, path: str, parts: dict[tuple[str, int], str] | None = None) -> None:
        self.messages.append(path)
        self.parts.append(parts or {})

    def rename(self, text: str | None) -> str | None:
        if text is None:
            return None

        def renamed(match):
            k = int(match.group(1))
            if k >= len(self.messages):
                return match.group(0)
            if match.group(2) and (match.group(2), int(match.group(3))) in self.parts[k]:
                return self.parts[k][(match.group(2), int(match.group(3)))]
            return self.messages[k] + (match.group(0)[match.group(0).index("]") + 1:])

        return re.sub(r"messages\[(\d+)\](?:\.(content|tool_calls)\[(\d+)\])?", renamed, text)


def to_chat(body: MessagesRequest, media_root) -> tuple[ChatCompletionRequest, Origins]:
    """The chat route's body for the same conversation, and where its messages came from."""
    origins, messages = Origins(), []
    if body.system is not None:
        content = body.system if isinstance(body.system, str) else [
            {"type": "text", "text": block.text} for block in body.system]
        messages.append({"role": "system", "content": content})
        origins.add("system", {("content", j): f"system[{j}]" for j in range(len(content))}
                    if isinstance(content, list) else None)
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            origins.add(where)
        elif message.role == "assistant":
            messages.append(_assistant(message.content, where, origins))
        else:
            _user(message.content, where, media_root, messages, origins)
    chat = {"model": body.model, "messages": messages, "max_tokens": body.max_tokens,
            "temperature": body.temperature, "stream": body.stream, "priority": body.priority, "timeout": body.timeout}
    if body.top_p is not None:
        chat["top_p"] = body.top_p
    if body.top_k is not None:
        chat["top_k"] = body.top_k
    if body.stop_sequences:
        chat["stop"] = body.stop_sequences
    if body.thinking is not None:
        chat["enable_thinking"] = body.thinking.type != "disabled"
    if body.tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": tool.name, "parameters": tool.input_schema,
            **({"description": tool.description} if tool.description is not None else {})}} for tool in body.tools]
    choice = body.tool_choice
    if choice is not None:
        chat["tool_choice"] = {"auto": "auto", "none": "none", "any": "required"}.get(choice.type) or {
            "type": "function", "function": {"name": choice.name}}
        if getattr(choice, "disable_parallel_tool_use", False):
            chat["parallel_tool_calls"] = False
    try:
        return ChatCompletionRequest.model_validate(chat), origins
    except ValidationError as error:  # what this body allows and the chat route's does not
        first = error.errors(include_url=False)[0]
        raise BadRequest(origins.rename(f"{field_path(first['loc'])}: {describe(first)}")) from None


def _assistant(blocks, where: str, origins: Origins) -> dict:
    """One assistant turn: its text, its thinking as reasoning_content, its tool_use blocks as calls."""
    parts, reasoning, calls, places = [], [], [], {}
    for j, block in enumerate(blocks):
        if block.type == "text":
            places[("content", len(parts))] = f"{where}.content[{j}]"
            parts.append({"type": "text", "text": block.text})
        elif block.type == "thinking":
            reasoning.append(block.thinking)
        else:
            places[("tool_calls", len(calls))] = f"{where}.content[{j}]"
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
    out = {"role": "assistant", "content": parts or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    origins.add(where, places)
    return out


def _user(blocks, where: str, media_root, messages: list, origins: Origins) -> None:
    """One user turn: its text and images as user turns, each tool_result a tool turn in its place."""
    parts, places = [], {}

    def flush():
        if parts:
            messages.append({"role": "user", "content": list(parts)})
            origins.add(where, dict(places))
            parts.clear()
            places.clear()

    for j, block in enumerate(blocks):
        if block.type == "tool_result":
            flush()
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id,
                             "content": _result_text(block.content, f"{where}.content[{j}]")})
            origins.add(f"{where}.content[{j}]")
            continue
        places[("content", len(parts))] = f"{where}.content[{j}]"
        if block.type == "text":
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {
                "url": _image_url(block.source, media_root, f"{where}.content[{j}].source")}})
    flush()


def _result_text(content, where: str) -> str | list[dict]:
    if content is None or isinstance(content, str):
        return content or ""
    for k, block in enumerate(content):
        if block.type != "text":
            raise BadRequest(f"{where}.content[{k}]: an image in a tool_result is not supported (send it in "
                             "a user turn's image block)")
    return [{"type": "text", "text": block.text} for block in content]


def _image_url(source, media_root, where: str) -> str:
    """The image as the chat route's image_url takes it, checked here so that an error names this
    body's field: a base64 source as a data: URL; a url source as the chat route's url (a data: URL,
    or a file inside --allowed-local-media-path; nothing is fetched from the network)."""
    if source.type == "base64":
        return media_source(f"data:{source.media_type};base64,{source.data}", media_root, f"{where}.data")
    return media_source(source.url, media_root, f"{where}.url")
