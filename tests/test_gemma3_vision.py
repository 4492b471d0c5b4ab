"""Gemma 3 with its vision tower end to end: a tiny random Gemma3ForConditionalGeneration at the
published geometry (896-pixel frames to 256 soft tokens, tests/family_assets.py) with Gemma 3's real
tokenizer, built, run on input files with images, against transformers: its Gemma3Processor for the
prompt's tokens (the text around each image, pan-and-scan crops), its model's tower for the rows, and
`generate` for the greedy tokens (the image tokens attend to each other both ways there too), with
several images a request, batched, continuous, chunked and with context reuse."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from PIL import Image

import family_assets
import helpers
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 10
SOFT = 256  # soft tokens a frame
# (height, width): wide enough for 3 pan-and-scan crops (4 frames), a small square, a tall one too
# narrow for crops of the minimum size (one frame)
SIZES = {"wide.png": (300, 900), "square.png": (40, 40), "tall.png": (200, 80)}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, family_model, build_engine_for):
    folder = family_assets.make_gemma3_vlm(family_model("gemma3"), tmp_path_factory.mktemp("gemma3-vlm"))
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=2048, max_kv_cache_capacity=2304,
                              vision={"max_image_tokens": 1536, "max_image_tokens_per_image": 1024})
    return folder, engine


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return helpers.random_pictures(tmp_path_factory.mktemp("images"), SIZES)


def image_request(*parts, pan_and_scan: bool | None = None) -> dict:
    """helpers.image_request, each image part with its pan_and_scan where one is given."""
    return helpers.image_request(*parts, **({} if pan_and_scan is None else {"pan_and_scan": pan_and_scan}))


def run_file(engine, folder, requests: list[dict], batch_size=None, **options):
    return helpers.run_file(engine, folder, requests, MAX_NEW, batch_size, **options)


_HF = {}


def oracle(folder):
    """transformers' model and Gemma3Processor (its PIL image processor) of the checkpoint."""
    if folder not in _HF:
        from transformers import AutoModelForImageTextToText, AutoTokenizer, Gemma3ImageProcessorPil, Gemma3Processor

        settings = {k: v for k, v in family_assets.GEMMA3_PREPROCESSOR.items() if k != "image_processor_type"}
        processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(**settings),
                                    tokenizer=AutoTokenizer.from_pretrained(folder), image_seq_length=SOFT)
        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(), processor)
    return _HF[folder]


