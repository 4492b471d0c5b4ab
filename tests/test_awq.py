"""AWQ (build/quantize/awq.py): the scaling leaves the float model's function as it was, and makes
round-to-nearest lose less where activations have outlier channels (as real LLMs' do).

Oracle: the float model itself (its logits), and plain round-to-nearest on the same weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trt_llm.build.quantize import QuantSpec
from trt_llm.build.quantize.awq import apply_awq
from trt_llm.build.quantize.rtn import quantize_rtn

SPEC = QuantSpec(4, 32)
HELD_OUT = "A quiet river runs past the old mill, where the miller counts his sacks of grain. " * 8


def _with_outliers(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # a few hidden channels 20x larger, as real models' residual streams have
        model.model.embed_tokens.weight[:, [3, 17, 40]] *= 20
    return model


def _rtn_copy(model):
    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.copy_(quantize_rtn(module.weight, SPEC, torch.float32).dequantize())
    return quantized


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_awq_keeps_the_float_model_and_loses_less_than_rtn(tiny_model, family):
    model_dir = tiny_model(family)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = _with_outliers(model_dir)
    ids = tokenizer(HELD_OUT, return_tensors="pt")["input_ids"][:, :256]
    with torch.no_grad():
        reference = model(ids).logits
        rtn = ((_rtn_copy(model)(ids).logits - reference) ** 2).mean()
    scaled = copy.deepcopy(model)
    totals = apply_awq(scaled, tokenizer, SPEC, clip=False)
    assert totals["awq"] < totals["rtn"]
    clipped = copy.deepcopy(model)
    apply_awq(clipped, tokenizer, SPEC)
    with torch.no_grad():
        torch.testing.assert_close(scaled(ids).logits, reference, rtol=1e-4, atol=1e-4)  # the same function
        awq = ((_rtn_copy(scaled)(ids).logits - reference) ** 2).mean()
        with_clip = ((_rtn_copy(clipped)(ids).logits - reference) ** 2).mean()
    assert awq < 0.9 * rtn, (float(awq), float(rtn))
    assert with_clip < rtn, (float(with_clip), float(rtn))


def test_awq_build_runs_and_is_recorded(tiny_model, build_engine_for, tmp_path):
    from helpers import chat_request, run_input

    calibration = tmp_path / "calibration.txt"
    calibration.write_text(HELD_OUT, encoding="utf-8")
    engine = build_engine_for(tiny_model("qwen2"), quantization={"weights": "int4", "group_size": 32,
                                                                 "method": "awq", "calibration": str(calibration)})
    summary = json.loads((engine / "manifest.json").read_text())["model"]["quantization"]
    assert summary["method"] == "awq" and summary["quantized_linears"] == 2 * 7 + 1  # HF linears, the LM head too
    output = run_input(engine, {"temperature": 0.0, "max_generate_length": 8, "requests": [chat_request("Hi")]})
    assert output.responses[0].generated_tokens == 8 or output.responses[0].finish_reason == "end-of-sequence"


def test_an_unreadable_calibration_file_is_one_line(tiny_model, tmp_path, capsys):
    from trt_llm.build.cli import main

    config = tmp_path / "build.yaml"
    config.write_text(f"model: {tiny_model('llama')}\noutput_dir: {tmp_path / 'e'}\n"
                      f"quantization: {{weights: int4, method: awq, calibration: {tmp_path / 'missing.txt'}}}\n")
    assert main([str(config), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "quantization.calibration" in error and "missing.txt" in error and "Traceback" not in error
