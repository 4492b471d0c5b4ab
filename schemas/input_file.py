"""The input file of ``trt-llm-run`` (see docs: input JSON format) and a loader that loses nothing.

The models carry every limit as a pydantic constraint, so the generated JSON Schema states them
too. ``load_input_file`` validates each request on its own: one bad request becomes a
``RequestError`` in its slot and the others still run; only whole-file problems raise.

Models are ``strict``: JSON ``"0.7"`` is not a number and ``1.0`` is not an integer (the reference
executor's JSON library rejects them too). Unknown keys are ignored but reported as warnings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field,
                      Tag, ValidationError, WithJsonSchema, model_validator)
from pydantic_core import PydanticCustomError

from ._errors import did_you_mean, format_errors, json_type

# The reference's limits (see reference-behaviour.md, "Limits and errors").
MAX_BATCH_SIZE = 16
MAX_MESSAGES = 64
MAX_CONTENT_ITEMS = 16
MAX_TEXT_BYTES = 128 * 1024
MAX_NUM_LOGPROBS = 50
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_LOGIT_BIAS = 100.0
INT32_MAX = 2**31 - 1

# Two-sided limits, so a message can say "51 is outside [0, 50]" whichever side was crossed.
RANGES = {
    "batch_size": f"[1, {MAX_BATCH_SIZE}]",
    "num_logprobs": f"[0, {MAX_NUM_LOGPROBS}]",
    "logit_bias": f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
    "top_p": "(0, 1]",
    "presence_penalty": "[-2, 2]",
    "frequency_penalty": "[-2, 2]",
    "min_p": "[0, 1]",
}

_STRICT_IGNORE = ConfigDict(strict=True, extra="ignore")


# --- field types -------------------------------------------------------------------------------

def _check_text(text: str) -> str:
    """One text is limited in UTF-8 bytes (not characters), and must be encodable at all."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate from a "\ud800" JSON escape
        raise PydanticCustomError("text_encoding", "not valid Unicode text (unpaired surrogate at "
                                  "position {pos})", {"pos": e.start}) from None
    if size > MAX_TEXT_BYTES:
        raise PydanticCustomError("text_too_long", "{actual} bytes, at most {limit} allowed",
                                  {"actual": size, "limit": MAX_TEXT_BYTES})
    return text


# The byte limit cannot be said in JSON Schema; maxLength (characters) is a necessary condition.
Text = Annotated[str, AfterValidator(_check_text),
                 Field(json_schema_extra={"maxLength": MAX_TEXT_BYTES},
                       description=f"At most {MAX_TEXT_BYTES} bytes of UTF-8.")]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def _token_id(key: Any) -> int:
    # JSON object keys are always strings; accept plain decimal ones only ("12", not "1e3",
    # " 12", "-1" or "١٢"), and real ints for callers building dicts in Python.
    if isinstance(key, str) and key.isascii() and key.isdigit():
        key = int(key)
    if isinstance(key, int) and not isinstance(key, bool) and 0 <= key <= INT32_MAX:
        return key
    raise PydanticCustomError("token_id", "key is not a token id (expected a decimal integer in "
                              "[0, {max}])", {"max": INT32_MAX})


TokenId = Annotated[int, BeforeValidator(_token_id),
                    WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,10}$"})]
Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS, allow_inf_nan=False)]
LogitBias = Annotated[dict[TokenId, Bias], Field(
    max_length=MAX_LOGIT_BIAS_ENTRIES,
    json_schema_extra={"additionalProperties": False},  # only token-id keys (patternProperties)
    description="Sparse map from token id (decimal string) to an additive logit bias.")]
NumLogprobs = Annotated[int, Field(ge=0, le=MAX_NUM_LOGPROBS)]
# The penalties and min_p, with OpenAI's and transformers' ranges.
OpenAIPenalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
def _positive(value: float) -> float:
    # (Field(gt=0) would say "0 must be greater than 0.0": pydantic keeps a float bound as a float.)
    if not value > 0:
        raise PydanticCustomError("repetition_penalty", "{value} must be > 0 (1 = off)",
                                  {"value": int(value) if value.is_integer() else value})
    return value


