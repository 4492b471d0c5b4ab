"""SmolVLM2 / Idefics3 engines end to end: tiny random checkpoints with SmolLM2's real tokenizer and
SmolVLM's image tokens (tests/smolvlm_assets.py), built, run on input files with images, against
transformers: its image processor and Idefics3Processor for the frames and the prompt's tokens (the
tiles' row / column tokens), its model's vision tower for the rows, and `generate` for the greedy
tokens, with several images a request (split into tiles, small ones upscaled), batched, continuous,
and with context reuse."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import numpy as np
import pytest
import torch
from PIL import Image

import helpers
import smolvlm_assets
from trt_llm.families.smolvlm.processor import TileProcessor
from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS as BLOCK
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 12
# (height, width): a 2 x 3 split, a tall small one upscaled to 3 x 2, a tiny square to 3 x 3, one tile
# tall after rounding (3 x 1)
SIZES = {"wide.png": (60, 90), "small.png": (20, 12), "tiny.png": (8, 8), "thin.png": (200, 10)}


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory, smollm2_dir, build_engine_for):
    folder = smolvlm_assets.make_tiny_smolvlm("smolvlm", tmp_path_factory.mktemp("smolvlm"), smollm2_dir)
    return folder, build_engine_for(folder, max_batch_size=4, max_input_len=512, max_kv_cache_capacity=768)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return helpers.random_pictures(tmp_path_factory.mktemp("images"), SIZES)


def run_file(engine, folder, requests: list[dict], **options):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": len(requests), "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=1, **options).run(loaded, loaded.settings)


_HF = {}


def oracle_inputs(folder, request: dict):
    """transformers' processor's inputs for a request (its pictures from their paths)."""
    if folder not in _HF:
        from transformers import AutoModelForImageTextToText

        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(),
                       smolvlm_assets.oracle_processor(folder))
    model, processor = _HF[folder]
    messages = request["messages"]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [Image.open(p["image"]).convert("RGB") for m in messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image"]
    if not pictures:
        return model, {"input_ids": processor.tokenizer(text, return_tensors="pt").input_ids}
    return model, processor(text=[text], images=[pictures], return_tensors="pt")


def transformers_greedy(folder, request: dict, max_new=MAX_NEW) -> list[int]:
    model, inputs = oracle_inputs(folder, request)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(**{**inputs, "attention_mask": torch.ones_like(ids)}, max_new_tokens=max_new,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def our_prompt(engine, folder, request: dict) -> list[int]:
    path = folder / "prompt.json"
    path.write_text(json.dumps({"requests": [request]}))
    loaded = load_input_file(path)
    runner = Runner(EngineDir.open(engine), threads=1)
    return runner.prepare(0, loaded.requests[0], loaded.settings, runner.formatter(loaded.settings, loaded.source)
                          ).sequence.prompt_ids


@pytest.mark.parametrize("settings", [{}, {"size": {"longest_edge": 32}}, {"do_image_splitting": False},
                                      {"size": {"longest_edge": 200}, "resample": 3}])
def test_frames_are_transformers_image_processors(images, settings):
    """Our numpy / Pillow frames equal transformers' Idefics3ImageProcessorPil's, value for value, and
    so do the rows and columns of the split: split, one tile (longest edge = the tile), no splitting,
    and larger images with bicubic resizing."""
    from transformers import Idefics3ImageProcessorPil

    config = {**smolvlm_assets.PREPROCESSOR, **settings}
    ours = TileProcessor.from_config(config, smolvlm_assets.TILE, smolvlm_assets.PATCH, smolvlm_assets.SCALE, 4096)
    theirs = Idefics3ImageProcessorPil(**config)
    for name, path in images.items():
        picture = Image.open(path)
        expected = theirs(images=[[picture]], return_row_col_info=True)
        frames = ours.preprocess([picture]).pixel_values
        np.testing.assert_array_equal(frames, np.asarray(expected["pixel_values"])[0, :len(frames)])
        assert len(frames) == int(np.asarray(expected["pixel_attention_mask"])[0].any(axis=(1, 2)).sum()), name
        assert ours.layout(picture.height, picture.width) == (expected["rows"][0][0], expected["cols"][0][0]), name


def test_prompt_tokens_are_the_processors(smolvlm, images, tmp_path):
    """An image's <image> becomes the tiles' row / column tokens, their image tokens and the newlines
    between rows, token for token Idefics3Processor's, for split images and beside text."""
    folder, engine = smolvlm
    for request in (helpers.image_request(images["wide.png"], "and", images["small.png"], "Compare them."),
                    helpers.image_request("Look:", images["thin.png"]), helpers.image_request(images["tiny.png"])):
        _, inputs = oracle_inputs(folder, request)
        assert our_prompt(engine, tmp_path, request) == inputs["input_ids"][0].tolist()
    # an image sent whole (a processor without splitting): one frame, the global view's tokens alone
    from trt_llm.families.adapters import adapter
    from trt_llm.families.smolvlm.prompt import image_text

    layout = adapter("smolvlm", json.loads((engine / "vision" / "config.json").read_text()))
    whole = smolvlm_assets.oracle_processor(folder)(text=["<image>"], images=[[Image.open(images["wide.png"])]],
                                                    do_image_splitting=False)
    assert image_text(0, 0, layout) == (whole["input_ids"][0], [2])


