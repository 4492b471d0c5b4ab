"""trt-llm-eval: perplexity equals transformers' on the same chunks, an engine against itself has
zero KL and full top-1 agreement, and an fp16 engine against its fp32 build shows a small KL."""

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import PROMPTS
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.app.eval_cli import main as eval_main
from trt_llm.runtime.app.evaluate import chunks, evaluate, open_model

TEXT = " ".join(PROMPTS * 12)
CONTEXT = 32


@pytest.fixture(scope="module")
def engines(tiny_model, build_engine_for):
    model_dir = tiny_model("qwen3")
    return model_dir, build_engine_for(model_dir), build_engine_for(model_dir, dtype="fp16")


def transformers_perplexity(model_dir, token_ids, context):
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    nll = []
    for chunk in chunks(token_ids, context):
        with torch.no_grad():
            logits = model(torch.tensor([chunk])).logits[0].double()
        rows = logits.log_softmax(-1)[context // 2:-1]
        nll += (-rows[torch.arange(len(rows)), torch.tensor(chunk[context // 2 + 1:])]).tolist()
    return math.exp(float(np.mean(nll))), len(nll)


def test_perplexity_equals_transformers(engines):
    model_dir, fp32, _ = engines
    token_ids = AutoTokenizer.from_pretrained(model_dir)(TEXT, add_special_tokens=False)["input_ids"]
    want, scored = transformers_perplexity(model_dir, token_ids, CONTEXT)
    report = evaluate(open_model(EngineDir.open(fp32), 1), token_ids, CONTEXT)
    assert report.tokens_scored == scored > 100
    assert report.perplexity == pytest.approx(want, rel=1e-4)


def test_against_itself_and_against_fp32(engines, tmp_path):
    model_dir, fp32, fp16 = engines
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "report.json"
    assert eval_main([str(tmp_path / "text.txt"), "--engine-dir", str(fp32), "--reference-dir", str(fp32),
                      "--context", str(CONTEXT), "--threads", "1", "-o", str(out)]) == 0
    same = json.loads(out.read_text())
    assert same["kl_max"] < 1e-9 and same["top1_agreement"] == 1.0 and same["logprob_gap_max"] < 1e-6
    assert same["perplexity"] == pytest.approx(same["reference_perplexity"])
    assert eval_main([str(tmp_path / "text.txt"), "--engine-dir", str(fp16), "--reference-dir", str(fp32),
                      "--context", str(CONTEXT), "--threads", "1", "-o", str(out)]) == 0
    half = json.loads(out.read_text())
    assert 0 < half["kl_mean"] < 1e-2 and half["top1_agreement"] > 0.9
    assert half["perplexity"] == pytest.approx(half["reference_perplexity"], rel=0.02)


def test_unusable_inputs_are_one_line_and_exit_2(engines, tmp_path, capsys):
    _, fp32, _ = engines
    (tmp_path / "short.txt").write_text("hi")
    assert eval_main([str(tmp_path / "short.txt"), "--engine-dir", str(fp32), "--context", "32"]) == 2
    assert eval_main([str(tmp_path / "missing.txt"), "--engine-dir", str(fp32)]) == 2
    assert eval_main([str(tmp_path / "short.txt"), "--engine-dir", str(fp32), "--context", "100000"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("trt-llm-eval: error: ") for line in errors)
