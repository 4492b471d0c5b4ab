"""An OpenAI body -> the input file's `Request` and `InputSettings` (schemas/input_file.py), so that the
server prepares, limits and samples a request exactly as `trt-llm-run` does."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from trt_llm.schemas._errors import _parts, format_errors
from trt_llm.schemas.input_file import MAX_TEXT_BYTES, GuidedDecoding, InputSettings, Request
from trt_llm.server.protocol import ChatCompletionRequest, CompletionRequest


class BadRequest(ValueError):
    """A request the server refuses with 400; `param` names the field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass
class Converted:
    request: Request
    settings: InputSettings
    chat: bool  # the chat template applies (chat completions) or the prompt is raw (completions)
    tool_calls: bool = False  # the answer may call the request's tools (tool_choice auto, required, named)
    forced: str | None = None  # tool_choice "required" or "named": a grammar makes the answer calls


def convert(body: ChatCompletionRequest | CompletionRequest, lora: dict[str, str], capacity: int,
            media_root: Path | None) -> Converted:
    """lora: the served adapters, model name -> path (a body's `model` naming one selects it);
    capacity: the engine's KV capacity (max_tokens absent = as many as fit); media_root: the folder
    local media paths may come from (None: no local paths)."""
    chat = isinstance(body, ChatCompletionRequest)
    if chat:
        messages = [_message(i, m, media_root) for i, m in enumerate(body.messages)]
    else:
        messages = [{"role": "user", "content": body.text}]
    request = {"messages": messages, "disable_spec_decode": body.disable_spec_decode,
               "num_logprobs": body.num_logprobs, "priority": body.priority, "timeout": body.timeout}
    choice = tool_choice(body) if chat else "none"
    calls = choice != "none"
    if chat and body.tools:  # under "none" too (vLLM's default): the prompt is the same whatever the choice
        request["tools"] = [tool.model_dump(exclude_none=True) for tool in body.tools]
    forced = choice if choice in ("required", "named") else None
    _constraint(body, chat, forced, request)
    if body.stop:  # a string, or a non-empty list (OpenAI sends [] for none)
        request["stop"] = body.stop
    if body.logit_bias:
        request["logit_bias"] = body.logit_bias
    if body.model in lora:
        request["lora_name"] = body.model
    settings = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                "presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
                "repetition_penalty": body.repetition_penalty, "min_p": body.min_p,
                "max_generate_length": body.new_tokens or capacity, "seed": body.seed,
                "apply_chat_template": chat, "add_generation_prompt": True,
                "enable_thinking": body.thinking if chat else False, "available_lora_weights": lora}
    return Converted(_validated(Request, request), _validated(InputSettings, settings), chat, calls, forced)


def _constraint(body, chat: bool, forced: str | None, request: dict) -> None:
    """The answer's one constraint into `request`: response_format (chat) or guided_decoding; with
    forced calls neither (force_tool_calls adds their grammar), a "text" response_format aside."""
    response_format = body.response_format if chat else None
    if forced is not None:
        if body.guided_decoding is not None:
            raise BadRequest(f"guided_decoding: not with tool_choice {forced!r}, which makes the answer tool calls",
                             param="guided_decoding")
        if response_format is not None and response_format.type != "text":
            raise BadRequest(f"tool_choice: {forced!r} makes the answer tool calls; it takes no "
                             f"response_format {response_format.type!r}", param="tool_choice")
        return
    if response_format is not None and body.guided_decoding is not None:
        raise BadRequest("guided_decoding: not with response_format (each constrains the answer; send one)",
                         param="guided_decoding")
    if response_format is not None:
        request["response_format"] = response_format.model_dump(exclude_none=True, by_alias=True)
    if body.guided_decoding is not None:
        request["guided_decoding"] = body.guided_decoding.model_dump(exclude_none=True)


def tool_choice(body: ChatCompletionRequest) -> str:
    """"none", "auto" (the default with tools, "none" without), "required" or "named" (the body's
    function, which must be one of its tools)."""
    choice = body.tool_choice
    if choice is None:
        return "auto" if body.tools else "none"
    what = f"{choice!r}" if isinstance(choice, str) else f"a named function ({choice.function.name!r})"
    if choice != "none" and not body.tools:
        raise BadRequest(f"tool_choice: {what} needs tools", param="tool_choice")
    if isinstance(choice, str):
        return choice
    if choice.function.name not in [tool.function.name for tool in body.tools]:
        known = ", ".join(repr(tool.function.name) for tool in body.tools)
        raise BadRequest(f"tool_choice: {choice.function.name!r} is not one of the tools ({known})",
                         param="tool_choice.function.name")
    return "named"


