"""POST /v1/audio/transcriptions: OpenAI's speech-to-text endpoint, on an engine whose audio component
is Whisper's (`runner.audio.kind == "cross_attention"`).

The form (multipart/form-data, as OpenAI's clients send it) becomes the input file's `Request`: one
user message with the uploaded bytes as an audio part (a data: URL) and the `prompt` as a text part,
the previous text Whisper continues from (runtime/media/audio/transcription.py). From there it takes the chat
route's path: `RequestPreparer.prepare` (decoding, the clip limits, the encoder) off the event loop,
then the server's one `ServingEngine`, with its queue, timeout, disconnect and error handling
(app.py's `_next`). The answer is the transcription's text without the space Whisper's first token
starts with, as OpenAI's API answers: `{"text": ..., "usage": ...}` (json, the default) or the bare
text (text).

Fields: file and model (required), prompt, response_format (json, text), temperature ([0, 1], plain
sampling: 0 is greedy, with no fallback to higher temperatures), language ("en" or absent: the
runtime transcribes English, see runtime/media/audio/transcription.py). OpenAI's other fields (timestamps,
verbose_json / srt / vtt, streaming, chunking, include) are refused with a 400 naming the field,
never ignored, as every unknown one is.
"""

from __future__ import annotations

import base64
import importlib.util

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from trt_llm.runtime.media.sources import _shown
from trt_llm.runtime.text.prompt import PromptError
from trt_llm.schemas.input_file import InputSettings
from trt_llm.schemas.input_file import Request as InputRequest
from trt_llm.server.app import ClientGone, HttpError, client_gone
from trt_llm.server.convert import BadRequest, _validated
from trt_llm.server.engine import Job

ROUTE = "/v1/audio/transcriptions"
FIELDS = ("file", "model", "prompt", "response_format", "temperature", "language", "stream")
UNSUPPORTED = {  # OpenAI's fields this server cannot honour, and why
    "timestamp_granularities": "timestamps are not supported (the decoder prompt has <|notimestamps|>)",
    "include": "no extra outputs (logprobs) are supported",
    "chunking_strategy": "no chunking: a clip is one window of at most 30 s",
    "known_speaker_names": "no diarization", "known_speaker_references": "no diarization",
    "keywords": "no keyword lists", "languages": "give one language (en)"}
FORMATS = ("json", "text")

_OPENAPI = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "model"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio file (wav, flac, mp3, ogg)"},
        "model": {"type": "string"},
        "prompt": {"type": "string", "description": "previous text the transcription continues"},
        "response_format": {"type": "string", "enum": list(FORMATS), "default": "json"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
        "language": {"type": "string", "enum": ["en"]}}}}}}}


def add_transcriptions(app: FastAPI, runner, metrics, config, enqueue, next_update) -> None:
    """Register the route. enqueue: app.py's `_enqueue(prepared, settings)`, the job on the serving
    engine; next_update: its `_next(job, request)`, the job's next update with the server's timeout
    and disconnect handling."""
    capacity = runner.limits["max_kv_cache_capacity"]
    forms = importlib.util.find_spec("python_multipart") is not None  # what Starlette parses forms with

    @app.post(ROUTE, openapi_extra=_OPENAPI)
    async def transcriptions(request: Request):
        # Every answer is counted by app.py's RequestCounter.
        _check_engine(runner)
        if not forms:
            raise HttpError(501, f"{ROUTE} needs the python-multipart package on the server "
                                 "(pip install 'trt-llm[server]')", code="not_installed")
        fields, data, filename = await _read_form(request)
        job = await _submit(fields, data, filename)
        try:
            text = await _collect(job, request)
        except ClientGone:
            return client_gone(ROUTE, len(job.prepared.sequence.generated))
        if fields.get("response_format", "json") == "text":
            return PlainTextResponse(text)
        s = job.prepared.sequence
        usage = {"type": "tokens", "input_tokens": len(s.prompt_ids), "output_tokens": len(s.generated),
                 "total_tokens": len(s.prompt_ids) + len(s.generated)}
        return {"text": text, "usage": usage}

    async def _submit(fields: dict, data: bytes, filename: str) -> Job:
        model = fields.get("model")
        if not model:
            raise HttpError(400, "model: required", "model")
        if model != config.model_name:
            raise HttpError(404, f"model {model!r} is not served here (GET /v1/models lists them)", "model",
                            "model_not_found")
        settings = _settings(fields, capacity)
        # The decoder reads the container from the bytes themselves; the type only has to be audio/*.
        url = f"data:audio/octet-stream;base64,{base64.b64encode(data).decode()}"
        content = [{"type": "audio", "audio": url}]
        if fields.get("prompt", "").strip():
            content.append({"type": "text", "text": fields["prompt"]})
        try:
            body = _validated(InputRequest, {"messages": [{"role": "user", "content": content}]})
            formatter = runner.formatter(settings)
            # Decoding the clip and running the encoder take milliseconds to seconds: off the event loop.
            prepared = await run_in_threadpool(runner.preparer.prepare, 0, body, settings, formatter, "request",
                                               False)
        except BadRequest as error:  # the input file's own limits (a prompt over its bytes)
            text = str(error).removeprefix("messages[0].content[1].text: ")
            if text != str(error):
                raise HttpError(400, f"prompt: {text}", "prompt") from None
            raise HttpError(error.status, str(error), error.param, error.code) from None
        except (PromptError, ValueError) as error:
            raise HttpError(400, *_field_message(str(error), url, filename)) from None
        return enqueue(prepared, settings)

    async def _collect(job: Job, request: Request) -> str:
        text = ""
        while True:
            update = await next_update(job, request)
            text += update.text
            if update.finished:
                return text.strip()


