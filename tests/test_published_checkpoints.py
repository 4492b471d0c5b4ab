"""GPTQ (with and without act-order) and AWQ checkpoints read as they are (issue 17 item 4).

A tiny random model is written in each layout by packing known integers with the format's own
rules (its documented bit layout, independent of the reader); the reader must give back exactly
those weights, and the engine built from the folder must be greedy-identical to transformers running
the float model with those dequantized weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from helpers import PROMPTS
from test_greedy_parity import assert_batch_matches_transformers
from trt_llm.build.quantize.formats import load_published
from trt_llm.runtime.backends import ort_engine

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ packs columns 0 2 4 6 1 3 5 7 into a word's nibbles


def _pack_rows(values: torch.Tensor) -> torch.Tensor:
    """[K, N] nibbles -> GPTQ's int32 [K/8, N]: row k in bits 4(k % 8) of word row k // 8."""
    v = values.to(torch.int64).view(-1, 8, values.shape[1])
    return sum(v[:, i] << (4 * i) for i in range(8)).to(torch.uint32).view(torch.int32)


def _pack_columns(values: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[R, N] nibbles -> int32 [R, N/8], slot i of word c holding column 8c + order[i]."""
    v = values.to(torch.int64).view(values.shape[0], -1, 8)
    return sum(v[:, :, order[i]] << (4 * i) for i in range(8)).to(torch.uint32).view(torch.int32)


def write_quantized(model_dir, out, fmt: str, group: int, act_order: bool = False, sym: bool = True, seed: int = 0):
    """The float checkpoint with every decoder linear replaced by random blocks in `fmt`; returns the
    folder and {module name: the dequantized weight [N, K]} computed by hand."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    expected = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in LINEARS:
            continue
        n, k = module.weight.shape
        groups = k // group
        q = torch.randint(0, 16, (k, n), generator=generator)
        zeros = torch.full((groups, n), 8) if sym else torch.randint(0, 16, (groups, n), generator=generator)
        scales = (torch.rand(groups, n, generator=generator) * 0.02 + 0.005).half()
        g_idx = torch.arange(k) // group
        if act_order:
            g_idx = g_idx[torch.randperm(k, generator=generator)]
        rows = g_idx if fmt == "gptq" else torch.arange(k) // group
        expected[name] = ((q - zeros[rows]) * scales.float()[rows]).t()
        del state[f"{name}.weight"]
        if fmt == "gptq":  # v1 stores zero - 1, wrapped to 4 bits
            state.update({f"{name}.qweight": _pack_rows(q), f"{name}.qzeros": _pack_columns((zeros - 1) & 0xF),
                          f"{name}.scales": scales, f"{name}.g_idx": g_idx.to(torch.int32)})
        else:
            state.update({f"{name}.qweight": _pack_columns(q, AWQ_ORDER),
                          f"{name}.qzeros": _pack_columns(zeros, AWQ_ORDER), f"{name}.scales": scales})
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": sym,
         "checkpoint_format": "gptq"} if fmt == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"})
    (out / "config.json").write_text(json.dumps(config))
    for file in model_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            (out / file.name).write_bytes(file.read_bytes())
    return out, expected


