"""Vision-language engines end to end: tiny random Qwen2.5-VL and Qwen3-VL with the real Qwen
tokenizer, built, run on input files with images, against transformers `generate` on the same
images (greedy tokens identical).

The oracle prepares its own inputs the way transformers' processor does: the chat template's one
<|image_pad|> per image widened to the image's tokens, transformers' image processor with the pixel
bounds the engine's limits give (written out by hand below), mm_token_type_ids marking the image
tokens; `generate` computes the mRoPE positions and runs the vision tower itself.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from PIL import Image

import helpers
from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS as BLOCK
import vlm_assets
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 16
# The engine's image sizes, by hand: the checkpoint's pixel range narrowed to the build's default
# token limits (4 to 512 tokens an image; a token is (patch * 2)^2 pixels).
PIXEL_BOUNDS = {"qwen2_5_vl": (max(3136, 4 * 28 * 28), min(12845056, 512 * 28 * 28)),
                "qwen3_vl": (max(65536, 4 * 32 * 32), min(16777216, 512 * 32 * 32))}


@pytest.fixture(scope="module", params=vlm_assets.VLM_FAMILIES)
def vlm(request, tmp_path_factory, npm_tokenizer, build_engine_for):
    family = request.param
    folder = vlm_assets.shared_tiny_vlm(family, tmp_path_factory, npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=768, max_kv_cache_capacity=1024)
    return family, folder, engine


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two random pictures of different sizes, as PNG files."""
    return helpers.random_pictures(tmp_path_factory.mktemp("images"), {"wide.png": (60, 200), "tall.png": (120, 90)})


def image_request(*parts) -> dict:
    """A user message of parts: a path-like str is an image, ("text", t) a text part."""
    content = [{"type": "text", "text": p[1]} if isinstance(p, tuple) else {"type": "image", "image": str(p)}
               for p in parts]
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict]):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": len(requests), "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings)


_HF = {}


def transformers_greedy(family, folder, request: dict, base, bounds=None, max_new=MAX_NEW) -> list[int]:
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessorPil

    if folder not in _HF:
        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(),
                       AutoTokenizer.from_pretrained(folder))
    model, tokenizer = _HF[folder]
    messages = request["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = [Image.open(_local(p["image"], base)).convert("RGB") for m in messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image"]
    extra = {}
    if pictures:
        settings = {k: v for k, v in vlm_assets.PREPROCESSOR[family].items() if k not in ("image_processor_type", "size", "min_pixels", "max_pixels")}
        low, high = bounds or PIXEL_BOUNDS[family]
        processed = Qwen2VLImageProcessorPil(**settings, min_pixels=low, max_pixels=high)(images=pictures,
                                                                                          return_tensors="pt")
        pieces = text.split("<|image_pad|>")
        text = pieces[0] + "".join("<|image_pad|>" * (int(grid.prod()) // 4) + rest
                                   for grid, rest in zip(processed["image_grid_thw"], pieces[1:]))
        extra = {"pixel_values": processed["pixel_values"], "image_grid_thw": processed["image_grid_thw"]}
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, mm_token_type_ids=(ids == vlm_assets.IMAGE_TOKEN).long(), **extra)
    return out[0, ids.shape[1]:].tolist()


def _local(source: str, base):
    if source.startswith("data:"):
        import io

        return io.BytesIO(base64.b64decode(source.split(",", 1)[1]))
    path = base / source
    return path if path.exists() else source


def test_images_and_text_in_one_batch_match_transformers(vlm, images, tmp_path):
    """One image; two images of different sizes in one request; a text-only request beside them."""
    family, folder, engine = vlm
    requests = [image_request(images["tall.png"], ("text", "Describe this.")),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                image_request(images["tall.png"], ("text", "and"), images["wide.png"], ("text", "Compare them."))]
    output = run_file(engine, tmp_path, requests)
    for request, response in zip(requests, output.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.output_token_ids == transformers_greedy(family, folder, request, tmp_path)
    # the prompt counts the images' tokens: 120x90 and 60x200 pictures, resized by hand's bounds
    assert output.responses[2].prompt_tokens > output.responses[0].prompt_tokens > output.responses[1].prompt_tokens


def test_the_same_image_as_path_relative_path_and_data_url_gives_the_same_output(vlm, images, tmp_path):
    family, folder, engine = vlm
    source = images["wide.png"]
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "copy.png").write_bytes(source.read_bytes())
    data_url = "data:image/png;base64," + base64.b64encode(source.read_bytes()).decode()
    requests = [image_request(source, ("text", "What is it?")), image_request("pictures/copy.png", ("text", "What is it?")),
                image_request(data_url, ("text", "What is it?"))]
    output = run_file(engine, tmp_path, requests)
    tokens = [r.output_token_ids for r in output.responses]
    assert tokens[0] == tokens[1] == tokens[2] and len(tokens[0]) > 0
    assert tokens[0] == transformers_greedy(family, folder, requests[0], tmp_path)


