"""Penalties and min-p (issue 31, item 3): repetition_penalty is transformers', presence_penalty and
frequency_penalty are OpenAI's (over the generated tokens), min_p is transformers' MinPLogitsWarper.

Greedy runs are compared with transformers `generate` token for token (repetition_penalty=..., and
for OpenAI's penalties a logits processor with OpenAI's formula, the oracle below); min_p, whose
seeded draws cannot be compared with torch's generator, by the set of tokens it keeps and by
greedy-equivalence (min_p 1 keeps only the best token). Under EAGLE the tokens are vanilla's."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from transformers.generation.logits_process import (LogitsProcessor, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from helpers import PROMPTS, _load, chat_request, tiny_eagle_engine
from trt_llm.runtime.engine.sequence import Sequence, TokenCounts, append_token
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams, _filter
from trt_llm.schemas.input_file import parse_input_dict


class OpenAIPenalties(LogitsProcessor):
    """The oracle: OpenAI's presence and frequency penalties over the generated tokens,
    logits[t] -= presence * (count[t] > 0) + frequency * count[t]."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_len:]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - (self.presence * (counts > 0).to(scores.dtype) + self.frequency * counts)


def run(engine_dir, data, **runner):
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    return Runner(EngineDir.open(engine_dir), threads=1, **runner).run(loaded, loaded.settings).responses


def hf_generate(model_dir, prompt_ids, max_new, repetition_penalty=1.0, presence=0.0, frequency=0.0):
    """transformers `generate`, greedy, one request alone."""
    processors = [OpenAIPenalties(len(prompt_ids), presence, frequency)] if presence or frequency else None
    with torch.no_grad():
        out = _load(str(model_dir)).generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False,
                                             repetition_penalty=repetition_penalty, logits_processor=processors)
    return out[0, len(prompt_ids):].tolist()


