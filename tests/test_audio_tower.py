"""Qwen2-Audio's audio graph (trt_llm/families/qwen2_audio/audio_tower.py, exported and lowered for ONNX Runtime)
against transformers on real speech, and the audio token count (trt_llm/families/qwen2_audio/host.py) against
transformers' Qwen2AudioProcessor.

Oracle for the embeddings: transformers' own Qwen2AudioModel.forward on the processor's prompt,
the multi-modal projector's output caught by a hook, so the padding mask it builds from
feature_attention_mask is transformers' too. Both sides get the same features (runtime/media/audio/features.py
from runtime/media/audio/decode.py's waveform, the settings read from the model's preprocessor_config.json), so
the comparison is of the graph alone: within 1e-5 on every clip's rows, 1 clip, 2 clips of different
lengths in one call, and a clip over 30 s (cut to the chunk: no padding at all). The graph runs the
valid rows only (trt_llm/families/qwen2_audio/audio_tower.py); transformers, all 1,500 with a mask.
The tiny model is random (tests/audio_llm_assets.py) but has the real input geometry.
"""

from __future__ import annotations

import json

import audio_assets
import audio_llm_assets
import numpy as np
import onnxruntime as ort
import pytest
import torch
from assets import AssetUnavailable
from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.families.qwen2_audio.audio_tower import AudioTowerGraph, export_audio_tower
from trt_llm.runtime.media.audio.decode import load_audio
from trt_llm.runtime.media.audio.features import config_from_preprocessor, extractor_for
from trt_llm.families.qwen2_audio.host import MAX_AUDIO_TOKENS, audio_token_count, packing
from trt_llm.runtime.text.tokenizer import Tokenizer

ESPEAK_TEXT = "The quick brown fox jumps over the lazy dog, twice."
LIBRIVOX = "sense_and_sensibility_01_austen_64kb-"
CASES = {  # clips of one call, by name (see `waveform`)
    "one clip": ["0870"],
    "two clips": [f"{LIBRIVOX}0890", "003"],
    "espeak and a card": ["espeak", "001"],
    "over 30 s": ["all", "0880"],
}


@pytest.fixture(scope="module")
def asset(tmp_path_factory):
    from transformers import Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor

    try:
        folder = audio_llm_assets.make_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio"))
    except AssetUnavailable as error:
        pytest.skip(f"the Qwen tokenizer is unavailable: {error}")
    model = Qwen2AudioForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    processor = Qwen2AudioProcessor.from_pretrained(folder)
    extractor = extractor_for(config_from_preprocessor(json.loads((folder / "preprocessor_config.json").read_text())))
    return model, processor, extractor


@pytest.fixture(scope="module")
def session(asset, tmp_path_factory):
    graph = AudioTowerGraph(asset[0], torch.float32)
    path = export_audio_tower(graph, tmp_path_factory.mktemp("audio") / "model.onnx", torch.float32)
    engine = compile_cpu(path)
    return ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def waveform():
    """Factory: a clip's 16 kHz waveform by name: a pocketsphinx utterance id (or the tail of a
    LibriVox one), "espeak" (22.05 kHz speech, resampled by load_audio), "all" (every pocketsphinx
    clip end to end: 34 s)."""
    try:
        clips = audio_assets.pocketsphinx_clips()
    except AssetUnavailable as error:
        pytest.skip(f"pocketsphinx-testdata unavailable: {error}")

    def get(name: str) -> np.ndarray:
        if name == "espeak":
            try:
                return load_audio(str(audio_assets.espeak_speech(ESPEAK_TEXT)))
            except AssetUnavailable as error:
                pytest.skip(f"espeak-ng unavailable: {error}")
        if name == "all":
            return np.concatenate([load_audio(str(clip.path)) for clip in clips.values()])
        (key,) = [k for k in clips if k == name or k == LIBRIVOX + name]
        return load_audio(str(clips[key].path))

    return get


def conversation(clips: int) -> list[dict]:
    parts = [{"type": "audio", "audio": f"clip{i}.wav"} for i in range(clips)]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is said?"}]}]


def audio_runs(input_ids: np.ndarray, processor) -> list[int]:
    """The <|AUDIO|> tokens between each <|audio_bos|> and <|audio_eos|> of a prompt, in order."""
    bos, eos = processor.tokenizer.convert_tokens_to_ids([processor.audio_bos_token, processor.audio_eos_token])
    starts, ends = np.flatnonzero(input_ids == bos), np.flatnonzero(input_ids == eos)
    assert len(starts) == len(ends)
    runs = [input_ids[s + 1:e] for s, e in zip(starts, ends)]
    assert all((run == processor.audio_token_id).all() for run in runs)
    return [len(run) for run in runs]