def test_a_bad_image_fails_its_request_alone_and_names_it(vlm, images, tmp_path):
    _, _, engine = vlm
    (tmp_path / "broken.png").write_bytes(b"not a png at all")
    requests = [image_request(images["wide.png"], ("text", "Fine.")),
                image_request(("text", "Look:"), "missing.png"),
                image_request("broken.png"),
                image_request("https://example.com/cat.png")]
    output = run_file(engine, tmp_path, requests)
    first, missing, broken, remote = output.responses
    assert first.finish_reason in ("end-of-sequence", "max-length") and first.output_token_ids
    assert missing.finish_reason == "error" and "requests[1].messages[0].content[1]" in missing.error
    assert "missing.png" in missing.error
    assert broken.finish_reason == "error" and "requests[2].messages[0].content[0]" in broken.error
    assert "broken.png" in broken.error and "not an image" in broken.error
    assert remote.finish_reason == "error" and "nothing is fetched" in remote.error


def test_too_many_image_tokens_are_refused_naming_the_limit(vlm, images, tmp_path, monkeypatch):
    _, _, engine = vlm
    engine_dir = EngineDir.open(engine)
    runner = Runner(engine_dir, threads=1)
    monkeypatch.setattr(runner.vision, "max_request_tokens", 8)
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"max_generate_length": 4, "requests": [image_request(images["wide.png"])]}))
    loaded = load_input_file(path)
    (response,) = runner.run(loaded, loaded.settings).responses
    assert response.finish_reason == "error"
    assert "more than the engine's max_image_tokens 8" in response.error and "requests[0].messages" in response.error
    monkeypatch.setattr(runner.vision, "max_request_tokens", 1024)
    monkeypatch.setitem(runner.preparer.limits, "max_input_len", 30)
    (response,) = runner.run(loaded, loaded.settings).responses
    assert response.finish_reason == "error" and "longer than the engine's max_input_len 30" in response.error
    assert runner.vision.encoded_images == 0  # refused before the encoder ran


def test_an_image_is_encoded_once_for_many_requests(vlm, images, tmp_path):
    _, _, engine = vlm
    runner = Runner(EngineDir.open(engine), threads=1)
    path = tmp_path / "input.json"
    requests = [image_request(images["tall.png"], ("text", f"Question {i}")) for i in range(3)]
    path.write_text(json.dumps({"batch_size": 3, "max_generate_length": 2, "requests": requests}))
    loaded = load_input_file(path)
    runner.run(loaded, loaded.settings)
    assert runner.vision.encoded_images == 1


def test_four_large_images_of_16k_patches_match_transformers(npm_tokenizer, build_engine_for, tmp_path_factory):
    """A request of four images totalling 16,384 patches (the reference's NaN above 16,384 vision
    tokens, its issue #59): no NaN, tokens identical to transformers. Each image is 64 x 64
    patches, 1,024 tokens, so the build raises the per-image and per-request limits."""
    folder = vlm_assets.make_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("large"), npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=1, max_input_len=4300, max_kv_cache_capacity=4400,
                              vision={"max_image_tokens_per_image": 1024, "max_image_tokens": 4096})
    work = tmp_path_factory.mktemp("large-images")
    rng = np.random.default_rng(1)
    parts = []
    for i in range(4):
        Image.fromarray((rng.random((896, 896, 3)) * 255).astype(np.uint8)).save(work / f"{i}.png")
        parts.append(work / f"{i}.png")
    request = image_request(*parts, ("text", "Compare the four."))
    runner = Runner(EngineDir.open(engine), threads=2)
    path = work / "input.json"
    path.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 8, "requests": [request]}))
    loaded = load_input_file(path)
    (response,) = runner.run(loaded, loaded.settings).responses
    assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
    assert runner.vision.encoded_tokens == 4096  # 16,384 patches in one encoder call
    assert all(np.isfinite(image.embeds).all() for image in runner.vision.cache.entries.values())
    expected = transformers_greedy("qwen2_5_vl", folder, request, work, bounds=(3136, 1024 * 28 * 28), max_new=8)
    assert response.output_token_ids == expected


