"""No silent random weights (issue 47 items 3 and 6): a checkpoint whose tensors are not the model its
config describes, or whose config holds values the graph cannot take, is refused by trt-llm-build
before the export in one line naming the tensor or config.json's key, exit status 2, nothing written.
The oracle for each tensor case is the edit itself (the tensor deleted, reshaped, or the key changed
by hand on a tiny checkpoint that builds untouched); transformers alone would have initialised the
missing tensors at random (its own loading report says so) or failed 300 lines into torch.export."""

import json
import shutil

import pytest
import torch

from trt_llm.build.checkpoint import CheckpointError, load_checkpoint
from trt_llm.build.cli import main


def broken(source, tmp_path, config_edit=None, tensor_edit=None):
    """A copy of the checkpoint `source` with its config.json and / or its tensors edited by hand."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "model"
    shutil.copytree(source, copy)
    if config_edit is not None:
        config = json.loads((copy / "config.json").read_text())
        config_edit(config)
        (copy / "config.json").write_text(json.dumps(config))
    if tensor_edit is not None:
        tensors = load_file(str(copy / "model.safetensors"))
        tensor_edit(tensors)
        save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def build(model, tmp_path, capsys):
    """trt-llm-build --export-only on `model`: (exit status, stderr lines, the output folder)."""
    out = tmp_path / "bundle"
    (tmp_path / "build.yaml").write_text(f"model: {model}\noutput_dir: {out}\nmax_batch_size: 2\n"
                                         "max_input_len: 32\nmax_kv_cache_capacity: 64\n")
    capsys.readouterr()
    status = main([str(tmp_path / "build.yaml"), "--export-only", "--quiet"])
    return status, capsys.readouterr().err.strip().splitlines(), out


def refused(model, tmp_path, capsys, *expected):
    status, lines, out = build(model, tmp_path, capsys)
    assert status == 2 and len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]
    assert not out.exists()  # nothing written
    return lines[0]


def drop(name):
    return lambda tensors: tensors.pop(name)


def reshape(name, shape):
    return lambda tensors: tensors.__setitem__(name, torch.zeros(shape))


TENSOR_CASES = {  # qwen2's tiny checkpoint: an untied LM head, q/k/v biases
    "missing_lm_head": (None, drop("lm_head.weight"), "tensor 'lm_head.weight' is missing from the checkpoint",
                        "random weights"),
    "missing_layer_weight": (None, drop("model.layers.1.mlp.up_proj.weight"),
                             "tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
    "misshapen_projection": (None, reshape("model.layers.0.self_attn.o_proj.weight", (64, 32)),
                             "tensor 'model.layers.0.self_attn.o_proj.weight' is [64, 32] in the checkpoint, the "
                             "config makes it [64, 64]"),
    "layers_past_the_config": (lambda c: c.update(num_hidden_layers=1, layer_types=["full_attention"]), None,
                               "tensor 'model.layers.1.", "has no place in the model",
                               "num_hidden_layers is 1"),
    "intermediate_size": (lambda c: c.update(intermediate_size=96), None, "mlp.down_proj.weight' is [64, 128] in "
                          "the checkpoint, the config makes it [64, 96] (and 5 more)"),
}


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_tensors_that_are_not_the_config_s_model_are_one_line(case, tiny_model, tmp_path, capsys):
    config_edit, tensor_edit, *expected = TENSOR_CASES[case]
    refused(broken(tiny_model("qwen2"), tmp_path, config_edit, tensor_edit), tmp_path, capsys, *expected)


def test_the_whole_load_refuses_as_the_streamed_one(tiny_model, tmp_path):
    """The same check when transformers loads the checkpoint (an AWQ build or a draft load it whole):
    its loading report's missing and mismatched tensors."""
    model = broken(tiny_model("qwen2"), tmp_path, None, reshape("model.layers.0.self_attn.o_proj.weight", (64, 32)))
    with pytest.raises(CheckpointError, match=r"o_proj.weight' is \[64, 32\] in the checkpoint"):
        load_checkpoint(str(model), "fp32", stream=False)
    (tmp_path / "model" / "model.safetensors").unlink()
    shutil.copy(tiny_model("qwen2") / "model.safetensors", tmp_path / "model")
    broken_head = broken(tmp_path / "model", tmp_path / "again", None, drop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="'lm_head.weight' is missing"):
        load_checkpoint(str(broken_head), "fp32", stream=False)


def swap(index, kind):
    return lambda c: c["layer_types"].__setitem__(index, kind)