RepetitionPenalty = Annotated[float, Field(allow_inf_nan=False, json_schema_extra={"exclusiveMinimum": 0}),
                              AfterValidator(_positive)]
MinP = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")


# --- messages ----------------------------------------------------------------------------------

class TextContent(BaseModel):
    model_config = _STRICT_IGNORE
    type: Literal["text"]
    text: Text


class ImageContent(BaseModel):
    model_config = _STRICT_IGNORE
    type: Literal["image"]
    image: NonEmptyStr = Field(description="Path to an image file (absolute or relative).")
    pan_and_scan: bool | None = Field(
        None, description="Gemma 3: also cut the image into crops seen beside it (transformers' do_pan_and_scan); "
                          "default: the engine's image processor config (off as published). Other families refuse true.")


class AudioContent(BaseModel):
    model_config = _STRICT_IGNORE
    type: Literal["audio"]
    audio: NonEmptyStr = Field(description="Path to a .wav / .mp3 / .flac file.")


def _video_source(value: Any) -> str | None:
    # The video's one path or URL, or its frames: only the branch of the JSON type is checked (as Content).
    return "path" if isinstance(value, str) else "frames" if isinstance(value, list) else None


VideoSource = Annotated[
    Union[Annotated[NonEmptyStr, Tag("path")],
          Annotated[list[NonEmptyStr], Field(min_length=1, max_length=768), Tag("frames")]],
    Discriminator(_video_source, custom_error_type="video_type",
                  custom_error_message="expected a path or URL string, or an array of frame images")]


