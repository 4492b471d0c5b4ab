"""Qwen3-ASR engines end to end: a tiny random Qwen3ASRForConditionalGeneration (2 encoder and 2 decoder
layers of width 64) with the real Qwen tokenizer and transformers' own Qwen3ASRProcessor files
(tests/audio_llm_assets.py), built, run on Debian's LibriVox clips through trt-llm-run and through
POST /v1/audio/transcriptions, against transformers on the same clips.

The oracles are transformers' Qwen3ASRFeatureExtractor (the features), Qwen3ASRProcessor (the audio
token count, `apply_transcription_request`'s prompt, `decode(..., return_format="transcription_only")`)
and the model's own encoder (`get_audio_features`) and `generate` (greedy tokens identical).
"""

from __future__ import annotations

import json

import audio_llm_assets
import numpy as np
import pytest
import torch
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.media.audio.decode import load_audio
from trt_llm.runtime.media.audio.encoder import AudioEncoder
from trt_llm.runtime.media.audio.features import Qwen3ASRFeatures
from trt_llm.runtime.media.audio.qwen3_asr_prompt import parse_output
from trt_llm.families.qwen3_asr.host import Qwen3ASRLayout

MAX_NEW = 16
CONTEXT = "Sense and Sensibility, Mr. Dashwood."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, npm_tokenizer):
    return audio_llm_assets.make_tiny_qwen3_asr(tmp_path_factory.mktemp("qwen3_asr"),
                                                tokenizer_dir=npm_tokenizer("qwen3"))


@pytest.fixture(scope="module")
def engine(model_dir, build_engine_for):
    return build_engine_for(model_dir, max_batch_size=4, max_input_len=1024, max_kv_cache_capacity=1100)


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    model = Qwen3ASRForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def clips(librivox_clips, tmp_path_factory):
    """Two LibriVox clips (7.1 s: one attention window; 3.0 s) and two joined with a pause (12.9 s:
    two windows, the second partial)."""
    import soundfile

    first, second = (load_audio(str(clip.path)) for clip in librivox_clips[:2])
    joined = tmp_path_factory.mktemp("joined") / "joined.wav"
    soundfile.write(joined, np.concatenate([first, np.zeros(8000, np.float32), second * 0.5]), 16000)
    return [str(librivox_clips[0].path), str(librivox_clips[1].path), str(joined)]


def transformers_greedy(hf, clip: str, context: str | None = None, capacity: int | None = None,
                        language: str | None = None) -> list[int]:
    """Greedy tokens of the transcription request: MAX_NEW, or as many as `capacity` positions hold
    (what the endpoint asks for)."""
    model, processor = hf
    inputs = processor.apply_transcription_request(audio=load_audio(clip), prompt=context, language=language)
    prompt = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW if capacity is None else capacity - prompt,
                             do_sample=False)
    return out[0, prompt:].tolist()


def test_features_and_token_counts_are_the_processors(hf, clips):
    """Qwen3ASRFeatures against Qwen3ASRFeatureExtractor (a clip, one under min_length, one whose
    length is no multiple of the hop) and the audio tokens against the processor's rule."""
    _, processor = hf
    extractor = processor.feature_extractor
    rng = np.random.default_rng(0)
    waveforms = [load_audio(clips[0]), (rng.standard_normal(4321) * 0.1).astype(np.float32),
                 load_audio(clips[1])[:16000 * 2 + 77]]
    ours = Qwen3ASRFeatures()
    for waveform in waveforms:
        theirs = extractor(waveform, sampling_rate=16000, padding=True, return_attention_mask=True)
        got = ours(waveform)
        assert got.features.shape == theirs["input_features"][0].shape
        assert got.num_frames == int(theirs["attention_mask"][0].sum()) == ours.num_frames(len(waveform))
        np.testing.assert_allclose(got.features, theirs["input_features"][0].numpy(), atol=1e-4)
    frames = np.arange(0, 2500, 7)
    layout = Qwen3ASRLayout()
    assert [layout.audio_token_count(int(n)) for n in frames] == \
        processor._get_audio_token_length(torch.from_numpy(frames)).tolist()


def test_encoder_rows_are_transformers(engine, hf, clips):
    """The engine's audio rows of each clip (alone and in one batch) against transformers' encoder
    and projector, windows included."""
    from trt_llm.runtime.media.encoder_cache import content_key

    model, processor = hf
    audio = AudioEncoder(EngineDir.open(engine), threads=1)
    pending = [audio.pending_waveform(load_audio(clip), content_key(clip.encode()), clip) for clip in clips]
    batch = audio._run(pending)  # one graph run over every clip
    for clip, encoded in zip(clips, batch):
        inputs = processor.feature_extractor(load_audio(clip), sampling_rate=16000, padding=True,
                                               return_attention_mask=True)
        with torch.no_grad():
            want = model.get_audio_features(inputs["input_features"], inputs["attention_mask"]).pooler_output
        assert encoded.embeds.shape == tuple(want.shape)
        np.testing.assert_allclose(encoded.embeds, want.numpy(), atol=2e-4, rtol=1e-3)
    assert batch[2].tokens > Qwen3ASRLayout().window_rows  # the joined clip spans two windows