# One batch, each request its own penalties (per-request values override the file's).
CASES = [
    {"repetition_penalty": 1.3},
    {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    {},
    {"repetition_penalty": 1.15, "presence_penalty": 0.4, "frequency_penalty": -0.3},
]


def assert_greedy_matches_transformers(engine_dir, model_dir, prompts, max_new):
    requests = [chat_request(p, **case) for p, case in zip(prompts, CASES)]
    data = {"batch_size": len(requests), "temperature": 0.0, "max_generate_length": max_new, "requests": requests}
    responses = run(engine_dir, data)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for response, case in zip(responses, CASES):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        prompt_ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        expected = hf_generate(model_dir, prompt_ids, max_new, case.get("repetition_penalty", 1.0),
                               case.get("presence_penalty", 0.0), case.get("frequency_penalty", 0.0))
        assert response.output_token_ids == expected, (response.request_idx, case)
    return responses


# -- the sampler, against transformers' processors ---------------------------------------------------

def _history(rng, vocab, prompt_len, generated_len):
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    generated = rng.integers(0, vocab // 4, generated_len).tolist()  # repeats, and tokens of the prompt
    return prompt, generated


def test_processors_equal_transformers_on_random_logits():
    rng = np.random.default_rng(0)
    vocab = 300
    params = [SamplingParams(0.0, repetition_penalty=1.3), SamplingParams(0.7, presence_penalty=1.2),
              SamplingParams(0.0, frequency_penalty=-0.8, presence_penalty=0.3, logit_bias={5: 4.0, 17: -3.0}),
              SamplingParams(1.0, repetition_penalty=0.7, frequency_penalty=1.9, logit_bias={3: 2.0}),
              SamplingParams(0.0)]
    sampler = Sampler(params, seeds=[1] * len(params))
    histories = [_history(rng, vocab, 20 + 5 * i, 30) for i in range(len(params))]
    counts = [TokenCounts(prompt, generated) for prompt, generated in histories]
    logits = rng.normal(0, 3, (len(params), vocab)).astype(np.float32)
    before = logits.copy()
    got = sampler.processed(logits, range(len(params)), counts)
    np.testing.assert_array_equal(logits, before)  # the caller's logits stay as they are
    for i, (p, (prompt, generated)) in enumerate(zip(params, histories)):
        ids = torch.tensor([prompt + generated])
        scores = torch.from_numpy(before[i:i + 1].copy())
        for token, value in (p.logit_bias or {}).items():  # SequenceBiasLogitsProcessor: first
            scores[0, token] += value
        if p.repetition_penalty != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, scores)
        scores = OpenAIPenalties(len(prompt), p.presence_penalty, p.frequency_penalty)(ids, scores)
        np.testing.assert_allclose(got[i], scores[0].numpy(), rtol=1e-6, atol=1e-6)


def test_counts_are_kept_as_tokens_join():
    prompt = [5, 9, 5, 2]
    s = Sequence(prompt, max_new_tokens=50)
    assert sorted(s.counts.seen.tolist()) == [2, 5, 9] and len(s.counts.generated[0]) == 0
    rng = np.random.default_rng(1)
    for token in rng.integers(0, 40, 45).tolist():  # past the arrays' first size: they grow
        append_token(set(), s, token, 0.0)
    assert sorted(s.counts.seen.tolist()) == sorted(set(prompt + s.generated))
    ids, n = s.counts.generated
    assert dict(zip(ids.tolist(), n.tolist())) == {t: s.generated.count(t) for t in set(s.generated)}
    fresh = TokenCounts(prompt, s.generated)  # the same as counting again
    assert sorted(fresh.seen.tolist()) == sorted(s.counts.seen.tolist())


def test_greedy_fast_path_applies_the_penalties():
    logits = np.array([[3.0, 2.9, 1.0, 0.5]], dtype=np.float32)
    counts = [TokenCounts([0], [])]
    assert Sampler([SamplingParams(0.0)]).sample(logits)[0] == 0
    assert Sampler([SamplingParams(0.0, repetition_penalty=1.1)]).sample(logits, counts=counts)[0] == 1
    counts = [TokenCounts([], [0])]
    assert Sampler([SamplingParams(0.0, presence_penalty=0.2)]).sample(logits, counts=counts)[0] == 1
    with pytest.raises(ValueError, match="token counts"):
        Sampler([SamplingParams(0.0, frequency_penalty=1.0)]).sample(logits)


def test_extreme_repetition_penalties_still_sample():
    """A penalty whose quotient overflows float32 (or that float32 rounds to 0) gives the limit: the
    seen positive tokens dominate (divided by ~0), or become impossible (multiplied by ~inf)."""
    logits = np.array([[2.0, 1.0, -1.0, 0.0, 3.0]], dtype=np.float32)
    for penalty, expected in ((1e-40, 1), (1e-300, 1), (1e30, 4), (1e300, 4)):
        counts = [TokenCounts([1, 2, 3], [])]
        for temperature in (0.0, 1.0, 0.5):
            token = Sampler([SamplingParams(temperature, top_k=0, top_p=1.0, repetition_penalty=penalty)],
                            seeds=[0]).sample(logits, counts=counts)[0]
            assert token == expected, (penalty, temperature)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 40, 1.0),
                                                         (0.8, 0, 0.9), (1.0, 100, 0.95)])
