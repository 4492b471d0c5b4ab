"""The body of Anthropic's `POST /v1/messages` (pydantic, with Anthropic's published fields and
bounds), and its validation errors as one line naming each field in this body's names
(`messages[0].content[1].source.data: ...`). server/anthropic.py serves it."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from trt_llm.schemas._errors import describe, did_you_mean
from trt_llm.schemas.input_file import MAX_TEXT_BYTES
from trt_llm.server.protocol import _either

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # what Anthropic's base64 source takes
MIN_THINKING_BUDGET = 1024  # Anthropic's lower bound on thinking.budget_tokens


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheControl(_Body):
    """Accepted and ignored: the server keeps and restores earlier turns by itself."""
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_BYTES)
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None  # an earlier answer's, sent back: ignored


class Base64Source(_Body):
    type: Literal["base64"]
    media_type: Literal[IMAGE_TYPES]
    data: str = Field(min_length=1)


class UrlSource(_Body):
    type: Literal["url"]
    url: str = Field(min_length=1, description="a data: URL, or a file path under --allowed-local-media-path")


class ImageBlock(_Body):
    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]
    cache_control: CacheControl | None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: _either(str, list[Annotated[Union[TextBlock, ImageBlock], Field(discriminator="type")]],
                     "expected a string or an array of text blocks") | None = None
    is_error: bool | None = None  # the content says what went wrong; the template has no flag for it
    cache_control: CacheControl | None = None


class ThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # ours is "": nothing to verify


Block = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock],
                  Field(discriminator="type")]
ROLE_BLOCKS = {"user": ("text", "image", "tool_result"), "assistant": ("text", "thinking", "tool_use")}


class Message(_Body):
    role: Literal["user", "assistant"]
    content: _either(str, Annotated[list[Block], Field(min_length=1)], "expected a string or an array of blocks")

    @model_validator(mode="after")
    def _blocks_of_the_role(self):
        for j, block in enumerate(self.content if isinstance(self.content, list) else ()):
            if block.type not in ROLE_BLOCKS[self.role]:
                raise PydanticCustomError("role_block", "content[{index}]: a {role} turn has no {type} blocks "
                                          "(it takes {allowed})", {"index": j, "role": self.role, "type": block.type,
                                           "allowed": ", ".join(ROLE_BLOCKS[self.role])})
        return self


class Tool(_Body):
    type: Literal["custom"] | None = None  # Anthropic's server tools (web search, ...) are not served here
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="a JSON Schema of the input")
    cache_control: CacheControl | None = None


class ToolChoiceAuto(_Body):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Body):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Body):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Body):
    type: Literal["none"]


class ThinkingEnabled(_Body):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=MIN_THINKING_BUDGET)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Body):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Body):
    type: Literal["disabled"]


class MessagesRequest(_Body):
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: _either(str, list[TextBlock], "expected a string or an array of text blocks") | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: float = Field(1.0, ge=0, le=1, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, description="0 = off")
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                           Field(discriminator="type")] | None = None
    thinking: Annotated[Union[ThinkingEnabled, ThinkingAdaptive, ThinkingDisabled],
                        Field(discriminator="type")] | None = None
    metadata: dict[str, Any] | None = None  # describes the caller: ignored
    service_tier: str | None = None  # likewise
    cache_control: CacheControl | None = None  # automatic caching: the server reuses contexts anyway
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1, description="extension: as the chat route's")
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False, description="extension: as the chat route's")

    @model_validator(mode="after")
    def _checks(self):
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise PydanticCustomError("thinking_budget", "thinking.budget_tokens: {budget} must be less than "
                                      "max_tokens ({max_tokens})",
                                      {"budget": self.thinking.budget_tokens, "max_tokens": self.max_tokens})
        names: dict[str, int] = {}
        for index, tool in enumerate(self.tools or ()):
            if tool.name in names:
                raise PydanticCustomError("tool_pairs", "tools[{index}].name: '{name}' is also tools[{first}]'s; tool "
                                          "names must be unique", {"index": index, "name": tool.name,
                                                                   "first": names[tool.name]})
            names[tool.name] = index
        _check_tool_pairs(self.messages)
        if self.messages[-1].role == "assistant":
            raise PydanticCustomError("prefill", "messages[{last}]: a final assistant turn (a prefill the answer "
                                      "continues) is not supported; end with a user turn",
                                      {"last": len(self.messages) - 1})
        return self

    @property
    def show_thinking(self) -> bool:
        return getattr(self.thinking, "display", None) != "omitted"


def _blocks(message, kind: str) -> list:
    return [b for b in message.content if b.type == kind] if isinstance(message.content, list) else []


def _check_tool_pairs(messages: list[Message]) -> None:
    """As Anthropic's API: each tool_use block is answered by a tool_result block in the next turn,
    and a tool_result answers a tool_use of the turn before it."""
    for i, message in enumerate(messages):
        results = [b.tool_use_id for b in _blocks(message, "tool_result")]
        asked = [b.id for b in _blocks(messages[i - 1], "tool_use")] if i else []
        stray = [r for r in results if r not in asked]
        if stray:
            raise PydanticCustomError("tool_pairs", "messages[{i}]: tool_result for {ids}, which no tool_use of the turn "
                                      "before it asked for", {"i": i, "ids": ", ".join(map(repr, stray))})
        if message.role == "assistant" and i + 1 < len(messages):
            answered = [b.tool_use_id for b in _blocks(messages[i + 1], "tool_result")]
            missing = [b.id for b in _blocks(message, "tool_use") if b.id not in answered]
            if missing:
                raise PydanticCustomError("tool_pairs", "messages[{i}]: tool_use {ids} without a tool_result in the "
                                          "next turn (messages[{next}]); each tool_use needs its tool_result there",
                                          {"i": i, "ids": ", ".join(map(repr, missing)), "next": i + 1})


_UNION_FIELDS = ("content", "system")  # typed with protocol._either: pydantic adds its "str" / "parts" tag
_TAGGED = ("source", "tool_choice", "thinking")  # discriminated unions: pydantic adds the branch's type


def field_path(loc) -> str:
    """A pydantic location in this body's names (`messages[0].content[1].source.data`), without the
    tags pydantic adds for a union's branch."""
    out, before = "", None
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        tag = ((part in ("str", "parts") and before in _UNION_FIELDS)
               or (before in _TAGGED and isinstance(part, str) and not last)
               or (isinstance(before, int) and isinstance(part, str) and not last
                   and part in ("text", "image", "tool_use", "tool_result", "thinking")))
        before = part
        if tag:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_message(error: ValidationError) -> str:
    """The first three errors, each `field: what is wrong`; a misspelt key first (it is why a field
    is missing), with the keys allowed there."""
    errors = sorted(error.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    shown = []
    for e in errors[:3]:
        if e["type"] == "extra_forbidden":
            *parent, key = e["loc"]
            shown.append(f"{field_path(e['loc'])}: unknown or unsupported parameter"
                         f"{did_you_mean(str(key), _fields_at(parent))}")
        elif e["type"] in ("role_block", "thinking_budget", "prefill", "tool_pairs"):
            text = e["msg"]
            shown.append(text if e["type"] != "role_block" else f"{field_path(e['loc'])}.{text}")
        else:
            shown.append(f"{field_path(e['loc']) or 'body'}: {describe(e)}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(shown) + more


def _fields_at(loc) -> list[str]:
    """The fields of the model at `loc`, for a did-you-mean (the top level's, or a block's)."""
    if not loc:
        return list(MessagesRequest.model_fields)
    models = {"tools": Tool, "tool_choice": ToolChoiceTool, "thinking": ThinkingEnabled, "messages": Message}
    return list(models[loc[0]].model_fields) if len(loc) <= 2 and loc[0] in models else []
