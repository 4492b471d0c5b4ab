"""POST /v1/audio/transcriptions against the official `openai` client on loopback, on an engine built from
the real Whisper tiny.en (tests/whisper_assets.py) and Debian's LibriVox clips: the text is
trt-llm-run's transcription of the same clip (without Whisper's leading space, as OpenAI answers),
with and without a previous-text prompt, as json and as text; bad inputs and an engine that is not
Whisper's get a 400 naming the field and why, and the server goes on serving."""

from __future__ import annotations

import io
import json

import audio_assets
import httpx
import numpy as np
import pytest
import whisper_assets
from assets import AssetUnavailable
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from test_server import LiveServer
from trt_llm.server.app import ServerConfig, create_app

KEY = "test-key-456"
LIBRIVOX = [f"sense_and_sensibility_01_austen_64kb-{n:04d}" for n in (870, 880)]
PROMPT = "Mr. Dashwood, Sense and Sensibility."


@pytest.fixture(scope="module")
def engine(build_engine_for):
    try:
        whisper_dir = whisper_assets.whisper_tiny_en_dir()
    except AssetUnavailable as error:
        pytest.skip(f"whisper tiny.en unavailable: {error}")
    return build_engine_for(whisper_dir, max_batch_size=4)  # test_whisper.py's engine


@pytest.fixture(scope="module")
def clips():
    try:
        found = audio_assets.pocketsphinx_clips()
    except AssetUnavailable as error:
        pytest.skip(f"pocketsphinx-testdata unavailable: {error}")
    return [found[name].path for name in LIBRIVOX]


def serve(engine) -> LiveServer:
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    return LiveServer(create_app(runner, ServerConfig(model_name="whisper", api_keys=(KEY,), max_rows=4)))


@pytest.fixture(scope="module")
def server(engine):
    live = serve(engine)
    yield live
    live.close()


def client(live: LiveServer):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)


def trt_llm_run(engine, clip, text: str | None = None) -> str:
    """trt-llm-run's greedy transcription of the clip, alone."""
    content = [{"type": "audio", "audio": str(clip)}] + ([{"type": "text", "text": text}] if text else [])
    loaded = parse_input_dict({"temperature": 0.0, "max_generate_length": 448,
                               "requests": [{"messages": [{"role": "user", "content": content}]}]})
    response = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses[0]
    assert response.finish_reason == "end-of-sequence", response.error
    return response.output_text


def test_transcriptions_are_trt_llm_runs(server, engine, clips):
    transcribe = client(server).audio.transcriptions.create
    for clip in clips:
        want = trt_llm_run(engine, clip)
        got = transcribe(model="whisper", file=clip)
        assert got.text == want.strip() and want.startswith(" ")
        assert got.usage.output_tokens >= len(got.text.split()) and got.usage.input_tokens == 2
    assert got.text == "He was not an old-sposed young man."
    plain = transcribe(model="whisper", file=(clips[1].name, clips[1].read_bytes(), "audio/wav"),
                       response_format="text", language="en", temperature=0)
    assert plain == got.text
    prompted = transcribe(model="whisper", file=clips[0], prompt=PROMPT)
    assert prompted.text == trt_llm_run(engine, clips[0], PROMPT).strip()
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'trt_llm_requests_total{route="/v1/audio/transcriptions",status="200"} 4.0' in metrics


def wav_bytes(seconds: float) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    noise = (np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)
    soundfile.write(buffer, noise, 16000, format="WAV")
    return buffer.getvalue()


def test_bad_requests_are_400_and_name_the_field(server, clips):
    url, auth = f"{server.url}/v1/audio/transcriptions", {"Authorization": f"Bearer {KEY}"}
    clip = ("clip.wav", clips[1].read_bytes(), "audio/wav")
    cases = [  # (form fields, files, status, param, words in the message)
        ({"model": "whisper"}, {"file": ("notes.txt", b"not audio at all", "text/plain")}, 400, "file", "'notes.txt'"),
        ({"model": "whisper"}, {"file": ("empty.wav", b"", "audio/wav")}, 400, "file", "empty"),
        ({"model": "whisper"}, None, 400, "file", "required"),
        ({"model": "whisper", "file": "just text"}, None, 400, "file", "file upload"),
        ({"model": "nope"}, {"file": clip}, 404, "model", "not served"),
        ({}, {"file": clip}, 400, "model", "required"),
        ({"model": "whisper", "language": "fr"}, {"file": clip}, 400, "language", "English-only"),
        ({"model": "whisper", "response_format": "xml"}, {"file": clip}, 400, "response_format",
         "verbose_json, srt, vtt"),
        ({"model": "whisper", "temperature": "1.5"}, {"file": clip}, 400, "temperature", "[0, 1]"),
        ({"model": "whisper", "timestamp_granularities[]": "word"}, {"file": clip}, 400, "timestamp_granularities",
         "no word timestamps"),
        ({"model": "whisper", "stream": "true"}, {"file": clip}, 400, "stream", "not supported"),
        ({"model": "whisper", "frobnicate": "1"}, {"file": clip}, 400, "frobnicate", "unknown"),
        ({"model": "whisper", "prompt": "word " * 300}, {"file": clip}, 400, "prompt", "previous-text prompt"),
        ({"model": "whisper", "prompt": "x" * 200_000}, {"file": clip}, 400, "prompt", "at most 131072"),
    ]
    for data, files, status, param, words in cases:
        answer = httpx.post(url, data=data, files=files, headers=auth, timeout=60)
        assert answer.status_code == status, (data, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param and words in error["message"], (data, error)
    not_form = httpx.post(url, json={"model": "whisper"}, headers=auth)
    assert not_form.status_code == 400 and "multipart/form-data" in not_form.json()["error"]["message"]
    assert httpx.post(url, data={"model": "whisper"}, files={"file": clip}).status_code == 401
    with pytest.raises(openai.BadRequestError) as refused:  # through the client too
        client(server).audio.transcriptions.create(model="whisper", file=clip, language="de")
    assert refused.value.status_code == 400 and "language" in str(refused.value)
    assert client(server).audio.transcriptions.create(model="whisper", file=clip).text  # and it still serves


def test_an_engine_that_is_not_whispers_answers_400(tiny_model, build_engine_for, clips):
    live = serve(build_engine_for(tiny_model("qwen3")))
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            client(live).audio.transcriptions.create(model="whisper", file=clips[0])
        assert refused.value.status_code == 400
        message = json.loads(refused.value.response.text)["error"]["message"]
        assert "needs a Whisper engine" in message and "no audio component" in message
    finally:
        live.close()
