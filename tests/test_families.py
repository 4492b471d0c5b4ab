"""The families beyond Llama / Qwen on tiny random checkpoints with their real tokenizers
(tests/family_assets.py): greedy tokens are transformers' `generate` on prompts longer than the
sliding window, in batches, under continuous scheduling, in chunks with context reuse; Phi-3's LongRoPE
on prompts on either side of its original context and on one that crosses it while generating; the
manifest records what sets each family apart."""

import importlib.util
import json

import pytest
from transformers import AutoTokenizer

import family_assets
from family_assets import LONGROPE_ORIGINAL, WINDOW
from helpers import PROMPTS, chat_request, hf_greedy
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

NEW = 12
TEXT = "The lighthouse keeper counted the ships that passed the rocks at night, one by one, in the rain."
FAMILIES = ["gemma3", "gemma2", "mistral", "phi3", "qwen3_moe", "qwen3_5", "qwen3_next", "lfm2", "gemma4",
            "gemma4_moe"]


def requests_for(family: str) -> list[dict]:
    if family == "phi3":  # a prompt past the original context, one that crosses it while generating, a short one
        return [chat_request(TEXT + " " + TEXT), chat_request(TEXT + " Tell me about the ships the keeper saw, and why he counted them."),
                chat_request(PROMPTS[1])]
    return [chat_request(TEXT + " " + TEXT), chat_request(PROMPTS[0]), chat_request(PROMPTS[2] + " " + TEXT)]


def run(engine, requests, batch_size=3, **runner):
    data = {"temperature": 0.0, "batch_size": batch_size, "max_generate_length": NEW, "requests": requests}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    return Runner(EngineDir.open(engine), threads=1, **runner).run(loaded, loaded.settings).responses


def assert_transformers_tokens(model, responses):
    tokenizer = AutoTokenizer.from_pretrained(model)
    lengths = []
    for response in responses:
        assert response.finish_reason != "error", response
        ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        assert response.output_token_ids == hf_greedy(model, ids, NEW)[: len(response.output_token_ids)]
        assert len(set(response.output_token_ids)) > 2  # the tiny model says something: the oracle can tell
    return lengths


RUNNERS = {"static": {}, "continuous": {"scheduling": "continuous"},
           "chunked-reuse": {"prefill_chunk": 5, "context_reuse": True, "scheduling": "continuous"}}
# Qwen3-Next and LFM2 share Qwen3.5's hybrid runtime, whose continuous rows tests/test_hybrid.py runs
# for LFM2 too; Gemma 4 with experts shares dense Gemma 4's: static and chunked with reuse here.
SHARED = ("qwen3_next", "lfm2", "gemma4_moe")


@pytest.mark.parametrize("family, runner", [
    pytest.param(family, runner, id=f"{name}-{family}") for family in FAMILIES for name, runner in RUNNERS.items()
    if not (family in SHARED and name == "continuous")])
def test_greedy_tokens_are_transformers(family, runner, family_model, build_engine_for):
    model = family_model(family)
    engine = build_engine_for(model)
    requests = requests_for(family)
    responses = run(engine, requests + requests[::-1], **runner)
    lengths = assert_transformers_tokens(model, responses)
    assert max(lengths) > 4 * WINDOW
    if family == "phi3":  # one prompt past the original context, one crossing it while generating
        assert max(lengths) > LONGROPE_ORIGINAL and any(n <= LONGROPE_ORIGINAL < n + NEW for n in lengths)
    if runner.get("context_reuse"):
        assert any(r.reused_tokens for r in responses[3:])


def layers_of(engine) -> list[dict]:
    return EngineDir.open(engine).manifest["model"]["layers"]


def test_gemma3_layers_have_their_own_window_base_and_scale(family_model, build_engine_for):
    layers = layers_of(build_engine_for(family_model("gemma3")))
    assert [layer["kind"] for layer in layers] == ["sliding", "full", "sliding"]
    assert layers[0]["window"] == WINDOW
    assert (layers[0]["rotary"]["base"], layers[1]["rotary"]["base"]) == (10_000.0, 1_000_000.0)
    assert layers[1]["rotary"]["scaling"] == "linear"
    assert layers[0]["scale"] == pytest.approx(24 ** -0.5)  # query_pre_attn_scalar, not head_dim


def test_gemma2_and_mistral_windows_and_soft_caps(family_model, build_engine_for):
    gemma2 = layers_of(build_engine_for(family_model("gemma2")))
    assert [layer["kind"] for layer in gemma2] == ["sliding", "full"]
    assert all(layer["soft_cap"] == 50.0 for layer in gemma2)
    mistral = layers_of(build_engine_for(family_model("mistral")))
    assert all(layer["kind"] == "sliding" and layer["window"] == WINDOW for layer in mistral)