def _check_engine(runner) -> None:
    """Only a Whisper engine transcribes; an audio-LLM (Qwen2-Audio) takes its clips in chat."""
    if runner.audio is None or runner.audio.kind != "cross_attention":
        what = "no audio component" if runner.audio is None else f"an audio component of kind {runner.audio.kind!r}"
        raise HttpError(400, f"{ROUTE} needs a Whisper engine (an encoder-decoder speech model); this engine has "
                             f"{what}: send its audio to /v1/chat/completions as input_audio parts",
                        code="model_not_supported")


async def _read_form(request: Request) -> tuple[dict, bytes, str]:
    """The form's fields (strings), the file's bytes and its name; refuses what the route cannot do
    before anything is decoded."""
    content_type = request.headers.get("content-type", "")
    # A url-encoded form cannot hold a file, but parsing it lets the answer say which field is missing.
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise HttpError(400, f"the body must be multipart/form-data (got {content_type or 'no content type'!r}) "
                             "with the audio as its file field")
    async with request.form(max_files=1, max_fields=32) as form:
        fields, upload = {}, None
        for key, value in form.multi_items():
            name = key.removesuffix("[]")
            if name in UNSUPPORTED:
                raise HttpError(400, f"{name}: not supported by this server: {UNSUPPORTED[name]}", name)
            if name not in FIELDS:
                raise HttpError(400, f"{name}: unknown or unsupported parameter", name)
            if name in fields or (name == "file" and upload is not None):
                raise HttpError(400, f"{name}: given more than once", name)
            if name == "file":
                if not isinstance(value, UploadFile):
                    raise HttpError(400, "file: must be a file upload (the audio bytes), not a text field", "file")
                upload = value
            elif isinstance(value, UploadFile):
                raise HttpError(400, f"{name}: must be a text field, not a file", name)
            else:
                fields[name] = value
        if upload is None:
            raise HttpError(400, "file: required (the audio file, as a multipart file field)", "file")
        data = await upload.read()
        filename = upload.filename or ""
    if not data:
        raise HttpError(400, f"file: {filename or 'the upload'} is empty", "file")
    return fields, data, filename


def _settings(fields: dict, capacity: int) -> InputSettings:
    response_format = fields.get("response_format", "json")
    if response_format not in FORMATS:
        raise HttpError(400, f"response_format: {response_format!r} is not supported; this server answers json or "
                             "text (no timestamps, so no verbose_json, srt or vtt)", "response_format")
    language = fields.get("language", "").strip().lower()
    if language not in ("", "en"):
        raise HttpError(400, f"language: {fields['language']!r} is not supported; this server transcribes English "
                             "(en) only", "language")
    if fields.get("stream", "false").lower() not in ("false", "0"):
        raise HttpError(400, "stream: streamed transcriptions are not supported", "stream")
    try:
        temperature = float(fields.get("temperature", "0"))
    except ValueError:
        raise HttpError(400, f"temperature: not a number: {fields['temperature']!r}", "temperature") from None
    if not 0 <= temperature <= 1:
        raise HttpError(400, f"temperature: {temperature:g} is outside [0, 1]", "temperature")
    try:
        # OpenAI's sampling: no top-k or top-p cut; as many tokens as the decoder's positions hold.
        return _validated(InputSettings, {"temperature": temperature, "top_p": 1.0, "top_k": 0,
                                          "max_generate_length": capacity, "apply_chat_template": False})
    except BadRequest as error:
        raise HttpError(400, str(error), error.param) from None


def _field_message(message: str, url: str, filename: str) -> tuple[str, str | None]:
    """The preparer's message in the form's terms: its audio part is the `file` field (named by its
    file name, not the data URL), its text the `prompt`."""
    message = message.removeprefix("request.").removeprefix("request: ")
    message = message.replace(_shown(url), repr(filename) if filename else "the upload")
    for part, field in (("messages[0].content[0]: ", "file"), ("messages[0].content[1]: ", "prompt")):
        if message.startswith(part):
            return f"{field}: {message.removeprefix(part)}", field
    if message.startswith("messages: the previous-text prompt"):
        return "prompt: " + message.removeprefix("messages: "), "prompt"
    return message, None
