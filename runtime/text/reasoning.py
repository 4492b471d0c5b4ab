"""A reasoning model's `<think>...</think>` block split from its answer, whole or delta by delta.

The split applies when the chat template mentions `<think>` (Qwen3, DeepSeek-R1, QwQ, ...), or Gemma 4's
thought channel, `<|channel>thought\n...<channel|>` (its template mentions `<|channel>`: the block's
`thought` label line is not reasoning, as vLLM's gemma4 parser strips it), and follows vLLM's qwen3 /
deepseek_r1 reasoning parsers:

- the output opens its block itself (`<think>abc</think>xyz`, Qwen3 with thinking on): `abc` is the
  reasoning, `xyz` the answer; an output that does not start with `<think>` has no reasoning;
- the prompt opened it (the generation prompt ends inside `<think>`, DeepSeek-R1's templates): the
  output starts as reasoning, up to `</think>` (a `<think>` the model writes again first is dropped);
- a block that is never closed (the length ran out while thinking) is all reasoning, streamed or not.

Nothing is stripped beyond the tags (vLLM's behaviour: the answer after `</think>` keeps its leading
newlines). A tag split across deltas never leaks into either side: a delta's tail that could still
become a tag is held back until the next delta (or `finish`) says what it is.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START, THINK_END = "<think>", "</think>"
CHANNEL_START, CHANNEL_END, CHANNEL_LABEL = "<|channel>", "<channel|>", "thought\n"  # Gemma 4's


@dataclass(frozen=True)
class ReasoningMode:
    opened: bool  # the prompt left a block open: the output starts inside it
    start: str = THINK_START
    end: str = THINK_END
    label: str = ""  # a line the block opens with that is not reasoning (Gemma 4's "thought\n")


def reasoning_mode(template: str | None, prompt_text: str) -> ReasoningMode | None:
    """The split for a prompt rendered with `template` (None: the template has no thinking block,
    or no template applied)."""
    if not template:
        return None
    if THINK_START in template:
        start, end, label = THINK_START, THINK_END, ""
    elif CHANNEL_START in template:
        start, end, label = CHANNEL_START, CHANNEL_END, CHANNEL_LABEL
    else:
        return None
    return ReasoningMode(prompt_text.rfind(start) > prompt_text.rfind(end), start, end, label)


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` are a proper prefix of `tag` (kept back)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningSplitter:
    """Text deltas in, (reasoning, content) deltas out; `finish` flushes what was held back."""

    def __init__(self, mode: ReasoningMode):
        self.state = "start"  # "start": before the first non-tag text; then "label", "reasoning" or "content"
        self.opened = mode.opened
        self.start, self.end, self.label = mode.start, mode.end, mode.label
        self.buffer = ""
        self.block = False  # the output has a reasoning block (opened by the prompt or by itself)

    def feed(self, delta: str) -> tuple[str, str]:
        self.buffer += delta
        reasoning = content = ""
        while self.buffer:
            if self.state == "start":
                if self.buffer.startswith(self.start):
                    self.buffer = self.buffer[len(self.start):]
                    self.state, self.block = "label", True
                elif self.start.startswith(self.buffer):
                    break  # maybe the tag, cut short
                else:
                    self.state, self.block = ("label", True) if self.opened else ("content", False)
            elif self.state == "label":  # the block's label line, when the format has one
                if self.label and self.label.startswith(self.buffer) and self.buffer != self.label:
                    break  # maybe the label, cut short
                if self.label and self.buffer.startswith(self.label):
                    self.buffer = self.buffer[len(self.label):]
                self.state = "reasoning"
            elif self.state == "reasoning":
                end = self.buffer.find(self.end)
                if end >= 0:
                    reasoning += self.buffer[:end]
                    self.buffer = self.buffer[end + len(self.end):]
                    self.state = "content"
                else:
                    keep = _held(self.buffer, self.end)
                    reasoning += self.buffer[:len(self.buffer) - keep]
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    break
            else:
                content += self.buffer
                self.buffer = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The text held back at the end: a cut-short tag is text after all."""
        rest, self.buffer = self.buffer, ""
        if self.state == "start":
            self.state, self.block = ("reasoning", True) if self.opened else ("content", False)
        return (rest, "") if self.state in ("label", "reasoning") else ("", rest)


def split_reasoning(text: str, mode: ReasoningMode | None) -> tuple[str | None, str]:
    """(reasoning, content) of a whole output; reasoning None where the output has no block."""
    if mode is None:
        return None, text
    splitter = ReasoningSplitter(mode)
    reasoning, content = splitter.feed(text)
    more_reasoning, more_content = splitter.finish()
    return (reasoning + more_reasoning if splitter.block else None), content + more_content
