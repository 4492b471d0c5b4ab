"""Chat completions with `input_audio` parts against the official `openai` client on loopback, on the tiny
random Qwen2-Audio (tests/audio_llm_assets.py) and Debian's LibriVox clips: the greedy answer and its
prompt tokens (the clip's audio tokens counted) are trt-llm-run's on the same request with the clip as a
path; a wav and an mp3 in one message both work; a payload that is not audio, a clip over 30 s and an
engine without an audio encoder each get a 400 naming the part and why, and the server goes on serving."""

from __future__ import annotations

import base64
import io

import audio_assets
import audio_llm_assets
import httpx
import numpy as np
import pytest
from assets import AssetUnavailable
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from test_server import LiveServer
from trt_llm.server.app import ServerConfig, create_app

KEY = "test-key-789"
CLIP = "sense_and_sensibility_01_austen_64kb-0880"  # 2.99 s
MAX_NEW = 8


@pytest.fixture(scope="module")
def clip():
    try:
        return audio_assets.pocketsphinx_clips()[CLIP].path
    except AssetUnavailable as error:
        pytest.skip(f"pocketsphinx-testdata unavailable: {error}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory, npm_tokenizer, build_engine_for):
    folder = audio_llm_assets.make_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2_audio"),
                                                     tokenizer_dir=npm_tokenizer("qwen3"))
    return build_engine_for(folder, max_batch_size=4, max_input_len=1024, max_kv_cache_capacity=1100)


def serve(engine) -> LiveServer:
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    return LiveServer(create_app(runner, ServerConfig(model_name="tiny", api_keys=(KEY,), max_rows=4)))


@pytest.fixture(scope="module")
def server(engine):
    live = serve(engine)
    yield live
    live.close()


def input_audio(data: bytes, fmt: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chat(live: LiveServer, *parts, **kwargs):
    return live.client(KEY).chat.completions.create(model="tiny", temperature=0, max_tokens=MAX_NEW,
                                                    messages=[{"role": "user", "content": list(parts)}], **kwargs)


def refusal(live: LiveServer, *parts) -> tuple[int, dict]:
    """A chat over raw HTTP: its status and OpenAI error object."""
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": list(parts)}]}
    answer = httpx.post(f"{live.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=60)
    return answer.status_code, answer.json().get("error", {})


def trt_llm_run(engine, *parts):
    """trt-llm-run's greedy response to the same message, a path a clip and a str a text part."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "audio", "audio": str(p)}
               for p in parts]
    loaded = parse_input_dict({"temperature": 0.0, "max_generate_length": MAX_NEW,
                               "requests": [{"messages": [{"role": "user", "content": content}]}]})
    response = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses[0]
    assert response.finish_reason != "error", response.error
    return response


def test_a_clip_answers_as_trt_llm_run(server, engine, clip):
    want = trt_llm_run(engine, clip, "What is said?")
    got = chat(server, input_audio(clip.read_bytes(), "wav"), {"type": "text", "text": "What is said?"})
    assert got.choices[0].message.content == want.output_text
    assert got.usage.prompt_tokens == want.prompt_tokens and got.usage.completion_tokens == want.generated_tokens
    assert got.usage.prompt_tokens > 60  # the 3 s clip's ~75 audio tokens are counted


def test_wav_and_mp3_in_one_message(server, engine, clip, tmp_path):
    import soundfile

    samples, rate = soundfile.read(clip, dtype="float32")
    mp3 = tmp_path / "clip.mp3"
    soundfile.write(mp3, samples, rate, format="MP3")
    want = trt_llm_run(engine, clip, "and", mp3, "Compare them.")
    got = chat(server, input_audio(clip.read_bytes(), "wav"), {"type": "text", "text": "and"},
               input_audio(mp3.read_bytes(), "mp3"), {"type": "text", "text": "Compare them."})
    assert got.choices[0].message.content == want.output_text and got.usage.prompt_tokens == want.prompt_tokens


def test_bad_audio_is_400_naming_the_part(server, clip):
    import soundfile

    rng = np.random.default_rng(0)
    status, error = refusal(server, {"type": "text", "text": "Listen:"}, input_audio(rng.bytes(4096), "wav"))
    assert status == 400 and error["param"] == "messages[0].content[1]" and "not audio" in error["message"], error
    long = io.BytesIO()
    soundfile.write(long, (rng.standard_normal(16000 * 31) * 0.1).astype(np.float32), 16000, format="WAV")
    status, error = refusal(server, input_audio(long.getvalue(), "wav"))
    assert status == 400 and error["param"] == "messages[0].content[0]", error
    assert "31.00 s" in error["message"] and "30 s" in error["message"], error
    assert chat(server, input_audio(clip.read_bytes(), "wav")).usage.completion_tokens >= 1  # still serving


def test_a_text_only_engine_refuses_audio(tiny_model, build_engine_for, clip):
    live = serve(build_engine_for(tiny_model("qwen3")))
    try:
        status, error = refusal(live, input_audio(clip.read_bytes(), "wav"), {"type": "text", "text": "Hi"})
    finally:
        live.close()
    assert status == 400 and error["param"] == "messages[0].content[0]", error
    assert "no audio encoder" in error["message"], error