class VideoContent(BaseModel):
    """A video for a Qwen2.5-VL / Qwen3-VL engine (docs/input-format.md): its frames sampled at `fps`
    and resized as transformers' video processors do (runtime/media/video)."""
    model_config = _STRICT_IGNORE
    type: Literal["video"]
    video: VideoSource = Field(
        description="A video file (MP4/MOV, Matroska/WebM, AVI, MPEG-TS: a path, file:// or data: URL), "
                    "or its frames as a list of images (a clip already sampled, at `fps`).")
    fps: Annotated[float, Field(gt=0, le=120, allow_inf_nan=False)] | None = Field(
        None, description="Frames sampled a second (default 2); for a list of frames, their rate.")
    max_frames: Annotated[int, Field(ge=2, le=768)] | None = Field(
        None, description="Most frames sampled (default 768).")
    min_pixels: Annotated[int, Field(ge=1)] | None = Field(None, description="Fewest pixels a frame is resized to.")
    max_pixels: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Most pixels a frame is resized to (within the engine's image limits).")


ContentItem = Annotated[Union[TextContent, ImageContent, AudioContent, VideoContent],
                        Field(discriminator="type")]
CONTENT_TYPES = ("text", "image", "audio", "video")


def _str_or_list(value: Any) -> str | None:
    # A callable discriminator instead of a plain union: with a plain union pydantic reports the
    # failure of *both* branches; this way only the branch matching the JSON type is checked.
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "parts"
    return None


Content = Annotated[
    Union[Annotated[Text, Tag("str")],
          Annotated[list[ContentItem], Field(max_length=MAX_CONTENT_ITEMS), Tag("parts")]],
    Discriminator(_str_or_list, custom_error_type="content_type",
                  custom_error_message="expected a string or an array of content items")]

StopStr = Annotated[NonEmptyStr, AfterValidator(_check_text)]
Stop = Annotated[
    Union[Annotated[StopStr, Tag("str")], Annotated[list[StopStr], Tag("parts")]],
    Discriminator(_str_or_list, custom_error_type="stop_type",
                  custom_error_message="expected a string or an array of strings")]


def _arguments(text: Any) -> Any:
    """A call's arguments: an object, or text that holds a JSON object (the template gets that object;
    other text would be pasted into the prompt as it is). Checked before the union, so that an error
    names the field and not pydantic's branches."""
    if isinstance(text, dict):
        return text
    if not isinstance(text, str):
        raise PydanticCustomError("arguments_json", "expected a JSON object or its text, got {kind}",
                                  {"kind": json_type(text)})
    try:
        value = json.loads(text)
    except ValueError as error:
        raise PydanticCustomError("arguments_json", "not JSON ({why}); give the arguments as a JSON object "
                                  "or its text", {"why": str(error)}) from None
    if not isinstance(value, dict):
        raise PydanticCustomError("arguments_json", "not a JSON object; give the arguments as a JSON object or its text")
    return text


class ToolCallFunction(BaseModel):
    model_config = _STRICT_IGNORE
    name: NonEmptyStr
    arguments: Annotated[str | dict[str, Any], BeforeValidator(_arguments)] = Field(
        description="The arguments as a JSON object's text (OpenAI's form) or an object; the chat template gets an "
        "object.")


class ToolFunction(BaseModel):
    """A function definition as the server's (OpenAI's) takes it."""
    model_config = _STRICT_IGNORE
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema of the arguments.")
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = _STRICT_IGNORE
    type: Literal["function"]
    function: ToolFunction


def _tool(value: dict[str, Any]) -> dict[str, Any]:
    """One tool checked as the server checks it; kept as the dict the chat template gets."""
    from ._errors import describe, path_of

    try:
        ToolDefinition.model_validate(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise PydanticCustomError("tool", "{where}: {why}", {"where": path_of(first["loc"]) or "tool",
                                                             "why": describe(first)}) from None
    return value


def _unique_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:
            raise PydanticCustomError("tool", "tools[{index}] repeats the function name '{name}' of tools[{first}]; "
                                      "each function needs a name of its own",
                                      {"index": index, "name": name, "first": seen[name]})
        seen[name] = index
    return tools


class ToolCall(BaseModel):
    """An earlier assistant turn's call (OpenAI's shape), rendered by the chat template."""
    model_config = _STRICT_IGNORE
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(BaseModel):
    model_config = _STRICT_IGNORE
    role: Literal["system", "user", "assistant", "tool"]
    content: Content = Field(description="Required, except in an assistant turn with tool_calls (then \"\").")
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant turn's function calls.")
    tool_call_id: str | None = Field(None, description="A tool turn: the id of the call it answers.")
    reasoning_content: str | None = Field(None, description="An assistant turn's reasoning (its <think> block).")

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        # OpenAI's assistant turn that only calls tools has content null (or none at all).
        if (isinstance(data, dict) and data.get("role") == "assistant" and data.get("tool_calls")
                and data.get("content") is None):
            return {**data, "content": ""}
        return data

    def parts(self) -> list[TextContent | ImageContent | AudioContent | VideoContent]:
        """Content as a list of items; a plain string is one text item."""
        if isinstance(self.content, str):
            return [TextContent(type="text", text=self.content)]
        return list(self.content)


# --- structured output -------------------------------------------------------------------------

class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema the answer must validate against.")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: free text, any JSON object, or a JSON Schema (runtime/sampling/grammar.py)."""
    model_config = _STRICT_IGNORE
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise PydanticCustomError("json_schema", "json_schema is required with type json_schema, and only then")
        return self


MAX_CHOICES = 1024
GUIDED_MODES = ("json_schema", "json_object", "regex", "choice", "ebnf")
NonEmptyText = Annotated[str, Field(min_length=1), AfterValidator(_check_text),
                         Field(json_schema_extra={"maxLength": MAX_TEXT_BYTES})]


def _true(value: bool) -> bool:
    if value is not True:
        raise PydanticCustomError("json_object", "must be true (leave guided_decoding out for free text)")
    return value


class GuidedDecoding(BaseModel):
    """Exactly one constraint on the answer (runtime/sampling/grammar.py, llguidance): a JSON Schema,
    any JSON object, a regex the whole answer matches, one of fixed strings, or a grammar in
    llguidance's Lark syntax (a llama.cpp GBNF grammar is converted); `grammar` is `ebnf`'s other name."""
    model_config = ConfigDict(strict=True, extra="ignore", json_schema_extra={"minProperties": 1})
    json_schema: dict[str, Any] | None = Field(None, description="A JSON Schema the answer validates against.")
    json_object: Annotated[bool, AfterValidator(_true), WithJsonSchema({"const": True, "type": "boolean"})] | None = \
        Field(None, description="true: the answer is any JSON object.")
    regex: NonEmptyText | None = Field(None, description="A regex (Rust regex syntax) the whole answer matches.")
    choice: Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_CHOICES)] | None = Field(
        None, description="The answer is exactly one of these strings.")
    ebnf: NonEmptyText | None = Field(
        None, description="A grammar in llguidance's Lark syntax (start: ...), or llama.cpp's GBNF (root ::= ...).")
    grammar: NonEmptyText | None = Field(None, description="Another name of ebnf.")

    @model_validator(mode="after")
    def _one_mode(self):
        given = [name for name in (*GUIDED_MODES, "grammar") if getattr(self, name) is not None]
        if len(given) != 1:
            raise PydanticCustomError("guided_decoding", "expected exactly one of json_schema, json_object, regex, "
                                      "choice or ebnf, got {got}", {"got": " and ".join(given) or "none"})
        return self

    def mode(self) -> tuple[str, str, Any]:
        """(the field as written, the mode grammar.py compiles, its value)."""
        for name in (*GUIDED_MODES, "grammar"):
            value = getattr(self, name)
            if value is not None:
                return name, "ebnf" if name == "grammar" else name, value
        raise AssertionError("validated: one mode is set")


