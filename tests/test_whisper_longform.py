"""Long-form Whisper: the real Whisper tiny.en (tests/whisper_assets.py) on a recording of about a minute
and a half made of Debian's LibriVox clips with pauses between them, against transformers' own
long-form `generate(input_features, return_timestamps=True, ...)` (the processor with
truncation=False, padding="longest", return_attention_mask=True): the text, the tokens and every
segment's start and end identical, with and without condition_on_prev_tokens; the srt and vtt files
parse and their cues are the segments; an over-limit clip fails alone, naming the field; fallback
temperatures are honoured, seeded (the same seed, the same path; a failing threshold moves to them).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

PAUSE_S = 1.5
ORDER = (0, 1, 2, 3, 4, 2, 0, 4, 1, 3, 3, 0, 2)  # the clips, some more than once: about 90 s


@pytest.fixture(scope="module")
def engine(whisper_tiny_en_dir, build_engine_for):
    return build_engine_for(whisper_tiny_en_dir, max_batch_size=4)  # test_whisper.py's engine


@pytest.fixture(scope="module")
def recording(librivox_clips, tmp_path_factory):
    """The LibriVox clips joined with PAUSE_S of silence between them, a 16 kHz wav."""
    import soundfile

    from trt_llm.runtime.media.audio.decode import load_audio

    pause = np.zeros(int(PAUSE_S * 16000), dtype=np.float32)
    pieces = []
    for i in ORDER:
        pieces += [load_audio(str(librivox_clips[i].path)), pause]
    path = tmp_path_factory.mktemp("longform") / "recording.wav"
    soundfile.write(path, np.concatenate(pieces[:-1]), 16000, subtype="FLOAT")
    return path


@pytest.fixture(scope="module")
def plain(engine, recording, tmp_path_factory):
    """The recording transcribed with the default settings (condition_on_prev_tokens off)."""
    return run_file(engine, tmp_path_factory.mktemp("plain"), [transcribe(recording)]).responses[0]


def run_file(engine, folder, requests: list[dict], runner_options=None, **settings):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": min(4, len(requests)), "temperature": 0.0, "max_generate_length": 448,
                                "requests": requests, **settings}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=2, **(runner_options or {})).run(loaded, loaded.settings)


def transcribe(clip) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "audio", "audio": str(clip)}]}]}


_HF = {}


def transformers_longform(whisper_dir, clip, **options) -> dict:
    """transformers' long-form transcription: (start, end, tokens) per segment and the sequences."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from trt_llm.runtime.media.audio.decode import load_audio

    if whisper_dir not in _HF:
        _HF[whisper_dir] = (WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval(),
                            WhisperProcessor.from_pretrained(whisper_dir))
    model, processor = _HF[whisper_dir]
    inputs = processor(load_audio(str(clip)), sampling_rate=16000, truncation=False, padding="longest",
                       return_attention_mask=True, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(inputs.input_features, attention_mask=inputs.attention_mask, return_timestamps=True,
                             return_segments=True, **options)
    segments = [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in out["segments"][0]]
    return {"segments": segments, "sequence": [t for t in out["sequences"][0].tolist()
                                               if t != model.generation_config.pad_token_id]}


THRESHOLDS = {"compression_ratio_threshold": 2.4, "logprob_threshold": -1.0, "no_speech_threshold": 0.6}


@pytest.mark.parametrize("condition", [False, True])
def test_segments_are_transformers_long_form(engine, whisper_tiny_en_dir, recording, plain, tmp_path, condition):
    response = plain if not condition else run_file(engine, tmp_path, [transcribe(recording)],
                                                    whisper={"condition_on_prev_tokens": True}).responses[0]
    assert response.finish_reason == "end-of-sequence", response.error
    expected = transformers_longform(whisper_tiny_en_dir, recording, temperature=0.0,
                                     condition_on_prev_tokens=condition, **THRESHOLDS)
    got = [(s.start, s.end, s.tokens) for s in response.segments]
    assert [tokens for _, _, tokens in got] == [tokens for _, _, tokens in expected["segments"]]
    assert [t for start, end, _ in got for t in (start, end)] == pytest.approx(
        [t for start, end, _ in expected["segments"] for t in (start, end)], abs=1e-9)
    assert response.output_token_ids == expected["sequence"]
    import soundfile

    assert response.duration == pytest.approx(soundfile.info(str(recording)).duration, abs=1e-3)
    assert len(response.segments) >= 10 and response.segments[-1].end > 60
    assert response.output_text == "".join(s.text for s in response.segments)
    assert "Dashwood" in response.output_text or "dashwood" in response.output_text.lower()


def test_srt_and_vtt_cues_are_the_segments(plain):
    from trt_llm.runtime.media.audio.subtitles import srt, vtt

    segments = plain.segments
    srt_cues = re.findall(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.+?)\n\n",
                          srt(segments), flags=re.S)
    vtt_text = vtt(segments)
    assert vtt_text.startswith("WEBVTT\n\n")
    vtt_cues = re.findall(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n(.+?)\n\n", vtt_text,
                          flags=re.S)
    assert len(srt_cues) == len(vtt_cues) == len(segments)

    def seconds(h, m, s, ms):
        return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000

    for i, (cue, vcue, segment) in enumerate(zip(srt_cues, vtt_cues, segments)):
        assert int(cue[0]) == i + 1
        assert seconds(*cue[1:5]) == pytest.approx(segment.start, abs=5e-4)
        assert seconds(*cue[5:9]) == pytest.approx(segment.end, abs=5e-4)
        assert seconds(*vcue[0:4]) == pytest.approx(segment.start, abs=5e-4)
        assert cue[9] == vcue[8] == segment.text.strip()


