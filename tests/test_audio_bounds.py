"""A clip's decoded size is bounded before it is paid (issue 47 item 1): its duration is read from its
header and a clip over the limit is refused before a sample is decoded (trt-llm-run: one line naming the
request, the part and whisper.max_audio_seconds, the other requests answered, the output written, exit
status 1; the server: a 400 naming --max-audio-seconds); a long clip is decoded as a stream whose samples,
features and VAD probabilities are the whole decode's, bit for bit (the whole decode is what
test_audio_inputs.py and test_whisper*.py check against transformers and silero-vad); the server counts
its decodes against one memory budget; a client that leaves mid-upload is one log line (item 6)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import socket
import time

import numpy as np
import pytest
import soundfile

from trt_llm.runtime.media.audio import decode, features
from trt_llm.runtime.media.audio.decode import AudioError, decode_audio, stream_audio
from trt_llm.runtime.media.audio.features import WhisperFeatures
from trt_llm.runtime.media.audio.streaming import stream_clip


def flac(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0) -> bytes:
    """Noise with a loud and a quiet stretch (so the features' floor is a real cut), as a FLAC."""
    rng = np.random.default_rng(seed)
    samples = (rng.standard_normal((int(seconds * rate), channels)) * 0.2).astype(np.float32)
    samples[: len(samples) // 3] *= 1e-4
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="FLAC")
    return buffer.getvalue()


# --- the stream is the whole decode ---------------------------------------------------------------

@pytest.mark.parametrize("rate, channels", [(16000, 1), (44100, 2), (22050, 1)])
def test_the_stream_decode_is_the_whole_decode(rate, channels):
    data = flac(3.7, rate, channels)
    whole = decode_audio(data, "clip")
    blocks = list(stream_audio(data, "clip", block_frames=5000))  # many blocks, none aligned to anything
    assert len(blocks) > 5
    np.testing.assert_array_equal(np.concatenate(blocks), whole)  # soxr's stream is its one-shot call


def test_streamed_features_are_the_whole_clips(monkeypatch):
    """The spilled features, read back window by window, equal the whole clip's unpadded features
    (windowed()'s, transformers' padding="longest"), floor included; small blocks so that the 4.2 s
    clip spans several."""
    monkeypatch.setattr(features, "FRAMES_PER_BLOCK", 64)
    data = flac(4.2, 44100, 2)
    waveform = decode_audio(data, "clip")
    extractor = WhisperFeatures()
    whole = dataclasses.replace(extractor, chunk_length=5, pad_to_chunk=False)(waveform).features
    clip = stream_clip(data, "clip", extractor, None)
    assert clip.features.shape == whole.shape and clip.samples == len(waveform)
    for start in range(0, whole.shape[1], 150):
        np.testing.assert_array_equal(clip.features[:, start:start + 150], whole[:, start:start + 150])
    np.testing.assert_array_equal(clip.features[:, :], whole)


def test_vad_probabilities_of_the_stream_are_the_whole_clips():
    pytest.importorskip("silero_vad")
    from trt_llm.runtime.media.audio import vad

    data = flac(40.3)  # two of the model's 16 s blocks and a part
    model = vad.SileroVad()
    clip = stream_clip(data, "clip", WhisperFeatures(), None, model)
    np.testing.assert_array_equal(clip.probabilities, model.probabilities(decode_audio(data, "clip")))
    np.testing.assert_array_equal(clip.waveform.read(0, clip.samples), decode_audio(data, "clip"))


# --- refused before decoding ----------------------------------------------------------------------

@pytest.fixture
def decoded(monkeypatch):
    """The sample rates of every clip whose samples were decoded (a spy on decode._mono_blocks)."""
    seen = []
    original = decode._mono_blocks

    def spy(clip, name, *args):
        seen.append(name)
        return original(clip, name, *args)

    monkeypatch.setattr(decode, "_mono_blocks", spy)
    return seen


def test_a_long_clip_is_refused_from_its_header(decoded):
    data = flac(3.0)
    for call in (lambda: decode_audio(data, "'long.flac'", max_seconds=2.5),
                 lambda: list(stream_audio(data, "'long.flac'", max_seconds=2.5)),
                 lambda: stream_clip(data, "'long.flac'", WhisperFeatures(), 2.5)):
        with pytest.raises(AudioError, match=r"^audio 'long.flac': 3.00 s long, over the limit of 2.5 s$"):
            call()
    assert decoded == []  # not a sample read


def test_a_header_that_understates_the_length_stops_as_it_decodes(monkeypatch):
    """A header that says 1 s of a 3 s clip (as an MP3's estimate can): the decode counts the frames
    and stops at the limit, a block past it at most."""
    data = flac(3.0)
    honest = decode.audio_info
    monkeypatch.setattr(decode, "audio_info",
                        lambda source, name, max_seconds=None: dataclasses.replace(honest(source, name), frames=16000))
    with pytest.raises(AudioError, match="over the limit of 2 s"):
        list(stream_audio(data, "clip", max_seconds=2, block_frames=4000))
    with pytest.raises(AudioError, match="over the limit of 2 s"):
        decode_audio(data, "clip", max_seconds=2)


@pytest.fixture(scope="module")
def engine(whisper_tiny_en_dir, build_engine_for):
    return build_engine_for(whisper_tiny_en_dir, max_batch_size=4)  # test_whisper.py's engine


def test_trt_llm_run_refuses_the_long_clip_alone(engine, tmp_path, decoded):
    """A 3 s and a 1 s clip under whisper.max_audio_seconds 2: the long one's error names the request,
    the part and the limit, and its samples are never decoded; the short one is answered, the output
    written whole, exit status 1."""
    from trt_llm.runtime.app.run_cli import main as run_main

    (tmp_path / "long.flac").write_bytes(flac(3.0))
    (tmp_path / "short.flac").write_bytes(flac(1.0, seed=1))
    requests = [{"messages": [{"role": "user", "content": [{"type": "audio", "audio": name}]}]}
                for name in ("short.flac", "long.flac", "short.flac")]
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 20, "whisper": {"max_audio_seconds": 2},
                                  "requests": requests}))
    out = tmp_path / "out.json"
    started = time.perf_counter()
    assert run_main([str(source), "--engine-dir", str(engine), "-o", str(out), "--threads", "1"]) == 1
    responses = json.loads(out.read_text())["responses"]
    assert [r["finish_reason"] == "error" for r in responses] == [False, True, False]
    error = responses[1]["error"]
    assert error.startswith("requests[1].messages[0].content[0]: audio 'long.flac'") and "\n" not in error
    assert error.endswith("3.00 s long, over the limit of 2 s (whisper.max_audio_seconds)")
    assert all(r["generated_tokens"] > 0 for r in (responses[0], responses[2]))
    assert not any("long.flac" in name for name in decoded) and any("short.flac" in name for name in decoded)
    assert time.perf_counter() - started < 60