# --- requests and the file ---------------------------------------------------------------------

LookupPolicy = Literal["use_cache", "bypass"]
CommitPolicy = Literal["including_generated_tokens", "prefill_state_only"]


class Request(BaseModel):
    model_config = _STRICT_IGNORE
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: Annotated[list[Annotated[dict[str, Any], AfterValidator(_tool)]], AfterValidator(_unique_tools)] | None = Field(
        None, description="Function definitions (OpenAI's tools: {type: function, function: {name, description, "
        "parameters}}), given to the chat template as transformers' apply_chat_template(tools=...) does.")
    lora_name: str | None = Field(None, description="A key of available_lora_weights.")
    save_system_prompt_kv_cache: bool = False
    disable_spec_decode: bool = False
    logit_bias: LogitBias | None = Field(None, description="Overrides the top-level logit_bias.")
    num_logprobs: NumLogprobs | None = Field(None, description="Overrides the top-level num_logprobs.")
    stop: Stop | None = Field(None, description="String(s) that end generation; excluded from the output.")
    response_format: ResponseFormat | None = Field(
        None, description="Structured output: {type: json_object} or {type: json_schema, json_schema: {schema: ...}}.")
    guided_decoding: GuidedDecoding | None = Field(
        None, description="Replaces the top-level guided_decoding (null: none for this request); not with "
        "response_format.")
    context_cache_lookup_policy: LookupPolicy | None = Field(
        None, description="Overrides the top-level context_cache_lookup_policy.")
    context_cache_commit_policy: CommitPolicy | None = Field(
        None, description="Overrides the top-level context_cache_commit_policy.")
    presence_penalty: OpenAIPenalty | None = Field(None, description="Overrides the top-level presence_penalty.")
    frequency_penalty: OpenAIPenalty | None = Field(None, description="Overrides the top-level frequency_penalty.")
    repetition_penalty: RepetitionPenalty | None = Field(
        None, description="Overrides the top-level repetition_penalty.")
    min_p: MinP | None = Field(None, description="Overrides the top-level min_p.")
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1, description=(
        "Extension (vLLM's): with --scheduling continuous, higher is served first (first come, first served "
        "within a priority), and a request waiting for a row pauses a running one of a lower priority, "
        "which resumes later with the tokens it would have had. Static scheduling reads it not."))
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "Extension: seconds from the start of the run after which the request ends with finish_reason "
        "'timeout': its answer so far, or no tokens if it never started."))
    task: Literal["generate", "embed"] = Field(
        "generate", description="Extension: embed answers the embedding of the request's one message's text (no chat "
        "template; the tokenizer's special tokens as for a prompt) in the response's embedding, instead of "
        "generating: the final norm's hidden states pooled (`pooling`) and L2-normalised.")
    pooling: Literal["last", "mean"] | None = Field(
        None, description="With task embed: the last token's hidden state or the mean over the tokens; default: the "
        "checkpoint's sentence-transformers pooling config, else last.")

    @model_validator(mode="after")
    def _embedding(self):
        if self.task != "embed":
            if self.pooling is not None:
                raise PydanticCustomError("pooling", "pooling: only with task embed")
            return self
        media = sum(part.type != "text" for message in self.messages for part in message.parts())
        if len(self.messages) != 1 or media:
            raise PydanticCustomError("messages", "messages: task embed takes one message of text (got {n} messages, "
                                      "{media} non-text parts)", {"n": len(self.messages), "media": media})
        given = [name for name in ("tools", "lora_name", "response_format", "guided_decoding")
                 if getattr(self, name) is not None]
        if given:
            raise PydanticCustomError("task", "{names}: not with task embed", {"names": ", ".join(given)})
        return self

    def embedding_text(self) -> str:
        """task embed: the text its message's parts make."""
        return "".join(part.text for part in self.messages[0].parts())

    @model_validator(mode="after")
    def _one_constraint(self):
        if self.response_format is not None and self.guided_decoding is not None:
            raise PydanticCustomError("guided_decoding", "response_format and guided_decoding both given; use one "
                                      "(guided_decoding's json_schema and json_object are response_format's)")
        return self

    def resolved_guided_decoding(self, settings: InputSettings) -> tuple[GuidedDecoding | None, bool]:
        """(the constraint, whether it is the file's default): the request's own guided_decoding (an
        explicit null: none), else none when it has a response_format, else the top-level one."""
        if "guided_decoding" in self.model_fields_set or self.response_format is not None:
            return self.guided_decoding, False
        return settings.guided_decoding, settings.guided_decoding is not None

    def resolved_penalties(self, settings: InputSettings) -> dict[str, float]:
        """presence_penalty, frequency_penalty, repetition_penalty, min_p: the request's own, else the file's."""
        return {name: getattr(settings, name) if getattr(self, name) is None else getattr(self, name)
                for name in PENALTY_FIELDS}

    def resolved_logit_bias(self, settings: InputSettings) -> dict[int, float]:
        """The request's map if it has one (even an empty one), else the file's default."""
        if self.logit_bias is not None:
            return dict(self.logit_bias)
        return dict(settings.logit_bias or {})

    def resolved_num_logprobs(self, settings: InputSettings) -> int:
        return settings.num_logprobs if self.num_logprobs is None else self.num_logprobs

    def resolved_context_policies(self, settings: InputSettings) -> tuple[str, str]:
        """(lookup, commit): the request's own, else the file's."""
        return (self.context_cache_lookup_policy or settings.context_cache_lookup_policy,
                self.context_cache_commit_policy or settings.context_cache_commit_policy)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


