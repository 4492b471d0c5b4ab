"""Gemma 4 with its audio tower end to end (issue 43): a tiny random Gemma4ForConditionalGeneration with both
towers (tests/family_assets.make_gemma4_audio_vlm: the tiny "gemma4" decoder, KV sharing and per-layer inputs
on, a 2-layer conformer and a 2-layer vision tower) with a Gemma-4-shaped tokenizer, built and run on input
files with real speech clips (and an image beside a clip), against transformers: its feature extractor, the
prompt its processor makes (`<|audio>` + n x `<|audio|>` + `<audio|>` per clip; Gemma4Processor itself wants
torchvision's video processor, so its replace_audio_token rule is applied here), its `generate` for the greedy
tokens, batched, continuous, chunked with context reuse; the log-probabilities, which tell a clip's rows
and the per-layer table's pad rows apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import audio_assets
import family_assets
import helpers
from assets import AssetUnavailable

MAX_NEW = 8
AUDIO, IMAGE = 3, 1  # transformers' mm_token_type_ids


@pytest.fixture(scope="module")
def clips():
    try:
        found = audio_assets.pocketsphinx_clips()
    except AssetUnavailable as error:
        pytest.skip(str(error))
    return [clip.path for name, clip in sorted(found.items()) if name.startswith("sense_and_sensibility")][:2]


@pytest.fixture(scope="module")
def gemma4_audio(tmp_path_factory, family_model, build_engine_for):
    folder = family_assets.make_gemma4_audio_vlm(family_model("gemma4"), tmp_path_factory.mktemp("gemma4-audio"),
                                                 Path("~/.cache/trt-llm-tests").expanduser())
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=768, max_kv_cache_capacity=800,
                              vision={"max_image_tokens": 128, "max_image_tokens_per_image": 70})
    return folder, engine


def request_of(*parts) -> dict:
    """A user message of parts: a .wav path is a clip, another path an image, a str a text part."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else
               {"type": "audio", "audio": str(p)} if Path(p).suffix == ".wav" else {"type": "image", "image": str(p)}
               for p in parts]
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict], batch_size=None, **options):
    return helpers.run_file(engine, folder, requests, MAX_NEW, batch_size, **options)


_HF = {}


def oracle_inputs(folder, request: dict) -> tuple[object, dict]:
    """transformers' model and its inputs: the template's text with each `<|audio|>` widened as
    Gemma4Processor.replace_audio_token does (its feature mask subsampled twice, summed) and each `<|image|>`
    as replace_image_token does, the feature extractor's and the PIL image processor's outputs at the
    checkpoint's settings, and the tokens' types."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Gemma4ImageProcessorPil
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    from trt_llm.runtime.media.audio.decode import load_audio

    if folder not in _HF:
        processor = json.loads((folder / "processor_config.json").read_text())
        features = {k: v for k, v in processor["feature_extractor"].items()
                    if k not in ("feature_extractor_type", "processor_class")}
        images = {k: v for k, v in processor["image_processor"].items() if k != "image_processor_type"}
        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(),
                       AutoTokenizer.from_pretrained(folder), Gemma4AudioFeatureExtractor(**features),
                       Gemma4ImageProcessorPil(**images))
    model, tokenizer, extractor, image_processor = _HF[folder]
    parts = [p for m in request["messages"] if isinstance(m["content"], list) for p in m["content"]]
    text = tokenizer.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
    inputs, widths = {}, {}
    waveforms = [load_audio(p["audio"]) for p in parts if p["type"] == "audio"]
    if waveforms:
        out = extractor(waveforms, sampling_rate=16000, return_tensors="pt")
        inputs.update(input_features=out["input_features"], input_features_mask=out["input_features_mask"])
        widths["<|audio|>"] = [("<|audio>", int(mask[::2][::2].sum()), "<audio|>") for mask in out["input_features_mask"]]
    pictures = [Image.open(p["image"]).convert("RGB") for p in parts if p["type"] == "image"]
    if pictures:
        processed = image_processor(pictures, return_tensors="pt")
        counts = processed.pop("num_soft_tokens_per_image").tolist()
        inputs.update(processed)
        widths["<|image|>"] = [("<|image>", n, "<image|>") for n in counts]
    for token, runs in widths.items():
        pieces = text.split(token)
        assert len(pieces) == len(runs) + 1
        text = pieces[0] + "".join(f"{begin}{token * n}{end}" + piece for (begin, n, end), piece in zip(runs, pieces[1:]))
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    inputs["input_ids"] = ids
    types = torch.zeros_like(ids)
    types[ids == tokenizer.convert_tokens_to_ids("<|image|>")] = IMAGE
    types[ids == tokenizer.convert_tokens_to_ids("<|audio|>")] = AUDIO
    inputs["mm_token_type_ids"] = types
    return model, inputs


def transformers_greedy(folder, request: dict) -> list[int]:
    model, inputs = oracle_inputs(folder, request)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(**{**inputs, "attention_mask": torch.ones_like(ids)}, max_new_tokens=MAX_NEW,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_greedy_tokens_with_clips_are_transformers(gemma4_audio, clips, tmp_path):
    """A clip, two clips in one request, a picture and a clip in one request (both towers), text alone: the
    prompt's token ids are the processor's and the tokens transformers'; static, continuous and chunked
    with reuse alike."""
    folder, engine = gemma4_audio
    picture = helpers.random_pictures(tmp_path, {"p.png": (100, 150)})["p.png"]
    requests = [request_of(clips[0], "What is said?"), request_of("Compare", clips[0], "and", clips[1]),
                request_of(picture, "Look, then listen:", clips[1]), request_of("Say something.")]
    expected = [transformers_greedy(folder, request) for request in requests]
    assert all(len(set(tokens)) > 1 for tokens in expected)
    for options in ({}, {"scheduling": "continuous"},
                    {"scheduling": "continuous", "prefill_chunk": 48, "context_reuse": True}):
        responses = run_file(engine, tmp_path, requests + requests[:1], batch_size=2, **options).responses
        for response, tokens in zip(responses, expected + expected[:1]):
            assert response.finish_reason != "error", response
            assert response.output_token_ids == tokens[: len(response.output_token_ids)], options


def test_log_probabilities_see_the_clip(gemma4_audio, clips, tmp_path):
    """The first token's top-5 log-probabilities within 1e-4 of transformers' (relative to the top one), and
    far from what transformers gives for the same prompt with the clip's rows zeroed: the clip decides."""
    folder, engine = gemma4_audio
    request = {**request_of(clips[1], "What is said?"), "num_logprobs": 5}
    response = run_file(engine, tmp_path, [request]).responses[0]
    ours = {c.token_id: c.logprob for c in response.logprobs[0]}
    model, inputs = oracle_inputs(folder, request)
    with torch.no_grad():
        heard = torch.log_softmax(model(**inputs).logits[0, -1].double(), -1).numpy()
        silent = torch.log_softmax(model(**{**inputs, "input_features": torch.zeros_like(inputs["input_features"])})
                                   .logits[0, -1].double(), -1).numpy()
    top = max(ours, key=ours.get)
    error = max(abs((ours[i] - ours[top]) - (heard[i] - heard[top])) for i in ours)
    moved = max(abs((silent[i] - silent[top]) - (heard[i] - heard[top])) for i in ours)
    assert error < 1e-4 and moved > 10 * max(error, 1e-5), (error, moved)
    assert np.isfinite(list(ours.values())).all()