def test_the_server_takes_an_image_as_a_data_url(vlm, images, tmp_path):
    """POST /v1/chat/completions with an image_url data URL: the file runner's answer."""
    from test_server import LiveServer
    from trt_llm.server.app import ServerConfig, create_app

    _, _, engine = vlm
    data_url = "data:image/png;base64," + base64.b64encode(images["tall.png"].read_bytes()).decode()
    expected = run_file(engine, tmp_path, [image_request(data_url, ("text", "What is it?"))]).responses[0]
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


def test_a_lora_adapter_applies_to_the_text_decoder_of_an_image_request(npm_tokenizer, build_engine_for,
                                                                        images, tmp_path_factory):
    """A PEFT adapter on the language model's projections, mixed in a batch with the base: the image
    request with it equals transformers + PEFT, the one without it the base model."""
    import peft
    from transformers import AutoModelForImageTextToText

    folder = vlm_assets.make_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("lora-vlm"), npm_tokenizer("qwen3"))
    torch.manual_seed(3)
    base = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    targets = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                        init_lora_weights=False))
    for name, param in wrapped.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.3)
    adapter = tmp_path_factory.mktemp("adapter") / "a"
    wrapped.save_pretrained(adapter)
    merged_dir = tmp_path_factory.mktemp("merged")
    wrapped.merge_and_unload().save_pretrained(merged_dir)  # the oracle: base + adapter as one model
    for file in folder.iterdir():
        if file.name.startswith(("tokenizer", "preprocessor")):
            (merged_dir / file.name).write_bytes(file.read_bytes())
    engine = build_engine_for(folder, max_batch_size=2, max_input_len=768, max_kv_cache_capacity=1024,
                              lora={"max_rank": 8})
    work = tmp_path_factory.mktemp("lora-run")
    request = image_request(images["tall.png"], ("text", "Describe this."))
    path = work / "input.json"
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "available_lora_weights": {"a": str(adapter)},
                                "requests": [{**request, "lora_name": "a"}, request]}))
    loaded = load_input_file(path)
    with_adapter, without = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    assert with_adapter.output_token_ids == transformers_greedy("qwen2_5_vl", merged_dir, request, work)
    assert without.output_token_ids == transformers_greedy("qwen2_5_vl", folder, request, work)
    assert with_adapter.output_token_ids != without.output_token_ids


def test_continuous_scheduling_gives_the_static_runs_tokens_with_images(vlm, images, tmp_path):
    """Image and text-only requests admitted as rows free (--scheduling continuous): each request's
    tokens are the static run's."""
    _, _, engine = vlm
    requests = [image_request(images["tall.png"], ("text", "One.")), {"messages": [{"role": "user", "content": "Two"}]},
                image_request(images["wide.png"], ("text", "Three.")), image_request(images["tall.png"], ("text", "Four."))]
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests}))
    loaded = load_input_file(path)
    static = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    continuous = Runner(EngineDir.open(engine), threads=1, scheduling="continuous").run(loaded, loaded.settings).responses
    assert [r.output_token_ids for r in continuous] == [r.output_token_ids for r in static]
    assert all(r.finish_reason in ("end-of-sequence", "max-length") for r in continuous)


def test_a_system_prompt_with_an_image_is_never_reused_for_another_image(vlm, images, tmp_path):
    """The system-prompt KV cache keys on tokens, and an image's tokens are all <|image_pad|>: a system
    message holding an image is prefilled whole each time, so a second request with another image in
    the same place gets that image's answer, not the first one's KV."""
    family, folder, engine = vlm

    def request(picture):
        return {"messages": [{"role": "system", "content": [{"type": "image", "image": str(picture)},
                                                            {"type": "text", "text": "Remember this."}]},
                             {"role": "user", "content": "What was it?"}],
                "save_system_prompt_kv_cache": True}

    runner = Runner(EngineDir.open(engine), threads=1)
    outputs = []
    for picture in (images["tall.png"], images["tall.png"], images["wide.png"]):
        path = tmp_path / "input.json"
        path.write_text(json.dumps({"temperature": 0.0, "max_generate_length": MAX_NEW, "requests": [request(picture)]}))
        loaded = load_input_file(path)
        (response,) = runner.run(loaded, loaded.settings).responses
        assert response.reused_tokens == 0
        outputs.append(response.output_token_ids)
    assert outputs[2] == transformers_greedy(family, folder, request(images["wide.png"]), tmp_path)
    assert outputs[0] == outputs[1]


