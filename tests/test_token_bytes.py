"""Tests for trt_llm.runtime.text.token_bytes: exact raw bytes per token id."""

import time

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from assets import CORPUS
from trt_llm.runtime.text.token_bytes import TokenBytes

# Chat markup, English, CJK and emoji; the rarer characters (not in the tiny tokenizer's
# corpus) are split into several byte tokens.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\nand newlines\r\n",
    "中文：你好，世界！龍龜鬱",
    "日本語とかな、한국어",
    "Emoji: 😀 🦀🦑 ❤️ 👍🏽 👨‍👩‍👧",
    "Café, naïve, Ωmega, Ελληνικά, Ǆ",
]
CHAT = "<|im_start|>user\nhi 🦀<|im_end|>\n<|im_start|>assistant\n中文<|im_end|>"


@pytest.fixture(scope="module")
def tiny_tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def smollm2_tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(params=["tiny", "smollm2"])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


def joined(tb, ids):
    return b"".join(tb.bytes_of(i) for i in ids if not tb.is_special(i))


def test_bytes_reproduce_text(tok):
    tb = TokenBytes(tok)
    assert tb.byte_level
    split_seen = False
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert joined(tb, ids) == text.encode()
        partial = [i for i in ids if not _is_utf8(tb.bytes_of(i))]
        for i in partial:
            assert "\ufffd" in tb.text_of(i)
        split_seen |= bool(partial)
    assert split_seen, "no test text split a character across tokens"


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


def test_special_tokens_excluded(tok):
    tb = TokenBytes(tok)
    ids = tok.encode(CHAT, add_special_tokens=False)
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert im_start in ids and im_end in ids
    assert tb.is_special(im_start) and tb.is_special(im_end)
    # Their bytes are still known (the logprob candidates show them).
    assert tb.bytes_of(im_end) == b"<|im_end|>" and tb.text_of(im_end) == "<|im_end|>"
    expected = CHAT.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert joined(tb, ids) == expected.encode()
    assert joined(tb, ids).decode() == tok.decode(ids, skip_special_tokens=True)


def test_every_token_matches_the_tokenizers_decoder(tok):
    """Token by token, the lossy text agrees with the tokenizer's own single-token decode."""
    tb = TokenBytes(tok)
    ids = [i for i in range(len(tok)) if not tb.is_special(i)]
    decoded = tok.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    assert [tb.text_of(i) for i in ids] == decoded


def test_tiny_added_tokens(tiny_tok):
    tb = TokenBytes(tiny_tok)
    assert len(tb) == len(tiny_tok) == 512
    assert {i for i in range(len(tb)) if tb.is_special(i)} == {0, 1, 2}
    think = tiny_tok.convert_tokens_to_ids("<think>")
    # <think> is an added token but not special: it stays in the output text.
    assert not tb.is_special(think) and tb.bytes_of(think) == b"<think>"


def test_ids_past_the_tokenizer_are_empty(tiny_tok):
    tb = TokenBytes(tiny_tok, vocab_size=520)  # model embedding padded past the tokenizer
    assert len(tb) == 520
    assert tb.bytes_of(515) == b"" and tb.text_of(519) == "" and not tb.is_special(515)


def test_smollm2_construction_is_fast(smollm2_tok):
    TokenBytes(smollm2_tok)  # warm-up: lazy imports, backend caches
    start = time.perf_counter()
    tb = TokenBytes(smollm2_tok)
    elapsed = time.perf_counter() - start
    assert len(tb) == 49152
    assert elapsed < 1.0, f"TokenBytes(SmolLM2) took {elapsed:.3f} s"  # ~0.06 s; loose for CI


# -- SentencePiece style: byte fallback tokens and the U+2581 word mark ------------------


@pytest.fixture(scope="module")
def sp_tok():
    """A Llama-2-like tokenizer: <unk> <s> </s>, then <0x00>..<0xFF>, then BPE pieces."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # Train on English only: CJK and emoji must then fall back to byte tokens.
    english = [line for line in CORPUS.splitlines() if line.isascii()]
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False)
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    base.train_from_iterator(english, trainer=trainer)
    trained = json.loads(base.to_str())["model"]

    # Rebuild with the special and byte tokens first in the model vocabulary, as
    # SentencePiece's converter lays it out.
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += sorted(trained["vocab"], key=trained["vocab"].get)
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                     decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_sentencepiece_byte_fallback_and_word_mark(sp_tok):
    tb = TokenBytes(sp_tok)
    assert not tb.byte_level
    assert tb.bytes_of(sp_tok.convert_tokens_to_ids("<0xE4>")) == b"\xe4"
    assert tb.bytes_of(sp_tok.convert_tokens_to_ids("<0x0A>")) == b"\n"
    assert tb.bytes_of(sp_tok.convert_tokens_to_ids("▁the")) == b" the"
    assert tb.is_special(sp_tok.convert_tokens_to_ids("</s>"))

    text = "the fox said 你好 🦀!"
    ids = sp_tok.encode(text, add_special_tokens=False)
    tokens = sp_tok.convert_ids_to_tokens(ids)
    assert "<0xE4>" in tokens and "<unk>" not in tokens
    # Metaspace marks the first word too; the raw bytes keep that space (decode strips it).
    assert joined(tb, ids) == (" " + text).encode()
    assert sp_tok.decode(ids) == text
    # A lone byte of a 3-byte character is lossy as text.
    assert tb.text_of(sp_tok.convert_tokens_to_ids("<0xE4>")) == "\ufffd"
