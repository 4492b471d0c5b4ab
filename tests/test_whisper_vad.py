"""Voice activity detection for Whisper (runtime/media/audio/vad.py, vad_transcription.py): Silero VAD's
probabilities against silero-vad's own two paths (its numpy front end and its torch streaming
wrapper), the speech spans, chunks and time map against faster-whisper's code on the same
probabilities, and on the real Whisper tiny.en (test_whisper.py's engine) a recording of the LibriVox
clips with long silences between them: the chunks fall on the clips, each chunk's segments are the
chunk transcribed alone, their times mapped back inside the clips' spans.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("silero_vad")

from trt_llm.runtime.media.audio import vad  # noqa: E402

SILENCE_S = 5.0
LEAD_S = 3.0
ORDER = (0, 1, 2, 3, 4, 0, 2)  # 37 s of speech: two chunks


@pytest.fixture(scope="module")
def joined(librivox_clips):
    """(audio, the clips' (start, end) samples): the clips after LEAD_S of silence, SILENCE_S between
    them, a little noise under everything (real recordings have no digital silence)."""
    from trt_llm.runtime.media.audio.decode import load_audio

    pieces, spans, at = [np.zeros(int(LEAD_S * vad.RATE), np.float32)], [], int(LEAD_S * vad.RATE)
    for i in ORDER:
        clip = load_audio(str(librivox_clips[i].path))
        pieces += [clip, np.zeros(int(SILENCE_S * vad.RATE), np.float32)]
        spans.append((at, at + len(clip)))
        at += len(clip) + int(SILENCE_S * vad.RATE)
    audio = np.concatenate(pieces)[:-100]  # not a whole number of VAD frames
    audio = audio + np.random.default_rng(0).normal(0, 1e-3, audio.shape).astype(np.float32)
    return audio, spans


@pytest.fixture(scope="module")
def recording(joined, tmp_path_factory):
    import soundfile

    path = tmp_path_factory.mktemp("vad") / "recording.wav"
    soundfile.write(path, joined[0], vad.RATE, subtype="FLOAT")
    return path


@pytest.fixture(scope="module")
def engine(whisper_tiny_en_dir, build_engine_for):
    return build_engine_for(whisper_tiny_en_dir, max_batch_size=4)  # test_whisper.py's engine


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # silero-vad's own loader
def test_probabilities_are_silero_vads_own(joined):
    """Bit-identical to silero-vad's numpy front end over the same file, and to its streaming torch
    wrapper (a frame a call) over another of its exports of the model."""
    from silero_vad import load_silero_vad
    from silero_vad.sequence_vad import SileroVADSequence

    audio = joined[0]
    ours = vad.SileroVad().probabilities(audio)
    assert ours.shape == (-(-len(audio) // vad.FRAME),)
    np.testing.assert_array_equal(ours, SileroVADSequence(str(vad.model_path())).audio_forward(audio))
    import torch

    part = audio[: 12 * vad.RATE]  # the streaming path runs a frame a call: 12 s of it
    streaming = load_silero_vad(onnx=True).audio_forward(torch.from_numpy(part), vad.RATE).numpy().reshape(-1)
    np.testing.assert_allclose(vad.SileroVad().probabilities(part), streaming, atol=1e-5)
    assert ours.max() > 0.9 and ours[: int(LEAD_S * vad.RATE) // vad.FRAME - 20].max() < 0.1


OPTIONS = [vad.VadOptions(),  # the batched pipeline's defaults
           vad.VadOptions(threshold=0.6, neg_threshold=0.3, min_speech_duration_ms=250, max_speech_duration_s=4,
                          min_silence_duration_ms=500, speech_pad_ms=100)]  # cuts long speech


@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "cut"])
def test_spans_chunks_and_times_are_faster_whispers(joined, options, monkeypatch):
    """faster-whisper's get_speech_timestamps, collect_chunks and SpeechTimestampsMap, given the same
    model (its SileroVADModel over silero-vad's file), give the same spans, chunk audio and times."""
    fv = pytest.importorskip("faster_whisper.vad")
    audio = joined[0]
    monkeypatch.setattr(fv, "get_vad_model", lambda: fv.SileroVADModel(str(vad.model_path())))
    theirs = fv.get_speech_timestamps(audio, fv.VadOptions(**options.__dict__))
    ours = vad.speech_spans(vad.SileroVad().probabilities(audio), len(audio), options)
    assert ours == [(s["start"], s["end"]) for s in theirs]
    assert len(ours) >= len(ORDER)
    assert max(end - start for start, end in ours) <= options.max_speech_duration_s * vad.RATE
    chunks = vad.merge_chunks(ours)
    their_audio, their_meta = fv.collect_chunks(audio, theirs, max_duration=30)
    assert [c.offset for c in chunks] == pytest.approx([m["offset"] for m in their_meta], abs=1e-9)
    for chunk, samples in zip(chunks, their_audio, strict=True):
        np.testing.assert_array_equal(chunk.audio(audio), samples)
        assert chunk.duration <= 30
    ours_map, their_map = vad.TimeMap(ours), fv.SpeechTimestampsMap(theirs, vad.RATE, time_precision=9)
    for t in np.linspace(0, sum(c.duration for c in chunks), 301):
        for is_end in (False, True):
            assert ours_map.original(t, is_end) == pytest.approx(their_map.get_original_time(t, is_end=is_end),
                                                                 abs=1e-8)


def test_chunks_fall_on_the_clips(joined):
    """Every clip inside one speech span (with its padding), every span on a clip: the silences out."""
    audio, clips = joined
    chunks, _ = vad.speech_chunks(audio, vad.VadOptions())
    assert len(chunks) == 2
    pad = vad.VadOptions().speech_pad_ms * vad.RATE // 1000
    spans = [span for chunk in chunks for span in chunk.spans]
    for start, end in clips:
        assert any(s <= start and end <= e for s, e in spans), (start, end)
    for s, e in spans:
        assert any(start - pad - vad.FRAME <= s and e <= end + pad + vad.FRAME for start, end in clips), (s, e)
    kept = sum(e - s for s, e in spans) / len(audio)
    assert kept < 0.6  # a third of the recording is silence


def run_file(engine, folder, requests, **settings):
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import load_input_file

    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": min(4, len(requests)), "temperature": 0.0, "max_generate_length": 448,
                                "requests": requests, **settings}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=2).run(loaded, loaded.settings)


