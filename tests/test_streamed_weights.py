"""A checkpoint read module by module (build/streamed_weights.py) makes the graph the whole model
makes: every weight of the exported module identical, for a MoE (experts per expert, sharded, bf16),
Gemma 3 (tied LM head, a rotary table per layer type) and Phi-3 (packed projections, LongRoPE); a
folder whose names are not the model's is loaded whole instead; and the big tensors are read in
slices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import family_assets
from conftest import _cache_root
from trt_llm.build import streamed_weights
from trt_llm.build.checkpoint import load_checkpoint
from trt_llm.build.models.llama import DecoderGraph
from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.factory import LinearFactory


@pytest.fixture(scope="module")
def family_source(tmp_path_factory):
    """Factory: the tiny checkpoint of a family, made once for the module."""
    made = {}

    def make(family: str):
        if family not in made:
            made[family] = family_assets.make_family_model(family, tmp_path_factory.mktemp(family), _cache_root())
        return made[family]

    return make


def _saved(source, out, dtype=torch.float32, shard: str | None = None):
    if dtype == torch.float32 and shard is None:
        return source
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    model.save_pretrained(out / "saved", max_shard_size=shard or "10GB")
    for file in source.iterdir():
        if file.name.startswith(("tokenizer", "chat_template", "generation_config", "special_tokens")):
            (out / "saved" / file.name).write_bytes(file.read_bytes())
    return out / "saved"


def _graph(checkpoint, quantized: bool) -> dict[str, torch.Tensor]:
    make_linear = LinearFactory(checkpoint.model, torch.float32, QuantSpec(4, 32)) if quantized else None
    kwargs = {"make_linear": make_linear} if make_linear else {}
    graph = DecoderGraph(checkpoint.model, checkpoint.family, 64, torch.float32, release_layers=True,
                         weights=checkpoint.weights, **kwargs)
    return {**dict(graph.named_parameters()), **dict(graph.named_buffers())}


@pytest.mark.parametrize("family,dtype,shard,quantized", [
    ("qwen3_moe", torch.bfloat16, "200KB", True),
    ("qwen3_moe", torch.float32, None, False),
    ("gemma3", torch.float32, None, False),
    ("phi3", torch.bfloat16, None, True),
], ids=["moe-bf16-sharded-int4", "moe-fp32", "gemma3-tied", "phi3-bf16-int4"])
def test_the_streamed_graph_is_the_loaded_one(family, dtype, shard, quantized, tmp_path, family_source):
    folder = _saved(family_source(family), tmp_path, dtype, shard)
    if shard:
        assert (folder / "model.safetensors.index.json").is_file()
    if family == "qwen3_moe":  # as published: one tensor per expert and projection
        names = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"] if shard else None
        assert names is None or "model.layers.0.mlp.experts.3.up_proj.weight" in names
    streamed = load_checkpoint(str(folder), "fp32", stream=True)
    assert streamed.weights is not None
    assert all(p.is_meta for p in streamed.model.model.layers.parameters())
    whole = load_checkpoint(str(folder), "fp32")
    assert whole.weights is None
    torch.testing.assert_close(streamed.embedding_table(torch.float32), whole.embedding_table(), rtol=0, atol=0)
    got, want = _graph(streamed, quantized), _graph(whole, quantized)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name


def test_stacked_experts_are_read_one_at_a_time(tmp_path, family_source):
    """A folder with the experts stacked (transformers' own layout) streams too."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = Path(shutil.copytree(family_source("qwen3_moe"), tmp_path / "stacked"))

    state = load_file(str(source / "model.safetensors"))
    stacked = {}
    for key in list(state):
        if ".experts." in key:
            prefix, rest = key.split(".experts.")
            expert, part, _ = rest.split(".")
            stacked.setdefault(prefix, {}).setdefault(part, {})[int(expert)] = state.pop(key)
    for prefix, parts in stacked.items():
        count = len(parts["gate_proj"])
        state[f"{prefix}.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts["gate_proj"][e], parts["up_proj"][e]]) for e in range(count)])
        state[f"{prefix}.experts.down_proj"] = torch.stack([parts["down_proj"][e] for e in range(count)])
    save_file(state, str(source / "model.safetensors"), metadata={"format": "pt"})
    streamed = load_checkpoint(str(source), "fp32", stream=True)
    assert streamed.weights is not None
    whole = load_checkpoint(str(source), "fp32")
    got, want = _graph(streamed, False), _graph(whole, False)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_a_folder_under_other_names_is_loaded_whole(tmp_path, family_source):
    import shutil

    from safetensors.torch import load_file, save_file

    source = Path(shutil.copytree(family_source("mistral"), tmp_path / "renamed"))

    state = load_file(str(source / "model.safetensors"))
    state = {key.replace("model.", "transformer.", 1): value for key, value in state.items()}
    save_file(state, str(source / "model.safetensors"), metadata={"format": "pt"})
    from transformers import AutoConfig

    from trt_llm.build.checkpoint import _streamed

    # transformers itself would load it with its weights missing (initialized at random); the stream
    # is not used for it
    assert _streamed(source, AutoConfig.from_pretrained(source)) is None


def test_a_large_tensor_is_read_in_slices(tmp_path, monkeypatch, family_source):
    folder = _saved(family_source("mistral"), tmp_path, torch.bfloat16)
    checkpoint = load_checkpoint(str(folder), "fp32", stream=True)
    whole = checkpoint.weights.read("model.embed_tokens.weight", dtype=torch.float16)
    monkeypatch.setattr(streamed_weights, "SLICE_BYTES", 1000)  # a few rows a slice
    sliced = checkpoint.weights.read("model.embed_tokens.weight", dtype=torch.float16)
    assert sliced.dtype == torch.float16 and torch.equal(sliced, whole)
    stored = checkpoint.weights.read("model.embed_tokens.weight", dtype=None)  # as stored: bf16
    assert stored.dtype == torch.bfloat16 and torch.equal(stored.to(torch.float16), whole)
