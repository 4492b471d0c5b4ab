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


def prefill_logits(engine_dir, token_ids):
    """The first step's logits, straight from the engine."""
    import numpy as np
    from safetensors.numpy import load_file

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.cache.kv_cache import KVCache
    from trt_llm.runtime.backends.ort_engine import OrtEngine
    from trt_llm.runtime.engine.step import Step

    engine = EngineDir.open(engine_dir)
    dims = engine.dims
    embedding = load_file(str(engine.component_path("llm", "embedding")))["embedding"]
    session = OrtEngine(engine.component_path("llm", "engine"), dims["num_layers"], threads=1)
    cache = KVCache(dims["num_layers"], 1, dims["kv_heads"], len(token_ids) + 1, dims["head_dim"], embedding.dtype)
    n = len(token_ids)
    logits = np.empty((1, 1, dims["vocab_size"]), np.float32)
    session.run(Step(embedding[np.array(token_ids)][None], np.arange(n, dtype=np.int32)[None],
                     np.zeros(1, np.int32), np.array([n], np.int32), np.array([[n - 1]], np.int32), logits), cache)
    return logits[0, 0]


def test_fp16_engine_close_to_fp32(tiny_model, build_engine_for):
    """fp16 weights and cache on the cpu backend give the fp32 logits up to fp16 rounding.

    (Greedy tokens are not compared: this random model has near-ties that fp16 may flip.)"""
    import numpy as np

    model_dir = tiny_model("qwen3")
    token_ids = AutoTokenizer.from_pretrained(model_dir)(PROMPTS[0] * 3)["input_ids"]
    fp32 = prefill_logits(build_engine_for(model_dir), token_ids)
    fp16 = prefill_logits(build_engine_for(model_dir, dtype="fp16"), token_ids)
    assert np.abs(fp16 - fp32).max() < 0.03 * np.abs(fp32).max()
    assert int(fp16.argmax()) in np.argsort(-fp32)[:2].tolist()