def dequantized_folder(model_dir, out, expected):
    """transformers' float model with the hand-dequantized weights: the oracle."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, weight in expected.items():
            model.get_submodule(name).weight.copy_(weight)
    model.save_pretrained(out)
    for file in model_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / file.name).write_bytes(file.read_bytes())
    return out


CASES = [  # family, format, group, act-order, symmetric
    ("llama", "gptq", 32, False, True),
    ("qwen2", "gptq", 32, True, True),
    ("qwen3", "gptq", 64, True, False),
    ("llama", "awq", 32, False, False),
]


@pytest.mark.parametrize("family,fmt,group,act_order,sym", CASES, ids=lambda c: str(c))
def test_published_checkpoint_loads_exactly_and_matches_transformers(
        family, fmt, group, act_order, sym, tiny_model, build_engine_for, tmp_path, monkeypatch):
    model_dir = tiny_model(family)
    folder, expected = write_quantized(model_dir, tmp_path / fmt, fmt, group, act_order, sym)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    model, published = load_published(folder, config)
    assert sorted(published) == sorted(expected)
    for name, weight in expected.items():
        torch.testing.assert_close(published[name].dequantize(), weight, rtol=0, atol=0)
        assert (published[name].zero_points is None) == sym  # symmetric blocks become signed ones
    # act-order: a linear of several groups gathers its input in the order of its sorted rows
    assert any(w.input_order is not None for w in published.values()) == act_order
    engine = build_engine_for(folder, quantization={"weights": "int4", "group_size": group})
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    assert summary["quantized_linears"] == len(expected) + 1  # + the LM head, by round-to-nearest
    oracle = dequantized_folder(model_dir, tmp_path / "oracle", expected)
    monkeypatch.setattr(ort_engine, "MATMUL_ACCURACY_LEVEL", 1)
    # The LM head is round-to-nearest in the engine: quantize it the same way in the oracle.
    from test_quantized_build import dequantized_copy
    from trt_llm.build.quantize import QuantSpec

    oracle = dequantized_copy(oracle, tmp_path / "oracle-head", QuantSpec(4, group), only=("lm_head",))
    lengths = assert_batch_matches_transformers(engine, oracle, PROMPTS, max_new=24)
    assert max(lengths) >= 16


def write_gptq_moe(model_dir, out, group: int, seed: int = 0):
    """A tiny Qwen3-MoE in GPTQ's layout, as published MoE checkpoints are: every decoder linear and
    each expert's gate, up and down projections as symmetric 4-bit blocks (the router stays float);
    returns the folder and {name: the dequantized weight [N, K]} computed by hand."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    expected = {}

    def put(name, n, k):
        q = torch.randint(0, 16, (k, n), generator=generator)
        scales = (torch.rand(k // group, n, generator=generator) * 0.02 + 0.005).half()
        rows = torch.arange(k) // group
        expected[name] = ((q - 8) * scales.float()[rows]).t()
        state.update({f"{name}.qweight": _pack_rows(q), f"{name}.qzeros": _pack_columns(torch.full((k // group, n), 7)),
                      f"{name}.scales": scales, f"{name}.g_idx": rows.to(torch.int32)})

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS and isinstance(module, torch.nn.Linear):
            del state[f"{name}.weight"]
            put(name, *module.weight.shape)
        elif name.endswith(".experts"):
            del state[f"{name}.gate_up_proj"], state[f"{name}.down_proj"]
            experts, width, hidden = module.gate_up_proj.shape
            for e in range(experts):
                put(f"{name}.{e}.gate_proj", width // 2, hidden)
                put(f"{name}.{e}.up_proj", width // 2, hidden)
                put(f"{name}.{e}.down_proj", hidden, width // 2)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False,
                                     "sym": True, "checkpoint_format": "gptq"}
    (out / "config.json").write_text(json.dumps(config))
    for file in model_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            (out / file.name).write_bytes(file.read_bytes())
    return out, expected


def test_a_gptq_moe_keeps_each_experts_blocks(tmp_path, build_engine_for, caplog):
    """A GPTQ Qwen3-MoE folder: each expert's three linears are read exactly and become the MoE op's
    blocks as they are (its stacked experts dequantize to the hand-computed weights bit for bit, gate
    and up rows interleaved), not quantized again; the engine builds and runs."""
    import family_assets
    from conftest import _cache_root
    from test_families import requests_for, run
    from trt_llm.build.checkpoint import load_checkpoint
    from trt_llm.build.models.llama import DecoderGraph
    from trt_llm.build.quantize.factory import factory_for
    from trt_llm.plugins import moe as moe_op
    from trt_llm.schemas.build_config import BuildConfig

    source = family_assets.make_family_model("qwen3_moe", tmp_path / "source", _cache_root())
    folder, expected = write_gptq_moe(source, tmp_path / "gptq", group=32)
    config = BuildConfig(model=str(folder), output_dir=str(tmp_path / "unused"),
                         quantization={"weights": "int4", "group_size": 32})
    checkpoint = load_checkpoint(str(folder), "fp32")
    experts = [name for name, blocks in checkpoint.published.items() if isinstance(blocks, list)]
    assert experts and len(experts) == sum(1 for name in expected if name.endswith(".0.gate_proj"))
    with caplog.at_level("WARNING"):
        make_linear = factory_for(config, checkpoint, torch.float32)
    assert not [r for r in caplog.records if "quantized again" in r.getMessage()]
    graph = DecoderGraph(checkpoint.model, checkpoint.family, 64, torch.float32, make_linear=make_linear)
    for layer, hf_layer in zip(graph.layers, checkpoint.model.model.layers):
        if not hasattr(hf_layer.mlp, "experts"):
            continue
        name = make_linear.names[id(hf_layer.mlp.experts)]
        gate_up = moe_op.dequantize(layer.mlp.gate_up, layer.mlp.gate_up_scales, 4)
        down = moe_op.dequantize(layer.mlp.down, layer.mlp.down_scales, 4)
        for e in range(gate_up.shape[0]):
            assert torch.equal(gate_up[e, 0::2], expected[f"{name}.{e}.gate_proj"])
            assert torch.equal(gate_up[e, 1::2], expected[f"{name}.{e}.up_proj"])
            assert torch.equal(down[e], expected[f"{name}.{e}.down_proj"])
    engine = build_engine_for(folder, quantization={"weights": "int4", "group_size": 32})
    responses = run(engine, requests_for("qwen3_moe")[:2], batch_size=2)
    assert all(r.finish_reason != "error" and r.output_token_ids for r in responses)
