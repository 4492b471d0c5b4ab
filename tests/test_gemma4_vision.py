"""Gemma 4 with its vision tower end to end (issue 43): a tiny random Gemma4ForConditionalGeneration
(tests/family_assets.make_gemma4_vlm: the tiny "gemma4" decoder, KV sharing and per-layer inputs on, the
vision mask on, a 2-layer tower) with a Gemma-4-shaped tokenizer, built, run on input files with images,
against transformers: its image processor and the prompt its processor makes (`<|image>` + n x `<|image|>` +
`<image|>` per image), its `generate` for the greedy tokens (the soft tokens of an image see each other both ways on
the sliding layers there too, and look up the per-layer table's pad row), batched, continuous, chunked
with context reuse; the log-probabilities, which tell the mask and the pad rows apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import family_assets
import helpers
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 8
SIZES = {"wide.png": (120, 400), "square.png": (100, 100), "tall.png": (300, 90)}


@pytest.fixture(scope="module")
def gemma4_vlm(tmp_path_factory, family_model, build_engine_for):
    folder = family_assets.make_gemma4_vlm(family_model("gemma4"), tmp_path_factory.mktemp("gemma4-vlm"),
                                           Path("~/.cache/trt-llm-tests").expanduser())
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=512, max_kv_cache_capacity=640,
                              vision={"max_image_tokens": 256, "max_image_tokens_per_image": 70})
    return folder, engine


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return helpers.random_pictures(tmp_path_factory.mktemp("images"), SIZES)


def run_file(engine, folder, requests: list[dict], batch_size=None, **options):
    return helpers.run_file(engine, folder, requests, MAX_NEW, batch_size, **options)


_HF = {}


def oracle_inputs(folder, request: dict) -> tuple[object, dict]:
    """transformers' model and its inputs for the request: the template's text with each `<|image|>` made
    `<|image>` + n x `<|image|>` + `<image|>` (Gemma4Processor.replace_image_token; the processor class itself
    wants a video processor, torchvision's), transformers' PIL image processor at the checkpoint's settings
    for the pixels and n, and the image tokens' types."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Gemma4ImageProcessorPil

    if folder not in _HF:
        settings = {k: v for k, v in family_assets.GEMMA4_PREPROCESSOR.items() if k != "image_processor_type"}
        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(),
                       AutoTokenizer.from_pretrained(folder), Gemma4ImageProcessorPil(**settings))
    model, tokenizer, images = _HF[folder]
    messages = request["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [Image.open(p["image"]).convert("RGB") for m in messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image"]
    inputs = {}
    if pictures:
        processed = images(pictures, return_tensors="pt")
        counts = processed.pop("num_soft_tokens_per_image").tolist()
        pieces = text.split("<|image|>")
        assert len(pieces) == len(pictures) + 1
        text = pieces[0] + "".join(f"<|image>{'<|image|>' * n}<image|>" + piece for n, piece in zip(counts, pieces[1:]))
        inputs.update(processed)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    inputs["input_ids"] = ids
    if pictures:
        inputs["mm_token_type_ids"] = (ids == tokenizer.convert_tokens_to_ids("<|image|>")).long()
    return model, inputs


def transformers_greedy(folder, request: dict) -> list[int]:
    model, inputs = oracle_inputs(folder, request)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(**{**inputs, "attention_mask": torch.ones_like(ids)}, max_new_tokens=MAX_NEW,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_greedy_tokens_with_images_are_transformers(gemma4_vlm, images, tmp_path):
    """Images of three shapes, two in one request, a text-only request beside them: the prompt's token ids
    are the processor's and the tokens transformers'; static, continuous and chunked with reuse alike."""
    folder, engine = gemma4_vlm
    requests = [helpers.image_request(images["wide.png"], "What is this?"),
                helpers.image_request("Compare", images["square.png"], "and", images["tall.png"]),
                {"messages": [{"role": "user", "content": "Say something."}]}]
    expected = [transformers_greedy(folder, request) for request in requests]
    assert all(len(set(tokens)) > 1 for tokens in expected)
    for options in ({}, {"scheduling": "continuous"},
                    {"scheduling": "continuous", "prefill_chunk": 40, "context_reuse": True}):
        responses = run_file(engine, tmp_path, requests + requests[:1], batch_size=2, **options).responses
        for response, tokens in zip(responses, expected + expected[:1]):
            assert response.finish_reason != "error", response
            assert response.output_token_ids == tokens[: len(response.output_token_ids)], options


def test_log_probabilities_see_the_mask_and_the_pad_rows(gemma4_vlm, images, tmp_path):
    """The first token's top-5 log-probabilities within 1e-4 of transformers' (relative to the top one), and
    far from what transformers gives without the image mask (token types off): the test tells them apart."""
    folder, engine = gemma4_vlm
    request = {**helpers.image_request(images["square.png"], "Describe it."), "num_logprobs": 5}
    response = run_file(engine, tmp_path, [request]).responses[0]
    ours = {c.token_id: c.logprob for c in response.logprobs[0]}
    model, inputs = oracle_inputs(folder, request)
    with torch.no_grad():
        both_ways = torch.log_softmax(model(**inputs).logits[0, -1].double(), -1).numpy()
        causal = torch.log_softmax(model(**{k: v for k, v in inputs.items() if k != "mm_token_type_ids"}).logits[0, -1]
                                   .double(), -1).numpy()
    top = max(ours, key=ours.get)
    error = max(abs((ours[i] - ours[top]) - (both_ways[i] - both_ways[top])) for i in ours)
    moved = max(abs((causal[i] - causal[top]) - (both_ways[i] - both_ways[top])) for i in ours)
    assert error < 1e-4 and moved > 10 * max(error, 1e-5), (error, moved)
    assert np.isfinite(list(ours.values())).all()


def test_prompt_lookup_with_images_decodes_vanillas_tokens(gemma4_vlm, images, tmp_path, every_chain):
    """Prompt lookup's verification passes give the decoder's tree_mask (its images' blocks) a causal
    [B, w, w] for the generated tokens: the tokens of vanilla decoding. A logit bias keeps a random model's
    answer to three tokens, so its n-grams recur."""
    _, engine = gemma4_vlm
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": 40,
                                "logit_bias": {"100": 40.0, "200": 40.0, "300": 40.0},
                                "requests": [helpers.image_request(images["wide.png"], "What is this?"),
                                             helpers.image_request(images["square.png"], "and", images["tall.png"])]}))
    loaded = load_input_file(path)
    vanilla = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    runner = Runner(EngineDir.open(engine), threads=1, speculation="prompt-lookup")
    looked = runner.run(loaded, loaded.settings).responses
    assert [r.output_token_ids for r in looked] == [r.output_token_ids for r in vanilla]
    assert runner.lookup_stats.accepted > 0