def test_greedy_tokens_are_transformers_through_trt_llm_run(engine, hf, clips, tmp_path):
    """trt-llm-run on transcription requests (a clip; the joined one; a clip with a context) in one
    batch: greedy tokens identical to transformers' generate on apply_transcription_request."""
    cases = [(clips[0], None), (clips[2], None), (clips[1], CONTEXT)]
    requests = [{"messages": ([{"role": "system", "content": context}] if context else [])
                 + [{"role": "user", "content": [{"type": "audio", "audio": clip}]}]} for clip, context in cases]
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"batch_size": 3, "temperature": 0.0, "max_generate_length": MAX_NEW,
                                  "requests": requests}))
    assert run_main([str(source), "--engine-dir", str(engine), "-o", str(tmp_path / "out.json"),
                     "--threads", "1"]) == 0
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    for (clip, context), response in zip(cases, responses):
        assert response["finish_reason"] in ("end-of-sequence", "max-length"), response.get("error")
        assert response["output_token_ids"] == transformers_greedy(hf, clip, context)
    assert responses[1]["prompt_tokens"] > responses[0]["prompt_tokens"] > responses[2]["prompt_tokens"]


SMALL_CAPACITY = 96  # the endpoint decodes as many tokens as fit: a random model rarely stops by itself


def test_the_transcriptions_endpoint_answers_transformers_text(model_dir, build_engine_for, hf, clips):
    """POST /v1/audio/transcriptions through the openai client (on an engine of 96 positions: the
    3 s clip's prompt and some 40 tokens): json and text, with a context and with a forced language,
    are the processor's transcription of transformers' greedy tokens; what the engine cannot do is a
    400 naming the field."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("python_multipart")
    import httpx
    from test_server import LiveServer
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    _, processor = hf
    engine = build_engine_for(model_dir, max_batch_size=2, max_input_len=80, max_kv_cache_capacity=SMALL_CAPACITY)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="asr", max_rows=4)))
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        texts = []
        for context in (None, CONTEXT):
            tokens = transformers_greedy(hf, clips[1], context, SMALL_CAPACITY)
            want = processor.decode(tokens, return_format="transcription_only")
            with open(clips[1], "rb") as upload:
                got = client.audio.transcriptions.create(model="asr", file=upload, **(
                    {"prompt": context} if context else {}))
            assert got.text == want == parse_output(processor.tokenizer.decode(tokens, skip_special_tokens=True))[1]
            assert got.usage.output_tokens == len(tokens) and got.usage.input_tokens + len(tokens) <= SMALL_CAPACITY
            texts.append(want)
        assert texts[0] != texts[1]  # the context reached the prompt
        with open(clips[1], "rb") as upload:
            plain = client.audio.transcriptions.create(model="asr", file=upload, response_format="text")
        assert plain == texts[0]
        # a forced language: the answer's "language English<asr_text>" written by the prompt, as the processor does
        forced = processor.decode(transformers_greedy(hf, clips[1], capacity=SMALL_CAPACITY, language="en"),
                                  return_format="transcription_only")
        with open(clips[1], "rb") as upload:
            assert client.audio.transcriptions.create(model="asr", file=upload, language="en").text == forced
        assert forced != texts[0]
        url, clip = f"{live.url}/v1/audio/transcriptions", ("a.wav", open(clips[1], "rb").read(), "audio/wav")
        for data, param, words in (({"response_format": "srt"}, "response_format", "no timestamps"),
                                   ({"language": "xx"}, "language", "en (English)"),
                                   ({"timestamp_granularities[]": "segment"}, "timestamp_granularities",
                                    "no timestamps"),
                                   ({"vad_filter": "true"}, "vad_filter", "not supported on a Qwen3-ASR")):
            answer = httpx.post(url, data={"model": "asr", **data}, files={"file": clip}, timeout=60)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
            assert words in answer.json()["error"]["message"]
        for data in ({}, {"prompt": CONTEXT}):  # the clip is the first or the second message's part
            broken = httpx.post(url, data={"model": "asr", **data}, files={"file": ("notes.txt", b"not audio", "text/plain")})
            assert broken.status_code == 400 and broken.json()["error"]["param"] == "file", broken.text
            assert "'notes.txt'" in broken.json()["error"]["message"]
        translated = httpx.post(f"{live.url}/v1/audio/translations", data={"model": "asr"}, files={"file": clip})
        assert translated.status_code == 400 and "Qwen3-ASR engine transcribes" in translated.text
    finally:
        live.close()


def test_the_answers_repeats_are_collapsed_as_transformers_does():
    """parse_output's repeat removal against transformers' own, on random texts of repeated units."""
    import random

    from transformers.models.qwen3_asr.processing_qwen3_asr import _detect_and_fix_repetitions, _parse_single_output

    from trt_llm.runtime.media.audio.qwen3_asr_prompt import collapse_repeats

    rng = random.Random(0)
    texts = ["a" * 25, " חו" * 22 + "tail", "ab" * 19, "x" + "abc" * 21 + "yy" + "z" * 22, ""]
    for _ in range(1000):
        texts.append("".join("".join(rng.choice("ab ") for _ in range(rng.randint(1, 4))) * rng.choice([1, 19, 20, 25])
                             for _ in range(rng.randint(0, 6))))
    for text in texts:
        assert collapse_repeats(text) == _detect_and_fix_repetitions(text), text
    for raw in ("language English<asr_text> Hello there. ", "language None<asr_text>", "no marker at all",
                "language German\n<asr_text>" + "ja " * 30):
        parsed = _parse_single_output(raw)
        assert parse_output(raw) == (parsed["language"], parsed["transcription"]), raw
