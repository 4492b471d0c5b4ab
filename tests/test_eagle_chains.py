"""EAGLE on sliding-window and hybrid models (issue 45 item 3): the draft's tree is a chain there
(runtime/decoding/eagle.py), whose nodes sit in the slots of their positions (Gemma 3's windows count
them right) and which a recurrent layer reads in order (Qwen3.5's Gated DeltaNet, LFM2's convolutions);
a row that refused part of its chain gets its states back and its taken tokens passed again. The oracle
is vanilla decoding on the same engine: the same tokens, greedy and seeded, static and continuous, with
a random draft (it guesses wrong: every round replays) and with one that proposes vanilla's next tokens
with a wrong one every third (chains taken whole and in part)."""

from __future__ import annotations

import json

import pytest

from family_assets import assets
from trt_llm.runtime.decoding import eagle
from trt_llm.runtime.decoding.spec_config import SpecConfig
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

REQUESTS = ["one two three four one two three four one two", "Say something long.", "Count with me: 1 2 3"]
BIAS = {"100": 40.0, "200": 40.0, "300": 40.0}  # a random model's answers kept to three tokens: n-grams recur


@pytest.fixture(scope="module")
def engines(family_model, build_engine_for, tmp_path_factory):
    built = {}

    def make(family: str):
        if family not in built:
            model = family_model(family)
            draft = assets.make_random_draft(model, tmp_path_factory.mktemp(f"{family}_draft"))
            built[family] = build_engine_for(model, draft={"model": str(draft), "max_draft_tree_size": 8,
                                                          "max_verify_tree_size": 8})
        return built[family]

    return make


def run(engine, speculation, scheduling="static", reuse=False, requests=REQUESTS, **settings):
    data = {"batch_size": 3, "max_generate_length": 40, "logit_bias": BIAS, "temperature": 0.0, **settings,
            "requests": [{"messages": [{"role": "user", "content": text}]} for text in requests]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1, speculation=speculation, scheduling=scheduling,
                    spec=SpecConfig(2, 3, 8), context_reuse=reuse)
    responses = runner.run(loaded, loaded.settings).responses
    assert all(r.finish_reason != "error" for r in responses), [r.error for r in responses]
    return responses, runner


def tokens(responses) -> list[list[int]]:
    return [r.output_token_ids for r in responses]


def foresee(futures: dict, engine, responses) -> None:
    """The oracle draft's futures: each prompt's (token ids, as the runner formatted it) vanilla tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(EngineDir.open(engine).tokenizer_dir)
    for r in responses:
        ids = tokenizer(r.formatted_complete_request, add_special_tokens=False)["input_ids"]
        futures[tuple(ids)] = r.output_token_ids


@pytest.fixture
def vanilla_chains(monkeypatch):
    """The draft's chain replaced by vanilla's next tokens, every third of them wrong."""
    futures = {}

    def chain(draft, state, draft_cache, hidden_root, spec, biases, max_position):
        for r in state:
            done = len(r.sequence.generated)
            future = futures[tuple(r.sequence.prompt_ids)][done:]
            r.tree = []
            for depth, token in enumerate(future[: spec.draft_steps], start=1):
                wrong = (done + depth) % 3 == 0
                r.tree.append(eagle._Node(token + 1 if wrong else token, len(r.tree) - 1, depth, -float(depth),
                                          hidden_root[0]))

    monkeypatch.setattr(eagle, "_draft_tree", chain)
    return futures


@pytest.mark.parametrize("family", ["gemma3", "qwen3_5", "lfm2"])
def test_a_random_draft_gives_vanillas_tokens(engines, family):
    engine = engines(family)
    vanilla, _ = run(engine, "none")
    spec, runner = run(engine, "eagle")
    assert tokens(spec) == tokens(vanilla) and runner.spec_stats.rounds > 0


@pytest.mark.parametrize("family,mode,scheduling", [("gemma3", "greedy", "static"), ("qwen3_5", "greedy", "continuous"),
                                                    ("qwen3_5", "seeded", "static"), ("lfm2", "greedy", "continuous")])
def test_chains_taken_whole_and_in_part_give_vanillas_tokens(engines, vanilla_chains, family, mode, scheduling):
    engine = engines(family)
    settings = {"temperature": 0.8, "top_p": 0.95, "seed": 5} if mode == "seeded" else {"temperature": 0.0}
    vanilla, _ = run(engine, "none", scheduling, **settings)
    foresee(vanilla_chains, engine, vanilla)
    spec, runner = run(engine, "eagle", scheduling, **settings)
    assert tokens(spec) == tokens(vanilla)
    stats = runner.spec_stats
    assert 1.5 < stats.mean_accepted < 4  # chains of 3: taken whole (4 tokens) and in part


def test_a_hybrid_with_context_reuse_gives_vanillas_tokens(engines, vanilla_chains):
    """Qwen3.5 committing its generated tokens: a chain stops at its block's end, where the states are
    snapshotted; the later requests restore what the earlier ones left."""
    engine = engines("qwen3_5")
    settings = dict(scheduling="continuous", reuse=True, requests=REQUESTS[:1] * 2, temperature=0.0, batch_size=1)
    vanilla, _ = run(engine, "none", **settings)
    foresee(vanilla_chains, engine, vanilla)
    spec, runner = run(engine, "eagle", **settings)
    assert tokens(spec) == tokens(vanilla) and runner.spec_stats.mean_accepted > 1.5
    assert runner.prefix_stats["hits"] > 0
