"""Quick checks that the offline test assets are what the other tests assume."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets import DEFAULT_SYSTEM_PROMPT, VOCAB_SIZE, make_tokenizer

USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_tokenizer_ids_and_round_trip(tok):
    assert len(tok) == VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    text = "Hello, world! 你好，世界。こんにちは 한국어 😀🚀 café\n  indented <think>hm</think>"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    # Emoji are split into byte pieces, so tokens holding part of a character exist.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    assert tok("<|im_start|><|im_end|>").input_ids == [1, 2]  # special tokens are single ids, no BOS


def test_tokenizer_is_deterministic(tokenizer_dir, tmp_path):
    again = make_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (tokenizer_dir / name).read_bytes(), name


def test_chat_template(tok):
    default = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert default == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}]
    convo = system + USER + [{"role": "assistant", "content": "Paris."}]
    rendered = tok.apply_chat_template(convo, tokenize=False)
    assert DEFAULT_SYSTEM_PROMPT not in rendered
    assert rendered.endswith("<|im_start|>assistant\nParis.<|im_end|>\n")
    no_think = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think == default + "<think>\n\n</think>\n\n"
    thinking = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert thinking == default


def test_tiny_model_reloads_and_generates(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and gen["do_sample"] is False
    assert config["vocab_size"] >= VOCAB_SIZE
    family = config["model_type"]
    assert config["tie_word_embeddings"] == (family == "qwen3")
    if family == "llama":
        assert config["rope_parameters"]["rope_type"] == "llama3"

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = tok.apply_chat_template(USER, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=32)
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    # A too-small init makes the random model repeat one token; the tests need variety.
    assert len(set(new)) >= 4, new


def test_tiny_model_is_deterministic(tiny_model, tmp_path):
    from assets import make_tiny_model

    again = make_tiny_model("qwen2", tmp_path)
    assert (again / "model.safetensors").read_bytes() == (tiny_model("qwen2") / "model.safetensors").read_bytes()


def test_tiny_model_overrides(tiny_model):
    config = json.loads((tiny_model("llama", num_hidden_layers=4) / "config.json").read_text())
    assert config["num_hidden_layers"] == 4


@pytest.mark.slow
def test_smollm2(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    prompt = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
    assert model.dtype == torch.float32
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1] :])
