"""Prompt lookup speculation (runtime/decoding/lookup.py, issue 45): the proposer on hand-made token lists,
and against vanilla decoding on the same engine, the independent oracle here (its tokens are transformers'
elsewhere): greedy tokens identical on SmolLM2 copying a passage (where proposals are taken) and chatting,
static and continuous; seeded samples identical (one draw a token, as vanilla draws it); the tiny families
with sliding windows and layers of two widths; what it cannot take refused in one line."""

from __future__ import annotations

import json

import pytest

from helpers import run_input
from trt_llm.runtime.decoding.choice import SpeculationError
from trt_llm.runtime.decoding.lookup import NgramIndex
from trt_llm.runtime.decoding.pass_cost import (PRIOR_SLOPE, Acceptance, MatchAcceptance, PassCost, behind,
                                                 expected_taken, plan)
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner, RunError
from trt_llm.schemas.input_file import parse_input_dict

PASSAGE = ("The lighthouse at Pointe Noire was built in 1902 from granite quarried on the island. Its lamp, "
           "first lit by kerosene, was electrified in 1934 and automated in 1987, when the last keeper, "
           "Marthe Dubois, moved to the mainland. The tower is 34 metres tall and its light reaches 22 nautical "
           "miles. Visitors may climb its 181 steps from May to September.")
COPYING = [f"Copy this text exactly, word for word:\n\n{PASSAGE}",
           f"{PASSAGE}\n\nWho was the last keeper, and when was the lamp automated? Quote the sentence."]
FREE = "Write a short poem about autumn."


def test_the_index_proposes_what_followed_the_match_that_reaches_back_furthest():
    index = NgramIndex()
    index.extend([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 6, 7])
    # the end "2 6 7": "6 7" was followed by 8 and by 1, with a 5 before it both times, not a 2: two
    # matches of 2 tokens, and the latest wins (the end itself has nothing after it)
    assert index.propose(3) == ([1, 2, 6], 2)
    index.extend([5, 6])  # "7 5 6": "5 6" at 0 (nothing before) and at 5 (a 9 before): 2 tokens, the latest
    assert index.propose(2) == ([7, 1], 2)
    index.extend([7, 9])  # "6 7 9": "7 9" never occurred before
    assert index.propose(4) == ([], 0)
    index.extend([5, 6, 7, 8])  # "5 6 7 8" at 0 reaches back 4 (then the list's start), "7 8" nowhere else
    assert index.propose(3) == ([9, 5, 6], 4) and index.propose(0) == ([], 0)
    index = NgramIndex()
    index.extend([1, 2, 3, 4, 9, 3, 4, 8, 1, 2, 3, 4])  # "3 4" at 9 (matches 2) and at 4 (matches 4): 4 wins
    assert index.propose(2) == ([9, 3], 4)


def test_chains_are_judged_by_the_length_of_their_match():
    """Prompt lookup learns acceptance per match length: a long match whose chains are taken keeps its chains
    while short matches that are refused stop proposing (the plan's margin), each from its own record."""
    acceptance = MatchAcceptance()
    for _ in range(10):
        acceptance[2].verified(4, 0)
        acceptance[12].verified(8, 8)
    assert acceptance[2].p < 0.15 and acceptance[8].p > 0.9 and acceptance[12] is acceptance[40]
    assert acceptance[3].p == pytest.approx(2 / 3)  # untried: the prior
    assert plan([(8, acceptance[2].p)], slope=0.23) == [0] and plan([(8, acceptance[9].p)], slope=0.23) == [8]


def run(engine, requests, speculation=None, scheduling="static", **settings):
    """The requests' responses (and the runner) with a strategy (None: the engine's default)."""
    data = {"batch_size": len(requests), "temperature": 0.0, "max_generate_length": 48, **settings,
            "requests": [{"messages": [{"role": "user", "content": text}]} for text in requests]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1, speculation=speculation, scheduling=scheduling)
    return runner.run(loaded, loaded.settings).responses, runner