def test_the_tower_matches_transformers(smolvlm, images):
    """The engine's vision graph on a request's frames: transformers' get_image_features (SigLIP,
    pixel shuffle, projection) within float tolerance, frame by frame."""
    from trt_llm.runtime.media.vision.encoder import VisionEncoder

    folder, engine = smolvlm
    encoder = VisionEncoder(EngineDir.open(engine))
    pending = [encoder.pending(images[name].read_bytes(), name) for name in ("wide.png", "tiny.png")]
    encoded = encoder.encode(pending)
    frames = encoder.processor.preprocess([image.picture for image in pending]).pixel_values
    model, _ = oracle_inputs(folder, helpers.image_request(images["tiny.png"]))
    with torch.no_grad():
        expected = model.model.get_image_features(torch.from_numpy(frames)[None]).pooler_output[0].numpy()
    ours = np.concatenate([image.embeds for image in encoded])
    assert ours.shape == expected.shape == (17 * smolvlm_assets.TILE_TOKENS, 64)
    np.testing.assert_allclose(ours, expected, atol=2e-5, rtol=1e-4)


def test_images_and_text_in_one_batch_match_transformers(smolvlm, images, tmp_path):
    """Two images in one request (one split 2 x 3, a small one upscaled), three, one, and text alone,
    batched: greedy tokens identical to transformers generate."""
    folder, engine = smolvlm
    requests = [helpers.image_request(images["wide.png"], "and", images["small.png"], "Compare them."),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                helpers.image_request(images["tiny.png"], images["thin.png"], images["wide.png"], "Which is odd?"),
                helpers.image_request(images["small.png"], "Describe this.")]
    output = run_file(engine, tmp_path, requests)
    for request, response in zip(requests, output.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.output_token_ids == transformers_greedy(folder, request)


def test_continuous_scheduling_gives_the_static_runs_tokens(smolvlm, images, tmp_path):
    _, engine = smolvlm
    requests = [helpers.image_request(images["wide.png"], "One."), {"messages": [{"role": "user", "content": "Two"}]},
                helpers.image_request(images["small.png"], images["tiny.png"], "Three."), helpers.image_request(images["thin.png"], "Four.")]
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests}))
    loaded = load_input_file(path)
    static = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    continuous = Runner(EngineDir.open(engine), threads=1, scheduling="continuous").run(loaded, loaded.settings).responses
    assert [r.output_token_ids for r in continuous] == [r.output_token_ids for r in static]
    assert all(r.finish_reason in ("end-of-sequence", "max-length") for r in continuous)


def test_context_reuse_tells_images_apart_and_restores_the_same_one(smolvlm, images, tmp_path):
    """With context reuse: the same image and question again restores past the image's frames; an
    image of the same size with other pixels (the same tokens) restores nothing past its first
    frame's first image token; a prefix may end inside a frame. Tokens are bypass's and transformers'."""
    folder, engine = smolvlm
    twin = tmp_path / "twin.png"
    Image.fromarray(255 - np.asarray(Image.open(images["wide.png"]).convert("RGB"))).save(twin)
    question = "Describe this picture in a few words, please."
    requests = [helpers.image_request(images["wide.png"], question), helpers.image_request(images["wide.png"], question),
                helpers.image_request(twin, question), helpers.image_request(images["wide.png"], "What colour is it?")]
    responses, prompts = helpers.reuse_run(engine, tmp_path, requests, MAX_NEW)
    bypassed = helpers.tokens_of_bypass(engine, tmp_path, requests, MAX_NEW)
    for i, request in enumerate(requests):
        assert responses[i].output_token_ids == bypassed[i] == transformers_greedy(folder, request), i
    spans = prompts[0][1]
    first, (last, count) = spans[0][0], spans[-1]
    assert prompts[2] == prompts[0]  # equal tokens and frames: only the pixels tell them apart
    assert responses[0].reused_tokens == 0 and responses[1].reused_tokens > last + count
    assert responses[2].reused_tokens == first // BLOCK * BLOCK
    assert responses[3].reused_tokens > last + count - BLOCK  # the image restored, up to the question