def force_tool_calls(converted: Converted, body: ChatCompletionRequest, grammars, syntax: str = "hermes") -> Request:
    """The converted request with its answer forced to be tool calls (tool_choice required or named):
    a grammar over the call syntax of the parser `syntax` (hermes, llama3_json, gemma4) as its guided decoding
    (server/tool_grammar.py). grammars: the engine's grammar.Grammars (the tags as its tokenizer
    writes them)."""
    from trt_llm.server.tool_grammar import ToolGrammarError, tool_grammar

    name = body.tool_choice.function.name if converted.forced == "named" else None
    try:
        grammar = tool_grammar(converted.request.tools, name, body.parallel_tool_calls, grammars.literal, syntax)
    except ToolGrammarError as error:
        raise BadRequest(str(error), param=error.param) from None
    size = len(grammar.encode("utf-8"))
    if size > MAX_TEXT_BYTES:  # the user wrote the tools, not this grammar: say it in their terms
        raise BadRequest(f"tools: the grammar that makes the answer calls of these tools would be {size} bytes, over "
                         f"the {MAX_TEXT_BYTES} a grammar may have (send fewer tools or smaller parameters schemas, or "
                         "tool_choice auto)", param="tools")
    return converted.request.model_copy(update={"guided_decoding": GuidedDecoding(ebnf=grammar)})


def _validated(model, data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]  # param: the field's path without pydantic's branch names (_parts drops them)
        param = ".".join(str(part) for _, part in _parts(first["loc"]))
        raise BadRequest("; ".join(format_errors(error)[:3]), param=param) from None


def _message(index: int, message, media_root: Path | None) -> dict:
    role = "system" if message.role == "developer" else message.role  # OpenAI's newer name for it
    out = {"role": role}
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump(exclude_none=True) for call in message.tool_calls]
    for key in ("tool_call_id", "reasoning_content"):
        if getattr(message, key) is not None:
            out[key] = getattr(message, key)
    if message.content is None:
        return out
    if isinstance(message.content, str):
        return {**out, "content": message.content}
    parts = []
    for j, part in enumerate(message.content):
        where = f"messages[{index}].content[{j}]"
        if part.type == "text":
            parts.append({"type": "text", "text": part.text})
        elif part.type == "image_url":
            parts.append({"type": "image", "image": media_source(part.image_url.url, media_root, f"{where}.image_url.url")})
        elif part.type == "video_url":  # the input file's video part; its options are checked there
            options = part.video_url.model_dump(exclude_none=True, exclude={"url"})
            parts.append({"type": "video", "video": media_source(part.video_url.url, media_root,
                                                                 f"{where}.video_url.url"), **options})
        else:
            parts.append({"type": "audio", "audio": _audio_source(part.input_audio, media_root, f"{where}.input_audio.data")})
    return {**out, "content": parts}


def _audio_source(audio, media_root: Path | None, param: str) -> str:
    """input_audio.data: the clip's bytes in base64 (OpenAI's form), or, like an image part's url, a
    data: URL or a file:// URL inside the allowed folder."""
    if audio.data.startswith(("data:", "file://")):
        return media_source(audio.data, media_root, param)
    try:
        base64.b64decode(audio.data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{param}: not base64 (send the clip's bytes in base64, or a data:audio/...;base64, URL)",
                         param=param) from None
    return f"data:audio/{audio.format};base64,{audio.data}"


def media_source(url: str, media_root: Path | None, param: str) -> str:
    """A media URL as the request may give it: a base64 data: URL, or a local file inside the allowed
    folder (a path or file:// URL; `..` and symlinks that lead out of the folder are refused).
    Never fetched from the network."""
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise BadRequest(f"{param}: a data URL must be base64 (data:<type>;base64,...)", param=param)
        try:
            base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{param}: the data URL's payload is not base64", param=param) from None
        return url
    if url.startswith(("http://", "https://")):
        raise BadRequest(f"{param}: this server fetches nothing from the network; send the bytes as a data URL",
                         param=param)
    if media_root is None:
        raise BadRequest(f"{param}: local media paths are off (start the server with --allowed-local-media-path)",
                         param=param, status=403)
    if "\0" in url:  # no file system takes it (and Path.resolve raises a bare "embedded null byte")
        raise BadRequest(f"{param}: {url!r} is not a valid path (it holds a NUL character)", param=param)
    path = Path(url.removeprefix("file://"))
    if not path.is_absolute():
        path = media_root / path
    resolved = path.resolve()  # follows symlinks: a link out of the folder resolves out of it
    if not resolved.is_relative_to(media_root.resolve()):
        raise BadRequest(f"{param}: {url!r} is outside the allowed media folder", param=param, status=403)
    if not resolved.is_file():
        raise BadRequest(f"{param}: no such file {url!r} in the allowed media folder", param=param)
    return str(resolved)
