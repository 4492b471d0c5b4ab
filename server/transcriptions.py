"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text endpoints, on an
engine whose family transcribes (its face's `transcription`, trt_llm/families: Whisper's window loop, or
Qwen3-ASR's chat request).

The form (multipart/form-data, as OpenAI's clients send it) is streamed to disk under the upload
limit (server/uploads.py: 25 MB by default, --max-upload-mb; 413 past it), the file removed after
the request. On a Qwen3-ASR engine it becomes the chat request the model's processor makes
(runtime/media/audio/qwen3_asr_prompt.py: the clip in the user turn, the `prompt` as its context in
the system turn) on the chat path, and the answer is the text after the model's
"language <Name><asr_text>" (json and text; `language`, a code or name of the model's 30, forces
it as transformers' processor does; timestamps, translation and VAD are refused). On a Whisper engine it becomes the input file's `Request`: one user message with the
uploaded file as an audio part (its path on disk) and the `prompt` as a text part,
the previous text Whisper continues from (runtime/media/audio/transcription.py), and its `whisper`
settings. `RequestPreparer.prepare` (decoding, the limits, the encoder) runs off the event loop; a
clip decoded once goes to the server's one `ServingEngine` as one job, with its queue, timeout,
disconnect and error handling (app.py's `_next`); a clip decoded window by window
(runtime/media/audio/longform.py: over 30 s, timestamps, fallback temperatures, language detection)
sends each of its decodes to the same engine as a job of its own, one after the other, so that its
windows share the running batch with everything else.

Fields: file and model (required), prompt, response_format (json, the default, and text: the text
without the space Whisper's first token starts with; verbose_json: the text, task, language, duration
and segments; srt and vtt: subtitles, one cue per segment), timestamp_granularities[] (segment),
temperature ([0, 1]; 0: greedy, falling back to 0.2 ... 1.0 when a window fails the thresholds, as
OpenAI's API does, seeded), language (an ISO 639-1 code; English-only checkpoints: en; absent on a
multilingual one: detected), vad_filter (true: the speech only, Silero VAD's chunks; the input file's
whisper.vad_filter) and vad_parameters (a JSON object: whisper.vad_parameters). /v1/audio/translations
(multilingual checkpoints) takes the same but language and answers in English. OpenAI's other fields (word timestamps, streaming, chunking,
include) are refused with a 400 naming the field, never ignored, as every unknown one is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import math
import time

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool
from trt_llm.runtime.media.audio.answer import transcription_response
from trt_llm.runtime.media.audio.languages import LANGUAGES
from trt_llm.runtime.media.audio.longform import encode, rounds
from trt_llm.runtime.media.audio.qwen3_asr_prompt import forced_language, parse_output, transcription_messages
from trt_llm.runtime.media.audio.subtitles import srt, vtt
from trt_llm.runtime.media.sources import _shown
from trt_llm.runtime.requests.prepare import Prepared
from trt_llm.runtime.text.detokenizer import IncrementalDetokenizer
from trt_llm.runtime.text.prompt import PromptError
from trt_llm.schemas.input_file import STANDARD_FALLBACK, InputSettings
from trt_llm.schemas.input_file import Request as InputRequest
from trt_llm.server.app import ClientGone, HttpError, client_gone
from trt_llm.server.convert import BadRequest, _validated
from trt_llm.server.engine import Job
from trt_llm.server.uploads import DEFAULT_MAX_UPLOAD_MB, MB, SavedUpload, UploadAbandoned, abandoned, read_form

ROUTE = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
FIELDS = ("file", "model", "prompt", "response_format", "temperature", "language", "stream",
          "timestamp_granularities", "vad_filter", "vad_parameters")
UNSUPPORTED = {  # OpenAI's fields this server cannot honour, and why
    "include": "no extra outputs (logprobs) are supported",
    "chunking_strategy": "the clip is transcribed in Whisper's own 30 s windows, advanced by its timestamps",
    "known_speaker_names": "no diarization", "known_speaker_references": "no diarization",
    "keywords": "no keyword lists", "languages": "give one language"}
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMESTAMPED = ("verbose_json", "srt", "vtt")
MEDIA_TYPES = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}

_OPENAPI = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "model"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio file (wav, flac, mp3, ogg)"},
        "model": {"type": "string"},
        "prompt": {"type": "string", "description": "previous text the transcription continues"},
        "response_format": {"type": "string", "enum": list(FORMATS), "default": "json"},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment"]}},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
        "language": {"type": "string", "description": "ISO 639-1 (transcriptions only)"},
        "vad_filter": {"type": "boolean", "default": False,
                       "description": "transcribe the speech only: Silero VAD's chunks of at most 30 s"},
        "vad_parameters": {"type": "string", "description": "the VAD's settings, a JSON object (the input "
                           "file's whisper.vad_parameters: threshold, min_speech_duration_ms, ...)"}}}}}}}


