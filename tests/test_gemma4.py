"""Gemma 4's text decoder (issue 43) on tiny random checkpoints with the real Gemma tokenizer
(tests/family_assets.py: "gemma4", layers of two widths with attention_k_eq_v; "gemma4_e2b", shaped as
E2B; "gemma4_moe", experts beside each MLP). Greedy tokens against transformers' `generate` run in
tests/test_families.py with the other families (static, continuous, chunked with reuse); here: what the manifest records, the cache the
shared layers do not hold (measured on the engine's own pool), log-probabilities against
transformers, the quantized and TensorRT-RTX builds, and what is refused in one line."""

import importlib.util
import json
import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from test_families import NEW, TEXT, assert_transformers_tokens, requests_for, run
from trt_llm.runtime.backends.engines import open_engine
from trt_llm.runtime.cache.cache_set import cache_set
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.schemas.layer_spec import parse_layers
from trt_llm.server.memory import pool_bytes


@pytest.fixture(scope="module")
def gemma4(family_model, build_engine_for):
    model = family_model("gemma4")
    return model, build_engine_for(model)


def test_the_manifest_records_each_layer_its_width_source_and_rope(gemma4):
    _, engine = gemma4
    model = json.loads((engine / "manifest.json").read_text())["model"]
    layers = model["layers"]
    assert [layer["kind"] for layer in layers] == ["sliding", "full"] * 3
    assert [(layer["head_dim"], layer["kv_heads"]) for layer in layers] == [(32, 2), (64, 1)] * 3
    # transformers' kv_sharing_modes: the last layer of each kind before the shared ones is their source
    assert [layer["kv_source"] for layer in layers] == [None, None, None, None, 2, 3]
    assert {layer["rotary"]["scaling"] for layer in layers[1::2]} == {"proportional"}
    # the proportional rope's tables turn the whole head (zero frequencies past the first quarter)
    assert all(layer["rotary"]["dims"] == layer["head_dim"] and layer["scale"] == 1.0 for layer in layers)
    assert model["per_layer_inputs"] == {"layers": 6, "width": 8, "vocab_size": 262_208,
                                         "scale": float(np.float32(8 ** 0.5))}
    assert model["embedding_scale"] == 8.0  # sqrt(64)
    assert (engine / "llm" / "per_layer_embedding.safetensors").is_file()


def test_the_shared_layers_hold_no_cache(gemma4):
    """The engine's own pool, measured: bytes a token of keys and values against the same layers with
    sharing off (each layer its own cache): 2 sliding owners of 2 x 32 and 2 global ones of 1 x 64, of
    3 and 3."""
    _, engine = gemma4
    engine_dir = EngineDir.open(engine)
    layers = parse_layers(engine_dir.manifest["model"]["layers"])
    unshared = [layer.model_copy(update={"kv_source": None}) for layer in layers]
    capacity = 64  # slots a row: every group the same (no widest step: a sliding group's too)
    pool = open_engine(engine_dir).new_cache(1, capacity)
    shared_bytes = pool_bytes(pool)["host"]
    whole_bytes = pool_bytes(cache_set(unshared, 1, capacity, np.float32))["host"]
    # the two readers' keys and values (one sliding layer of 2 x 32, one global of 1 x 64): 1,024 bytes a token
    assert whole_bytes - shared_bytes == capacity * 2 * 4 * (2 * 32 + 64)
    # of 3,072 a token (plus the sliding group's row offsets, the same in both)
    assert shared_bytes == pytest.approx(whole_bytes * 2 / 3, rel=1e-3)
    assert [group.layers for group in pool.groups] == [[0, 2], [1, 3]]


