"""Gemma 4's audio parts (issue 43, docs/plans/gemma4.md step 8) against transformers 5.25, before the
family face uses them:

- runtime/media/audio/gemma4_features.py against Gemma4AudioFeatureExtractor (called with a list of
  clips, as Gemma4Processor calls it: 5.25's extractor fails on a bare 1-D array): within 1e-4 and the
  same valid frames (its mask), for clips of one frame, 1 s, 7 s, a length no hop divides, silence, a
  chirp in noise, one past the 30 s cut, real speech; and with the settings a checkpoint may change;
- the soft-token count (audio_host.soft_tokens) against Gemma4Processor's two rules for many lengths;
- trt_llm/families/gemma4/audio_tower.py (the torch module, and its exported graph lowered for and run
  by ONNX Runtime) against Gemma4Model.get_audio_features and the rows transformers scatters at the
  prompt's <|audio|> tokens (its output mask's rows), clips of different lengths in one call (one of
  175 rows: many attention chunks of 12; one of a single row): within 1e-5.

The tiny checkpoint is the plan's audio config (family_assets.GEMMA4_AUDIO) on a tiny text model (no
vision), made non-trivial by family_assets.gemma4_audio_nontrivial: norm weights, per_dim_scale, the
clipped linears' bounds and output_proj's bias random, so a dropped term shows.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch

import family_assets
from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.families.adapters import adapter
from trt_llm.families.gemma4.audio_host import AudioSoftTokens, feeds, soft_tokens
from trt_llm.families.gemma4.audio_tower import Gemma4AudioTower, export_tower
from trt_llm.runtime.media.audio.features import config_from_preprocessor, extractor_for
from trt_llm.runtime.media.audio.gemma4_features import Gemma4Features
from trt_llm.runtime.media.sequence_media import widen_placeholders

RATE = 16000


def _chirp(n: int, seed: int = 0) -> np.ndarray:
    """A 100 Hz -> 4 kHz sweep in noise (every mel band gets energy, none the same)."""
    t = np.arange(n) / RATE
    noise = np.random.default_rng(seed).standard_normal(n)
    return (0.5 * np.sin(2 * np.pi * (100 * t + 2000 * t * t)) + 0.05 * noise).astype(np.float32)


CLIPS = {"one_frame": _chirp(200), "one_second": _chirp(RATE), "seven_seconds": _chirp(7 * RATE),
         "odd_length": _chirp(3 * RATE + 77), "silence": np.zeros(RATE, np.float32),
         "quiet_noise": (1e-4 * np.random.default_rng(1).standard_normal(20_000)).astype(np.float32),
         "past_the_cut": _chirp(31 * RATE + 5)}


def _transformers_features(clips, **settings):
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    extractor = Gemma4AudioFeatureExtractor(**settings)
    out = extractor(list(clips), return_tensors="np")
    return extractor, out["input_features"], out["input_features_mask"]


def _assert_features_match(ours: Gemma4Features, clip: np.ndarray, expected: np.ndarray, mask: np.ndarray):
    got = ours(clip)
    valid = int(mask.sum())
    assert got.num_frames == valid == ours.num_frames(len(clip)) and mask[:valid].all()
    assert got.features.dtype == np.float32 and got.features.shape == (valid, 128)
    np.testing.assert_allclose(got.features, expected[:valid], atol=1e-4, rtol=0)
    assert not expected[valid:].any()  # transformers zeroes the rows past the clip: the graph masks them


@pytest.mark.parametrize("name", list(CLIPS))
def test_the_features_are_transformers(name):
    _, features, masks = _transformers_features([CLIPS[name]])
    ours = extractor_for(config_from_preprocessor({"feature_extractor_type": "Gemma4AudioFeatureExtractor"}))
    _assert_features_match(ours, CLIPS[name], features[0], masks[0])


def test_the_features_of_real_speech_are_transformers(librivox_clips):
    from trt_llm.runtime.media.audio.decode import decode_audio

    clip = decode_audio(librivox_clips[0].path.read_bytes(), "speech", RATE)
    _, features, masks = _transformers_features([clip])
    _assert_features_match(Gemma4Features(), clip, features[0], masks[0])


def test_a_checkpoints_settings_are_read_as_transformers_saves_them():
    """preemphasis (both flavours), per-bin normalisation (saved nested, [1, 1, bins]), a wider FFT,
    a scale, a floor and a band: the extractor's JSON through config_from_preprocessor."""
    rng = np.random.default_rng(2)
    mean, std = rng.normal(size=128).tolist(), rng.uniform(0.5, 2.0, size=128).tolist()
    clip = _chirp(2 * RATE + 33, seed=3)
    for settings in (dict(preemphasis=0.97), dict(preemphasis=0.97, preemphasis_htk_flavor=False),
                     dict(per_bin_mean=mean, per_bin_stddev=std, fft_overdrive=True, input_scale_factor=0.5,
                          mel_floor=1e-5, min_frequency=125.0, max_frequency=7600.0)):
        extractor, features, masks = _transformers_features([clip], **settings)
        config = config_from_preprocessor(json.loads(extractor.to_json_string()))
        assert config["feature_extractor"] == "gemma4"
        _assert_features_match(extractor_for(config), clip, features[0], masks[0])


