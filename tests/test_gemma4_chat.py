"""Gemma 4's chat markup (issue 43): its tool calls, `<|tool_call>call:name{key:<|"|>text<|"|>,...}<tool_call|>`
(server/gemma4_tool_calls.py), its thought channel, `<|channel>thought\\n...<channel|>`
(runtime/text/reasoning.py), and the detokenizer writing those tags out although Gemma 4's vocabulary
makes them special tokens. The oracles: the format as vLLM's gemma4 parsers document it (hand-written
answers and the dicts they mean), the whole answer and its deltas giving the same result, and a
Gemma-4-shaped tokenizer (tests/family_assets.make_gemma4_tokenizer) whose template renders the calls."""

import json
from pathlib import Path

import pytest

import family_assets
from trt_llm.runtime.text.detokenizer import IncrementalDetokenizer, markup_ids
from trt_llm.runtime.text.reasoning import ReasoningSplitter, reasoning_mode, split_reasoning
from trt_llm.runtime.text.token_bytes import TokenBytes
from trt_llm.runtime.text.tokenizer import Tokenizer
from trt_llm.server.gemma4_tool_calls import parse_arguments
from trt_llm.server.tool_calls import make_parser, parse_tool_calls, tool_parser_for

Q = '<|"|>'


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


def streamed(text: str, name: str = "gemma4", parallel: bool = True):
    """The answer fed a character at a time (every tag split across deltas)."""
    parser = make_parser(name, parallel)
    content, calls = "", []
    for char in text:
        more, new = parser.feed(char)
        content, calls = content + more, calls + new
    more, new = parser.finish()
    return content + more, calls + new


ANSWERS = {
    "one call": (call("get_weather", f"city:{Q}Paris{Q},days:3"), "", [("get_weather", {"city": "Paris", "days": 3})]),
    "text, then two calls": (
        "Let me check. " + call("get_weather", f"city:{Q}Paris{Q}") + call("get_time", f"zone:{Q}CET{Q}"),
        "Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    "every kind of value": (
        call("book", f"who:{Q}Ann, \"Bo\" {{x}}{Q},n:-2.5,ok:true,no:false,none:null,"
                     f"seats:[{Q}1A{Q},{Q}1B{Q}],when:{{day:{Q}Mon{Q},slots:[9,10]}},empty:{{}}"),
        "", [("book", {"who": 'Ann, "Bo" {x}', "n": -2.5, "ok": True, "no": False, "none": None,
                       "seats": ["1A", "1B"], "when": {"day": "Mon", "slots": [9, 10]}, "empty": {}})]),
    "no arguments": (call("now", ""), "", [("now", {})]),
    "not a call: left as written": (
        "<|tool_call>weather please<tool_call|>", "<|tool_call>weather please<tool_call|>", []),
    "arguments that do not parse": (call("f", f"a:{Q}open"), call("f", f"a:{Q}open"), []),
    "plain text": ("No tools needed: 3 < 4.", "No tools needed: 3 < 4.", []),
}


@pytest.mark.parametrize("case", ANSWERS)
def test_calls_parse_whole_and_streamed_alike(case):
    text, content, expected = ANSWERS[case]
    for got_content, calls in (parse_tool_calls(text, name="gemma4"), streamed(text)):
        assert got_content == content
        assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
        assert [c.index for c in calls] == list(range(len(expected)))


def test_one_call_when_not_parallel_and_a_call_cut_short():
    text = call("a", "x:1") + call("b", "y:2")
    assert [c.name for c in streamed(text, parallel=False)[1]] == ["a"]
    # the length ran out before the end tag: its body is whole, so it is a call
    content, calls = parse_tool_calls("<|tool_call>call:a{x:1}", name="gemma4")
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1})]


@pytest.mark.parametrize("text", ["{a:1,}", "{a:}", "{:1}", "{a:1} b", f"{{a:{Q}x}}"])
def test_malformed_arguments_are_refused(text):
    with pytest.raises(ValueError):
        parse_arguments(text)


def test_the_template_chooses_the_parser():
    assert tool_parser_for(family_assets.GEMMA4_TEMPLATE) == "gemma4"
    assert tool_parser_for("{{ '<tool_call>' }}") == "hermes"
    assert tool_parser_for(family_assets.GEMMA4_TEMPLATE, "none") is None


THOUGHT = "<|channel>thought\nThe user wants a number.<channel|>42"


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_the_thought_channel_splits_off(size):
    mode = reasoning_mode(family_assets.GEMMA4_TEMPLATE + "<|channel>", "<|turn>model\n")
    assert mode is not None and not mode.opened
    splitter = ReasoningSplitter(mode)
    reasoning = content = ""
    for start in range(0, len(THOUGHT), size):
        r, c = splitter.feed(THOUGHT[start:start + size])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    assert (reasoning + r, content + c) == ("The user wants a number.", "42")
    assert split_reasoning("Just 42.", mode) == (None, "Just 42.")
    # a prompt that opened the channel: the output starts inside it
    opened = reasoning_mode(family_assets.GEMMA4_TEMPLATE + "<|channel>", "<|turn>model\n<|channel>")
    assert split_reasoning("thought\nhm<channel|>7", opened) == ("hm", "7")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    cache = Path("~/.cache/trt-llm-tests").expanduser()
    try:
        folder = family_assets.make_gemma4_tokenizer(tmp_path_factory.mktemp("gemma4_tokenizer"), cache)
    except family_assets.assets.AssetUnavailable as exc:
        pytest.skip(f"the gemma3 tokenizer is unavailable: {exc}")
    return Tokenizer.from_dir(folder)


def test_the_detokenizer_writes_out_the_markup_the_template_mentions(tokenizer):
    """Gemma 4's tags are special tokens: skipped by default, written out when the template mentions them,
    so the calls and the thought channel reach their parsers; <turn|> (end of turn) stays skipped."""
    markup = markup_ids(tokenizer)
    assert markup == {tokenizer.token_to_id(t) for t in ('<|tool_call>', '<tool_call|>', Q)}
    answer = call("get_weather", f"city:{Q}Paris{Q}")
    ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.token_to_id("<turn|>")]
    token_bytes = TokenBytes(tokenizer.backend)
    assert all(token_bytes.is_special(i) for i in markup)

    def text(keep):
        detokenizer = IncrementalDetokenizer(token_bytes, keep=keep)
        for i in ids:
            detokenizer.add(i)
        return detokenizer.finish()

    assert text(markup) == answer
    assert text(frozenset()) == "call:get_weather{city:Paris}"
    content, calls = parse_tool_calls(text(markup), name="gemma4")
    assert content == "" and json.loads(calls[0].arguments) == {"city": "Paris"}


def test_an_assistant_call_renders_as_the_parser_reads_it(tokenizer):
    """The template's own rendering of an assistant's call parses back to that call."""
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"days": 3, "city": "Paris", "metric": True}}}]}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    rendered = tokenizer.apply_chat_template(messages, tools=tools)
    turn = rendered.split("<|turn>model\n")[1].split("<turn|>")[0]
    assert turn == f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3,metric:true}}<tool_call|>"  # keys sorted
    _, calls = parse_tool_calls(turn, name="gemma4")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3, "metric": True})]