def oracle_inputs(folder, request: dict):
    model, processor = oracle(folder)
    messages = request["messages"]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [Image.open(p["image"]).convert("RGB") for m in messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image"]
    if not pictures:
        return model, {"input_ids": processor.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids}
    pan = any(p.get("pan_and_scan") for m in messages if isinstance(m["content"], list) for p in m["content"])
    return model, processor(text=[text], images=[pictures], add_special_tokens=False, do_pan_and_scan=pan,
                            return_tensors="pt")


def transformers_greedy(folder, request: dict) -> list[int]:
    model, inputs = oracle_inputs(folder, request)
    ids = inputs["input_ids"]
    inputs = {k: v for k, v in inputs.items() if k != "num_crops"}
    with torch.no_grad():
        out = model.generate(**{**inputs, "attention_mask": torch.ones_like(ids)}, max_new_tokens=MAX_NEW,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def our_prompt(engine, folder, request: dict):
    """Our prompt's token ids and its media's spans (first token, tokens)."""
    path = folder / "prompt.json"
    path.write_text(json.dumps({"requests": [request]}))
    loaded = load_input_file(path)
    runner = Runner(EngineDir.open(engine), threads=1)
    sequence = runner.prepare(0, loaded.requests[0], loaded.settings, runner.formatter(loaded.settings, loaded.source)
                              ).sequence
    return sequence.prompt_ids, [(first, tokens) for first, tokens, _ in sequence.media.spans()]


def test_the_engine_has_the_tower_and_the_mask(gemma3):
    _, engine = gemma3
    manifest = EngineDir.open(engine).manifest
    assert manifest["model"]["architecture"] == "Gemma3ForConditionalGeneration"
    assert manifest["components"]["vision"]["adapter"] == "gemma3"
    assert manifest["model"]["bidirectional_block"] == SOFT
    assert manifest["model"]["embedding_scale"] == pytest.approx(64 ** 0.5)


def test_prompt_tokens_are_the_processors(gemma3, images, tmp_path):
    """The text around each image (and "Here is the original image ... crops" for the wide one's 3
    crops) tokenized as the processor does, newlines merged with the template's."""
    folder, engine = gemma3
    request = image_request(images["wide.png"], "and", images["square.png"], "Compare them.", pan_and_scan=True)
    ids, spans = our_prompt(engine, tmp_path, request)
    _, inputs = oracle_inputs(folder, request)
    assert ids == inputs["input_ids"][0].tolist()
    assert [tokens for _, tokens in spans] == [SOFT] * 5  # 4 frames of the wide image, 1 of the square
    types = inputs["token_type_ids"][0].tolist()
    assert [i for i, t in enumerate(types) if t] == [first + k for first, n in spans for k in range(n)]


def test_the_tower_matches_transformers(gemma3, images):
    """The rows of an image and its 3 pan-and-scan crops, against transformers' get_image_features on its
    processor's pixels."""
    from types import SimpleNamespace

    from trt_llm.families.gemma3.prompt import frames_of
    from trt_llm.runtime.media.vision.encoder import VisionEncoder

    folder, engine = gemma3
    model, processor = oracle(folder)
    vision = VisionEncoder(EngineDir.open(engine), threads=1)
    pending = [vision.pending(images["wide.png"].read_bytes(), "wide.png")]
    frames = frames_of(vision, [(0, 0, SimpleNamespace(pan_and_scan=True))], pending)[0]
    ours = np.concatenate([image.embeds for image in vision.encode(frames)])
    pixels = processor.image_processor(images=[[Image.open(images["wide.png"]).convert("RGB")]], do_pan_and_scan=True,
                                       return_tensors="pt").pixel_values
    with torch.no_grad():
        expected = model.model.get_image_features(pixels).pooler_output.reshape(-1, 64).numpy()
    assert ours.shape == expected.shape == (4 * SOFT, 64)
    np.testing.assert_allclose(ours, expected, atol=2e-5, rtol=1e-4)


def test_images_and_text_in_one_batch_match_transformers(gemma3, images, tmp_path):
    """An image with its 3 pan-and-scan crops beside a small one, text alone, three images, the wide one
    without crops: batched, greedy tokens identical to transformers generate."""
    folder, engine = gemma3
    requests = [image_request(images["wide.png"], "and", images["square.png"], "Compare them.", pan_and_scan=True),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                image_request(images["square.png"], images["tall.png"], images["square.png"], "Which is odd?"),
                image_request(images["wide.png"], "Describe this.")]
    output = run_file(engine, tmp_path, requests)
    for request, response in zip(requests, output.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.output_token_ids == transformers_greedy(folder, request)


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_the_image_tokens_see_each_other_as_in_transformers(gemma3, images, tmp_path, pan_and_scan):
    """The first token's top log-probabilities, each against the top one's, equal transformers' (with
    its token_type_ids mask) within float noise, and move 10x more than that when an image's tokens do
    not see each other both ways (transformers without token_type_ids: causal over the image), so the
    test tells the masks apart (the greedy tokens of a tiny random model barely do). Against the top
    one's: the normaliser's sum over 262k tokens alone differs by ~1e-4 between two float32 sums."""
    folder, engine = gemma3
    request = {**image_request(images["wide.png"], "What is this?", pan_and_scan=pan_and_scan), "num_logprobs": 5}
    response = run_file(engine, tmp_path, [request]).responses[0]
    ours = {c.token_id: c.logprob for c in response.logprobs[0]}
    model, inputs = oracle_inputs(folder, request)
    inputs = {k: v for k, v in inputs.items() if k != "num_crops"}
    with torch.no_grad():
        both_ways = torch.log_softmax(model(**inputs).logits[0, -1], -1).tolist()
        causal = torch.log_softmax(model(**{k: v for k, v in inputs.items() if k != "token_type_ids"}).logits[0, -1],
                                   -1).tolist()
    top = max(ours, key=ours.get)
    error = max(abs((ours[i] - ours[top]) - (both_ways[i] - both_ways[top])) for i in ours)
    moved = max(abs((causal[i] - causal[top]) - (both_ways[i] - both_ways[top])) for i in ours)
    assert error < 1e-4 and moved > 10 * max(error, 1e-5), (error, moved)


def test_continuous_and_chunked_give_the_static_runs_tokens(gemma3, images, tmp_path):
    """Continuous scheduling, and prefill chunks of 100 tokens: an image's 256 soft tokens are never
    split (a chunk that would end inside them ends before, or takes them whole), so the log-probabilities
    are the static run's too."""
    _, engine = gemma3
    requests = [image_request(images["tall.png"], "One."), {"messages": [{"role": "user", "content": "Two"}]},
                image_request(images["square.png"], images["wide.png"], "Three.", pan_and_scan=True)]
    requests = [{**request, "num_logprobs": 3} for request in requests]
    static = run_file(engine, tmp_path, requests).responses
    continuous = run_file(engine, tmp_path, requests, batch_size=2, scheduling="continuous").responses
    chunked = run_file(engine, tmp_path, requests, batch_size=2, scheduling="continuous", prefill_chunk=100).responses
    assert all(r.finish_reason in ("end-of-sequence", "max-length") for r in static + continuous + chunked)
    for other in (continuous, chunked):
        for ours, theirs in zip(other, static):
            assert ours.output_token_ids == theirs.output_token_ids
            first, expected = ours.logprobs[0], theirs.logprobs[0]
            assert [c.logprob for c in first] == pytest.approx([c.logprob for c in expected], abs=1e-5)


def test_context_reuse_restores_the_same_image(gemma3, images, tmp_path):
    """The same image again restores whole blocks of its prompt, which end inside the image's soft
    tokens (the rest of them is computed seeing all of the image, as the first pass did); another
    question after it too. Tokens are bypass's and transformers'."""
    folder, engine = gemma3
    requests = [image_request(images["tall.png"]), image_request(images["tall.png"]),
                image_request(images["tall.png"], "What colour is it?")]
    responses, prompts = helpers.reuse_run(engine, tmp_path, requests, MAX_NEW)
    bypassed = helpers.tokens_of_bypass(engine, tmp_path, requests, MAX_NEW)
    for i, request in enumerate(requests):
        assert responses[i].output_token_ids == bypassed[i] == transformers_greedy(folder, request), i
    first, count = prompts[0][1][0]
    assert first < responses[1].reused_tokens < first + count
    assert first < responses[2].reused_tokens


def test_images_over_the_limits_fail_their_request_alone(gemma3, images, tmp_path):
    """The wide image's 4 frames take 1,024 tokens: two of them are more than the engine's 1,536 a
    request; checked before any image is encoded, and the other requests run."""
    _, engine = gemma3
    requests = [image_request(images["wide.png"], images["wide.png"], "Two wide ones.", pan_and_scan=True),
                image_request(images["square.png"], "Fine.")]
    output = run_file(engine, tmp_path, requests)
    assert output.responses[0].finish_reason == "error" and "max_image_tokens" in output.responses[0].error
    assert output.responses[1].finish_reason in ("end-of-sequence", "max-length")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                    reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_the_tower_and_the_masked_decoder_build_tensorrt_rtx_plans_ahead_of_time(gemma3, tmp_path):
    """The engine's vision graph for tensorrt-rtx without a GPU, on the adapter's profile (one frame to
    what max_image_tokens fills), and its decoder with the tree_mask input (the attention's body)."""
    from trt_llm.build.tensorrt_backend import compile_tensorrt, encoder_profiles, input_profiles
    from trt_llm.schemas.build_config import BuildConfig

    _, engine = gemma3
    config = BuildConfig(**json.loads((engine / "manifest.json").read_text())["build_config"])
    profiles = encoder_profiles("gemma3", config, engine / "vision" / "config.json")
    ((low, _, high),) = input_profiles(engine / "vision" / "model.onnx", config, profiles)[0].values()
    assert low == (1, 3, 896, 896) and high == (config.vision.max_image_tokens // SOFT, 3, 896, 896)
    for part in ("vision", "llm"):
        (tmp_path / part).mkdir()
    plan = compile_tensorrt(engine / "vision" / "model.onnx", tmp_path / "vision", config, rtx=True, profiles=profiles)
    assert plan.stat().st_size > 100_000
    decoder = compile_tensorrt(engine / "llm" / "model.onnx", tmp_path / "llm", config, rtx=True)
    assert decoder.stat().st_size > 100_000
