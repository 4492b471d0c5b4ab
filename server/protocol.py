"""The OpenAI-compatible request bodies, and how each becomes the input file's Request and settings.

A body is validated here (pydantic: the OpenAPI schema FastAPI publishes is these models), then
converted into the same `Request` / `InputSettings` that `trt-llm-run` reads, so a request is
prepared, limited and sampled exactly as the input file's would be (runtime/requests/prepare.py).

Unknown fields are refused (400 naming the field) rather than silently ignored, except a few that
only describe the caller (`user`, `metadata`, `store`, `service_tier`). A parameter this server
cannot honour (n > 1, echo, suffix, best_of) is refused,
never dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool, Tag,
                      model_validator)
from pydantic_core import PydanticCustomError

from trt_llm.schemas.input_file import MAX_LOGIT_BIAS, MAX_TEXT_BYTES, GuidedDecoding

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # ... and on the legacy completions' logprobs
CALLER_FIELDS = ("user", "metadata", "store", "service_tier")  # accepted and ignored


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Body):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_BYTES)


class ImageUrl(_Body):
    url: str = Field(min_length=1, description="a data: URL, or a file path under --allowed-local-media-path")
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(_Body):
    data: str = Field(min_length=1, description="the clip's bytes in base64 (OpenAI's form), or a data:audio/...;base64, "
                                                "URL, or a file:// URL under --allowed-local-media-path")
    format: Literal["wav", "mp3", "flac"]


class AudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


class VideoUrl(_Body):
    """vLLM's video part; fps, max_frames, min_pixels, max_pixels are the input file's video options."""
    url: str = Field(min_length=1, description="a data:video/...;base64, URL, or a file path under "
                                               "--allowed-local-media-path")
    fps: float | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None


class VideoPart(_Body):
    type: Literal["video_url"]
    video_url: VideoUrl


ContentPart = Annotated[Union[TextPart, ImagePart, AudioPart, VideoPart], Field(discriminator="type")]
PART_TYPES = ("text", "image_url", "input_audio", "video_url")


def _str_or_list(value) -> str | None:
    """The branch of a string-or-list field: only that branch validates, so an error names what is
    wrong inside a list (a part's field) instead of "not a string (and 1 more)". app.py drops the
    tag ("str" / "parts") from the error's location."""
    if isinstance(value, str):
        return "str"
    return "parts" if isinstance(value, list) else None


def _either(text, items, what: str):
    return Annotated[Union[Annotated[text, Tag("str")], Annotated[items, Tag("parts")]],
                     Discriminator(_str_or_list, custom_error_type="str_or_list_type", custom_error_message=what)]


UNION_FIELDS = ("content", "stop", "prompt")  # the fields typed with _either
TOOL_CHOICE_TAGS = ("mode", "named")  # tool_choice's branches (_tool_choice_branch), dropped from a field's path


def json_object_text(text: str) -> str:
    """An earlier call's arguments: a JSON object's text (a template writes them as an object; text
    that is not one would be pasted into the prompt as it is)."""
    import json

    try:
        value = json.loads(text)
    except ValueError as error:
        raise PydanticCustomError("arguments_json", "not JSON ({why}); send the arguments as a JSON object's text",
                                  {"why": str(error)}) from None
    if not isinstance(value, dict):
        raise PydanticCustomError("arguments_json", "not a JSON object; send the arguments as a JSON object's text")
    return text


class FunctionCall(_Body):
    name: str = Field(min_length=1)
    arguments: Annotated[str, AfterValidator(json_object_text)] = Field(
        description="the arguments as a JSON object's text")


class ToolCallBody(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: _either(str, list[ContentPart], "expected a string or an array of content parts") | None = Field(
        None, description="required, except in an assistant turn with tool_calls")
    name: str | None = None
    tool_calls: list[ToolCallBody] | None = Field(None, description="an assistant turn's function calls")
    tool_call_id: str | None = Field(None, description="a tool turn: the id of the call it answers")
    reasoning_content: str | None = Field(None, description="extension (vLLM's): an assistant turn's reasoning")

    @model_validator(mode="after")
    def _content_given(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant turn with tool_calls may leave it out)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant turn has tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool turn needs the tool_call_id of the call it answers")
        return self


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema of the arguments")
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str = Field(min_length=1)


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Body):
    include_usage: StrictBool = False


class JsonSchemaSpec(_Body):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Body):
    """Structured output (runtime/sampling/grammar.py): a keyword the grammar cannot enforce is a 400."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class ChatTemplateKwargs(BaseModel):
    model_config = ConfigDict(extra="allow")
    enable_thinking: StrictBool | None = None


def _tool_choice_branch(value) -> str | None:
    """tool_choice's branch (a mode's name or a named function), so that an error names the field and
    not pydantic's branches (`tool_choice.literal['none','auto','required']`)."""
    if isinstance(value, str):
        return "mode"
    return "named" if isinstance(value, dict) else None


