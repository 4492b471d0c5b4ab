"""Sliding-window layers (a Qwen3 config with use_sliding_window: its layers from max_window_layers on
see only their last `sliding_window` tokens): the manifest's layer specs say so, the window cache
holds window - 1 + the widest step, and greedy tokens are transformers' on prompts longer than the
window, in batches, continuous, in chunks and with context reuse."""

import json

import pytest
from transformers import AutoTokenizer

from helpers import PROMPTS, chat_request, hf_greedy
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

WINDOW, NEW = 8, 12
TEXT = "The lighthouse keeper counted the ships that passed the rocks at night, one by one, in the rain."


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("qwen3", num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                      max_window_layers=1)


@pytest.fixture(scope="module")
def engine(model, build_engine_for):
    return build_engine_for(model)


def prompts() -> list[dict]:
    return [chat_request(TEXT), chat_request(PROMPTS[0]), chat_request(TEXT + " " + PROMPTS[1]),
            chat_request(PROMPTS[2] + " " + TEXT)]


def run(engine, requests, batch_size=3, **runner):
    data = {"temperature": 0.0, "batch_size": batch_size, "max_generate_length": NEW, "requests": requests}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    return Runner(EngineDir.open(engine), threads=1, **runner).run(loaded, loaded.settings).responses


def test_the_layer_specs_record_the_window(engine):
    layers = EngineDir.open(engine).manifest["model"]["layers"]
    assert [layer["kind"] for layer in layers] == ["full", "sliding", "sliding"]
    assert layers[1]["window"] == WINDOW and layers[1]["rotary"]["dims"] == 16


@pytest.mark.parametrize("runner", [{}, {"scheduling": "continuous"}, {"prefill_chunk": 5},
                                    {"prefill_chunk": 5, "context_reuse": True, "scheduling": "continuous"}],
                         ids=["static", "continuous", "chunked", "chunked-reuse-continuous"])
def test_greedy_tokens_are_transformers(model, engine, runner):
    tokenizer = AutoTokenizer.from_pretrained(model)
    responses = run(engine, prompts() + prompts()[::-1], **runner)
    for response in responses:
        ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        assert len(ids) > 3 * WINDOW
        assert response.output_token_ids == hf_greedy(model, ids, NEW)[: len(response.output_token_ids)]
        assert response.finish_reason != "error"
    if runner.get("context_reuse"):
        assert any(r.reused_tokens for r in responses[4:])  # the second round restores the first's prompts


def test_the_window_cache_holds_the_window_and_the_widest_step(engine):
    runner = Runner(EngineDir.open(engine), threads=1, prefill_chunk=5)
    core = runner.engine_core(2, "static")
    core.add_request(runner.engine_request(prepared(runner, TEXT)))
    core.run_to_completion()
    full, sliding = core.cache.groups
    assert (full.layers, sliding.layers) == ([0], [1, 2])
    assert sliding.slots == WINDOW - 1 + 5 and full.slots == full.capacity > sliding.slots
    assert sliding.keys[0].nbytes < full.keys[0].nbytes / 2


def prepared(runner, text):
    from trt_llm.runtime.text.prompt import PromptFormatter
    from trt_llm.schemas.input_file import InputSettings, Request

    settings = InputSettings(temperature=0.0, max_generate_length=NEW)
    return runner.prepare(0, Request.model_validate(chat_request(text)), settings,
                          PromptFormatter(runner.tokenizer, True, True, False))


@pytest.mark.parametrize("chunk", [5, None], ids=["chunked", "whole"])
def test_a_reused_prefix_restores_only_what_the_window_needs(engine, chunk):
    """A request whose prefix is cached restores it (a sliding layer its last window - 1 tokens
    only), with the tokens and log-probabilities of the same request computed whole; also where the
    window cache holds every slot (no prefill chunk: its row's restored tokens still start at slot 0).
    Another prompt between the two takes the row, so nothing the first left in it can stand in."""
    first, second = chat_request(TEXT + " " + PROMPTS[0]), chat_request(TEXT + " " + PROMPTS[1])
    other = chat_request(PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[1])
    second["num_logprobs"] = 3
    reused = run(engine, [first, other, second], batch_size=1, context_reuse=True, prefill_chunk=chunk)
    whole = run(engine, [second])
    assert reused[2].reused_tokens > 2 * WINDOW
    assert reused[2].output_token_ids == whole[0].output_token_ids
    for ours, theirs in zip(reused[2].logprobs, whole[0].logprobs):
        assert [c.token_id for c in ours] == [c.token_id for c in theirs]
        assert [c.logprob for c in ours] == pytest.approx([c.logprob for c in theirs], abs=1e-5)


def test_a_restored_prefix_on_a_window_cache_of_every_slot(family_model, build_engine_for):
    """Mistral (a window on every layer) without prefill chunks, so its window cache holds a slot per
    token: a restored prefix leaves its row's last window - 1 tokens from slot 0, and the step after
    it reads them there (the first token's log-probabilities are those of the prompt computed whole).
    """
    engine = build_engine_for(family_model("mistral"))
    request = {**chat_request("word " * 200), "num_logprobs": 3}  # (the engine takes 256 tokens)
    reused = run(engine, [request, request], batch_size=1, context_reuse=True)
    assert reused[1].reused_tokens > 10 * WINDOW
    for ours, theirs in zip(reused[1].logprobs, reused[0].logprobs):
        assert [c.token_id for c in ours] == [c.token_id for c in theirs]
        assert [c.logprob for c in ours] == pytest.approx([c.logprob for c in theirs], abs=1e-5)