def test_an_over_limit_clip_fails_alone(engine, recording, librivox_clips, tmp_path):
    output = run_file(engine, tmp_path, [transcribe(librivox_clips[1].path), transcribe(recording)],
                      whisper={"max_audio_seconds": 60})
    short, long = output.responses
    assert short.finish_reason == "end-of-sequence" and short.segments is None
    assert long.finish_reason == "error"
    assert "requests[1].messages[0].content[0]" in long.error and "whisper.max_audio_seconds" in long.error
    assert "over the limit of 60 s" in long.error and "\n" not in long.error


def test_fallback_temperatures_are_seeded_and_taken_when_a_threshold_fails(engine, librivox_clips, tmp_path):
    """A logprob_threshold no greedy decode can pass (0) sends every window to the fallback
    temperatures: the last one's decode is kept; the same seed gives the same path, and the
    segments say which temperature decoded them."""
    clip = librivox_clips[0].path
    whisper = {"return_timestamps": True, "temperature_fallback": [0.6, 1.0], "logprob_threshold": 0.0,
               "no_speech_threshold": None}
    first = run_file(engine, tmp_path, [transcribe(clip)], seed=7, whisper=whisper).responses[0]
    again = run_file(engine, tmp_path, [transcribe(clip)], seed=7, whisper=whisper).responses[0]
    greedy = run_file(engine, tmp_path, [transcribe(clip)], whisper={"return_timestamps": True}).responses[0]
    assert first.finish_reason == "end-of-sequence", first.error
    assert {s.temperature for s in first.segments} == {1.0}
    assert {s.temperature for s in greedy.segments} == {0.0}
    assert first.output_token_ids == again.output_token_ids
    assert first.output_token_ids != greedy.output_token_ids


def test_the_endpoint_answers_verbose_json_srt_and_vtt(engine, recording, tmp_path):
    """/v1/audio/transcriptions through the official client: verbose_json's segments are trt-llm-run's
    with the server's settings (temperature 0 with openai-whisper's fallback temperatures, seed 0),
    srt and vtt their cues; an English-only engine refuses /v1/audio/translations."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    pytest.importorskip("python_multipart")
    from test_server import LiveServer
    from trt_llm.schemas.input_file import STANDARD_FALLBACK
    from trt_llm.server.app import ServerConfig, create_app

    short = recording.parent / "short.wav"  # 40 s: two windows, cheaper than the whole recording
    import soundfile

    audio, rate = soundfile.read(str(recording), dtype="float32")
    soundfile.write(short, audio[: 40 * rate], rate, subtype="FLOAT")
    want = run_file(engine, tmp_path, [transcribe(short)], seed=0,
                    whisper={"temperature_fallback": STANDARD_FALLBACK}).responses[0]
    runner = Runner(EngineDir.open(engine), threads=2, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="whisper", api_keys=("k",), max_rows=4)))
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="k", max_retries=0)
        verbose = client.audio.transcriptions.create(model="whisper", file=short, response_format="verbose_json",
                                                     timestamp_granularities=["segment"])
        assert verbose.language == "english" and verbose.duration == pytest.approx(40.0, abs=1e-3)
        assert [(s.start, s.end, s.text, s.tokens) for s in verbose.segments] == \
            [(s.start, s.end, s.text, s.tokens) for s in want.segments]
        assert verbose.text == want.output_text.strip()
        from trt_llm.runtime.media.audio.subtitles import srt, vtt

        assert client.audio.transcriptions.create(model="whisper", file=short, response_format="srt") == \
            srt(want.segments)
        assert client.audio.transcriptions.create(model="whisper", file=short, response_format="vtt") == \
            vtt(want.segments)
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.translations.create(model="whisper", file=short)
        assert "multilingual" in str(refused.value)
    finally:
        live.close()