def test_phi3_rotates_half_its_head_with_longrope_tables(family_model, build_engine_for):
    engine = build_engine_for(family_model("phi3"))
    rotary = layers_of(engine)[0]["rotary"]
    assert (rotary["dims"], rotary["scaling"]) == (16, "longrope")
    assert rotary["original_context"] == LONGROPE_ORIGINAL and rotary["long_rows"] == 512  # the capacity


@pytest.mark.parametrize("family,targets", [("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
                                            ("gemma3", ["q_proj", "v_proj", "o_proj", "down_proj"])])
def test_lora_adapters_mixed_in_a_batch_are_peft(family, targets, family_model, build_engine_for, tmp_path):
    """Phi-3's adapters name its packed projections; each row of a batch its own adapter or none."""
    pytest.importorskip("peft")
    from helpers import assert_adapter_rows_are_peft, make_adapter

    model = family_model(family)
    engine = build_engine_for(model, lora={"max_rank": 4})
    adapter = make_adapter(model, tmp_path / "adapter", seed=1, rank=4, targets=targets)
    assert_adapter_rows_are_peft(model, engine, adapter, TEXT, NEW)


def test_what_does_not_apply_is_refused_in_one_line(family_model, build_engine_for, tmp_path):
    from trt_llm.build.compile import BuildError

    with pytest.raises(BuildError, match="packed projection"):
        build_engine_for(family_model("mistral"), lora={"max_rank": 4, "target_modules": ["qkv_proj"]})
    draft = family_assets.assets.make_random_draft(family_model("phi3"), tmp_path / "draft")
    with pytest.raises(BuildError, match="LongRoPE"):
        build_engine_for(family_model("phi3"), draft={"model": str(draft)})


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed")
@pytest.mark.parametrize("family", ["gemma3", "gemma2", "phi3", "qwen3_moe", "qwen3_5"])
def test_tensorrt_rtx_plans_build_ahead_of_time(family, family_model, build_engine_for):
    """TensorRT-RTX parses each family's graph (its ops' function bodies inlined: the window, the
    soft-caps, partial rotary, the experts) and builds its plan without a GPU."""
    engine = build_engine_for(family_model(family), backend="tensorrt-rtx", dtype="fp16", max_batch_size=2,
                              max_input_len=64, max_kv_cache_capacity=128)
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["backend"] == "tensorrt-rtx" and (engine / "llm" / "model.plan").stat().st_size > 0


def test_moe_routing_decides_the_tokens(family_model, build_engine_for, tmp_path):
    """The same checkpoint with its sparse layers' router rows permuted (each token goes to other
    experts) gives other tokens, and each engine still gives its checkpoint's."""
    import torch
    from transformers import AutoModelForCausalLM

    model = family_model("qwen3_moe")
    rerouted = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        for layer in rerouted.model.layers:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.gate.weight.copy_(layer.mlp.gate.weight.roll(1, dims=0))
    rerouted.save_pretrained(tmp_path / "rerouted")
    AutoTokenizer.from_pretrained(model).save_pretrained(tmp_path / "rerouted")
    (tmp_path / "rerouted" / "generation_config.json").write_bytes((model / "generation_config.json").read_bytes())
    requests = requests_for("qwen3_moe")[:2]
    ours = run(build_engine_for(model), requests, batch_size=2)
    other = run(build_engine_for(tmp_path / "rerouted"), requests, batch_size=2)
    assert_transformers_tokens(tmp_path / "rerouted", other)
    assert [r.output_token_ids for r in ours] != [r.output_token_ids for r in other]


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_experts_build_and_run(weights, family_model, build_engine_for):
    """int8 / int4 covers the experts too (ONNX Runtime's QMoE; tests/test_moe_plugin.py checks the
    op against the dequantized reference): the engine runs, and int8's first tokens are the float
    engine's (int4 in blocks of 32 on every linear of a random model moves them)."""
    model = family_model("qwen3_moe")
    engine = build_engine_for(model, quantization={"weights": weights, "group_size": 32})
    graph = onnx_ops(EngineDir.open(engine).component_path("llm", "engine"))
    assert "QMoE" in graph and "MoE" not in graph
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    assert summary["quantized_expert_layers"] == 2  # layer 1 is dense (mlp_only_layers)
    responses = run(engine, requests_for("qwen3_moe")[:2], batch_size=2)
    floats = run(build_engine_for(model), requests_for("qwen3_moe")[:2], batch_size=2)
    for quantized, exact in zip(responses, floats):
        assert quantized.finish_reason != "error"
        assert len(quantized.output_token_ids) == NEW
        if weights == "int8":
            assert quantized.output_token_ids[0] == exact.output_token_ids[0]


def onnx_ops(path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}