def transformers_embeds(model, processor, waves, features: np.ndarray, frames: np.ndarray):
    """The projector's output [clips, 750, H] in transformers' forward on the processor's prompt,
    fed our features; and the processor's <|AUDIO|> count per clip."""
    text = processor.apply_chat_template(conversation(len(waves)), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, audio=waves, sampling_rate=16000, return_tensors="pt")
    np.testing.assert_array_equal(inputs["feature_attention_mask"].sum(-1).numpy(), frames)
    caught = []
    hook = model.model.multi_modal_projector.register_forward_hook(lambda module, args, out: caught.append(out))
    try:
        with torch.no_grad():
            mask = torch.from_numpy(np.arange(features.shape[-1])[None, :] < frames[:, None]).long()
            model.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                        input_features=torch.from_numpy(features), feature_attention_mask=mask)
    finally:
        hook.remove()
    (embeds,) = caught
    return embeds.numpy(), audio_runs(inputs["input_ids"][0].numpy(), processor)


@pytest.mark.parametrize("names", CASES.values(), ids=CASES.keys())
def test_audio_graph_equals_transformers(asset, session, waveform, names):
    model, processor, extractor = asset
    waves = [waveform(name) for name in names]
    computed = [extractor(wave) for wave in waves]
    features = np.stack([c.features for c in computed])
    frames = np.array([c.num_frames for c in computed], dtype=np.int64)
    expected, counts = transformers_embeds(model, processor, waves, features, frames)

    row_index, cu_seqlens, pool_index = packing(frames)
    (embeds,) = session.run(None, {"input_features": features, "row_index": row_index, "cu_seqlens": cu_seqlens,
                                   "pool_index": pool_index})
    assert counts == audio_token_count(frames).tolist()
    assert embeds.shape == (sum(counts), model.config.text_config.hidden_size)
    starts = np.cumsum([0, *counts])
    for clip, n in enumerate(counts):
        np.testing.assert_allclose(embeds[starts[clip]:starts[clip] + n], expected[clip, :n], atol=1e-5, rtol=0)

    padded = [clip for clip, n in enumerate(frames) if n < features.shape[-1]]
    if padded:  # the padding is left out: attending over all 1,500 rows moves the valid ones far off
        full = np.full_like(frames, features.shape[-1])
        row_index, cu_seqlens, _ = packing(full)
        pool_index = np.concatenate([clip * 1500 + 2 * np.arange(n) for clip, n in enumerate(counts)])
        (unmasked,) = session.run(None, {"input_features": features, "row_index": row_index, "cu_seqlens": cu_seqlens,
                                         "pool_index": pool_index})
        for clip in padded:
            n = counts[clip]
            assert np.abs(unmasked[starts[clip]:starts[clip] + n] - expected[clip, :n]).max() > 1e-3


# sample counts around the frame (160) and convolution boundaries, a full chunk and past it
SAMPLES = [1, 160, 161, 320, 321, 480, 481, 640, 16000, 16000 * 7 + 37, 479_840, 479_999, 480_000, 480_001,
           16000 * 45]


def test_processor_expands_audio_as_audio_tokens(asset):
    """The chat template's one <|AUDIO|> per audio part, widened by the processor, is
    audio_token_count of the clip's frames (WhisperFeatures.num_frames of its samples)."""
    model, processor, extractor = asset
    assert processor.audio_token_id == model.config.audio_token_index
    rng = np.random.default_rng(0)
    waves = [rng.uniform(-0.5, 0.5, n).astype(np.float32) for n in SAMPLES]
    text = processor.apply_chat_template(conversation(len(waves)), add_generation_prompt=True, tokenize=False)
    assert "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>\n" in text
    runtime = Tokenizer.from_dir(model.name_or_path)  # the runtime renders and encodes it alike
    assert runtime.apply_chat_template(conversation(len(waves)), add_generation_prompt=True) == text
    assert runtime.token_to_id("<|AUDIO|>") == processor.audio_token_id
    inputs = processor(text=text, audio=waves, sampling_rate=16000, return_tensors="np")
    frames = [extractor.num_frames(n) for n in SAMPLES]
    assert inputs["feature_attention_mask"].sum(-1).tolist() == frames
    assert audio_runs(inputs["input_ids"][0], processor) == [audio_token_count(f) for f in frames]
    assert audio_token_count(np.array(frames)).tolist() == [audio_token_count(f) for f in frames]
    assert [audio_token_count(f) for f in (0, 1, 2, 3, 4, 5, 3000)] == [0, 0, 0, 1, 1, 1, MAX_AUDIO_TOKENS]