STANDARD_FALLBACK = [0.2, 0.4, 0.6, 0.8, 1.0]  # openai-whisper's temperatures after 0


class VadParameters(BaseModel):
    """Silero VAD's settings (faster-whisper's VadOptions; the defaults its batched pipeline uses)."""
    model_config = _STRICT_IGNORE
    threshold: float = Field(0.5, gt=0, lt=1, allow_inf_nan=False,
                             description="A 32 ms frame whose speech probability is at least this is speech.")
    neg_threshold: float | None = Field(
        None, gt=0, lt=1, allow_inf_nan=False, description="Speech ends under this (null: threshold - 0.15, at "
        "least 0.01).")
    min_speech_duration_ms: int = Field(0, ge=0, description="Shorter speech is dropped.")
    max_speech_duration_s: float = Field(
        30.0, gt=0, le=30, allow_inf_nan=False, description="Longer speech is cut (at its last silence over 98 ms "
        "if it has one): at most Whisper's 30 s window.")
    min_silence_duration_ms: int = Field(160, ge=0, description="Speech ends after this much silence.")
    speech_pad_ms: int = Field(400, ge=0, description="Each stretch of speech is widened by this on both sides.")


class WhisperSettings(BaseModel):
    """A Whisper engine's transcription settings (runtime/media/audio/longform.py). The first decode of
    a window is at the file's `temperature` (0 = greedy); the thresholds decide when a window is
    decoded again at the next `temperature_fallback` and when it is skipped as silence."""
    model_config = _STRICT_IGNORE
    return_timestamps: bool = Field(
        False, description="Segments with start and end times (the response's segments). A clip over 30 s is "
        "always transcribed window by window, with timestamps.")
    language: NonEmptyStr | None = Field(
        None, description="The spoken language: an ISO 639-1 code (en, fr, ...). None: English on an English-only "
        "model, detected on a multilingual one.")
    task: Literal["transcribe", "translate"] = Field(
        "transcribe", description="translate: into English (multilingual models only).")
    condition_on_prev_tokens: bool = Field(
        False, description="Each window's prompt holds the text of the windows before it.")
    temperature_fallback: list[Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]] = Field(
        default_factory=list, max_length=10, description=f"Temperatures tried, in order, when a window's decode "
        f"fails compression_ratio_threshold or logprob_threshold (openai-whisper's: {STANDARD_FALLBACK}); "
        "empty: none (greedy and deterministic at temperature 0). Sampling uses the file's seed (0 when none).")
    compression_ratio_threshold: float | None = Field(
        2.4, gt=0, allow_inf_nan=False, description="A decode whose tokens compress (zlib) better than this is "
        "too repetitive: the next fallback temperature. null: off.")
    logprob_threshold: float | None = Field(
        -1.0, allow_inf_nan=False, description="A decode whose average token log-probability is under this: the "
        "next fallback temperature. null: off.")
    no_speech_threshold: float | None = Field(
        0.6, ge=0, le=1, allow_inf_nan=False, description="A window under logprob_threshold whose no-speech "
        "probability is over this is skipped as silence. null: off.")
    max_audio_seconds: float = Field(
        7200.0, gt=0, allow_inf_nan=False, description="Longer clips are refused (before they are decoded).")
    vad_filter: bool = Field(
        False, description="Transcribe only the speech: Silero VAD cuts the clip into chunks of at most 30 s "
        "(silences left out), decoded side by side, each as a clip of its own; the segments' times are the "
        "clip's. Needs the silero-vad package (trt-llm[vad]).")
    vad_parameters: VadParameters = Field(default_factory=VadParameters,
                                          description="The voice activity detection's settings (with vad_filter).")