FAMILY_CASES = {
    # Qwen3.5: a Gated DeltaNet layer named full attention (its attention weights are not there)
    "qwen3_5_swapped_layer": ("qwen3_5", swap(0, "full_attention"), "model.layers.0.self_attn",
                              "is missing from the checkpoint", "layer_types[0] is 'full_attention'"),
    "qwen3_5_unknown_layer": ("qwen3_5", swap(0, "sliding_attention"), "config.json: layer_types[0]: "
                              "'sliding_attention' is not a Qwen3.5 layer type"),
    "qwen3_5_layer_count": ("qwen3_5", lambda c: c["layer_types"].pop(), "num_hidden_layers",
                            "layer_types", "(4)", "(3)"),
    "qwen3_5_kernel": ("qwen3_5", lambda c: c.update(linear_conv_kernel_dim=3), "linear_attn.conv1d.weight' is "
                       "[128, 1, 4] in the checkpoint, the config makes it [128, 1, 3]"),
    "qwen3_5_kernel_of_one": ("qwen3_5", lambda c: c.update(linear_conv_kernel_dim=1),
                              "config.json: linear_conv_kernel_dim: 1 is less than 2"),
    "qwen3_5_value_heads": ("qwen3_5", lambda c: c.update(linear_num_value_heads=8), "the config makes it [8]"),
    "lfm2_swapped_layer": ("lfm2", swap(0, "full_attention"), "model.layers.0.self_attn", "is missing"),
    "lfm2_conv_cache": ("lfm2", lambda c: c.update(conv_L_cache=1), "config.json: conv_L_cache: 1 is less than 2"),
    "lfm2_conv_cache_larger": ("lfm2", lambda c: c.update(conv_L_cache=4), "conv.conv.weight' is [64, 1, 3] in the "
                               "checkpoint, the config makes it [64, 1, 4]"),
    "mistral_negative_window": ("mistral", lambda c: c.update(sliding_window=-8),
                                "config.json: sliding_window: -8 is less than 1"),
    "mistral_window_a_string": ("mistral", lambda c: c.update(sliding_window="8"), "sliding_window",
                                "expected int, got str"),
    "moe_top_k_past_the_experts": ("qwen3_moe", lambda c: c.update(num_experts_per_tok=9),
                                   "config.json: num_experts_per_tok: 9 is more than num_local_experts (8)"),
    "moe_fewer_experts": ("qwen3_moe", lambda c: c.update(num_local_experts=4), "mlp.experts.",
                          "the config makes it [4, "),
    "moe_sparse_step": ("qwen3_moe", lambda c: c.update(decoder_sparse_step=0),
                        "config.json: decoder_sparse_step: 0 is less than 1"),
    "moe_dense_layer_past_the_model": ("qwen3_moe", lambda c: c.update(mlp_only_layers=[7]),
                                       "config.json: mlp_only_layers: 7 is not a layer index (0 to 2)"),
}


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_a_family_s_config_mistake_is_one_line(case, family_model, tmp_path, capsys):
    family, edit, *expected = FAMILY_CASES[case]
    refused(broken(family_model(family), tmp_path, edit), tmp_path, capsys, *expected)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "qwen3_moe"])
def test_the_untouched_checkpoints_pass_the_checks(family, family_model):
    checkpoint = load_checkpoint(str(family_model(family)), "fp32", stream=True)
    assert checkpoint.weights is not None  # streamed, every header checked


def test_a_bare_key_error_names_where_the_value_is(family_model, tmp_path):
    """transformers' KeyError for an unknown rope type is the bare word; the message says where it is."""
    model = broken(family_model("mistral"), tmp_path, lambda c: c["rope_parameters"].update(rope_type="foo"))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(str(model), "fp32", stream=True)
    assert str(error.value).endswith("config.json: rope_parameters.rope_type: 'foo' is not one transformers knows")


def test_a_draft_config_missing_a_key_names_it(tiny_model, tmp_path, capsys):
    """build messages are never a bare KeyError: an EAGLE draft whose config.json lacks hidden_size."""
    import assets

    draft = assets.make_random_draft(tiny_model("qwen2"), tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    config.pop("target_hidden_size", None)
    del config["hidden_size"]
    (draft / "config.json").write_text(json.dumps(config))
    out = tmp_path / "bundle"
    (tmp_path / "build.yaml").write_text(f"model: {tiny_model('qwen2')}\noutput_dir: {out}\nmax_batch_size: 2\n"
                                         f"max_input_len: 32\nmax_kv_cache_capacity: 64\ndraft:\n  model: {draft}\n")
    capsys.readouterr()
    assert main([str(tmp_path / "build.yaml"), "--export-only", "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"trt-llm-build: error: draft.model: cannot use {str(draft)!r}: missing 'hidden_size'"]
    assert not out.exists()