def add_transcriptions(app: FastAPI, runner, metrics, config, enqueue, next_update) -> None:
    """Register the route. enqueue: app.py's `_enqueue(prepared, settings)`, the job on the serving
    engine; next_update: its `_next(job, request)`, the job's next update with the server's timeout
    and disconnect handling."""
    capacity = runner.limits["max_kv_cache_capacity"]
    forms = importlib.util.find_spec("python_multipart") is not None  # what Starlette parses forms with
    upload_limit = getattr(config, "max_upload_bytes", DEFAULT_MAX_UPLOAD_MB * MB)
    from trt_llm.server.audio_budget import DEFAULT_DECODE_BUDGET, DEFAULT_MAX_AUDIO_SECONDS, DecodeBudget

    max_seconds = getattr(config, "max_audio_seconds", DEFAULT_MAX_AUDIO_SECONDS)
    budget = DecodeBudget(getattr(config, "audio_decode_budget", DEFAULT_DECODE_BUDGET), config.max_waiting)

    async def answer(request: Request, task: str):
        # Every answer is counted by app.py's RequestCounter.
        route = ROUTE if task == "transcribe" else TRANSLATIONS
        _check_engine(runner, route)
        if not forms:
            raise HttpError(501, f"{route} needs the python-multipart package on the server "
                                 "(pip install 'trt-llm[server]')", code="not_installed")
        try:
            fields, upload = await _read_form(request, task, upload_limit)
        except UploadAbandoned as gone:
            return abandoned(route, gone)
        try:
            return await answer_upload(request, task, route, fields, upload)
        finally:
            upload.remove()  # the request is over: its file goes

    async def answer_upload(request: Request, task: str, route: str, fields: dict, upload: SavedUpload):
        if _transcribes_in_chat(runner):
            return await _chat_transcription(request, fields, upload, task)
        prepared, settings = await _prepare(fields, upload, task)
        response_format = fields.get("response_format", "json")
        try:
            if prepared.transcription is None:
                job = enqueue(prepared, settings)
                text = (await _collect(job, request)).strip()
                s = job.prepared.sequence
                if response_format == "text":
                    return PlainTextResponse(text)
                return {"text": text, "usage": _usage(len(s.prompt_ids), len(s.generated))}
            response = await _windows(prepared, settings, request)
        except ClientGone:
            return client_gone(route, 0)
        return _render(response, response_format, task)

    @app.post(ROUTE, openapi_extra=_OPENAPI)
    async def transcriptions(request: Request):
        return await answer(request, "transcribe")

    @app.post(TRANSLATIONS, openapi_extra=_OPENAPI)
    async def translations(request: Request):
        return await answer(request, "translate")

    def _check_model(fields: dict) -> None:
        model = fields.get("model")
        if not model:
            raise HttpError(400, "model: required", "model")
        if model != config.model_name:
            raise HttpError(404, f"model {model!r} is not served here (GET /v1/models lists them)", "model",
                            "model_not_found")

    async def _prepare(fields: dict, upload: SavedUpload, task: str, settings: InputSettings | None = None,
                       messages: list[dict] | None = None):
        """The upload's request prepared; `messages` (default: Whisper's, the clip and the prompt's
        previous text) name the clip by its file on disk, which the preparer reads once."""
        _check_model(fields)
        settings = settings or _settings(fields, capacity, task, max_seconds)
        url = str(upload.path)  # the decoder reads the container from the bytes themselves
        filename = upload.filename
        if messages is None:
            content = [{"type": "audio", "audio": url}]
            if fields.get("prompt", "").strip():
                content.append({"type": "text", "text": fields["prompt"]})
            messages = [{"role": "user", "content": content}]
        try:
            body = _validated(InputRequest, {"messages": messages})
            formatter = runner.formatter(settings)
            # Decoding the clip and running the encoder take milliseconds to seconds: off the event loop.
            async with budget.hold(await _decode_cost(upload, settings)):
                prepared = await run_in_threadpool(runner.preparer.prepare, 0, body, settings, formatter, "request",
                                                   False)
        except BadRequest as error:  # the input file's own limits (a prompt over its bytes)
            text = str(error).removeprefix("messages[0].content[1].text: ")
            if text != str(error):
                raise HttpError(400, f"prompt: {text}", "prompt") from None
            raise HttpError(error.status, str(error), error.param, error.code) from None
        except (PromptError, ValueError) as error:
            raise HttpError(400, *_field_message(str(error), url, filename)) from None
        return prepared, settings

    async def _decode_cost(upload: SavedUpload, settings: InputSettings) -> int:
        """The upload's duration from its header (over --max-audio-seconds: a 400 before it is decoded)
        and the bytes its decode is counted for in the budget (server/audio_budget.py). A file that is
        no audio costs nothing here: the preparer refuses it, naming why."""
        from trt_llm.runtime.media.audio.decode import AudioError, audio_info
        from trt_llm.server.audio_budget import WHISPER_WINDOW_SECONDS, decode_cost, refuse_long

        try:
            info = await run_in_threadpool(audio_info, upload.path, repr(upload.filename))
        except AudioError:
            return 0
        refuse_long(info.seconds, max_seconds, upload.filename or "the upload")
        whisper = settings.whisper
        streamed = not _transcribes_in_chat(runner) and (
            info.seconds > WHISPER_WINDOW_SECONDS or whisper.return_timestamps or whisper.vad_filter)
        return decode_cost(info.seconds, streamed)

    def _with_answer_prefix(prepared: Prepared, prefix: str) -> Prepared:
        """The prepared request with `prefix` after its generation prompt, as transformers' processor
        writes a forced language (apply_transcription_request): the prompt's tokens then the prefix's."""
        ids = runner.tokenizer.encode(prefix, add_special_tokens=False)
        s, limit = prepared.sequence, runner.limits["max_input_len"]
        if len(s.prompt_ids) + len(ids) > limit or s.max_new_tokens <= len(ids):
            raise HttpError(400, f"file: the prompt with the clip's tokens is {len(s.prompt_ids) + len(ids)} tokens, "
                                 f"over the engine's max_input_len {limit}", "file")
        prompt = dataclasses.replace(prepared.prompt, text=prepared.prompt.text + prefix,
                                     token_ids=prepared.prompt.token_ids + ids)
        sequence = dataclasses.replace(s, prompt_ids=s.prompt_ids + ids, max_new_tokens=s.max_new_tokens - len(ids))
        return dataclasses.replace(prepared, prompt=prompt, sequence=sequence)

    async def _windows(prepared, settings: InputSettings, request: Request):
        """A transcription decoded window by window: each round's decodes (one, or a VAD
        transcription's one per speech chunk, side by side) jobs on the serving engine, their windows
        encoded in one encoder batch."""
        t = prepared.transcription
        for work in rounds([t]):  # the window loop trt-llm-run's driver runs too (longform.rounds)
            await run_in_threadpool(encode, runner.audio, [d.attempt for d in work])
            jobs = [enqueue(Prepared(prepared.index, prepared.request, prepared.prompt,
                                     d.start(IncrementalDetokenizer(runner.token_bytes)), d.attempt.params(), None,
                                     seed=t.seed_of(d.attempt)), settings) for d in work]
            # Each job sees the client leave (or its time run out) and aborts itself: wait for all, then raise.
            outcomes = await asyncio.gather(*(_collect(job, request) for job in jobs), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            for d in work:
                d.finish()
        return transcription_response(prepared, runner.token_bytes, 0, time.perf_counter(), [])

    async def _collect(job: Job, request: Request) -> str:
        text = ""
        while True:
            update = await next_update(job, request)
            text += update.text
            if update.finished:
                return text

    async def _chat_transcription(request: Request, fields: dict, upload: SavedUpload, task: str):
        """A Qwen3-ASR engine's transcription: the chat request its processor makes of the clip
        (runtime/media/audio/qwen3_asr_prompt.py; the `prompt` is its context) on the serving engine,
        the answer's text what follows its "language <Name><asr_text>"."""
        _check_model(fields)
        settings = _chat_settings(fields, capacity, task)
        language = fields.get("language", "").strip()
        try:
            prefix = forced_language(language) if language else None
        except ValueError as error:
            raise HttpError(400, f"language: {error}", "language") from None
        context = fields.get("prompt", "").strip() or None
        prepared, settings = await _prepare(fields, upload, task, settings,
                                            transcription_messages(str(upload.path), context))
        if prefix is not None:
            prepared = _with_answer_prefix(prepared, prefix)
        try:
            job = enqueue(prepared, settings)
            _, text = parse_output(await _collect(job, request))
        except ClientGone:
            return client_gone(ROUTE, 0)
        if fields.get("response_format", "json") == "text":
            return PlainTextResponse(text)
        s = job.prepared.sequence
        return {"text": text, "usage": _usage(len(s.prompt_ids), len(s.generated))}


def _usage(prompt: int, generated: int) -> dict:
    return {"type": "tokens", "input_tokens": prompt, "output_tokens": generated, "total_tokens": prompt + generated}


def _render(response, response_format: str, task: str):
    """A windowed transcription's answer in the asked format."""
    text = response.output_text.strip()
    segments = response.segments or []
    if response_format == "text":
        return PlainTextResponse(text)
    if response_format in ("srt", "vtt"):
        body = srt(segments) if response_format == "srt" else vtt(segments)
        return PlainTextResponse(body, media_type=MEDIA_TYPES[response_format])
    usage = {"type": "duration", "seconds": math.ceil(response.duration or 0)}
    if response_format == "json":
        return {"text": text, "usage": _usage(response.prompt_tokens, response.generated_tokens)}
    language = LANGUAGES.get(response.language or "", response.language)
    return {"task": task, "language": "english" if task == "translate" else language,
            "duration": response.duration, "text": text,
            "segments": [segment.model_dump() for segment in segments], "usage": usage}


def _transcribes_in_chat(runner) -> bool:
    """Qwen3-ASR: a transcription is a chat request holding the clip (Whisper: the window loop)."""
    return runner.family.transcription == "chat"


def _check_engine(runner, route: str) -> None:
    """Whisper and Qwen3-ASR engines transcribe; another audio-LLM (Qwen2-Audio) takes its clips in chat."""
    if runner.family.transcription is None:
        what = "no audio component" if runner.audio is None else f"{runner.family.architecture}'s audio component"
        raise HttpError(400, f"{route} needs a Whisper engine (an encoder-decoder speech model) or a Qwen3-ASR one; "
                             f"this engine has {what}: send its audio to /v1/chat/completions as input_audio parts",
                        code="model_not_supported")


def _chat_settings(fields: dict, capacity: int, task: str) -> InputSettings:
    """A Qwen3-ASR request's settings: what it cannot do (translation, timestamps, a forced
    language) is refused, naming the field."""
    if task == "translate":
        raise HttpError(400, f"{TRANSLATIONS} needs a multilingual Whisper engine; a Qwen3-ASR engine transcribes "
                             f"({ROUTE})", code="model_not_supported")
    response_format = fields.get("response_format", "json")
    if response_format not in ("json", "text"):
        raise HttpError(400, f"response_format: {response_format!r} is not supported on a Qwen3-ASR engine, which "
                             "gives no timestamps; it answers json, text", "response_format")
    if "timestamp_granularities" in fields:
        raise HttpError(400, "timestamp_granularities: a Qwen3-ASR engine gives no timestamps",
                        "timestamp_granularities")
    for name in ("vad_filter", "vad_parameters"):
        if name in fields:
            raise HttpError(400, f"{name}: Whisper's voice activity detection; not supported on a Qwen3-ASR engine",
                            name)
    if fields.get("stream", "false").lower() not in ("false", "0"):
        raise HttpError(400, "stream: streamed transcriptions are not supported", "stream")
    temperature = _temperature(fields)
    try:
        return _validated(InputSettings, {"temperature": temperature, "top_p": 1.0, "top_k": 0, "seed": 0,
                                          "max_generate_length": capacity})
    except BadRequest as error:
        raise HttpError(400, str(error), error.param) from None


def _temperature(fields: dict) -> float:
    try:
        temperature = float(fields.get("temperature", "0"))
    except ValueError:
        raise HttpError(400, f"temperature: not a number: {fields['temperature']!r}", "temperature") from None
    if not 0 <= temperature <= 1:
        raise HttpError(400, f"temperature: {temperature:g} is outside [0, 1]", "temperature")
    return temperature


async def _read_form(request: Request, task: str, limit: int) -> tuple[dict, SavedUpload]:
    """The form's fields (strings) and its file, streamed to disk under `limit` bytes
    (server/uploads.py); refuses what the route cannot do before anything is decoded. The caller
    removes the file."""
    content_type = request.headers.get("content-type", "")
    # A url-encoded form cannot hold a file, but parsing it lets the answer say which field is missing.
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise HttpError(400, f"the body must be multipart/form-data (got {content_type or 'no content type'!r}) "
                             "with the audio as its file field")
    items, upload = await read_form(request, limit)
    try:
        fields, saw_file = {}, False
        for key, value in items:
            name = key.removesuffix("[]")
            if name in UNSUPPORTED:
                raise HttpError(400, f"{name}: not supported by this server: {UNSUPPORTED[name]}", name)
            if name not in FIELDS or (name == "language" and task == "translate"):
                raise HttpError(400, f"{name}: unknown or unsupported parameter", name)
            if name in fields or (name == "file" and saw_file):
                raise HttpError(400, f"{name}: given more than once", name)
            if name == "file":
                if not isinstance(value, SavedUpload):
                    raise HttpError(400, "file: must be a file upload (the audio bytes), not a text field", "file")
                saw_file = True
            elif isinstance(value, SavedUpload):
                raise HttpError(400, f"{name}: must be a text field, not a file", name)
            else:
                fields[name] = value
        if not saw_file:
            raise HttpError(400, "file: required (the audio file, as a multipart file field)", "file")
        if upload.size == 0:
            raise HttpError(400, f"file: {upload.filename or 'the upload'} is empty", "file")
    except BaseException:
        if upload is not None:
            upload.remove()
        raise
    return fields, upload


def _settings(fields: dict, capacity: int, task: str, max_audio_seconds: float | None = None) -> InputSettings:
    response_format = fields.get("response_format", "json")
    if response_format not in FORMATS:
        raise HttpError(400, f"response_format: {response_format!r} is not supported; this server answers "
                             f"{', '.join(FORMATS)}", "response_format")
    granularity = fields.get("timestamp_granularities", "segment")
    if granularity != "segment":
        raise HttpError(400, f"timestamp_granularities: {granularity!r} is not supported; this server gives segment "
                             "timestamps (no word timestamps)", "timestamp_granularities")
    language = fields.get("language", "").strip() or None
    if fields.get("stream", "false").lower() not in ("false", "0"):
        raise HttpError(400, "stream: streamed transcriptions are not supported", "stream")
    temperature = _temperature(fields)
    # OpenAI's: at 0 the temperature rises when a window fails the thresholds (seeded: the same
    # answer every time); at any other temperature that one alone.
    whisper = {"return_timestamps": response_format in TIMESTAMPED, "language": language, "task": task,
               "temperature_fallback": STANDARD_FALLBACK if temperature == 0 else [], **_vad_fields(fields)}
    if max_audio_seconds is not None:  # the server's own (--max-audio-seconds), below the input file's
        whisper["max_audio_seconds"] = max_audio_seconds
    try:
        # OpenAI's sampling: no top-k or top-p cut; as many tokens as the decoder's positions hold.
        return _validated(InputSettings, {"temperature": temperature, "top_p": 1.0, "top_k": 0, "seed": 0,
                                          "max_generate_length": capacity, "apply_chat_template": False,
                                          "whisper": whisper})
    except BadRequest as error:
        if str(error).startswith("whisper.vad_parameters"):  # the form's own field
            raise HttpError(400, str(error).removeprefix("whisper."), "vad_parameters") from None
        raise HttpError(400, str(error), error.param) from None


def _vad_fields(fields: dict) -> dict:
    """vad_filter (true / false) and vad_parameters (a JSON object) as the input file's whisper settings."""
    out = {}
    if "vad_filter" in fields:
        flag = fields["vad_filter"].strip().lower()
        if flag not in ("true", "false", "1", "0"):
            raise HttpError(400, f"vad_filter: {fields['vad_filter']!r} is not a boolean (true or false)", "vad_filter")
        out["vad_filter"] = flag in ("true", "1")
    if "vad_parameters" in fields:
        try:
            parameters = json.loads(fields["vad_parameters"])
        except json.JSONDecodeError as error:
            raise HttpError(400, f"vad_parameters: not JSON: {error}", "vad_parameters") from None
        if not isinstance(parameters, dict):
            raise HttpError(400, "vad_parameters: must be a JSON object (threshold, min_speech_duration_ms, "
                                 "max_speech_duration_s, min_silence_duration_ms, speech_pad_ms)", "vad_parameters")
        out["vad_parameters"] = parameters
    return out


def _field_message(message: str, url: str, filename: str) -> tuple[str, str | None]:
    """The preparer's message in the form's terms: its audio part is the `file` field (named by its
    file name, not the data URL), its text the `prompt`."""
    message = message.removeprefix("request.").removeprefix("request: ")
    message = message.replace(_shown(url), repr(filename) if filename else "the upload")
    message = message.replace("(whisper.max_audio_seconds)", "(--max-audio-seconds)")
    for part, field in (("messages[0].content[0]: ", "file"), ("messages[0].content[1]: ", "prompt"),
                        ("messages[1].content[0]: ", "file")):  # Qwen3-ASR's clip after its context
        if message.startswith(part):
            return f"{field}: {message.removeprefix(part)}", field
    if message.startswith("messages: the previous-text prompt"):
        return "prompt: " + message.removeprefix("messages: "), "prompt"
    if message.startswith("whisper.language "):
        return "language: " + message.removeprefix("whisper.language "), "language"
    if message.startswith("whisper.task 'translate'"):
        return f"{TRANSLATIONS}" + message.removeprefix("whisper.task 'translate'"), None
    return message, None
