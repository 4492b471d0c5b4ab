"""Audio-LLM engines end to end: a tiny random Qwen2-Audio with the real Qwen tokenizer, built, run on
input files with real speech, against transformers `generate` on the same clips (greedy tokens
identical): one clip, two clips in one request, and beside a text-only request in one batch.

The oracle is transformers' own Qwen2AudioProcessor (its WhisperFeatureExtractor, its <|AUDIO|>
expansion) and Qwen2AudioForConditionalGeneration, which runs the audio tower itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import audio_assets
import helpers
from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS as BLOCK
import audio_llm_assets
from assets import AssetUnavailable
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 12


@pytest.fixture(scope="module")
def clips():
    try:
        found = audio_assets.pocketsphinx_clips()
    except AssetUnavailable as error:
        pytest.skip(str(error))
    return [clip.path for name, clip in sorted(found.items()) if name.startswith("sense_and_sensibility")][:3]


@pytest.fixture(scope="module")
def qwen2_audio(tmp_path_factory, npm_tokenizer, build_engine_for):
    folder = audio_llm_assets.make_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2_audio"),
                                                     tokenizer_dir=npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=1024, max_kv_cache_capacity=1100)
    return folder, engine


def audio_request(*parts) -> dict:
    """A user message of parts: a path is a clip, a str a text part."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "audio", "audio": str(p)}
               for p in parts]
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict], **settings):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": len(requests), "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests, **settings}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings)


_HF = {}


