"""Tests for trt_llm.runtime.text.detokenizer: incremental UTF-8 text and stop strings."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from trt_llm.runtime.text.detokenizer import IncrementalDetokenizer
from trt_llm.runtime.text.token_bytes import TokenBytes


class Pieces:
    """A stand-in for TokenBytes whose token i is pieces[i]: exact control over token borders."""

    def __init__(self, pieces, special=()):
        self.pieces, self.special = list(pieces), set(special)

    def bytes_of(self, i):
        return self.pieces[i]

    def is_special(self, i):
        return i in self.special


def feed(pieces, stop, special=()):
    """Feed the pieces in order; return (detokenizer, number of tokens consumed)."""
    detok = IncrementalDetokenizer(Pieces(pieces, special), stop)
    for n in range(len(pieces)):
        if detok.add(n):
            return detok, n + 1
    return detok, len(pieces)


def bytewise(text: str) -> list[bytes]:
    """One token per byte: every multi-byte character is split."""
    return [bytes([b]) for b in text.encode()]


# -- text without stop strings ----------------------------------------------------


def test_incomplete_character_is_held_back():
    detok = IncrementalDetokenizer(Pieces([b"a\xe4", b"\xb8", b"\xad!", b"\xf0\x9f"]))
    seen = []
    for i in range(4):
        assert not detok.add(i)
        seen.append(detok.text)
    assert seen == ["a", "a", "a中!", "a中!"]
    assert detok.finish() == "a中!\ufffd" == b"a\xe4\xb8\xad!\xf0\x9f".decode("utf-8", "replace")
    assert detok.finish() == detok.text == "a中!\ufffd"  # idempotent


def test_special_tokens_add_no_text():
    detok, n = feed([b"hi", b"<|im_end|>", b" there"], stop=["hi<"], special={1})
    assert n == 3 and detok.finish() == "hi there" and detok.matched_stop is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=5), max_size=12))
def test_any_byte_stream_decodes_like_the_whole(pieces):
    """Invalid and split bytes come out exactly as one decode(errors="replace") of it all."""
    detok, _ = feed(pieces, stop=[])
    assert detok.finish() == b"".join(pieces).decode("utf-8", "replace")


# -- stop strings --------------------------------------------------------------------


def test_multi_token_stop():
    detok, n = feed(bytewise("Hello world. ###\nmore"), stop=["###"])
    assert n == len("Hello world. ###")  # halted on the token that completed it
    assert detok.finish() == "Hello world. " and detok.matched_stop == "###"


def test_stop_inside_the_first_token():
    detok, n = feed([b"Hello there", b"!"], stop=["ell"])
    assert n == 1 and detok.finish() == "H"


def test_stop_ends_in_the_middle_of_a_token():
    detok, n = feed([b"The", b" answer is", b" 42."], stop=["r i"])
    assert n == 2 and detok.finish() == "The answe"


def test_no_stop_runs_to_the_end():
    detok, n = feed([b"ab", b"a", b"c"], stop=["abab", "x"])
    assert n == 3 and not detok.stopped and detok.finish() == "abac"


def test_overlapping_occurrences_cut_at_the_first():
    detok, n = feed(bytewise("xababab"), stop=["abab"])
    assert n == 5 and detok.finish() == "x"


def test_earlier_start_wins_when_both_complete_on_one_token():
    # "bab" and "abab" both complete with the last "b"; "abab" starts first.
    detok, _ = feed(bytewise("xabab"), stop=["bab", "abab"])
    assert detok.finish() == "x" and detok.matched_stop == "abab"
    # Same inside one token, whatever the list order.
    detok, _ = feed([b"x", b"abab--cd"], stop=["cd", "bab", "abab"])
    assert detok.finish() == "x" and detok.matched_stop == "abab"


def test_halts_on_the_first_stop_to_appear():
    # "bc" is complete before "abcd" is, so generation halts there and then.
    detok, n = feed(bytewise("xabcd"), stop=["abcd", "bc"])
    assert n == 4 and detok.finish() == "xa" and detok.matched_stop == "bc"


def test_cjk_stop_over_split_characters():
    text = "你好世界！再见"
    detok, n = feed(bytewise(text), stop=["世界"])
    assert n == len("你好世界".encode()) and detok.finish() == "你好"


def test_emoji_stop():
    detok, _ = feed([b"ok \xf0\x9f", b"\x9a\x80\xf0", b"\x9f\x8c\x8d done"], stop=["🚀🌍"])
    assert detok.finish() == "ok " and detok.matched_stop == "🚀🌍"


def test_accented_stop_split_across_byte_tokens():
    # "é" is b"\xc3\xa9"; the stop "café" completes only with its second byte.
    detok, n = feed([b"un caf", b"\xc3", b"\xa9", b" noir"], stop=["café"])
    assert n == 3 and detok.finish() == "un "


def test_stop_waits_for_the_partial_character():
    # The stop "a中" ends inside a character whose bytes span three tokens: no halt until
    # the character is complete, and then the held-back bytes are not output.
    detok = IncrementalDetokenizer(Pieces([b"xa\xe4", b"\xb8", b"\xadz"]), ["a中"])
    assert not detok.add(0) and detok.text == "xa"
    assert not detok.add(1) and detok.text == "xa"
    assert detok.add(2) and detok.finish() == "x"


def test_stop_is_sticky_and_text_stays_cut():
    detok = IncrementalDetokenizer(Pieces([b"one. two", b" three"]), [". "])
    assert detok.add(0) and detok.text == "one"
    assert detok.add(1) and detok.finish() == "one" and detok.matched_stop == ". "


def test_stop_in_the_flushed_replacement_character():
    detok, _ = feed([b"ab\xe4"], stop=["b\ufffd"])
    assert not detok.stopped
    assert detok.finish() == "a" and detok.matched_stop == "b\ufffd"


def test_single_string_stop():
    detok, n = feed([b"a##", b"#b"], stop="###")
    assert n == 2 and detok.finish() == "a"


def test_empty_and_duplicate_stops():
    detok, n = feed([b"abc", b"abc"], stop=["", "bc", "bc"])
    assert n == 1 and detok.finish() == "a"


def test_long_stop_across_many_short_tokens():
    # The window must reach back max_stop_len - 1 characters, not just one token.
    detok, n = feed(bytewise("x" * 20 + "the end" + "y"), stop=["the end", "q"])
    assert n == 27 and detok.finish() == "x" * 20


# -- with real tokenizers ---------------------------------------------------------------

TEXTS = [
    "Hello world! The capital of France is Paris.",
    "中文：你好，世界！龍龜鬱 日本語とかな、한국어",
    "Emoji: 😀 🦀🦑 ❤️ 👍🏽 👨‍👩‍👧 Café naïve",
]


@pytest.fixture(scope="module")
def tiny(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tok, TokenBytes(tok)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    return tok, TokenBytes(tok)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_no_stop_equals_tokenizer_decode(name, request):
    tok, tb = request.getfixturevalue(name)
    text = "<|im_start|>assistant\n" + "\n".join(TEXTS) + "<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tb, ["never there"])
    assert not any(detok.add(i) for i in ids)
    expected = tok.decode(ids, skip_special_tokens=True)
    assert detok.finish() == expected == b"".join(
        tb.bytes_of(i) for i in ids if not tb.is_special(i)).decode("utf-8", "replace")


def test_stop_with_real_tokens(tiny):
    tok, tb = tiny
    ids = tok.encode("The weather today is sunny. 你好，世界！ The end.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tb, ["世界", "sunny and"])
    n = next(k + 1 for k, i in enumerate(ids) if detok.add(i))
    assert detok.finish() == "The weather today is sunny. 你好，"
    # Halted on the token that completed "界", not later.
    assert "世界" in tok.decode(ids[:n]) and "世界" not in tok.decode(ids[: n - 1])


# Few characters, so that random stop strings actually occur; multi-byte ones included.
ALPHABET = st.sampled_from(list("ab  .\n") + ["é", "中", "界", "😀", "🦀"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(ALPHABET, max_size=30),
       stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3))
def test_stops_iff_a_stop_string_appears(tiny, text, stops):
    tok, tb = tiny
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tb, stops)
    data = b""
    for k, i in enumerate(ids):
        data += tb.bytes_of(i)
        so_far = data.decode("utf-8", "ignore")  # complete characters only (text is valid UTF-8)
        present = [(so_far.find(s), len(s), s) for s in stops if s in so_far]
        halted = detok.add(i)
        assert halted == bool(present), (k, so_far)
        if halted:
            start, _, stop = min(present)
            assert detok.finish() == so_far[:start] and detok.matched_stop == stop
            assert text.startswith(so_far[:start] + stop)
            break
    else:
        assert not any(s in text for s in stops)
        assert detok.finish() == text == tok.decode(ids, skip_special_tokens=True)
    assert not any(s in detok.finish() for s in stops)


# -- streaming deltas ---------------------------------------------------------------


@given(pieces=st.lists(st.sampled_from([b"a", b"b", b"ab", b"\xe4", b"\xb8\xad", b"!", b"s", b"to", b"p", b"\xf0"]),
                       max_size=24),
       stop=st.lists(st.sampled_from(["stop", "ab!", "b", "\u4e2d!", "zz"]), max_size=2))
@settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_deltas_join_to_the_final_text_and_never_retract(pieces, stop):
    detok = IncrementalDetokenizer(Pieces(pieces), stop)
    streamed = ""
    for n in range(len(pieces)):
        halted = detok.add(n)
        streamed += detok.delta()
        assert detok.text.startswith(streamed)  # nothing handed out is ever taken back
        if halted:
            break
    final = detok.finish()
    streamed += detok.delta()
    assert streamed == final
    assert not any(s in streamed for s in stop if s)  # a stop string never reaches the stream


def test_a_possible_stop_start_is_held_back_until_it_cannot_be_one():
    detok = IncrementalDetokenizer(Pieces([b"hello s", b"t", b"ay", b"!"]), ["stop"])
    deltas = []
    for n in range(4):
        detok.add(n)
        deltas.append(detok.delta())
    assert deltas == ["hello ", "", "stay", "!"]  # "s", then "st" might have begun "stop"