def test_the_features_refuse_what_they_cannot_reproduce():
    with pytest.raises(ValueError, match="160 samples make no gemma4 frame; a frame needs 161 samples"):
        Gemma4Features()(np.zeros(160, np.float32))
    with pytest.raises(ValueError, match="dither 0.1 is not supported"):
        config_from_preprocessor({"feature_extractor_type": "Gemma4AudioFeatureExtractor", "dither": 0.1})
    with pytest.raises(ValueError, match=r"per_bin_stddev must be a list of num_mel_bins \(128\) numbers"):
        Gemma4Features(per_bin_stddev=[1.0] * 80)
    with pytest.raises(ValueError, match="hop_length_ms must be a positive number, got 0"):
        extractor_for({"feature_extractor": "gemma4", "hop_length_ms": 0})


def test_the_soft_token_count_is_the_processors():
    """Gemma4Processor's two rules: its prompt's (replace_audio_token: the extractor's mask subsampled
    [::2] twice, summed) and its arithmetic one (_compute_audio_num_tokens, capped at 750)."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    extractor, ours = Gemma4AudioFeatureExtractor(), Gemma4Features()
    processor = SimpleNamespace(feature_extractor=extractor, audio_seq_length=750, boa_token="<|audio>",
                                audio_token="<|audio|>", eoa_token="<audio|>")
    lengths = [*range(150, 1200, 7), 16000, 16001, 33333, 7 * RATE + 5, 480_000, 500_000]
    for n in lengths:
        expected = Gemma4Processor._compute_audio_num_tokens(processor, np.zeros(n), RATE)
        assert soft_tokens(ours.num_frames(n)) == expected, n
    assert soft_tokens(ours.num_frames(RATE)) == 25 and soft_tokens(ours.num_frames(480_000)) == 750
    clips = [np.ones(n, np.float32) for n in (161, 321, 481, 641, 800, 16000, 16001, 40_003)]
    masks = extractor(clips, return_tensors="np")["input_features_mask"]  # padded to the longest, as a batch
    for i, clip in enumerate(clips):
        markup = Gemma4Processor.replace_audio_token(processor, {"input_features_mask": masks}, i)
        n = soft_tokens(ours.num_frames(len(clip)))
        assert markup == "<|audio>" + "<|audio|>" * n + "<audio|>"


def _tiny_model(**audio):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig

    text = Gemma4TextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                            hidden_size_per_layer_input=8, num_kv_shared_layers=0)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=None,
                                                        audio_config={**family_assets.GEMMA4_AUDIO, **audio})).eval()
    family_assets.gemma4_audio_nontrivial(model)
    return model


@pytest.fixture(scope="module")
def tiny_model():
    return _tiny_model()


# Clips of 7 s (175 rows: 15 attention chunks), 1 s, 3 s and a bit, and one frame (a single row)
TOWER_CLIPS = ["seven_seconds", "one_second", "odd_length", "one_frame"]


def transformers_rows(model, clips) -> tuple[np.ndarray, list[int]]:
    """The rows transformers scatters at the prompt's <|audio|> tokens (get_audio_features' rows that its
    mask keeps, clip after clip) for the clips as one batch, and each clip's count."""
    _, features, masks = _transformers_features(clips)
    with torch.no_grad():
        out = model.model.get_audio_features(torch.from_numpy(features), torch.from_numpy(masks), return_dict=True)
    return out.pooler_output[out.attention_mask].numpy(), out.attention_mask.sum(-1).tolist()


def our_feeds(clips) -> dict[str, np.ndarray]:
    extracted = [Gemma4Features()(clip) for clip in clips]
    return feeds([f.features for f in extracted], [f.num_frames for f in extracted], np.float32)


def test_the_tower_module_gives_transformers_rows(tiny_model):
    clips = [CLIPS[name] for name in TOWER_CLIPS]
    expected, counts = transformers_rows(tiny_model, clips)
    assert counts == [175, 25, 75, 1] == [soft_tokens(Gemma4Features().num_frames(len(c))) for c in clips]
    tower = Gemma4AudioTower(tiny_model, torch.float32).eval()
    with torch.no_grad():
        got = tower(*(torch.from_numpy(x) for x in our_feeds(clips).values())).numpy()
    assert got.shape == (sum(counts), 64)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # transformers gives a clip's rows alike alone and in a batch padded past it: so does the graph
    start = 0
    for clip, count in zip(clips, counts):
        alone, _ = transformers_rows(tiny_model, [clip])
        np.testing.assert_allclose(alone, expected[start:start + count], atol=1e-5, rtol=0)
        start += count
    # the clip bounds bite: without them transformers' rows move by far more than the tolerance
    bounds = [b for name, b in tiny_model.model.audio_tower.named_buffers() if name.endswith(("_min", "_max"))]
    saved = [b.clone() for b in bounds]
    with torch.no_grad():
        for bound in bounds:
            bound.fill_(float("inf") if bound > 0 else float("-inf"))
        unclipped, _ = transformers_rows(tiny_model, clips)
        for bound, value in zip(bounds, saved):
            bound.copy_(value)
    assert np.abs(unclipped - expected).max() > 1e-2


