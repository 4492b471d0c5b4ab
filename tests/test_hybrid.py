"""Hybrid models (Qwen3.5: Gated DeltaNet layers with recurrent states beside gated full attention;
LFM2: short gated convolutions beside attention) on tiny random checkpoints with the real Qwen
tokenizer (tests/family_assets.py): greedy tokens are
transformers' `generate` for prompts of a few tokens to a few hundred in one ragged batch, statically
and with requests joining rows mid-decode; context reuse restores states snapshotted at block
boundaries and gives the tokens of bypass, across requests sharing a system prompt, across turns
and across processes; what a recurrent state rules out is refused in one line.

tests/test_families.py runs the family's short prompts in its static / continuous / chunked-reuse
parity matrix as well; tests/test_gated_delta_rule.py checks the op itself."""

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from helpers import chat_request, hf_greedy, reuse_run, tokens_of_bypass
from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS, ContextCache
from trt_llm.runtime.cache.reuse import ContextPlan
from trt_llm.runtime.engine.engine_core import EngineRequest
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.sampling.sampler import SamplingParams
from trt_llm.schemas.input_file import parse_input_dict

NEW = 10
STORY = ("The lighthouse keeper counted the ships that passed the rocks at night, one by one, in the rain, "
         "and wrote each name in a book that his grandmother had bound in blue cloth. ")
SYSTEM = ("You are the help desk of a small railway museum. You answer questions about opening hours, tickets, "
          "the steam engines on show and the workshop tours, briefly and kindly, in one or two sentences.")


@pytest.fixture(scope="module", params=["qwen3_5", "lfm2"])
def hybrid(request, family_model, build_engine_for):
    """Each hybrid family's tiny checkpoint and engine (test_families' parity matrix's: built once)."""
    model = family_model(request.param)
    return model, build_engine_for(model)


@pytest.fixture(scope="module")
def qwen3_5(family_model, build_engine_for):
    model = family_model("qwen3_5")
    return model, build_engine_for(model)


def run(engine, requests, **settings):
    runner_settings = {k: settings.pop(k) for k in ("scheduling", "prefill_chunk") if k in settings}
    data = {"temperature": 0.0, "max_generate_length": NEW, "requests": requests, **settings}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    return Runner(EngineDir.open(engine), threads=1, **runner_settings).run(loaded, loaded.settings).responses


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
def test_ragged_rows_of_a_few_to_hundreds_of_tokens_are_transformers(hybrid, scheduling):
    """Rows of very different lengths in one batch: a row's padding never reaches its states. Under
    continuous scheduling the long prompt is prefilled in chunks of 64 while the short one decodes,
    so the short one finishes first and the third request joins while the long one decodes."""
    model, engine = hybrid
    requests = [chat_request("Hi"), chat_request(STORY * 6 + "Why did he count them?"), chat_request(STORY)]
    continuous = {"batch_size": 2, "scheduling": "continuous", "prefill_chunk": 64} if scheduling == "continuous" else {}
    responses = run(engine, requests, **({"batch_size": 3} | continuous))
    tokenizer = AutoTokenizer.from_pretrained(model)
    lengths = []
    for response in responses:
        assert response.finish_reason != "error", response.error
        ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        assert response.output_token_ids == hf_greedy(model, ids, NEW)[: len(response.output_token_ids)]
    assert min(lengths) < 16 and max(lengths) > 200


def conversations() -> list[dict]:
    """Three requests sharing a long system prompt, then a conversation's second turn."""
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which engines run on Sunday?"}]
    return [{"messages": first},
            {"messages": [first[0], {"role": "user", "content": "How much is a family ticket?"}]},
            {"messages": [first[0], {"role": "user", "content": "Can children visit the workshop?"}]},
            {"messages": first + [{"role": "assistant", "content": "The two tank engines and the shunter."},
                                  {"role": "user", "content": "And on Monday?"}]}]