# -- context reuse (runtime/cache/reuse.py) with images: a block's key covers the images whose tokens it
# holds, so equal token ids with another image restore nothing past that image's first token, the same
# image restores past its tokens, and a prefix may end inside an image's span; tokens are bypass's.

QUESTION = "Describe this picture in a few words, please."


@pytest.fixture(scope="module")
def twins(images, tmp_path_factory):
    """For each picture of `images`, one of the same size (so the same image tokens) and other pixels."""
    folder = tmp_path_factory.mktemp("twins")
    for name, path in images.items():
        Image.fromarray(255 - np.asarray(Image.open(path).convert("RGB"))).save(folder / name)
    return {name: folder / name for name in images}


def reuse_run(engine, folder, requests: list[dict], **options):
    return helpers.reuse_run(engine, folder, requests, MAX_NEW, **options)


def tokens_of_bypass(engine, folder, requests: list[dict], **options) -> list[list[int]]:
    return helpers.tokens_of_bypass(engine, folder, requests, MAX_NEW, **options)


def test_equal_token_ids_with_another_image_share_nothing_past_its_first_token(vlm, images, twins, tmp_path):
    """Pairs of prompts whose token ids are equal and whose images differ (same size: same image
    tokens): the second of a pair restores the text blocks before the first image that differs, never
    a block holding one of its tokens; its tokens are bypass's and transformers'."""
    family, folder, engine = vlm
    wide, tall = images["wide.png"], images["tall.png"]
    before = ("text", "Look closely at the little picture below, then tell me what you see in it:")
    pairs = [((wide, ("text", QUESTION)), (twins["wide.png"], ("text", QUESTION))),
             ((before, tall, ("text", QUESTION)), (before, twins["tall.png"], ("text", QUESTION))),
             # the first image shared, the second one differing
             ((wide, ("text", "and"), tall, ("text", "Compare them.")),
              (wide, ("text", "and"), twins["tall.png"], ("text", "Compare them.")))]
    requests = [image_request(*parts) for pair in pairs for parts in pair]
    responses, prompts = reuse_run(engine, tmp_path, requests)
    bypassed = tokens_of_bypass(engine, tmp_path, requests)
    for i, request in enumerate(requests):
        assert responses[i].output_token_ids == bypassed[i] == transformers_greedy(family, folder, request, tmp_path), i
    for pair in range(len(pairs)):
        (ids, spans), (other_ids, other_spans) = prompts[2 * pair], prompts[2 * pair + 1]
        assert ids == other_ids and spans == other_spans, pair  # equal tokens: only the images tell them apart
        differing = spans[1][0] if pair == 2 else spans[0][0]  # the first token of the first image that differs
        assert responses[2 * pair + 1].reused_tokens == differing // BLOCK * BLOCK, pair  # nothing past it
    assert responses[3].reused_tokens and responses[5].reused_tokens  # but the text, or the image, before it
    assert responses[0].output_token_ids != responses[1].output_token_ids  # another image's KV would show


def test_the_same_image_is_restored_past_its_tokens(vlm, images, tmp_path):
    """A request repeated, and the same image with a longer question that starts the same: each
    restores past the image's last token, and its tokens are bypass's."""
    family, folder, engine = vlm
    wide = images["wide.png"]
    requests = [image_request(wide, ("text", QUESTION)), image_request(wide, ("text", QUESTION)),
                image_request(wide, ("text", QUESTION[:-1] + ", and name its main colour."))]
    responses, prompts = reuse_run(engine, tmp_path, requests)
    ((first, count),) = prompts[0][1]
    assert responses[0].reused_tokens == 0
    assert responses[1].reused_tokens > first + count and responses[2].reused_tokens > first + count
    assert [r.output_token_ids for r in responses] == tokens_of_bypass(engine, tmp_path, requests)
    assert responses[2].output_token_ids == transformers_greedy(family, folder, requests[2], tmp_path)


def test_a_prefix_that_ends_inside_an_image_restores_part_of_it(vlm, images, tmp_path):
    """The same image and text before it, another question right after it: the restored prefix ends
    at a block boundary inside the image's tokens (mRoPE positions, and Qwen3-VL's deepstack
    features, of the rest computed from there); its tokens are bypass's and transformers'."""
    family, folder, engine = vlm
    before = ("text", "A longer question before the picture please")
    pairs = [((images["wide.png"], ("text", QUESTION)), (images["wide.png"], ("text", "What colour is it?"))),
             ((before, images["tall.png"], ("text", QUESTION)), (before, images["tall.png"], ("text", "Is it dark?")))]
    requests = [image_request(*parts) for pair in pairs for parts in pair]
    responses, prompts = reuse_run(engine, tmp_path, requests)
    for i in (1, 3):
        ((first, count),) = prompts[i][1]
        assert first < responses[i].reused_tokens < first + count, (i, first, count, responses[i].reused_tokens)
    bypassed = tokens_of_bypass(engine, tmp_path, requests)
    for i in (1, 3):
        assert responses[i].output_token_ids == bypassed[i] == transformers_greedy(family, folder, requests[i], tmp_path)