def transcribe(clip) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "audio", "audio": str(clip)}]}]}


def test_each_chunk_is_transcribed_as_alone_and_mapped_back(engine, joined, recording, tmp_path):
    import soundfile

    audio, clips = joined
    (got,) = run_file(engine, tmp_path, [transcribe(recording)],
                      whisper={"vad_filter": True, "return_timestamps": True}).responses
    assert got.finish_reason == "end-of-sequence", got.error
    chunks, time_map = vad.speech_chunks(audio, vad.VadOptions())
    paths = []
    for i, chunk in enumerate(chunks):
        paths.append(tmp_path / f"chunk{i}.wav")
        soundfile.write(paths[i], chunk.audio(audio), vad.RATE, subtype="FLOAT")
    alone = run_file(engine, tmp_path, [transcribe(p) for p in paths], whisper={"return_timestamps": True}).responses
    assert [s.tokens for s in got.segments] == [s.tokens for r in alone for s in r.segments]
    assert got.output_text == "".join(r.output_text for r in alone)
    want = [(time_map.original(chunk.offset + s.start), time_map.original(chunk.offset + s.end, is_end=True))
            for chunk, r in zip(chunks, alone) for s in r.segments]
    assert [t for s in got.segments for t in (s.start, s.end)] == pytest.approx([t for pair in want for t in pair],
                                                                               abs=1.5e-3)
    # Each time inside a clip's span (a segment may run across a cut silence: its start in one clip, its
    # end in the next, as faster-whisper's are), the segments in order.
    pad = vad.VadOptions().speech_pad_ms / 1000 + 0.05
    seconds = [(start / vad.RATE, end / vad.RATE) for start, end in clips]
    for s in got.segments:
        assert s.start < s.end
        assert any(a - pad <= s.start <= b + pad for a, b in seconds), s.start
        assert any(a - pad <= s.end <= b + pad for a, b in seconds), s.end
    assert [s.start for s in got.segments] == sorted(s.start for s in got.segments)
    assert got.duration == pytest.approx(len(audio) / vad.RATE, abs=1e-3)
    assert "dashwood" in got.output_text.lower()


def test_silence_alone_is_no_speech(engine, tmp_path):
    import soundfile

    path = tmp_path / "silence.wav"
    soundfile.write(path, np.zeros(20 * vad.RATE, np.float32), vad.RATE, subtype="FLOAT")
    (got,) = run_file(engine, tmp_path, [transcribe(path)],
                      whisper={"vad_filter": True, "return_timestamps": True}).responses
    assert got.finish_reason == "end-of-sequence" and got.output_text == "" and got.segments == []


def test_bad_vad_parameters_name_the_field(tmp_path):
    from trt_llm.schemas.input_file import InputFileError, load_input_file

    path = tmp_path / "input.json"
    path.write_text(json.dumps({"whisper": {"vad_filter": True, "vad_parameters": {"max_speech_duration_s": 45}},
                                "requests": [transcribe("x.wav")]}))
    with pytest.raises(InputFileError) as error:
        load_input_file(path)
    assert "whisper.vad_parameters.max_speech_duration_s" in str(error.value) and "30" in str(error.value)


def test_the_form_takes_vad_filter_and_its_parameters():
    pytest.importorskip("fastapi")
    from trt_llm.server.app import HttpError
    from trt_llm.server.transcriptions import _settings

    settings = _settings({"vad_filter": "true", "vad_parameters": '{"threshold": 0.6, "speech_pad_ms": 200}'},
                         448, "transcribe")
    assert settings.whisper.vad_filter and settings.whisper.vad_parameters.threshold == 0.6
    assert settings.whisper.vad_parameters.speech_pad_ms == 200
    assert not _settings({}, 448, "transcribe").whisper.vad_filter
    for fields, words in (({"vad_filter": "maybe"}, "vad_filter"), ({"vad_parameters": "[1]"}, "JSON object"),
                          ({"vad_parameters": '{"max_speech_duration_s": 40}'}, "vad_parameters.max_speech_duration_s")):
        with pytest.raises(HttpError) as error:
            _settings(fields, 448, "transcribe")
        assert words in error.value.message and error.value.status == 400


def test_without_the_model_the_request_fails_naming_it(engine, recording, tmp_path, monkeypatch):
    """No silero-vad model file: the request fails with one line naming it and the extra, nothing decoded."""
    monkeypatch.setattr(vad, "MODEL_FILE", "absent.onnx")
    monkeypatch.setattr(vad, "shared_vad", lambda: vad.SileroVad())  # not the process's session, made already
    (got,) = run_file(engine, tmp_path, [transcribe(recording)], whisper={"vad_filter": True}).responses
    assert got.finish_reason == "error"
    assert got.error.startswith("requests[0]") and "trt-llm[vad]" in got.error and "\n" not in got.error