class InputSettings(BaseModel):
    """The top-level fields of an input file (everything but ``requests``)."""
    model_config = _STRICT_IGNORE
    batch_size: int = Field(1, ge=1, le=MAX_BATCH_SIZE, description="Requests per batch.")
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False, description="0 = greedy.")
    top_p: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(50, ge=0, description="0 = off.")
    logit_bias: LogitBias | None = None
    max_generate_length: int = Field(256, ge=1)
    num_logprobs: NumLogprobs = 0
    presence_penalty: OpenAIPenalty = Field(
        0.0, description="OpenAI's: each token generated so far loses this from its logit (0 = off).")
    frequency_penalty: OpenAIPenalty = Field(
        0.0, description="OpenAI's: each token generated so far loses this times its count from its logit (0 = off).")
    repetition_penalty: RepetitionPenalty = Field(
        1.0, description="transformers': each token of the prompt or generated so far has its logit divided by "
        "this (multiplied where negative); 1 = off.")
    min_p: MinP = Field(0.0, description="Sampling drops a token less likely than min_p times the most likely "
                                         "one (0 = off).")
    guided_decoding: GuidedDecoding | None = Field(
        None, description="The default constraint of every request (a request's own guided_decoding or "
        "response_format replaces it).")
    apply_chat_template: bool = True
    add_generation_prompt: bool = True
    enable_thinking: bool = False
    available_lora_weights: dict[str, NonEmptyStr] = Field(
        default_factory=dict, description="LoRA adapter name -> file path.")
    seed: int | None = Field(None, ge=0, le=2**64 - 1, description="Sampling seed; none = random.")
    context_cache_lookup_policy: LookupPolicy = Field(
        "use_cache", description="With context reuse on: use_cache restores a request's longest cached prefix, "
        "bypass computes it whole and commits nothing.")
    context_cache_commit_policy: CommitPolicy = Field(
        "including_generated_tokens", description="With context reuse on: what a request leaves in the cache, "
        "its prompt and generated tokens, or its prompt only (prefill_state_only).")
    whisper: WhisperSettings = Field(default_factory=WhisperSettings,
                                     description="Transcription settings of a Whisper engine.")
    speculation: Literal["prompt-lookup", "prompt_lookup", "eagle", "mtp", "none"] | None = Field(
        None, description="Extension: the run's decoding strategy (trt-llm-run --speculation wins over it): "
        "prompt-lookup (guesses from the request's own text, verified by the base), eagle (the engine's draft), "
        "none; unset: the engine's draft if it has one, else none. Tokens are vanilla's whichever runs.")