@pytest.mark.parametrize("window", [dict(attention_context_right=3),  # keys ahead too (the table ends before them)
                                    dict(attention_chunk_size=4, attention_context_left=17, conv_kernel_size=3)],
                         ids=["ahead", "past_the_table"])
def test_other_attention_windows_give_transformers_rows(window):
    """Windows transformers' block layout shapes otherwise: keys ahead of the query, and a left context
    wider than its relative position table (distances it gives no bias), a shorter convolution."""
    model = _tiny_model(**window)
    clips = [CLIPS[name] for name in TOWER_CLIPS]
    expected, _ = transformers_rows(model, clips)
    with torch.no_grad():
        got = Gemma4AudioTower(model, torch.float32).eval()(*(torch.from_numpy(x) for x in our_feeds(clips).values()))
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=0)


def test_the_exported_tower_gives_transformers_rows_in_onnxruntime(tiny_model, tmp_path):
    """And its graph builds a tensorrt-rtx plan ahead of time (no GPU) at the adapter's profile: one clip
    of 1 s to 8 of 30 s."""
    from trt_llm.build.tensorrt_backend import compile_tensorrt
    from trt_llm.schemas.build_config import BuildConfig

    tower = Gemma4AudioTower(tiny_model, torch.float32).eval()
    graph = export_tower(tower, tmp_path / "model.onnx", torch.float32)
    session = ort.InferenceSession(str(compile_cpu(graph)), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input_features", "tensor(float)", ["clips", "audio_frames", 128]),
        ("frame_counts", "tensor(int64)", ["clips"]), ("row_index", "tensor(int64)", ["audio_tokens"])]
    assert [(o.name, o.shape) for o in session.get_outputs()] == [("audio_embeds", ["audio_tokens", 64])]
    for names in (TOWER_CLIPS, ["odd_length"], ["one_frame", "one_second"]):
        clips = [CLIPS[name] for name in names]
        expected, _ = transformers_rows(tiny_model, clips)
        (got,) = session.run(None, our_feeds(clips))
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    (tmp_path / "plan").mkdir()
    config = BuildConfig(model="tiny", output_dir=str(tmp_path / "out"))
    profile = AudioSoftTokens.tensorrt_profile(config, {"window_frames": 3000})
    assert profile == {"clips": (1, 1, 8), "audio_frames": (100, 3000, 3000), "audio_tokens": (25, 750, 6000)}
    plan = compile_tensorrt(graph, tmp_path / "plan", config, rtx=True, profiles=[profile])
    assert plan.stat().st_size > 100_000


def test_the_adapter_feeds_counts_widens_and_profiles():
    from trt_llm.schemas.build_config import BuildConfig

    settings = {"window_frames": 3000, "audio_token_id": 258881, "boa_token_id": 256000, "eoa_token_id": 258883}
    audio = adapter("gemma4_audio", settings)
    assert isinstance(audio, AudioSoftTokens) and not audio.cross_attention
    assert [audio.token_count(n) for n in (0, 1, 4, 5, 99, 2999)] == [0, 1, 1, 2, 25, 750]
    features = [np.full((n, 128), n, np.float32) for n in (9, 3)]
    fed = audio.feeds(features, [9, 3], np.float16)
    assert fed["input_features"].shape == (2, 9, 128) and fed["input_features"].dtype == np.float16
    assert (fed["input_features"][1, :3] == 3).all() and not fed["input_features"][1, 3:].any()
    assert fed["frame_counts"].tolist() == [9, 3]
    assert fed["row_index"].tolist() == [0, 1, 2, 3]  # 3 rows a clip (ceil(9 / 4)): clip 0's 3, clip 1's 1
    ids, starts = widen_placeholders([2, 258881, 7, 258881], audio.audio_token_id, [2, 1], audio.wrap_tokens)
    assert ids == [2, 256000, 258881, 258881, 258883, 7, 256000, 258881, 258883] and starts == [2, 7]
    config = BuildConfig(model="tiny", output_dir="out", audio={"min_mel_frames": 50, "max_mel_frames": 2000,
                                                                "max_clips": 4})
    assert audio.tensorrt_profile(config, settings) == {
        "clips": (1, 1, 4), "audio_frames": (50, 2000, 2000), "audio_tokens": (13, 500, 2000)}