def test_a_pass_takes_the_chains_that_pay():
    """pass_cost.plan by hand: tokens per unit of cost, width 1 (a token a row, cost 1) included."""
    assert expected_taken(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125) and expected_taken(1.0, 4) == 4
    assert plan([(8, 0.9)], slope=0.07) == [8]  # cheap wide passes: all of a good chain
    # costly ones: 5 tokens give (1 + 3.69) / 2.55 = 1.84 a unit of cost, 4 give 1.83, 8 give 1.76
    assert plan([(8, 0.9)], slope=0.31) == [5]
    assert plan([(8, 0.1)], slope=0.31) == [0]  # (1 + 0.1) / 1.31 < 1: vanilla's step
    assert plan([(1, 0.5)], slope=0.2) == [1]  # 1.5 / 1.2 = 1.25: above the margin
    assert plan([(1, 0.35)], slope=0.2) == [0]  # 1.35 / 1.2 = 1.125: a gain, but within MARGIN (1.15)
    assert plan([(3, 0.9), (0, 0.0), (0, 0.0), (0, 0.0)], slope=0.5) == [0, 0, 0, 0]  # one row can't carry four
    assert plan([(3, 0.9)] * 4, slope=0.5) == [3, 3, 3, 3]  # (4 + 4 x 2.44) / 2.5 = 5.5 > 4
    # a recurrent row passes its taken tokens again when it refuses some: a chain of 2 at 0.6 gives
    # 0.96 - 0.64 x 1.0 = 0.32 tokens for 0.1 of a pass of cost; at 0.3 nothing
    assert plan([(2, 0.6)], slope=0.05, replay=1.0) == [2] and plan([(2, 0.3)], slope=0.05, replay=1.0) == [0]


def test_a_static_batch_speculates_for_its_last_row():
    """A batch that ends with its last row (static: no request waits for a freed row) counts the tokens of
    the rows furthest from their end only: three rows ahead of the fourth do not pay for a wide pass that
    the fourth gains nothing from, and ride along in one that it pays for."""
    assert behind([40, 90, 90, 12]) == [0.0, 1.0, 1.0, 0.0] and behind([]) == []
    rows = [(8, 0.95), (8, 0.95), (0, 0.67), (8, 0.95)]  # three rows that repeat themselves, one that copies nothing
    assert plan(rows, slope=0.5) == [4, 4, 0, 4]  # counting every row: (4 + 3 x 3.5) / 3 = 4.9 > 4 x 1.15
    assert plan(rows, slope=0.5, worth=behind([60, 60, 100, 60])) == [0, 0, 0, 0]  # the fourth is the end
    rows[2] = (3, 0.95)
    assert plan(rows, slope=0.5, worth=behind([60, 60, 100, 60])) == [3, 3, 3, 3]  # (1 + 2.7) / 2.5 = 1.48 > 1.15


def test_the_pass_cost_is_fitted_from_the_timed_passes():
    cost = PassCost()
    assert cost.slope(4) == PRIOR_SLOPE
    for width, seconds in [(1, 0.020), (3, 0.030), (5, 0.040), (9, 0.060)] * 3:  # 20 ms + 5 ms a token
        cost.record(4, width, seconds)
    assert cost.slope(4) == pytest.approx(0.25) and cost.slope(1) == PRIOR_SLOPE
    acceptance = Acceptance()
    for _ in range(20):
        acceptance.verified(4, 0)
    assert acceptance.p < 0.01
    for _ in range(100):
        acceptance.idle()
    assert acceptance.p > 0.6  # back near the prior: it is tried again


def test_smollm2_copies_with_vanilla_tokens(smollm2_engine, monkeypatch):
    """Copying requests beside a free one, continuous (the seeded test below is a static batch): the same
    tokens as vanilla decoding, and proposals were taken (the test would pass without speculating otherwise).
    The pass cost is pinned: fitted from timed passes, on a loaded machine it can find wide passes dear and
    propose little (CI on two workers: 13 proposed), and how much it proposes is not what this test checks."""
    monkeypatch.setattr(PassCost, "slope", lambda self, batch: 0.1)
    requests = COPYING + [FREE]
    vanilla, _ = run(smollm2_engine, requests, "none")
    looked, runner = run(smollm2_engine, requests, "prompt-lookup", scheduling="continuous")
    for ours, theirs in zip(looked, vanilla):
        assert ours.finish_reason == theirs.finish_reason and ours.output_token_ids == theirs.output_token_ids
    stats = runner.lookup_stats
    assert stats.accepted > 20 and stats.emitted > stats.rounds  # more than one token a pass where it copied