@pytest.mark.parametrize("scheduling,chunk", [("static", None), ("continuous", 7)])
def test_reuse_resumes_from_snapshotted_states_exactly(hybrid, tmp_path, scheduling, chunk):
    """Each request restores the blocks (and the states at their end) the ones before it committed:
    the system prompt for the second and third, the first turn for the fourth; tokens are bypass's."""
    _, engine = hybrid
    requests = conversations()
    reused, prompts = reuse_run(engine, tmp_path, requests, NEW, scheduling=scheduling, prefill_chunk=chunk)
    assert [r.output_token_ids for r in reused] == tokens_of_bypass(engine, tmp_path, requests, NEW,
                                                                  scheduling=scheduling, prefill_chunk=chunk)
    # Snapshotted: the last block boundary of the system prompt and of the first request's prompt.
    tokenizer = AutoTokenizer.from_pretrained(hybrid[0])
    system = len(tokenizer(tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=False),
                           add_special_tokens=False)["input_ids"])
    first = (len(prompts[0][0]) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert prompts[3][0][:first] == prompts[0][0][:first]  # the second turn starts with the first's prompt
    assert reused[0].reused_tokens == 0
    assert all(r.reused_tokens >= system // BLOCK_TOKENS * BLOCK_TOKENS > 0 for r in reused[1:3])
    assert reused[3].reused_tokens >= first > reused[1].reused_tokens - BLOCK_TOKENS


def test_a_kept_system_prompt_restores_its_states(qwen3_5):
    """save_system_prompt_kv_cache keeps the system prompt with the states at its very end."""
    _, engine = qwen3_5
    requests = conversations()[:3]
    kept = run(engine, [{**r, "save_system_prompt_kv_cache": True} for r in requests], batch_size=1)
    alone = run(engine, requests, batch_size=1)
    assert [r.output_token_ids for r in kept] == [r.output_token_ids for r in alone]
    assert kept[0].reused_tokens == 0 and kept[1].reused_tokens == kept[2].reused_tokens > BLOCK_TOKENS


def turn(runner, prompt: list[int], commit: str) -> Sequence:
    core = runner.engine_core(1, "static")
    s = Sequence(list(prompt), NEW)
    s.context = ContextPlan(runner.prefix_cache.root(None), lookup=commit != "none", commit=commit)
    core.add_request(EngineRequest(0, s, SamplingParams(0.0, 0, 1.0, None)))
    core.run_to_completion()
    return s


@pytest.mark.parametrize("commit", ["generated", "prefill"])
def test_a_next_turn_resumes_where_the_turn_before_it_snapshotted(hybrid, commit, tmp_path):
    """The second turn restores the first's prompt and answer (the states snapshotted at the last
    block boundary it decoded through) or, committing its prompt only, the prompt's last block; a
    second process restores from --kv-cache-dir what the second turn snapshotted; tokens are those
    computed cold."""
    _, engine = hybrid
    identity = EngineDir.open(engine).identity
    runner = Runner(EngineDir.open(engine), threads=1, context_reuse=True,
                    prefix_cache=ContextCache(identity, directory=tmp_path / "kv"))
    rng = np.random.default_rng(5)
    prompt = rng.integers(3, 2000, size=45).tolist()
    first = turn(runner, prompt, commit)
    follow = prompt + first.generated + rng.integers(3, 2000, size=9).tolist()
    computed = len(prompt) + len(first.generated) - 1 if commit == "generated" else len(prompt) - 1
    second = turn(runner, follow, commit)
    assert second.reused_tokens == computed - computed % BLOCK_TOKENS > 0
    cold = turn(Runner(EngineDir.open(engine), threads=1), follow, "none")
    assert cold.reused_tokens == 0 and second.generated == cold.generated
    restarted = Runner(EngineDir.open(engine), threads=1, context_reuse=True,
                       prefix_cache=ContextCache(identity, directory=tmp_path / "kv"))
    again = turn(restarted, follow, commit)
    # (the second turn snapshotted its own prompt's last block boundary too)
    assert again.reused_tokens == (len(follow) - 1) // BLOCK_TOKENS * BLOCK_TOKENS and again.generated == cold.generated


def test_adapters_beyond_the_mlps_are_refused_in_one_line(qwen3_5, build_engine_for, tmp_path):
    """(An EAGLE draft is not refused: its tree is a chain here, tests/test_eagle_chains.py.)"""
    from trt_llm.build.compile import BuildError

    model, _ = qwen3_5
    with pytest.raises(BuildError, match="lora: target_modules q_proj: Qwen3_5ForCausalLM's adapters go on"):
        build_engine_for(model, lora={"max_rank": 4, "target_modules": ["q_proj", "down_proj"]})


def test_mlp_adapters_mixed_in_a_batch_are_peft(qwen3_5, build_engine_for, tmp_path):
    """LoRA on a hybrid's MLPs (every layer has one; its mixers differ): a row with an adapter gives
    PEFT's tokens, the row beside it without one the base model's."""
    pytest.importorskip("peft")
    from helpers import assert_adapter_rows_are_peft, make_adapter

    model, _ = qwen3_5
    engine = build_engine_for(model, lora={"max_rank": 4})  # the default targets: the MLPs'
    adapter = make_adapter(model, tmp_path / "adapter", seed=1, rank=4, targets=["gate_proj", "up_proj", "down_proj"])
    assert_adapter_rows_are_peft(model, engine, adapter, STORY, NEW)


def test_a_qwen3_5_vision_checkpoint_answers_text_as_its_text_model(qwen3_5, build_engine_for, tmp_path):
    """Qwen3.5 is published as a vision-language checkpoint: the build takes its decoder on mRoPE
    positions and its vision tower (tests/test_qwen3_5_vision.py runs images); a text request's tokens
    are the text model's (a text token's three positions are one)."""
    import family_assets

    model, engine = qwen3_5
    vlm = family_assets.make_qwen3_5_vlm(model, tmp_path / "vlm")
    built = build_engine_for(vlm)
    manifest = EngineDir.open(built).manifest
    assert manifest["model"]["architecture"] == "Qwen3_5ForConditionalGeneration"
    assert manifest["model"]["mrope"] == "interleaved" and "vision" in manifest["components"]
    requests = [chat_request(STORY), chat_request("Hi")]
    assert ([r.output_token_ids for r in run(built, requests, batch_size=2)]
            == [r.output_token_ids for r in run(engine, requests, batch_size=2)])


def test_quantized_projections_run(qwen3_5, build_engine_for):
    """int8 weights on every projection (the DeltaNet's packed in_proj and out_proj, the attention's,
    the MLP's): the long prompt's first tokens are the float engine's, and the optimised graph the
    cpu engine loads (its Loop body's weights included, build/cpu_backend.py) says something."""
    model, engine = qwen3_5
    quantized = build_engine_for(model, quantization={"weights": "int8"})
    requests = [chat_request(STORY), chat_request("Hi")]
    ours, floats = run(quantized, requests, batch_size=2), run(engine, requests, batch_size=2)
    assert all(r.finish_reason != "error" and len(set(r.output_token_ids)) > 2 for r in ours)
    assert ours[0].output_token_ids[:3] == floats[0].output_token_ids[:3]


def test_the_profile_says_what_a_row_holds(qwen3_5):
    """A row holds 1 KiB a token (the one attention layer: keys and values of 2 heads of 64 floats)
    and, whatever its length, 3 Gated DeltaNet layers' states: conv [128, 3] and delta [4, 16, 16]
    float32 each (tests/family_assets.py's widths)."""
    from trt_llm.runtime.engine.profiler import Profiler

    _, engine = qwen3_5
    profiler = Profiler()
    data = {"temperature": 0.0, "max_generate_length": 2, "requests": [chat_request("Hi")]}
    loaded = parse_input_dict(data, source="<test>")
    Runner(EngineDir.open(engine), threads=1, profiler=profiler).run(loaded, loaded.settings)
    cache = profiler.summary().cache
    assert cache.attention_bytes_per_token == 2 * 2 * 64 * 4
    assert cache.state_bytes_per_row == 3 * (128 * 3 + 4 * 16 * 16) * 4 and cache.recurrent_layers == 3
