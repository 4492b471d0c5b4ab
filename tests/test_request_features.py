"""Request features end to end: log-probabilities, stop strings, logit bias, against transformers."""

import pytest
import torch
from transformers import AutoTokenizer, LogitsProcessorList
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

from helpers import PROMPTS, _load, chat_request, hf_greedy, run_input
from trt_llm.runtime.text.token_bytes import TokenBytes


@pytest.fixture(scope="module")
def qwen3(tiny_model, build_engine_for):
    model_dir = tiny_model("qwen3")
    return model_dir, build_engine_for(model_dir)


def hf_step_logprobs(model_dir, prompt_ids, generated):
    """transformers' log-softmax of the raw logits at each generated position (teacher forcing)."""
    model = _load(str(model_dir))
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1: len(prompt_ids) + len(generated) - 1]
    return torch.log_softmax(logits.float(), dim=-1)


def check_logprobs(model_dir, response, k):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
    expected = hf_step_logprobs(model_dir, prompt_ids, response.output_token_ids)
    assert len(response.logprobs) == len(response.output_token_ids) == len(response.sampled_tokens)
    for step, candidates in enumerate(response.logprobs):
        assert len(candidates) == k
        values = [c.logprob for c in candidates]
        assert values == sorted(values, reverse=True)
        for c in candidates:
            assert abs(c.logprob - expected[step, c.token_id].item()) < 1e-4
        # The candidates are the top K (up to ties within tolerance).
        assert values[-1] >= expected[step].topk(k).values[-1].item() - 1e-4
        sampled = response.sampled_tokens[step]
        assert sampled.token_id == response.output_token_ids[step]
        assert abs(sampled.logprob - expected[step, sampled.token_id].item()) < 1e-4


def test_logprobs_equal_transformers_log_softmax(qwen3):
    model_dir, engine = qwen3
    data = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 12, "num_logprobs": 3,
            "requests": [chat_request(PROMPTS[0]), chat_request(PROMPTS[1], num_logprobs=5)]}
    responses = run_input(engine, data).responses
    for response in responses:  # batch-uniform: both requests get the batch's largest K
        check_logprobs(model_dir, response, k=5)


@pytest.mark.slow
def test_smollm2_logprobs_equal_transformers(smollm2_dir, smollm2_engine):
    data = {"temperature": 0.0, "max_generate_length": 10, "num_logprobs": 5,
            "requests": [chat_request("The capital of France is")]}
    check_logprobs(smollm2_dir, run_input(smollm2_engine, data).responses[0], k=5)


def test_logprobs_off_by_default(qwen3):
    _, engine = qwen3
    response = run_input(engine, {"max_generate_length": 3, "requests": [chat_request("hi")]}).responses[0]
    assert response.logprobs is None and response.sampled_tokens is None


def test_sampled_bytes_rebuild_text_with_split_characters(qwen3):
    """Sampling over a vocabulary with CJK and emoji pieces: the sampled tokens' bytes, concatenated,
    rebuild output_text exactly, also where a character is split across tokens."""
    model_dir, engine = qwen3
    table = TokenBytes(AutoTokenizer.from_pretrained(model_dir))
    partial = [i for i in range(len(table)) if table.bytes_of(i) and _is_partial(table.bytes_of(i))]
    assert partial, "the tiny tokenizer has tokens that hold part of a character"
    data = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_generate_length": 48, "num_logprobs": 1,
            "seed": 7, "logit_bias": {str(i): 6.0 for i in partial[:60]},
            "requests": [chat_request(p) for p in PROMPTS]}
    split_seen = False
    for response in run_input(engine, {**data, "batch_size": 4}).responses:
        raw = b"".join(bytes(t.bytes) for t in response.sampled_tokens if not table.is_special(t.token_id))
        assert raw.decode("utf-8", errors="replace") == response.output_text
        split_seen |= any(_is_partial(bytes(t.bytes)) for t in response.sampled_tokens)
    assert split_seen


def _is_partial(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stop_strings_per_request(qwen3):
    _, engine = qwen3
    base = {"batch_size": 3, "temperature": 0.0, "max_generate_length": 40}
    free = run_input(engine, {**base, "requests": [chat_request(p) for p in PROMPTS[:3]]}).responses
    texts = [r.output_text for r in free]
    # A stop string spanning several tokens, one inside the first token, and none at all.
    multi = texts[0][5:12]
    first = texts[1][1:3]
    requests = [chat_request(PROMPTS[0], stop=[multi, "\u00e9\u00e9\u00e9"]), chat_request(PROMPTS[1], stop=first),
                chat_request(PROMPTS[2])]
    stopped = run_input(engine, {**base, "requests": requests}).responses
    assert stopped[0].finish_reason == "stop-words" and stopped[0].output_text == texts[0][: texts[0].find(multi)]
    assert stopped[1].finish_reason == "stop-words" and stopped[1].output_text == texts[1][: texts[1].find(first)]
    assert stopped[2].output_text == texts[2] and stopped[2].finish_reason == free[2].finish_reason
    # Generation halted at the token that completed the stop string.
    assert stopped[0].generated_tokens < free[0].generated_tokens
    assert stopped[0].output_token_ids == free[0].output_token_ids[: stopped[0].generated_tokens]


def test_logit_bias_equals_transformers_with_bias_processor(qwen3):
    model_dir, engine = qwen3
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bias = {"100": 4.0, "200": -3.0, "300": 2.5, "2": -100.0}
    data = {"temperature": 0.0, "max_generate_length": 24, "requests": [chat_request(PROMPTS[2], logit_bias=bias)]}
    response = run_input(engine, data).responses[0]
    prompt_ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
    processor = SequenceBiasLogitsProcessor({(int(k),): v for k, v in bias.items()})
    expected = hf_greedy(model_dir, prompt_ids, 24, LogitsProcessorList([processor]))
    assert response.output_token_ids == expected