@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_keeps_what_transformers_keeps(temperature, top_k, top_p, min_p):
    """The kept set of temperature -> top-k -> top-p -> min-p equals transformers' warpers'."""
    rng = np.random.default_rng(2)
    logits = (rng.normal(0, 2.5, (6, 500)) * rng.uniform(0.3, 2.0, (6, 1))).astype(np.float32)
    warpers = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    warpers += [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
    warpers += [MinPLogitsWarper(min_p)]
    scores = torch.from_numpy(logits.copy())
    for warper in warpers:
        scores = warper(None, scores)
    for row, (weights, ids) in enumerate(_filter(logits, temperature, top_k, top_p, min_p)):
        ids = np.arange(len(weights)) if ids is None else ids
        kept = set(ids[weights > 0].tolist())
        assert kept == set(torch.isfinite(scores[row]).nonzero()[:, 0].tolist()), row
        if min_p == 1.0:
            assert kept == {int(logits[row].argmax())}


def test_out_of_range_params_are_refused():
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -2.01}, {"repetition_penalty": 0.0},
                {"min_p": 1.5}, {"min_p": -0.1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


# -- end to end --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model, build_engine_for):
    model = tiny_model("llama")
    return build_engine_for(model), model


def test_tiny_greedy_penalties_equal_transformers(tiny):
    engine, model = tiny
    responses = assert_greedy_matches_transformers(engine, model, PROMPTS, max_new=32)
    assert len({tuple(r.output_token_ids) for r in responses}) == len(responses)


@pytest.mark.slow
def test_smollm2_greedy_penalties_equal_transformers(smollm2_dir, smollm2_engine):
    prompts = ["Write a short poem about autumn leaves.", "List ten fruits.",
               "Explain what a neural network is to a ten year old.", "Count from one to twenty in words."]
    responses = assert_greedy_matches_transformers(smollm2_engine, smollm2_dir, prompts, max_new=40)
    plain = run(smollm2_engine, {"temperature": 0.0, "max_generate_length": 40, "requests": [chat_request(prompts[0])]})
    assert responses[0].output_token_ids != plain[0].output_token_ids  # the penalty changed something


def test_top_level_values_are_defaults_and_requests_override_them(tiny):
    engine, _ = tiny
    base = {"temperature": 0.0, "max_generate_length": 16, "batch_size": 2}
    by_default = run(engine, {**base, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                              "requests": [chat_request(PROMPTS[0]), chat_request(PROMPTS[2], repetition_penalty=1.0)]})
    each = run(engine, {**base, "requests": [chat_request(PROMPTS[0], repetition_penalty=1.3, presence_penalty=0.5),
                                             chat_request(PROMPTS[2], presence_penalty=0.5)]})
    assert [r.output_token_ids for r in by_default] == [r.output_token_ids for r in each]


def test_min_p_end_to_end(tiny):
    """min_p 1 keeps only the best token: sampled, it is greedy decoding; a usual min_p samples
    (seeded: the same tokens again) within what min_p allows."""
    engine, _ = tiny
    requests = [chat_request(p) for p in PROMPTS]
    greedy = run(engine, {"temperature": 0.0, "max_generate_length": 24, "batch_size": 4, "requests": requests})
    only_best = run(engine, {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 1.0, "seed": 3,
                             "max_generate_length": 24, "batch_size": 4, "requests": requests})
    assert [r.output_token_ids for r in only_best] == [r.output_token_ids for r in greedy]
    sampled = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 3, "max_generate_length": 24,
               "batch_size": 4, "requests": [chat_request(p, min_p=0.1) for p in PROMPTS]}
    first, again = run(engine, sampled), run(engine, sampled)
    assert all(r.finish_reason in ("end-of-sequence", "max-length") for r in first)
    assert [r.output_token_ids for r in first] == [r.output_token_ids for r in again]
    assert [r.output_token_ids for r in first] != [r.output_token_ids for r in greedy]


def test_out_of_range_values_are_that_requests_error(tiny):
    engine, _ = tiny
    data = {"temperature": 0.0, "max_generate_length": 8, "batch_size": 2,
            "requests": [chat_request(PROMPTS[0], repetition_penalty=1.2), chat_request(PROMPTS[1], repetition_penalty=0),
                         chat_request(PROMPTS[2], presence_penalty=2.5), chat_request(PROMPTS[3], min_p=-0.5),
                         chat_request(PROMPTS[1], frequency_penalty=-3)]}
    responses = run(engine, data)
    assert responses[0].finish_reason in ("end-of-sequence", "max-length") and responses[0].output_token_ids
    assert [r.error for r in responses[1:]] == [
        "requests[1].repetition_penalty: 0 must be > 0 (1 = off)",
        "requests[2].presence_penalty: 2.5 is outside [-2, 2]",
        "requests[3].min_p: -0.5 is outside [0, 1]",
        "requests[4].frequency_penalty: -3 is outside [-2, 2]"]
    assert all(r.finish_reason == "error" for r in responses[1:])