def test_an_image_over_the_token_limit_fails_its_request_alone(smolvlm, images, tmp_path):
    _, engine = smolvlm
    runner = Runner(EngineDir.open(engine), threads=1)
    runner.vision.processor = dataclasses.replace(runner.vision.processor, max_tokens=20)
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"max_generate_length": 4, "requests": [
        helpers.image_request(images["thin.png"], "Fine."), helpers.image_request("Look:", images["wide.png"])]}))
    loaded = load_input_file(path)
    fine, refused = runner.run(loaded, loaded.settings).responses
    assert fine.finish_reason in ("end-of-sequence", "max-length") and fine.output_token_ids
    assert refused.finish_reason == "error" and "requests[1].messages[0].content[1]" in refused.error
    assert "7 frame(s) of 4 image tokens each, 28, more than the engine's max_image_tokens_per_image 20" in refused.error


def test_idefics3_is_the_same_path(tmp_path_factory, smollm2_dir, build_engine_for, images, tmp_path):
    """Idefics3ForConditionalGeneration (SmolVLM's source in transformers) builds and runs on the same
    code: tokens identical to transformers with two images."""
    folder = smolvlm_assets.make_tiny_smolvlm("idefics3", tmp_path_factory.mktemp("idefics3"), smollm2_dir, seed=1)
    engine = build_engine_for(folder, max_batch_size=1, max_input_len=256, max_kv_cache_capacity=384)
    assert json.loads((engine / "manifest.json").read_text())["model"]["family"] == "idefics3"
    request = helpers.image_request(images["small.png"], "and", images["wide.png"], "Compare them.")
    (response,) = run_file(engine, tmp_path, [request]).responses
    assert response.output_token_ids == transformers_greedy(folder, request)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None,
                    reason="TensorRT-RTX is not installed (pip install 'trt-llm[tensorrt-rtx]')")
def test_the_tower_builds_a_tensorrt_rtx_plan_ahead_of_time(smolvlm, images, tmp_path):
    """The engine's vision graph for tensorrt-rtx without a GPU, on the adapter's profile: frames from
    one to what max_image_tokens fills, covering a request's frames."""
    from trt_llm.build.tensorrt_backend import compile_tensorrt, encoder_profiles, input_profiles
    from trt_llm.schemas.build_config import BuildConfig

    _, engine = smolvlm
    config = BuildConfig(**json.loads((engine / "manifest.json").read_text())["build_config"])
    profiles = encoder_profiles("smolvlm", config, engine / "vision" / "config.json")
    ((low, _, high),) = input_profiles(engine / "vision" / "model.onnx", config, profiles)[0].values()
    assert low == (1, 3, 32, 32) and high == (config.vision.max_image_tokens // smolvlm_assets.TILE_TOKENS, 3, 32, 32)
    plan = compile_tensorrt(engine / "vision" / "model.onnx", tmp_path, config, rtx=True, profiles=profiles)
    assert plan.stat().st_size > 100_000


def test_the_server_takes_an_image_as_a_data_url(smolvlm, images, tmp_path):
    """POST /v1/chat/completions with an image_url data URL: the file runner's answer and prompt count."""
    import base64

    from test_server import LiveServer
    from trt_llm.server.app import ServerConfig, create_app

    _, engine = smolvlm
    data_url = "data:image/png;base64," + base64.b64encode(images["wide.png"].read_bytes()).decode()
    expected = run_file(engine, tmp_path, [helpers.image_request(images["wide.png"], "What is it?")]).responses[0]
    live = LiveServer(create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                                 ServerConfig(model_name="tiny", max_rows=2)))
    try:
        answer = live.client().chat.completions.create(
            model="tiny", temperature=0, max_tokens=MAX_NEW,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                                   {"type": "text", "text": "What is it?"}]}])
    finally:
        live.close()
    assert answer.choices[0].message.content == expected.output_text
    assert answer.usage.prompt_tokens == expected.prompt_tokens


def test_pan_and_scan_is_refused_by_a_tower_that_cuts_no_crops(smolvlm, images, tmp_path):
    """An image part's pan_and_scan (Gemma 3's) on SmolVLM's tower fails its request alone, naming the field."""
    _, engine = smolvlm
    asked = helpers.image_request(images["small.png"], "What is it?")
    asked["messages"][0]["content"][0]["pan_and_scan"] = True
    output = run_file(engine, tmp_path, [asked, helpers.image_request(images["small.png"], "What is it?")])
    assert output.responses[0].finish_reason == "error"
    assert "requests[0].messages[0].content[0].pan_and_scan" in output.responses[0].error
    assert output.responses[1].finish_reason in ("end-of-sequence", "max-length")
