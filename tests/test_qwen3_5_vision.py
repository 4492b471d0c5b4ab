"""Qwen3.5 as it is published (Qwen3_5ForConditionalGeneration): its hybrid decoder (Gated DeltaNet and
gated attention) on mRoPE positions and its vision tower (Qwen3-VL's, without deepstack), built from a
tiny random checkpoint with the real Qwen tokenizer, against transformers `generate` on the same images
(greedy tokens identical). The oracle and the request helpers are test_vlm's.
"""

from __future__ import annotations

import pytest

import test_vlm
import vlm_assets
from test_vlm import PIXEL_BOUNDS, image_request, reuse_run, run_file, tokens_of_bypass, transformers_greedy
from trt_llm.runtime.engine_dir import EngineDir

FAMILY = "qwen3_5_vl"
PIXEL_BOUNDS[FAMILY] = PIXEL_BOUNDS["qwen3_vl"]  # the same processor, the same default token limits


images = test_vlm.images  # the two pictures, test_vlm's fixture


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, npm_tokenizer, build_engine_for):
    folder = vlm_assets.make_tiny_vlm(FAMILY, tmp_path_factory.mktemp(FAMILY), npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=768, max_kv_cache_capacity=1024)
    return FAMILY, folder, engine


def test_the_published_checkpoint_builds_its_vision_tower_on_the_hybrid_decoder(vlm):
    _, _, engine = vlm
    manifest = EngineDir.open(engine).manifest
    assert manifest["model"]["architecture"] == "Qwen3_5ForConditionalGeneration"
    assert manifest["model"]["mrope"] == "interleaved"
    assert manifest["components"]["vision"]["adapter"] == "qwen3_vl"
    assert [layer["kind"] for layer in manifest["model"]["layers"]] == ["recurrent", "full", "recurrent", "full"]


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
    assert output.responses[2].prompt_tokens > output.responses[0].prompt_tokens > output.responses[1].prompt_tokens


def test_continuous_scheduling_with_reuse_gives_the_static_runs_tokens(vlm, images, tmp_path):
    """Requests sharing an image, admitted as rows free, prompts prefilled 24 tokens a pass, with context
    reuse (a hybrid restores a prefix only where its recurrent states were kept): each request's tokens
    are the static run's without reuse, and the repeated request restores what the first committed."""
    family, folder, engine = vlm
    wide, tall = images["wide.png"], images["tall.png"]
    question = "What is in this picture? Answer in detail, please."
    requests = [image_request(wide, ("text", question)), {"messages": [{"role": "user", "content": "Hello there"}]},
                image_request(tall, ("text", "and"), wide, ("text", "Compare them.")),
                image_request(wide, ("text", question))]
    static = tokens_of_bypass(engine, tmp_path, requests, batch_size=2)
    continuous, _ = reuse_run(engine, tmp_path, requests, scheduling="continuous", batch_size=2, prefill_chunk=24)
    assert [r.output_token_ids for r in continuous] == static
    assert continuous[3].reused_tokens > 0
    assert static[0] == transformers_greedy(family, folder, requests[0], tmp_path)