# -- under EAGLE -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eagle_engine(tiny_model, build_engine_for, tmp_path_factory):
    """test_eagle.py's engine: a 4-layer tiny Llama with a random EAGLE3 draft."""
    return tiny_eagle_engine(tiny_model, build_engine_for, tmp_path_factory)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_penalties_under_eagle_are_vanilla(eagle_engine, monkeypatch, mode):
    """A draft that proposes vanilla's own continuation: rounds accept several tokens, and each one
    verified must be sampled with the counts of the path before it to stay vanilla's."""
    from trt_llm.runtime.decoding import eagle
    from trt_llm.runtime.decoding.spec_config import SpecConfig

    settings = {"temperature": 0.0} if mode == "greedy" else {"temperature": 0.9, "top_k": 30, "seed": 5, "min_p": 0.05}
    data = {**settings, "batch_size": 4, "max_generate_length": 32,
            "requests": [chat_request(p, **case) for p, case in zip(PROMPTS, CASES)]}
    vanilla = run(eagle_engine, data, spec_decode=False)
    tokenizer = AutoTokenizer.from_pretrained(EngineDir.open(eagle_engine).tokenizer_dir)
    futures = {tuple(tokenizer(r.formatted_complete_request, add_special_tokens=False)["input_ids"]): r.output_token_ids
               for r in vanilla}

    def tree(draft, state, draft_cache, hidden_root, spec, biases, max_position):
        for r in state:
            future = futures[tuple(r.sequence.prompt_ids)][len(r.sequence.generated):]
            r.tree, parent = [], -1
            for depth, token in enumerate(future[: spec.draft_steps], start=1):
                r.tree.append(eagle._Node(token, parent, depth, -float(depth), hidden_root[0]))
                parent = len(r.tree) - 1

    monkeypatch.setattr(eagle, "_draft_tree", tree)
    loaded = parse_input_dict(json.loads(json.dumps(data)))
    runner = Runner(EngineDir.open(eagle_engine), threads=1, spec=SpecConfig(4, 4, 10))
    spec = runner.run(loaded, loaded.settings).responses
    assert runner.spec_stats.mean_accepted > 3
    for a, b in zip(spec, vanilla):
        assert a.finish_reason == b.finish_reason != "error", a.error
        assert a.output_token_ids == b.output_token_ids


# -- the server --------------------------------------------------------------------------------------

def test_the_server_takes_penalties_and_min_p(tiny):
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    import httpx

    from test_server import KEY, LiveServer
    from trt_llm.server.app import ServerConfig, create_app

    engine, _ = tiny
    penalties = {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.2, "min_p": 0.1}
    want = run(engine, {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_generate_length": 16,
                        "requests": [chat_request(PROMPTS[1], **penalties)]})[0]
    plain = run(engine, {"temperature": 0.0, "max_generate_length": 16, "requests": [chat_request(PROMPTS[1])]})[0]
    assert want.output_token_ids != plain.output_token_ids
    runner = Runner(EngineDir.open(engine), threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", api_keys=(KEY,), max_rows=4)))
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 16,
                "temperature": 0}
        answer = httpx.post(f"{live.url}/v1/chat/completions", json={**body, **penalties}, headers=auth, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == want.output_text
        completion = httpx.post(f"{live.url}/v1/completions", headers=auth, timeout=60,
                                json={"model": "tiny", "prompt": "Once upon", "max_tokens": 8, **penalties})
        assert completion.status_code == 200, completion.text
        for field, value in (("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
                             ("min_p", 1.2)):
            refused = httpx.post(f"{live.url}/v1/chat/completions", json={**body, field: value}, headers=auth)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text
    finally:
        live.close()
