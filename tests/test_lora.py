"""LoRA adapters: equal to transformers + PEFT and to merged weights; one batch mixing adapters gives
each row what it gets alone; clear errors for adapters the engine cannot take."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import chat_request, make_adapter, run_input

peft = pytest.importorskip("peft")


def peft_greedy(base_dir, adapter_dir, prompt_ids, n, merged=False):
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    if merged:
        model = model.merge_and_unload()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def setup(tiny_model, build_engine_for, tmp_path_factory):
    base = tiny_model("qwen3")
    engine = build_engine_for(base, lora={"max_rank": 8})
    folder = tmp_path_factory.mktemp("adapters")
    adapters = {
        "full": make_adapter(base, folder / "full", seed=1),
        "attn": make_adapter(base, folder / "attn", seed=2, rank=8, targets=["q_proj", "v_proj"]),
        "rs": make_adapter(base, folder / "rs", seed=3, rank=2, targets=["o_proj", "down_proj"], rslora=True),
    }
    return base, engine, adapters


PROMPT = "Tell me about the sea."


def run_with(engine, adapters, names, n=16, batch_size=None):
    requests = [_request(i, name) for i, name in enumerate(names)]
    data = {"temperature": 0.0, "max_generate_length": n, "available_lora_weights": adapters,
            "batch_size": batch_size or len(names), "requests": requests}
    return run_input(engine, data).responses


@pytest.mark.parametrize("name", ["full", "attn", "rs"])
def test_adapter_equals_peft_and_merged_weights(setup, name):
    base, engine, adapters = setup
    response = run_with(engine, adapters, [name])[0]
    assert response.finish_reason != "error", response.error
    prompt_ids = AutoTokenizer.from_pretrained(base)(response.formatted_complete_request,
                                                     add_special_tokens=False)["input_ids"]
    assert response.output_token_ids == peft_greedy(base, adapters[name], prompt_ids, 16)
    assert response.output_token_ids == peft_greedy(base, adapters[name], prompt_ids, 16, merged=True)
    assert response.output_token_ids != run_with(engine, adapters, [None])[0].output_token_ids


def test_batch_mixing_adapters_gives_each_row_its_own_result(setup):
    _, engine, adapters = setup
    names = ["full", None, "attn", "rs"]
    mixed = run_with(engine, adapters, names)
    for i, name in enumerate(names):
        alone = run_input(engine, {"temperature": 0.0, "max_generate_length": 16,
                                   "available_lora_weights": adapters,
                                   "requests": [_request(i, name)]}).responses[0]
        assert mixed[i].output_token_ids == alone.output_token_ids, name


def _request(i, name):
    return chat_request(PROMPT if i % 2 == 0 else "Hi there, who are you?", **({"lora_name": name} if name else {}))


def test_adapter_errors_name_adapter_and_tensor(setup, tiny_model, build_engine_for, tmp_path):
    base, engine, adapters = setup
    too_big = make_adapter(base, tmp_path / "big", seed=4, rank=16, targets=["q_proj"])
    weights = load_file(f"{adapters['full']}/adapter_model.safetensors")
    bad_shape_dir = tmp_path / "shape"
    bad_shape_dir.mkdir()
    key = next(k for k in weights if "lora_A" in k)
    save_file({**weights, key: torch.zeros(4, 3)}, str(bad_shape_dir / "adapter_model.safetensors"))
    (bad_shape_dir / "adapter_config.json").write_text(open(f"{adapters['full']}/adapter_config.json").read())
    narrow = build_engine_for(base, lora={"max_rank": 8, "target_modules": ["q_proj", "v_proj"]})
    cases = [
        (engine, {"big": too_big}, "big", "rank 16, above the engine's max_rank 8"),
        (engine, {"shape": str(bad_shape_dir)}, "shape", "do not match the base model"),
        (narrow, {"full": adapters["full"]}, "full", "engine was built with LoRA on q_proj, v_proj"),
        (build_engine_for(base), {"full": adapters["full"]}, "full", "built without LoRA inputs"),
        (engine, {"gone": str(tmp_path / "missing")}, "gone", "not found"),
    ]
    for engine_dir, available, name, message in cases:
        data = {"max_generate_length": 4, "available_lora_weights": available,
                "requests": [chat_request("hi", lora_name=name), chat_request("hi")]}
        responses = run_input(engine_dir, data).responses
        assert responses[0].finish_reason == "error" and message in responses[0].error, responses[0].error
        assert f"LoRA adapter {name!r}" in responses[0].error or "without LoRA" in responses[0].error
        assert responses[1].finish_reason != "error"  # the other request still runs


def test_prefix_cache_is_keyed_on_the_adapter(setup):
    _, engine, adapters = setup
    system = "You are a helpful assistant who loves the sea and answers briefly."
    def req(name, save=False):
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
                "save_system_prompt_kv_cache": save, **({"lora_name": name} if name else {})}
    data = {"temperature": 0.0, "max_generate_length": 8, "available_lora_weights": adapters, "batch_size": 1,
            "requests": [req("full", save=True), req("attn"), req("full"), req(None)]}
    responses = run_input(engine, data).responses
    assert [r.reused_tokens > 0 for r in responses] == [False, False, True, False]
    alone = run_input(engine, {**data, "requests": [req("attn")]}).responses[0]
    assert responses[1].output_token_ids == alone.output_token_ids


@pytest.mark.slow
def test_smollm2_adapter_equals_peft(smollm2_dir, build_engine_for, tmp_path):
    engine = build_engine_for(smollm2_dir, lora={"max_rank": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]},
                              max_input_len=256, max_kv_cache_capacity=512)
    adapter = make_adapter(smollm2_dir, tmp_path / "a", seed=5, rank=8, targets=["q_proj", "v_proj", "down_proj"])
    response = run_input(engine, {"temperature": 0.0, "max_generate_length": 24, "available_lora_weights": {"a": adapter},
                                  "requests": [chat_request("What is the capital of France?", lora_name="a")]}).responses[0]
    prompt_ids = AutoTokenizer.from_pretrained(smollm2_dir)(response.formatted_complete_request,
                                                           add_special_tokens=False)["input_ids"]
    assert response.output_token_ids == peft_greedy(smollm2_dir, adapter, prompt_ids, 24)