def test_an_image_over_the_pixel_limit_is_refused_before_its_pixels_are_decoded(tmp_path, monkeypatch):
    """Images: the size from the header, the limit checked before Pillow's load() (a spy that fails if
    called), for each format that is opened."""
    from PIL import Image, ImageFile

    from trt_llm.runtime.media.sources import MediaError, decode_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    loaded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loaded.append(self.format))
    for fmt in ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP"):
        buffer = io.BytesIO()
        Image.new("RGB", (50, 40)).save(buffer, format=fmt)  # 2,000 pixels
        with pytest.raises(MediaError, match=r"50x40 is 2,000 pixels, over the limit of 1,000"):
            decode_image(buffer.getvalue(), f"'bomb.{fmt.lower()}'")
    assert loaded == []


# --- the server: its limit, its budget, a client that leaves ---------------------------------------

pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")
import httpx  # noqa: E402

BOUNDARY = "bounds-boundary-1c9e"


def multipart(data: bytes, filename: str, **fields) -> bytes:
    text = "".join(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                   for k, v in {"model": "whisper", **fields}.items())
    head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: audio/flac\r\n\r\n")
    return (text + head).encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.fixture(scope="module")
def server(engine):
    from test_server import LiveServer
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="whisper", max_rows=2, max_audio_seconds=2)))
    yield live
    live.close()


