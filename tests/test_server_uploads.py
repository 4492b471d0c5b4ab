"""Speech uploads streamed to disk under a size limit (server/uploads.py), on the real Whisper tiny.en's
engine (test_whisper.py's): a file of exactly the limit transcribes, one byte more is a 413 naming the
limit (by its Content-Length, and without one, as its bytes arrive); the routes take uploads larger
than --max-body-bytes, which still caps the JSON routes; the file reaches the disk a received chunk
at a time, never whole in memory, and is gone after the request, refused or not."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from test_server import LiveServer  # noqa: E402
from trt_llm.runtime.engine_dir import EngineDir  # noqa: E402
from trt_llm.runtime.requests.runner import Runner  # noqa: E402
from trt_llm.server import uploads  # noqa: E402
from trt_llm.server.app import ServerConfig, create_app  # noqa: E402

SECONDS = 7
LIMIT = 44 + 2 * 16000 * SECONDS  # a 7 s 16-bit mono WAV: its header and samples (219 KiB)
PIECE = 8192  # what the slow client sends at a time
BODY_LIMIT = 10_000  # --max-body-bytes, far under the upload
BOUNDARY = "test-boundary-7f3a"


@pytest.fixture(scope="module")
def clip_wav(librivox_clips) -> bytes:
    """The first LibriVox clip's first 7 s as a WAV of exactly LIMIT bytes."""
    import soundfile

    samples, rate = soundfile.read(str(librivox_clips[0].path), dtype="int16")
    buffer = io.BytesIO()
    soundfile.write(buffer, samples[:rate * SECONDS], rate, format="WAV", subtype="PCM_16")
    assert len(buffer.getvalue()) == LIMIT
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(whisper_tiny_en_dir, build_engine_for):
    engine = build_engine_for(whisper_tiny_en_dir, max_batch_size=4)  # test_whisper.py's engine
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="whisper", max_rows=2, max_upload_bytes=LIMIT,
                                                      max_body_bytes=BODY_LIMIT)))
    yield live
    live.close()


def multipart(data: bytes, filename: str = "clip.wav") -> bytes:
    fields = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
    head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: audio/wav\r\n\r\n")
    return (fields + head).encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def pieces(body: bytes, size: int):
    for start in range(0, len(body), size):
        yield body[start:start + size]
        time.sleep(0.01)  # each piece its own arrival, as from a slow client


def post(server, body: bytes, chunked: bool = False, piece: int = PIECE) -> httpx.Response:
    """The form sent whole (with its Content-Length) or in pieces (chunked: no Content-Length)."""
    content = pieces(body, piece) if chunked else body
    return httpx.post(f"{server.url}/v1/audio/transcriptions", content=content, timeout=120,
                      headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})


@pytest.fixture
def writes(monkeypatch):
    """Every chunk the upload writes to disk, and the file's path, by a spy on its writer."""
    seen = {"chunks": [], "paths": set()}
    original = uploads._Form.write

    def spy(self, chunk):
        seen["chunks"].append(len(chunk))
        seen["paths"].add(self.upload.path)
        return original(self, chunk)

    monkeypatch.setattr(uploads._Form, "write", spy)
    return seen


def test_an_upload_of_the_limit_transcribes_in_chunks_and_is_removed(server, clip_wav, writes):
    answer = post(server, multipart(clip_wav), chunked=True)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"].strip()
    # written piece by piece as the body arrived (never the whole file in one buffer), then removed
    assert sum(writes["chunks"]) == LIMIT and len(writes["chunks"]) >= 4 and max(writes["chunks"]) < LIMIT // 2
    (path,) = writes["paths"]
    assert not path.exists()


def test_one_byte_over_the_limit_is_413_naming_it(server, clip_wav, writes):
    """As its bytes arrive (with a Content-Length and without), and far over it by its Content-Length
    before a byte is read."""
    for body, chunked, written in ((multipart(clip_wav + b"\0"), False, True), (multipart(clip_wav + b"\0"), True, True),
                                   (multipart(clip_wav + bytes(uploads.FORM_ALLOWANCE + 1)), False, False)):
        writes["chunks"].clear()
        answer = post(server, body, chunked=chunked)
        assert answer.status_code == 413, (chunked, answer.text)
        error = answer.json()["error"]
        assert error["param"] == "file" and error["code"] == "file_too_large"
        assert f"limit of {LIMIT / uploads.MB:g} MB ({LIMIT} bytes; --max-upload-mb)" in error["message"]
        assert 0 < sum(writes["chunks"]) <= LIMIT if written else not writes["chunks"]  # nothing past the limit
    assert writes["paths"] and not any(path.exists() for path in writes["paths"])  # the partial files went too


def test_the_json_routes_keep_max_body_bytes(server):
    answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "model": "whisper", "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]})
    assert answer.status_code == 413 and "--max-body-bytes" in answer.json()["error"]["message"]


def test_a_malformed_form_is_400_and_leaves_nothing(server, clip_wav, writes):
    cut = multipart(clip_wav)[:-len(f"\r\n--{BOUNDARY}--\r\n") - 10]  # the file part never ends
    answer = post(server, cut)
    assert answer.status_code == 400, answer.text
    assert not any(path.exists() for path in writes["paths"])


def test_the_flag_sets_the_limit():
    from trt_llm.server.cli import parse_args

    assert parse_args(["--engine-dir", "e"]).max_upload_mb == 25
    assert parse_args(["--engine-dir", "e", "--max-upload-mb", "0.5"]).max_upload_mb == 0.5
    assert np.isclose(ServerConfig(model_name="m").max_upload_bytes, 25 * uploads.MB)