def test_a_next_turn_restores_the_image_and_the_turn_before_it(vlm, images, tmp_path):
    """Turn 2 repeats turn 1 (an image and a question) with its answer: it restores at least turn 1's
    prompt blocks, and the blocks of the answer's tokens where its text tokenizes back to them (they
    were computed at decoding's positions, the prompt's mRoPE delta on); its tokens are bypass's and
    transformers'."""
    family, folder, engine = vlm
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=True)

    def run(request):
        path = tmp_path / "input.json"
        path.write_text(json.dumps({"temperature": 0.0, "max_generate_length": MAX_NEW, "requests": [request]}))
        loaded = load_input_file(path)
        (response,) = runner.run(loaded, loaded.settings).responses
        return response

    turn = image_request(images["wide.png"], ("text", QUESTION))["messages"]
    first = run({"messages": turn})
    second = {"messages": turn + [{"role": "assistant", "content": first.output_text},
                                  {"role": "user", "content": "And its colours?"}]}
    answer = run(second)
    assert answer.reused_tokens >= first.prompt_tokens // BLOCK * BLOCK
    assert answer.output_token_ids == tokens_of_bypass(engine, tmp_path, [second])[0]
    assert answer.output_token_ids == transformers_greedy(family, folder, second, tmp_path)


@pytest.mark.parametrize("chunk", [None, 24])
def test_continuous_scheduling_with_reuse_gives_the_static_runs_tokens_with_images(vlm, images, twins, tmp_path, chunk):
    """Requests that share images, differ by an image of the same size, or share part of one, beside a
    text-only one, admitted as rows free with context reuse: each request's tokens are the static run's,
    with reuse and without, and later requests restore what earlier ones committed. Also with prompts
    prefilled 24 tokens a pass (prefill_chunk: passes that end inside images and inside blocks)."""
    _, _, engine = vlm
    wide, tall = images["wide.png"], images["tall.png"]
    requests = [image_request(wide, ("text", QUESTION)), image_request(twins["wide.png"], ("text", QUESTION)),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                image_request(wide, ("text", QUESTION)), image_request(wide, ("text", "What colour is it?")),
                image_request(tall, ("text", "and"), wide, ("text", "Compare them.")),
                image_request(tall, ("text", "and"), twins["wide.png"], ("text", "Compare them.")),
                image_request(tall, ("text", "Is it dark?"))]
    static = tokens_of_bypass(engine, tmp_path, requests, batch_size=2)
    static_reused, _ = reuse_run(engine, tmp_path, requests, batch_size=2, prefill_chunk=chunk)
    continuous, _ = reuse_run(engine, tmp_path, requests, scheduling="continuous", batch_size=2, prefill_chunk=chunk)
    assert [r.output_token_ids for r in continuous] == [r.output_token_ids for r in static_reused] == static
    # (whether request 6 restores request 5's first image depends on whether they are admitted together)
    assert [continuous[i].reused_tokens > 0 for i in (0, 1, 2, 3, 4, 5, 7)] == [False] * 3 + [True] * 2 + [False, True]


def test_prompt_lookup_with_images_decodes_vanillas_tokens(vlm, images, tmp_path, every_chain):
    """Prompt lookup's verification passes (runtime/decoding/lookup.py) take the generated tokens' mRoPE
    positions (after the images' rows) and Qwen3-VL's deepstack input at their width: the tokens of vanilla
    decoding. A logit bias keeps a random model's answer to three tokens, so its n-grams recur."""
    _, _, engine = vlm
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 40,
            "logit_bias": {"100": 40.0, "200": 40.0, "300": 40.0},
            "requests": [image_request(images["tall.png"], ("text", "Describe this.")),
                         image_request(images["wide.png"], ("text", "and"), images["tall.png"])]}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data))
    loaded = load_input_file(path)
    vanilla = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    runner = Runner(EngineDir.open(engine), threads=1, speculation="prompt-lookup")
    looked = runner.run(loaded, loaded.settings).responses
    assert [r.output_token_ids for r in looked] == [r.output_token_ids for r in vanilla]
    assert runner.lookup_stats.accepted > 0