def test_the_server_refuses_a_clip_over_its_limit_before_decoding(server, decoded):
    post = lambda data, name, **f: httpx.post(f"{server.url}/v1/audio/transcriptions",  # noqa: E731
                                              content=multipart(data, name, **f), timeout=120,
                                              headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    for fields in ({}, {"response_format": "verbose_json"}):
        answer = post(flac(3.0), "long.flac", **fields)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "file" and error["code"] == "audio_too_long"
        assert error["message"] == ("file: 'long.flac' is 3.00 s long, over the server's limit of 2 s "
                                    "(--max-audio-seconds)")
    assert decoded == []
    answer = post(flac(1.0, seed=1), "short.flac")  # the server goes on; a clip under it is answered
    assert answer.status_code == 200, answer.text
    assert len(decoded) == 1  # its samples only


def test_the_server_flags_and_their_defaults():
    from trt_llm.server.app import ServerConfig
    from trt_llm.server.cli import parse_args

    args = parse_args(["--engine-dir", "e"])
    assert args.max_audio_seconds == 1800 and args.audio_decode_budget == 256 << 20
    assert ServerConfig(model_name="m").max_audio_seconds == 1800 < 7200  # trt-llm-run's default
    args = parse_args(["--engine-dir", "e", "--max-audio-seconds", "60", "--audio-decode-budget", "64M"])
    assert args.max_audio_seconds == 60 and args.audio_decode_budget == 64 << 20


def test_the_decode_budget_admits_first_come_first_served():
    """Decodes hold the budget together: one that does not fit waits, in arrival order (a large one is
    not passed by small ones behind it), one larger than the budget runs alone, and past max_waiting
    waiters a decode is refused with a 429."""
    from trt_llm.server.app import HttpError
    from trt_llm.server.audio_budget import DecodeBudget, decode_cost

    assert decode_cost(7200, streamed=True) == decode_cost(60, streamed=True) < decode_cost(60, streamed=False)

    async def scenario():
        budget, log = DecodeBudget(100, max_waiting=2), []
        gates = {name: asyncio.Event() for name in "abcd"}

        async def decode(name, cost):
            async with budget.hold(cost):
                log.append((name, budget.used))
                await gates[name].wait()

        a = asyncio.create_task(decode("a", 60))
        await asyncio.sleep(0)
        b = asyncio.create_task(decode("b", 60))  # does not fit beside a: waits
        await asyncio.sleep(0)
        c = asyncio.create_task(decode("c", 10))  # would fit, but b came first
        await asyncio.sleep(0.01)
        assert log == [("a", 60)]
        with pytest.raises(HttpError) as refused:
            async with budget.hold(1):
                pass
        assert refused.value.status == 429 and "--audio-decode-budget" in refused.value.message
        gates["a"].set()
        await asyncio.sleep(0.01)
        assert log == [("a", 60), ("b", 70), ("c", 70)]  # both admitted as a left, in order
        gates["b"].set()
        gates["c"].set()
        await asyncio.gather(a, b, c)
        d = asyncio.create_task(decode("d", 1000))  # over the whole budget: alone, counted as all of it
        await asyncio.sleep(0.01)
        assert log[-1] == ("d", 100)
        gates["d"].set()
        await d
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_client_leaving_mid_upload_is_one_log_line(server, caplog):
    body = multipart(flac(1.5), "clip.flac")
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n").encode()
    with caplog.at_level(logging.INFO):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head + body[:len(body) // 2])
            time.sleep(0.3)
        deadline = time.time() + 20
        while not any("upload" in r.getMessage() for r in caplog.records) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything else it would log
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].getMessage().startswith("/v1/audio/transcriptions: the client disconnected during its upload (")
    assert lines[0].exc_info is None and "\n" not in lines[0].getMessage()