class InputFile(InputSettings):
    """The whole file, for the JSON Schema and for strict all-or-nothing validation."""
    requests: list[Request] = Field(min_length=1)


# --- loading -----------------------------------------------------------------------------------

class InputFileError(ValueError):
    """The file as a whole cannot be used (unreadable, not JSON, bad top-level field, ...)."""


@dataclass(frozen=True)
class RequestError:
    """A request that failed validation; ``message`` starts with ``requests[<index>]``."""
    index: int
    message: str
    raw: Any = field(default=None, repr=False, compare=False)  # the request as given

    def raw_messages(self) -> list[Any]:
        """The request's ``messages`` as given, for echoing into the output file."""
        return messages_as_given(self.raw)


def messages_as_given(raw: Any) -> list[Any]:
    """A raw request's ``messages`` for echoing into the output file ([] where there is no list)."""
    msgs = raw.get("messages") if isinstance(raw, dict) else None
    return msgs if isinstance(msgs, list) else []


@dataclass
class LoadedInput:
    source: str
    settings: InputSettings
    requests: list[Request | RequestError]  # one slot per request of the file, in file order
    warnings: list[str]
    raw_requests: list[Any]  # as given (for echoing ``messages`` into the output file)

    @property
    def errors(self) -> list[RequestError]:
        return [r for r in self.requests if isinstance(r, RequestError)]

    def messages(self, index: int) -> list[Any]:
        """Request `index`'s ``messages`` as given, for echoing into the output file."""
        return messages_as_given(self.raw_requests[index])