def test_seeded_samples_are_vanillas(smollm2_engine):
    """Sampling draws each emitted token once from the base's distribution with the row's generator, as
    vanilla does: with one seed, the same samples (penalties and top-k / top-p on)."""
    settings = dict(temperature=0.8, top_p=0.9, top_k=40, seed=11, repetition_penalty=1.1)
    vanilla, _ = run(smollm2_engine, COPYING, "none", **settings)
    looked, runner = run(smollm2_engine, COPYING, "prompt_lookup", **settings)
    assert [r.output_token_ids for r in looked] == [r.output_token_ids for r in vanilla]
    assert runner.lookup_stats.rounds > 0


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "qwen3_5", "lfm2"])
def test_the_families_decode_vanillas_tokens(family, family_model, build_engine_for, every_chain):
    """Sliding windows (a chain's tokens sit at their own slots, past the window here), layers of two widths
    and shared keys and values (Gemma 4's readers take every position of a pass), recurrent layers (Qwen3.5's
    Gated DeltaNet, LFM2's convolutions: a row that refused part of its chain gets its states back and its
    taken tokens passed again): the tokens of vanilla decoding. A random model copies nothing, so a logit bias keeps its answers to three tokens, which it
    orders by its own logits: their n-grams recur, proposals are taken and refused."""
    engine = build_engine_for(family_model(family))
    requests = ["one two three four one two three four one two", "Say something long."]
    settings = dict(max_generate_length=60, logit_bias={"100": 40.0, "200": 40.0, "300": 40.0})
    vanilla, _ = run(engine, requests, "none", **settings)
    looked, runner = run(engine, requests, "prompt-lookup", **settings)
    assert [r.output_token_ids for r in looked] == [r.output_token_ids for r in vanilla]
    stats = runner.lookup_stats
    assert stats.accepted > 0 and stats.proposed > stats.accepted, stats


def test_a_hybrid_with_context_reuse_decodes_vanillas_tokens(family_model, build_engine_for, every_chain):
    """Qwen3.5 with its generated tokens committed to the context cache (their states snapshotted at each
    block's end, where a chain stops), the second request restoring what the first left: vanilla's tokens."""
    engine = build_engine_for(family_model("qwen3_5"))
    data = {"batch_size": 1, "temperature": 0.0, "max_generate_length": 60,
            "logit_bias": {"100": 40.0, "200": 40.0, "300": 40.0},
            "requests": [{"messages": [{"role": "user", "content": "one two three four one two three four"}]}] * 2}
    outputs = {}
    for speculation in ("none", "prompt-lookup"):
        loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
        runner = Runner(EngineDir.open(engine), threads=1, speculation=speculation, scheduling="continuous",
                        context_reuse=True)
        outputs[speculation] = [r.output_token_ids for r in runner.run(loaded, loaded.settings).responses]
    assert outputs["prompt-lookup"] == outputs["none"] and runner.lookup_stats.accepted > 0
    assert runner.prefix_stats["hits"] > 0


def test_what_it_cannot_take_is_refused_in_one_line(smollm2_engine):
    with pytest.raises(SpeculationError, match="'eagle' needs an engine built with an EAGLE draft"):
        Runner(EngineDir.open(smollm2_engine), threads=1, speculation="eagle")
    data = {"speculation": "mtp", "requests": [{"messages": [{"role": "user", "content": "hi"}]}]}
    with pytest.raises(RunError, match="speculation: 'mtp'"):
        run_input(smollm2_engine, data)


def test_the_server_speculates_by_lookup_and_reports_it(smollm2_engine):
    """trt-llm-serve's engine with prompt lookup: a copying chat answer is vanilla's, and /metrics counts the
    tokens proposed and taken."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from test_server import LiveServer
    from trt_llm.server.app import ServerConfig, create_app

    body = {"model": "tiny", "messages": [{"role": "user", "content": COPYING[0]}], "max_tokens": 40,
            "temperature": 0.0}
    answers = {}
    for speculation in ("none", "prompt-lookup"):
        runner = Runner(EngineDir.open(smollm2_engine), threads=1, scheduling="continuous", speculation=speculation)
        live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=2)))
        try:
            answers[speculation] = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=120).json()
            metrics = httpx.get(f"{live.url}/metrics", timeout=30).text
        finally:
            live.close()
    assert answers["prompt-lookup"]["choices"][0]["message"] == answers["none"]["choices"][0]["message"]
    accepted = [line for line in metrics.splitlines()
                if line.startswith('trt_llm_spec_decode_num_accepted_tokens_total{strategy="prompt-lookup"}')]
    assert accepted and float(accepted[0].split()[-1]) > 0, metrics
