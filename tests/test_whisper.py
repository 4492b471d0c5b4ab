"""Whisper engines end to end: the real Whisper tiny.en (tests/whisper_assets.py) built and run on input
files of real speech (Debian's LibriVox clips), against transformers' `generate` on the same clips:
greedy tokens identical, with and without a previous-text prompt, in static and continuous batches.
The word error rate against the clips' transcripts is in the README (benchmarks/whisper_speed.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

@pytest.fixture(scope="module")
def whisper_dir(whisper_tiny_en_dir):
    return whisper_tiny_en_dir


@pytest.fixture(scope="module")
def clips(librivox_clips):
    return [clip.path for clip in librivox_clips]


@pytest.fixture(scope="module")
def engine(whisper_dir, build_engine_for):
    # max_input_len and the cache are cut to Whisper's 448 decoder positions by the build
    return build_engine_for(whisper_dir, max_batch_size=4)


def transcribe_request(clip, text: str | None = None) -> dict:
    content = [{"type": "audio", "audio": str(clip)}] + ([{"type": "text", "text": text}] if text else [])
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict], runner_options=None, **settings):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": min(4, len(requests)), "temperature": 0.0, "max_generate_length": 448,
                                "requests": requests, **settings}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=2, **(runner_options or {})).run(loaded, loaded.settings)


_HF = {}


def transformers_tokens(whisper_dir, clip, text: str | None = None) -> list[int]:
    """transformers' greedy transcription of one clip: the tokens after its decoder prompt."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from trt_llm.runtime.media.audio.decode import load_audio

    if whisper_dir not in _HF:
        _HF[whisper_dir] = (WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval(),
                            WhisperProcessor.from_pretrained(whisper_dir))
    model, processor = _HF[whisper_dir]
    features = processor(load_audio(str(clip)), sampling_rate=16000, return_tensors="pt").input_features
    extra = {}
    if text:
        extra["prompt_ids"] = torch.tensor(processor.get_prompt_ids(text))
    with torch.inference_mode():
        out = model.generate(features, do_sample=False, num_beams=1, **extra)[0].tolist()
    # the output starts after the prompt (and ends with <|endoftext|>, which ours does not count)
    start = out.index(model.generation_config.no_timestamps_token_id) + 1 if \
        model.generation_config.no_timestamps_token_id in out else 0
    return [t for t in out[start:] if t != model.generation_config.eos_token_id]


def test_librivox_transcriptions_are_token_identical_to_transformers(engine, whisper_dir, clips, tmp_path):
    """Five clips in two static batches (4 + 1): each transcription is transformers' own."""
    output = run_file(engine, tmp_path, [transcribe_request(clip) for clip in clips])
    for clip, response in zip(clips, output.responses):
        assert response.finish_reason == "end-of-sequence", response.error
        assert response.output_token_ids[-1] == 50256  # <|endoftext|>
        assert response.output_token_ids[:-1] == transformers_tokens(whisper_dir, clip)
    assert output.responses[1].output_text == " He was not an old-sposed young man."


def test_a_previous_text_prompt_is_transformers_prompt_ids(engine, whisper_dir, clips, tmp_path):
    text = "Mr. Dashwood, Sense and Sensibility."
    output = run_file(engine, tmp_path, [transcribe_request(clips[0], text), transcribe_request(clips[1])])
    prompted = output.responses[0]
    assert prompted.finish_reason == "end-of-sequence", prompted.error
    assert prompted.output_token_ids[:-1] == transformers_tokens(whisper_dir, clips[0], text)
    assert output.responses[1].output_token_ids[:-1] == transformers_tokens(whisper_dir, clips[1])


def test_continuous_batching_transcribes_the_same(engine, clips, tmp_path):
    requests = [transcribe_request(clip) for clip in clips]
    static = run_file(engine, tmp_path, requests)
    continuous = run_file(engine, tmp_path, requests, runner_options={"scheduling": "continuous"})
    assert [r.output_token_ids for r in continuous.responses] == [r.output_token_ids for r in static.responses]


def test_bad_whisper_requests_fail_alone_and_say_why(engine, clips, tmp_path):
    import soundfile

    long_clip = tmp_path / "long.wav"
    soundfile.write(long_clip, (np.random.default_rng(0).standard_normal(16000 * 31) * 0.1).astype(np.float32), 16000)
    requests = [transcribe_request(clips[1]),
                {"messages": [{"role": "user", "content": [{"type": "audio", "audio": str(clips[0])},
                                                           {"type": "audio", "audio": str(clips[1])}]}]},
                {"messages": [{"role": "user", "content": "no audio here"}]},
                transcribe_request(long_clip),
                transcribe_request(tmp_path / "missing.flac")]
    output = run_file(engine, tmp_path, requests, whisper={"max_audio_seconds": 30})
    good, two, none, long, missing = output.responses
    assert good.finish_reason == "end-of-sequence"
    assert two.finish_reason == "error" and "one audio part per request, got 2" in two.error
    assert none.finish_reason == "error" and "got 0" in none.error and "requests[2].messages" in none.error
    assert long.finish_reason == "error" and "31.00 s" in long.error and "over the limit of 30 s" in long.error
    assert "whisper.max_audio_seconds" in long.error
    assert missing.finish_reason == "error" and "requests[4].messages[0].content[0]" in missing.error
    assert "missing.flac" in missing.error


def test_the_profile_reports_audio_seconds_and_the_real_time_factor(engine, clips, tmp_path):
    import soundfile

    from trt_llm.runtime.engine.profiler import Profiler

    profiler = Profiler()
    run_file(engine, tmp_path, [transcribe_request(clip) for clip in clips[:2]], runner_options={"profiler": profiler})
    stats = profiler.summary().multimodal
    seconds = sum(soundfile.info(str(clip)).duration for clip in clips[:2])
    assert stats.clips == 2 and stats.audio_seconds == pytest.approx(seconds, rel=1e-3)
    assert 0 < stats.real_time_factor < 10 and stats.audio_encoder_ms_per_second > 0


def test_response_format_text_keeps_the_token_rules_and_json_is_refused(engine, clips, tmp_path):
    from trt_llm.runtime.media.audio.transcription import TokenRules
    from trt_llm.schemas.input_file import InputSettings, Request

    runner = Runner(EngineDir.open(engine), threads=1)
    settings = InputSettings.model_validate({"temperature": 0.0})
    text = Request.model_validate({**transcribe_request(clips[1]), "response_format": {"type": "text"}})
    prepared = runner.preparer.prepare(0, text, settings, runner.formatter(settings))
    assert isinstance(prepared.sequence.constraint, TokenRules)  # suppress_tokens still apply
    assert not prepared.sequence.constraint.allowed()[50256]  # <|endoftext|> is not a first token
    structured = {**transcribe_request(clips[1]), "response_format": {"type": "json_object"}}
    (refused,) = run_file(engine, tmp_path, [structured]).responses
    assert refused.finish_reason == "error" and "requests[0].response_format" in refused.error