def transformers_greedy(folder, request: dict) -> list[int]:
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    from trt_llm.runtime.media.audio.decode import load_audio

    if folder not in _HF:
        _HF[folder] = (Qwen2AudioForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval(),
                       AutoProcessor.from_pretrained(folder))
    model, processor = _HF[folder]
    messages = request["messages"]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    waveforms = [load_audio(p["audio"]) for m in messages if isinstance(m["content"], list)
                 for p in m["content"] if p["type"] == "audio"]
    inputs = processor(text=text, audio=waveforms or None, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_clips_and_text_in_one_batch_match_transformers(qwen2_audio, clips, tmp_path):
    """One clip; two clips of different lengths in one request; a text-only request beside them."""
    folder, engine = qwen2_audio
    requests = [audio_request(clips[0], "What is said?"),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                audio_request(clips[1], "and", clips[2], "Compare them.")]
    output = run_file(engine, tmp_path, requests)
    for request, response in zip(requests, output.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.output_token_ids == transformers_greedy(folder, request)
    # the prompts count the clips' tokens (up to 750 each)
    assert output.responses[2].prompt_tokens > output.responses[0].prompt_tokens > output.responses[1].prompt_tokens + 100


def test_a_bad_clip_fails_its_request_alone_and_names_it(qwen2_audio, clips, tmp_path):
    _, engine = qwen2_audio
    (tmp_path / "broken.wav").write_bytes(b"RIFF not really a wave file")
    requests = [audio_request(clips[0], "Fine."), audio_request("Listen:", Path("missing.wav")),
                audio_request("Listen:", tmp_path / "broken.wav")]
    output = run_file(engine, tmp_path, requests)
    good, missing, broken = output.responses
    assert good.finish_reason != "error" and good.output_token_ids
    assert missing.finish_reason == "error" and "requests[1].messages[0].content[1]" in missing.error
    assert "missing.wav" in missing.error
    assert broken.finish_reason == "error" and "requests[2].messages[0].content[1]" in broken.error
    assert "broken.wav" in broken.error and "not audio" in broken.error


def test_clip_limits_are_refused_with_the_limit(qwen2_audio, tmp_path):
    """Under min_mel_frames (100: 1 s) and over the encoder's 30 s window; the rest of the batch runs."""
    import soundfile

    _, engine = qwen2_audio
    rng = np.random.default_rng(0)
    soundfile.write(tmp_path / "short.wav", (rng.standard_normal(8000) * 0.1).astype(np.float32), 16000)
    soundfile.write(tmp_path / "long.flac", (rng.standard_normal(16000 * 31) * 0.1).astype(np.float32), 16000)
    soundfile.write(tmp_path / "ok.wav", (rng.standard_normal(16000 * 2) * 0.1).astype(np.float32), 16000)
    output = run_file(engine, tmp_path, [audio_request(tmp_path / "short.wav"), audio_request(tmp_path / "long.flac"),
                                         audio_request(tmp_path / "ok.wav")])
    short, long, ok = output.responses
    assert short.finish_reason == "error" and "50 mel frames" in short.error and "min_mel_frames 100" in short.error
    assert long.finish_reason == "error" and "31.00 s" in long.error and "30 s" in long.error
    assert ok.finish_reason != "error"


def test_the_profile_counts_clips_and_audio_seconds(qwen2_audio, clips, tmp_path):
    from trt_llm.runtime.engine.profiler import Profiler

    _, engine = qwen2_audio
    path = tmp_path / "input.json"
    requests = [audio_request(clips[0], "Once."), audio_request(clips[0], "Twice.")]
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": 2, "requests": requests}))
    loaded = load_input_file(path)
    profiler = Profiler()
    Runner(EngineDir.open(engine), threads=1, profiler=profiler).run(loaded, loaded.settings)
    stats = profiler.summary().multimodal
    import soundfile

    seconds = soundfile.info(str(clips[0])).duration
    assert stats.clips == 2 and stats.audio_seconds == pytest.approx(2 * seconds, rel=1e-3)
    assert stats.audio_encoder_ms_per_second > 0 and stats.real_time_factor > 0
    assert len(profiler.stages["audio_encode"]) == 1  # the same clip twice is encoded once


def test_audio_on_an_engine_without_an_audio_encoder_is_refused(tiny_model, build_engine_for, clips, tmp_path):
    output = run_file(build_engine_for(tiny_model("qwen3")), tmp_path, [audio_request(clips[0], "Hi")])
    (response,) = output.responses
    assert response.finish_reason == "error" and "no audio encoder" in response.error
    assert "requests[0].messages[0].content[0]" in response.error


# -- context reuse (runtime/cache/reuse.py) with clips: a block's key covers the clips whose tokens it
# holds, so equal token ids with another clip restore nothing past its first token, the same clip
# restores past its tokens (or to within them); tokens are bypass's and transformers'.

QUESTION = "What is said in this recording, in a few words?"


@pytest.fixture(scope="module")
def twin_clips(clips, tmp_path_factory):
    """Two clips of other speech and the same length (so the same audio tokens): clips[1], and
    clips[0] cut to clips[1]'s samples."""
    import soundfile

    folder = tmp_path_factory.mktemp("twin-clips")
    short, sampling_rate = soundfile.read(str(clips[1]), dtype="float32")
    long, rate = soundfile.read(str(clips[0]), dtype="float32")
    assert rate == sampling_rate and len(long) > len(short)
    soundfile.write(folder / "cut.wav", long[: len(short)], rate)
    return clips[1], folder / "cut.wav"


def reuse_run(engine, folder, requests: list[dict], **options):
    return helpers.reuse_run(engine, folder, requests, MAX_NEW, **options)


def tokens_of_bypass(engine, folder, requests: list[dict], **options) -> list[list[int]]:
    return helpers.tokens_of_bypass(engine, folder, requests, MAX_NEW, **options)


def test_equal_token_ids_with_another_clip_share_nothing_past_its_first_token(qwen2_audio, twin_clips, tmp_path):
    """Pairs of prompts whose token ids are equal and whose clips differ (same length: same audio
    tokens): the second of a pair restores the blocks before the first clip that differs, never a
    block holding one of its tokens; its tokens are bypass's and transformers'."""
    folder, engine = qwen2_audio
    one, other = twin_clips
    before = "Listen carefully to this short recording of a woman reading aloud from an old novel, and then"
    pairs = [((one, QUESTION), (other, QUESTION)),
             ((before, one, QUESTION), (before, other, QUESTION)),
             ((one, "and", other, "Compare them."), (one, "and", one, "Compare them."))]  # the second clip differs
    requests = [audio_request(*parts) for pair in pairs for parts in pair]
    responses, prompts = reuse_run(engine, tmp_path, requests)
    bypassed = tokens_of_bypass(engine, tmp_path, requests)
    for i, request in enumerate(requests):
        assert responses[i].output_token_ids == bypassed[i] == transformers_greedy(folder, request), i
    for pair in range(len(pairs)):
        (ids, spans), (other_ids, other_spans) = prompts[2 * pair], prompts[2 * pair + 1]
        assert ids == other_ids and spans == other_spans, pair  # equal tokens: only the clips tell them apart
        differing = spans[1][0] if pair == 2 else spans[0][0]  # the first token of the first clip that differs
        assert responses[2 * pair + 1].reused_tokens == differing // BLOCK * BLOCK, pair  # nothing past it
    assert responses[3].reused_tokens > BLOCK and responses[5].reused_tokens > sum(prompts[5][1][0])  # what is before it
    assert responses[0].output_token_ids != responses[1].output_token_ids  # another clip's KV would show


def test_the_same_clip_is_restored_past_its_tokens_or_to_within_them(qwen2_audio, twin_clips, tmp_path):
    """A request repeated restores past its clip's last token; the same clip with another question
    restores to a block boundary inside the clip's tokens and computes the rest; tokens are bypass's
    and transformers'."""
    folder, engine = qwen2_audio
    _, cut = twin_clips  # cut off mid-speech: its last tokens are not silence
    # the text before the clip moves its end to late in a block (without it, to a block's end), so that
    # the restore ends some tokens before it
    before = "Please listen to this short recording of a reader very carefully and then"
    requests = [audio_request(before, cut, question) for question in (QUESTION, QUESTION, "Who speaks?")]
    responses, prompts = reuse_run(engine, tmp_path, requests)
    ((first, count),) = prompts[0][1]
    assert responses[0].reused_tokens == 0
    assert responses[1].reused_tokens > first + count
    assert first < responses[2].reused_tokens < first + count
    assert [r.output_token_ids for r in responses] == tokens_of_bypass(engine, tmp_path, requests)
    assert responses[2].output_token_ids == transformers_greedy(folder, requests[2])
