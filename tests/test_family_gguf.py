"""The families beyond Llama / Qwen built from a .gguf file (tests/gguf_family_assets.py: each tiny
checkpoint written the way llama.cpp writes it, tokenizer as tokenizer.ggml.* metadata): the file
loads in transformers as the checkpoint it came from (same logits), and an engine built from the file
gives transformers' greedy tokens on the model and tokenizer it loads from the same file, for a chat
prompt several sliding windows long and a short one."""

import functools
import json
from pathlib import Path

import pytest
import torch

import gguf_family_assets
from conftest import _cache_root
from family_assets import WINDOW
from helpers import PROMPTS, chat_request
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers reads GGUF only with it

NEW = 10
TEXT = "The lighthouse keeper counted the ships that passed the rocks at night, one by one, in the rain."
FAMILIES = ["gemma3", "gemma2", "mistral", "phi3", "qwen3_moe"]
# About 4 min on 2 cores: each file is read by transformers' legacy GGUF loader, whose reader parses the
# real 128k-262k token vocabularies in Python, and Gemma's merges are rebuilt from its vocabulary.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def read_each_file_once():
    """transformers' legacy GGUF loader builds a gguf.GGUFReader, which parses every string of the
    128k-262k token vocabulary in Python (about 10 s), for the config, the weights and the tokenizer:
    a build and the oracle read each file seven times. The reader is read-only (a memmap), so one per
    file serves them all; nothing read changes."""
    import gguf

    real, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        if mode != "r":
            return real(path, mode)
        key = str(Path(path).resolve())
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    yield
    gguf.GGUFReader = real


@pytest.fixture(scope="module")
def family_gguf(tmp_path_factory):
    """Factory: family_gguf(family) -> the tiny checkpoint's .gguf path, each written once."""
    made = {}

    def make(family: str):
        if family not in made:
            try:
                made[family] = gguf_family_assets.make_family_gguf_model(
                    family, tmp_path_factory.mktemp(f"gguf-{family}"), _cache_root())
            except gguf_family_assets.family_assets.assets.AssetUnavailable as exc:
                pytest.skip(f"the {family} tokenizer is unavailable: {exc}")
        return made[family]

    return make


@functools.cache
def from_gguf(path):
    return gguf_family_assets.load_gguf(path)


def greedy(path, ids: list[int]) -> list[int]:
    model, _ = from_gguf(path)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_file_loads_as_the_checkpoint(family, family_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = family_gguf(family)
    model, tokenizer = from_gguf(path)
    hf_dir = path.parent.parent / "hf"
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    messages = [{"role": "user", "content": TEXT}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    with torch.no_grad():
        expected, got = hf(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got - expected).abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_from_the_file_gives_transformers_tokens(family, family_gguf, build_engine_for):
    path = family_gguf(family)
    engine = build_engine_for(str(path))
    requests = [chat_request(TEXT + " " + TEXT), chat_request(PROMPTS[1])]
    data = {"temperature": 0.0, "batch_size": 2, "max_generate_length": NEW, "requests": requests}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    responses = Runner(EngineDir.open(engine), threads=1).run(loaded, loaded.settings).responses
    _, tokenizer = from_gguf(path)
    lengths = []
    for response in responses:
        assert response.finish_reason != "error", response
        ids = tokenizer(response.formatted_complete_request, add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        assert response.output_token_ids == greedy(path, ids)[: len(response.output_token_ids)]
        assert len(set(response.output_token_ids)) > 2  # the tiny model says something: the oracle can tell
    assert max(lengths) > 4 * WINDOW