def _unique_names(tools):
    """Each function once: a duplicate name makes a call ambiguous (OpenAI refuses it too)."""
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools or ()):
        if tool.function.name in seen:
            raise PydanticCustomError("duplicate_tool", "tools[{index}] repeats the function name '{name}' of "
                                      "tools[{first}]; each function needs a name of its own",
                                      {"index": index, "name": tool.function.name, "first": seen[tool.function.name]})
        seen[tool.function.name] = index
    return tools


NULLABLE = ("temperature", "top_p", "top_k", "n", "stream", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "min_p", "logprobs", "parallel_tool_calls", "echo")


class _Sampling(_Body):
    """The sampling fields both endpoints share; the defaults are OpenAI's. null is its default
    wherever OpenAI's API (or vLLM's, for its extensions) takes null (NULLABLE); booleans are
    booleans (pydantic's lax "yes" / "on" / 1 are refused)."""

    model: str = Field(min_length=1)
    temperature: float | None = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(0, ge=0, description="extension: 0 = off")
    max_tokens: int | None = Field(None, ge=1)
    stop: _either(str, list[Annotated[str, Field(min_length=1)]], "expected a string or an array of strings") | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    logit_bias: dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = None
    n: Literal[1] | None = Field(1, description="one choice per request")
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(1.0, gt=0, allow_inf_nan=False,
                                             description="extension (vLLM's): transformers' repetition penalty, 1 = off")
    min_p: float | None = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="extension (vLLM's): 0 = off")
    disable_spec_decode: StrictBool = Field(False, description="extension: vanilla decoding for this request")
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1, description=(
        "extension (vLLM's): higher is served first; a request waiting for a row pauses a running one of a "
        "lower priority, which resumes later with the same tokens"))
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "extension: seconds from its arrival after which the request ends with finish_reason 'timeout' and "
        "its answer so far (no tokens if it never started)"))
    guided_decoding: GuidedDecoding | None = Field(
        None, description="extension: the input file's guided_decoding, exactly one of json_schema, json_object, "
        "regex, choice or ebnf (not with response_format)")
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _options_need_stream(self):
        for name in NULLABLE:  # an explicit null: the default, as OpenAI reads it
            if name in type(self).model_fields and getattr(self, name) is None:
                setattr(self, name, type(self).model_fields[name].default)
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options needs stream: true")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: StrictBool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    enable_thinking: StrictBool | None = Field(None, description="extension: the chat template's thinking switch")
    chat_template_kwargs: ChatTemplateKwargs | None = None
    tools: Annotated[list[Tool], AfterValidator(_unique_names)] | None = Field(
        None, description="functions the model may call (the chat template shows them, also under tool_choice none)")
    tool_choice: Annotated[Union[Annotated[Literal["none", "auto", "required"], Tag("mode")],
                                 Annotated[NamedToolChoice, Tag("named")]],
                           Discriminator(_tool_choice_branch, custom_error_type="tool_choice_type",
                                         custom_error_message="expected none, auto, required or a named "
                                         "function (an object with type function and function.name)")] | None = Field(
        None, description="none, auto (the default with tools), required (one or more calls) or a named function "
        "(a call of it); required and named are enforced by a grammar")
    parallel_tool_calls: StrictBool | None = Field(True, description="false: the answer's first call only")

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def thinking(self) -> bool:
        if self.enable_thinking is not None:
            return self.enable_thinking
        kwargs = self.chat_template_kwargs
        return bool(kwargs and kwargs.enable_thinking)

    @property
    def num_logprobs(self) -> int:
        """K for the engine: the sampled token's logprob needs at least one candidate recorded."""
        return max(1, self.top_logprobs or 0) if self.logprobs else 0


def _one_prompt(value):
    """A list prompt must be one string: token ids and batches of prompts are refused by name."""
    if isinstance(value, list):
        if value and all(isinstance(v, (int, list)) and not isinstance(v, bool) for v in value):
            raise PydanticCustomError("prompt_tokens", "token ids are not supported; send the prompt as a string")
        if not value:
            raise PydanticCustomError("prompt_count", "an empty array; send the prompt as a string")
        if len(value) != 1:
            raise PydanticCustomError("prompt_count", "a list of {count} prompts; this server completes one prompt "
                                      "per request (send each as a request of its own)", {"count": len(value)})
    return value


class CompletionRequest(_Sampling):
    prompt: Annotated[_either(str, Annotated[list[str], Field(min_length=1, max_length=1)],
                              "expected a string (or an array of one string)"), BeforeValidator(_one_prompt)] = Field(
        description="one raw prompt (a list of one string is accepted)")
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: Literal[False] | None = False
    suffix: None = None
    best_of: Literal[1] | None = None

    @property
    def new_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def num_logprobs(self) -> int:
        return 0 if self.logprobs is None else max(1, self.logprobs)