def load_input_file(path: str | Path) -> LoadedInput:
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")  # tolerate a BOM
    except OSError as e:
        raise InputFileError(f"{source}: cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputFileError(f"{source}: not UTF-8 text (byte {e.start})") from None
    duplicates: dict[int, list[str]] = {}
    try:
        data = json.loads(text, parse_constant=_reject_constant,
                          object_pairs_hook=lambda pairs: _object(pairs, duplicates))
    except json.JSONDecodeError as e:
        raise InputFileError(f"{source}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # NaN / Infinity, or an integer too long for Python to parse
        raise InputFileError(f"{source}: not valid JSON: {e}") from None
    except RecursionError:
        raise InputFileError(f"{source}: not valid JSON: nested too deeply") from None
    loaded = parse_input_dict(data, source)
    if duplicates:
        loaded.warnings[:0] = [f"{where}: duplicate key {key!r}; the last value is used"
                               for where, key in _duplicate_keys(data, duplicates)]
    return loaded


def _object(pairs: list[tuple[str, Any]], duplicates: dict[int, list[str]]) -> dict:
    # JSON allows a key twice in one object and keeps the last; a user who wrote it twice most
    # likely meant one of them, so each one is reported (by the object's id, located below).
    result = dict(pairs)
    if len(result) < len(pairs):
        seen: set[str] = set()
        duplicates[id(result)] = [k for k, _ in pairs if k in seen or seen.add(k)]
    return result


def _duplicate_keys(value: Any, duplicates: dict[int, list[str]], where: str = "") -> list[tuple[str, str]]:
    """(path, key) of each duplicate key in the decoded document, in document order."""
    found = []
    if isinstance(value, dict):
        found += [(where or "top level", key) for key in dict.fromkeys(duplicates.get(id(value), []))]
        for key, item in value.items():
            found += _duplicate_keys(item, duplicates, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _duplicate_keys(item, duplicates, f"{where}[{index}]")
    return found


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_input_dict(data: Any, source: str = "<input>") -> LoadedInput:
    """Validate decoded JSON. Raises InputFileError only for whole-file problems."""
    if not isinstance(data, dict):
        raise InputFileError(f"{source}: the top level must be a JSON object, got {json_type(data)}")
    if "requests" not in data:
        raise InputFileError(f"{source}: no 'requests' array")
    raw_requests = data["requests"]
    if not isinstance(raw_requests, list):
        raise InputFileError(f"{source}: 'requests' must be an array, got {json_type(raw_requests)}")
    if not raw_requests:
        raise InputFileError(f"{source}: 'requests' is empty; at least one request is required")

    warnings = _unknown_keys(data, InputFile, "top level")
    warnings += _unknown_keys(data.get("guided_decoding"), GuidedDecoding, "guided_decoding")
    whisper = data.get("whisper")
    warnings += _unknown_keys(whisper, WhisperSettings, "whisper")
    warnings += _unknown_keys(whisper.get("vad_parameters") if isinstance(whisper, dict) else None, VadParameters,
                              "whisper.vad_parameters")
    try:
        settings = InputSettings.model_validate({k: v for k, v in data.items() if k != "requests"})
    except ValidationError as e:
        raise InputFileError(f"{source}: " + "; ".join(format_errors(e, ranges=RANGES))) from None

    requests: list[Request | RequestError] = []
    for i, raw in enumerate(raw_requests):
        warnings += _request_warnings(raw, i)
        requests.append(_validate_request(raw, i, settings))
    return LoadedInput(source, settings, requests, warnings, list(raw_requests))


def _validate_request(raw: Any, i: int, settings: InputSettings) -> Request | RequestError:
    prefix = f"requests[{i}]"
    try:
        req = Request.model_validate(raw)
    except ValidationError as e:
        return RequestError(i, "; ".join(format_errors(e, prefix, RANGES)), raw)
    # Checks that need the file's settings, or that the format allows but we cannot run.
    problems = []
    if req.lora_name is not None and req.lora_name not in settings.available_lora_weights:
        known = ", ".join(sorted(settings.available_lora_weights)) or "none"
        problems.append(f"{prefix}.lora_name: {req.lora_name!r} is not in available_lora_weights (known: {known})")
    return RequestError(i, "; ".join(problems), raw) if problems else req


# --- unknown-key warnings ----------------------------------------------------------------------

_CONTENT_MODELS = {"text": TextContent, "image": ImageContent, "audio": AudioContent, "video": VideoContent}


def _unknown_keys(obj: Any, model: type[BaseModel], where: str, hint_from: type[BaseModel] | None = None) -> list[str]:
    if not isinstance(obj, dict):
        return []  # a type error, reported by validation
    known = model.model_fields
    out = []
    for key in obj:
        if key in known:
            continue
        hint = did_you_mean(str(key), known)
        if not hint and hint_from is not None and key in hint_from.model_fields:
            hint = f" ({key!r} is a top-level setting)"
        out.append(f"{where}: unknown key {str(key)!r} ignored{hint}")
    return out


def _request_warnings(raw: Any, i: int) -> list[str]:
    where = f"requests[{i}]"
    out = _unknown_keys(raw, Request, where, hint_from=InputSettings)
    if isinstance(raw, dict):
        out += _unknown_keys(raw.get("guided_decoding"), GuidedDecoding, f"{where}.guided_decoding")
    messages = raw.get("messages") if isinstance(raw, dict) else None
    for m, msg in enumerate(messages if isinstance(messages, list) else []):
        out += _unknown_keys(msg, Message, f"{where}.messages[{m}]")
        content = msg.get("content") if isinstance(msg, dict) else None
        for c, item in enumerate(content if isinstance(content, list) else []):
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind in _CONTENT_MODELS:
                out += _unknown_keys(item, _CONTENT_MODELS[kind], f"{where}.messages[{m}].content[{c}]")
    return out


__all__ = [
    "TextContent", "ImageContent", "AudioContent", "VideoContent", "ContentItem", "Message",
    "Request", "GuidedDecoding", "InputSettings", "InputFile", "InputFileError", "RequestError", "LoadedInput",
    "load_input_file", "parse_input_dict", "RANGES", "CONTENT_TYPES",
]
