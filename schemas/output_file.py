"""The output file of ``trt-llm-run``: one response per request of the input file, in input order.

Serialize with ``OutputFile.to_json()``: it drops fields that are ``None`` (``logprobs`` when no
logprobs were asked for, ``error`` on success, ``time_to_first_token_ms`` when not measured), as the
reference does for ``logprobs``. ``messages`` is echoed as given (raw JSON), so ``None`` inside it
is kept.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# "timeout" (ours): the request's `timeout` passed; its answer so far (runtime/engine/preemption.py)
FinishReason = Literal["end-of-sequence", "max-length", "stop-words", "error", "timeout"]
Byte = Annotated[int, Field(ge=0, le=255)]
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class LogprobCandidate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_id: int = Field(ge=0)
    token: str = Field(description="The token decoded as UTF-8, invalid bytes as U+FFFD (lossy).")
    bytes: list[Byte] = Field(description="The raw token bytes (concatenate across tokens for exact text).")
    logprob: float = Field(description="log(softmax(logits)) at temperature 1.")


class Segment(BaseModel):
    """One segment of a Whisper transcription with timestamps, as OpenAI's verbose_json has it."""
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=0)
    seek: int = Field(ge=0, description="The window's first mel frame (10 ms each).")
    start: float = Field(ge=0, description="Seconds from the clip's start.")
    end: float = Field(ge=0)
    text: str
    tokens: list[int] = Field(description="Its tokens, the timestamp tokens at both ends included.")
    temperature: float = Field(ge=0, description="The temperature its window was decoded at.")
    avg_logprob: float = Field(description="Its window's average token log-probability (<|endoftext|> counted).")
    compression_ratio: float = Field(description="Its window's tokens: raw bytes over zlib's.")
    no_speech_prob: float | None = Field(None, description="Its window's probability of <|nocaptions|>.")


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_idx: int = Field(ge=0, description="Index of the request in the input file.")
    batch_idx: int = Field(ge=0, description="Position of the request inside its batch.")
    output_text: str
    reasoning_text: str | None = Field(
        None, description="Beyond the reference: a reasoning model's <think> block (without its tags), when the "
        "chat template has one and the output holds one; output_text stays the whole text.")
    content_text: str | None = Field(
        None, description="With reasoning_text: the answer after the block (output_text without it).")
    finish_reason: FinishReason
    error: str | None = Field(None, description="Why the request failed; only with finish_reason 'error'.")
    logprobs: list[list[LogprobCandidate]] | None = Field(
        None, description="Per generated token, the top num_logprobs candidates; only when K > 0.")
    sampled_tokens: list[LogprobCandidate] | None = Field(
        None, description="Beyond the reference: the token sampled at each step with its bytes and "
        "logprob, so the text can be rebuilt byte-exactly even where it is outside the top K; "
        "only when K > 0.")
    messages: list[Any] = Field(default_factory=list, description="The request's messages, as given.")
    formatted_system_prompt: str = ""
    formatted_complete_request: str = ""
    prompt_tokens: int = Field(0, ge=0)
    generated_tokens: int = Field(0, ge=0)
    reused_tokens: int = Field(0, ge=0, description="Prompt tokens taken from a saved KV cache.")
    output_token_ids: list[int] = Field(default_factory=list)
    time_to_first_token_ms: float | None = Field(None, ge=0)
    segments: list[Segment] | None = Field(
        None, description="A Whisper transcription with timestamps: its segments (output_text is their text).")
    language: str | None = Field(None, description="A Whisper transcription's language (ISO 639-1), given or "
                                 "detected.")
    duration: float | None = Field(None, ge=0, description="A Whisper transcription's clip, in seconds.")
    embedding: list[float] | None = Field(
        None, description="Extension: a request of task embed's vector (float32 values, L2-normalised); its "
        "prompt_tokens the tokens embedded, its finish_reason end-of-sequence.")

    @model_validator(mode="after")
    def _error_has_reason(self) -> Response:
        # A failed request must say why; the user otherwise only sees an empty output_text.
        if self.finish_reason == "error" and not self.error:
            raise ValueError("finish_reason 'error' needs an 'error' message")
        return self


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file: str
    responses: list[Response]

    def to_json(self, indent: int | None = 2) -> str:
        """The file's text. ``None`` fields are omitted (see module doc); non-ASCII is kept as is
        (write it with ``encoding="utf-8"``), lone surrogates escaped."""
        # Python mode: every field already holds JSON types, and pydantic's JSON mode cannot encode
        # a lone surrogate in a key of an echoed message (it raises), which json.dumps can.
        data = self.model_dump(exclude_none=True)
        text = json.dumps(data, indent=indent, ensure_ascii=False) + "\n"
        # An echoed message (or a file name) may hold a lone surrogate ("\ud800" in the input):
        # it has no UTF-8 form, so it is written back as the JSON escape it came in as. Only
        # string contents can hold one, so this keeps the JSON valid and the value exact.
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


__all__ = ["FinishReason", "LogprobCandidate", "Response", "OutputFile", "Segment"]