def test_log_probabilities_are_transformers(gemma4, tmp_path):
    """Each generated token's top five log-probabilities, against the top one's (the normaliser over
    262k tokens alone differs by ~1e-4 between two float32 sums), within 1e-4 of transformers'."""
    model, engine = gemma4
    request = {"messages": [{"role": "user", "content": TEXT}], "num_logprobs": 5}
    response = run(engine, [request], batch_size=1)[0]
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + response.output_token_ids])
    with torch.no_grad():
        theirs = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1:-1].double(), -1)
    assert len(response.logprobs) == NEW
    for step, candidates in enumerate(response.logprobs):
        ours = {c.token_id: c.logprob for c in candidates}
        top = max(ours, key=ours.get)
        assert top == response.output_token_ids[step]
        error = max(abs((ours[i] - ours[top]) - float(theirs[step, i] - theirs[step, top])) for i in ours)
        assert error < 1e-4, (step, error)


def test_logits_at_every_position_are_transformers(gemma4):
    """trt-llm-eval's pass asks for logits at every position of a chunk (the graph's readers then take all
    of them, not only the last: run_layers' kept rows): each position's log-probabilities are transformers'
    within 1e-4, relative to its top token, across the window and the shared layers."""
    from trt_llm.runtime.app.evaluate import chunk_log_softmax, open_model

    model, engine = gemma4
    tokenizer = AutoTokenizer.from_pretrained(model)
    chunk = tokenizer(TEXT + " " + TEXT, add_special_tokens=True)["input_ids"][:40]
    ours = chunk_log_softmax(open_model(EngineDir.open(engine), threads=1), chunk)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = torch.log_softmax(hf(torch.tensor([chunk])).logits[0].double(), -1).numpy()
    top = theirs.argmax(-1)
    assert (ours.argmax(-1) == top).all()
    rows = np.arange(len(chunk))
    error = np.abs((ours - ours[rows, top][:, None]) - (theirs - theirs[rows, top][:, None]))[:, :1000].max()
    assert error < 1e-4, error


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_builds_run(weights, gemma4, build_engine_for):
    """int8 / int4 weights (every linear, the per-layer projections too; the per-layer table stored as the
    embedding is, fp16 by default, int8 blocks when asked): the engine runs whole requests; int8's first
    tokens are the float ones."""
    from trt_llm.runtime.backends.embedding import mapped_tensors

    model, engine = gemma4
    embedding = "fp16" if weights == "int8" else "int8"
    quantized = build_engine_for(model, quantization={"weights": weights, "group_size": 32, "embedding": embedding})
    manifest = json.loads((quantized / "manifest.json").read_text())
    assert manifest["model"]["quantization"]["embedding"] == embedding
    table = mapped_tensors(quantized / "llm" / "per_layer_embedding.safetensors")
    assert table["embedding"].dtype == {"fp16": np.float16, "int8": np.int8}[embedding]
    assert ("scales" in table) == (embedding == "int8")
    requests = requests_for("gemma4")[:2]
    floats = run(engine, requests, batch_size=2)
    for ours, exact in zip(run(quantized, requests, batch_size=2), floats):
        assert ours.finish_reason == "max-length" and len(ours.output_token_ids) == NEW
        if weights == "int8":
            assert ours.output_token_ids[:2] == exact.output_token_ids[:2]


def test_the_e2b_shape_is_transformers(family_model, build_engine_for):
    """E2B's shape: one kv head on every layer, the global layers' own values (no k_eq_v), three
    sliding layers to two global ones, the last two reading layers 1 and 2."""
    model = family_model("gemma4_e2b")
    engine = build_engine_for(model)
    layers = json.loads((engine / "manifest.json").read_text())["model"]["layers"]
    assert [layer["kv_source"] for layer in layers] == [None, None, None, 1, 2]
    requests = requests_for("gemma4_e2b")
    assert_transformers_tokens(model, run(engine, requests + requests[::-1], batch_size=3))


