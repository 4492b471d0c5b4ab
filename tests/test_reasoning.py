"""A reasoning model's <think> block split from its answer (runtime/text/reasoning.py): the split
itself on hand-written outputs, whole and cut into deltas everywhere (a tag split across deltas
never leaks into either side), both ways a block opens (by the output, Qwen3's; by the prompt,
DeepSeek-R1's), and the output file's `reasoning_text` / `content_text` from a real run (the tiny
engine answering from a script: tests/scripted.py)."""

import itertools

import pytest

from helpers import run_input
from scripted import scripted_answers
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.runtime.text.reasoning import ReasoningMode, ReasoningSplitter, reasoning_mode, split_reasoning

OUTPUT, OPENED = ReasoningMode(opened=False), ReasoningMode(opened=True)


def _streamed(text: str, cuts, mode) -> tuple[str, str, bool]:
    splitter, reasoning, content = ReasoningSplitter(mode), "", ""
    bounds = [0, *cuts, len(text)]
    for start, stop in zip(bounds, bounds[1:]):
        r, c = splitter.feed(text[start:stop])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return reasoning + r, content + c, splitter.block


@pytest.mark.parametrize("text, mode, want", [
    ("<think>\nLet me see.\n</think>\n\nParis.", OUTPUT, ("\nLet me see.\n", "\n\nParis.")),
    ("Paris.", OUTPUT, (None, "Paris.")),  # no block: all content
    ("Paris. <think>x</think>", OUTPUT, (None, "Paris. <think>x</think>")),  # a block must come first
    ("<think>still thinking", OUTPUT, ("still thinking", "")),  # cut short: all reasoning
    ("<thin", OUTPUT, (None, "<thin")),  # a tag cut short is text after all
    ("Let me see.</think>Paris.", OPENED, ("Let me see.", "Paris.")),  # the prompt opened the block
    ("<think>Let me see.</think>Paris.", OPENED, ("Let me see.", "Paris.")),  # ... and the model again
    ("still thinking </thi", OPENED, ("still thinking </thi", "")),
    ("a</think>b</think>c", OPENED, ("a", "b</think>c")),  # only the first end tag closes it
    ("x", None, (None, "x")),
])
def test_split_whole_and_in_every_pair_of_cuts(text, mode, want):
    assert split_reasoning(text, mode) == want
    if mode is None:
        return
    for cuts in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        reasoning, content, block = _streamed(text, cuts, mode)
        assert (reasoning if block else None, content) == want, cuts


def test_a_tag_split_across_deltas_is_held_back_never_leaked():
    splitter = ReasoningSplitter(OUTPUT)
    assert splitter.feed("<th") == ("", "")
    assert splitter.feed("ink>abc</") == ("abc", "")
    assert splitter.feed("thi") == ("", "")
    assert splitter.feed("nk>\n\nxyz") == ("", "\n\nxyz")
    assert splitter.finish() == ("", "")


def test_mode_comes_from_the_template_and_the_prompt(npm_tokenizer):
    assert reasoning_mode(None, "x") is None
    assert reasoning_mode("{{ messages[0].content }}", "x") is None  # no thinking block in the template
    assert reasoning_mode("<think>", "<|im_start|>assistant\n") == OUTPUT
    assert reasoning_mode("<think>", "<|im_start|>assistant\n<think>\n") == OPENED
    assert reasoning_mode("<think>", "<|im_start|>assistant\n<think>\n\n</think>\n\n") == OUTPUT  # thinking off
    from trt_llm.runtime.text.prompt import PromptFormatter
    from trt_llm.runtime.text.tokenizer import Tokenizer
    from trt_llm.schemas.input_file import Message

    qwen3 = Tokenizer.from_dir(npm_tokenizer("qwen3"))
    messages = [Message(role="user", content="Hi")]
    for thinking in (True, False):
        prompt = PromptFormatter(qwen3, True, True, thinking).format(messages)
        assert prompt.reasoning == OUTPUT  # Qwen3: the output opens its block itself (thinking on)
    assert PromptFormatter(qwen3, False, True, True).format(messages).reasoning is None  # no template: no split


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))


def test_output_file_has_the_split_beside_the_whole_text(engine, monkeypatch):
    runner = Runner(EngineDir.open(engine), threads=1)
    tok = runner.tokenizer
    answer = "<think>\nThe capital of France is Paris.\n</think>\n\nParis."
    data = {"temperature": 0.0, "max_generate_length": 64, "enable_thinking": True,
            "requests": [{"messages": [{"role": "user", "content": "What is the capital of France?"}]}]}
    with scripted_answers(monkeypatch, tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]):
        response = run_input(engine, data).responses[0]
        plain = run_input(engine, {**data, "apply_chat_template": False}).responses[0]  # raw: no template, no split
    assert response.finish_reason == "end-of-sequence"
    assert response.output_text == answer
    assert response.reasoning_text == "\nThe capital of France is Paris.\n"
    assert response.content_text == "\n\nParis."
    assert plain.output_text == answer and plain.reasoning_text is None and plain.content_text is None
    assert "reasoning_text" not in plain.model_dump(exclude_none=True)  # the file has no such key then
