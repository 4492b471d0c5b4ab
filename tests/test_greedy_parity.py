"""Greedy output is token-identical to transformers `generate`: a ragged batch of 4 prompts, each
request compared with transformers running it alone."""

import pytest
from transformers import AutoTokenizer

from helpers import PROMPTS, chat_request, hf_greedy, run_input

MAX_NEW = 40


def assert_batch_matches_transformers(engine_dir, model_dir, prompts, max_new=MAX_NEW):
    data = {"batch_size": len(prompts), "temperature": 0.0, "max_generate_length": max_new,
            "requests": [chat_request(p) for p in prompts]}
    output = run_input(engine_dir, data)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = []
    for response in output.responses:
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        prompt_ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        assert len(prompt_ids) == response.prompt_tokens
        expected = hf_greedy(model_dir, prompt_ids, max_new)
        assert response.output_token_ids == expected, f"request {response.request_idx}"
        lengths.append(len(expected))
    return lengths


def test_tiny_models_match_transformers(tiny_model_dir, build_engine_for):
    engine = build_engine_for(tiny_model_dir)
    lengths = assert_batch_matches_transformers(engine, tiny_model_dir, PROMPTS)
    assert len(set(lengths)) > 1 or max(lengths) == MAX_NEW
    assert max(lengths) >= 32  # the comparison covers at least 32 generated tokens


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_dir, smollm2_engine):
    prompts = ["What is the capital of France?", "Write a short poem about autumn leaves.",
               "Explain what a neural network is to a ten year old.", "Hi"]
    lengths = assert_batch_matches_transformers(smollm2_engine, smollm2_dir, prompts, max_new=48)
    assert max(lengths) >= 32


def test_fp16_engine_follows_fp32(tiny_model, build_engine_for):
    """fp16 weights and cache on the cpu backend: the same greedy path as fp32 on a tiny model."""
    model_dir = tiny_model("qwen3")
    data = {"temperature": 0.0, "max_generate_length": 16, "requests": [chat_request(PROMPTS[0])]}
    fp32 = run_input(build_engine_for(model_dir), data).responses[0]
    fp16 = run_input(build_engine_for(model_dir, dtype="fp16"), data).responses[0]
    assert fp16.output_token_ids[:8] == fp32.output_token_ids[:8]