def test_quantized_experts_run_their_gelu_body(family_model, build_engine_for):
    """int4 experts with GELU gates: ONNX Runtime's QMoE gates by SwiGLU only, so the node keeps its body
    (the experts gathered and dequantized); the engine runs whole requests."""
    from test_families import onnx_ops

    model = family_model("gemma4_moe")
    engine = build_engine_for(model, quantization={"weights": "int4", "group_size": 32})
    graph = onnx_ops(EngineDir.open(engine).component_path("llm", "engine"))
    # the body, inlined by the build's optimisation: the chosen experts gathered, dequantized and multiplied,
    # their gate's tanh GELU; no QMoE
    assert "QMoE" not in graph and {"Gather", "MatMul", "Tanh"} <= set(graph), " ".join(sorted(graph))
    assert json.loads((engine / "manifest.json").read_text())["model"]["quantization"]["quantized_expert_layers"] == 4
    for response in run(engine, requests_for("gemma4_moe")[:2], batch_size=2):
        assert response.finish_reason == "max-length" and len(response.output_token_ids) == NEW


@pytest.mark.parametrize("family", ["gemma4", "gemma4_moe"])
def test_lora_adapters_on_layers_of_different_shapes_are_peft(family, family_model, build_engine_for, tmp_path):
    """PEFT adapters on every module each layer has: the two head widths, k_eq_v's global layers (no
    v_proj), the shared layers (q_proj alone, double-wide MLPs), the dense MLP beside the experts; a row
    with the adapter gives PEFT's tokens, a row without it the base model's, in one batch."""
    pytest.importorskip("peft")
    from helpers import LORA_MODULES, assert_adapter_rows_are_peft, make_adapter

    model = family_model(family)
    engine = build_engine_for(model, lora={"max_rank": 4})
    manifest = json.loads((engine / "manifest.json").read_text())
    groups = manifest["lora"]["layer_groups"]
    keys_are_values = json.loads((model / "config.json").read_text()).get("attention_k_eq_v")
    for layer, spec in zip(groups, manifest["model"]["layers"]):
        qkv = (["q_proj"] if spec["kv_source"] is not None else  # a shared layer: q alone
               ["q_proj", "k_proj"] if spec["kind"] == "full" and keys_are_values else ["q_proj", "k_proj", "v_proj"])
        assert [g["modules"] for g in layer] == [qkv, ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
        assert layer[0]["out_features"] == (spec["kv_heads"] * (len(qkv) - 1) + 4) * spec["head_dim"]  # 4 q heads
    adapter = make_adapter(model, tmp_path / "adapter", seed=3, rank=4, targets=LORA_MODULES)
    assert_adapter_rows_are_peft(model, engine, adapter, TEXT, NEW)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed")
def test_tensorrt_rtx_plan_builds_ahead_of_time(gemma4, build_engine_for):
    """TensorRT-RTX parses the graph (the shared layers' attention over their source's presents, the
    per-layer inputs) and builds its plan without a GPU."""
    model, _ = gemma4
    engine = build_engine_for(model, backend="tensorrt-rtx", dtype="fp16", max_batch_size=2, max_input_len=64,
                              max_kv_cache_capacity=128)
    assert (engine / "llm" / "model.plan").stat().st_size > 0


def test_what_it_cannot_take_is_refused_in_one_line(gemma4, build_engine_for, tmp_path):
    from trt_llm.build.checkpoint import CheckpointError
    from trt_llm.build.compile import BuildError

    model, _ = gemma4
    with pytest.raises(BuildError, match=r"draft: an EAGLE draft on Gemma 4 \(its layers share keys and values\)"):
        build_engine_for(model, draft={"model": str(tmp_path)})  # (refused before any draft is read)
    config = json.loads((model / "config.json").read_text())
    for edit, expected in ((dict(enable_moe_block=True, num_experts=4, top_k_experts=8, moe_intermediate_size=32),
                            "top_k_experts: 8 is more than num_experts (4)"),
                           (dict(use_bidirectional_attention="all"), "use_bidirectional_attention: 'all'"),
                           (dict(vocab_size_per_layer_input=1000), "vocab_size_per_layer_input: 1000 is less")):
        folder = tmp_path / expected.split(":")[0]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, **edit}))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_bytes((model / name).read_bytes())
        with pytest.raises(CheckpointError, match=re.escape(f"config.json: {expected}")):
            build_engine_for(folder)
