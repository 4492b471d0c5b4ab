"""Function calls in a chat answer: the Hermes format of Qwen 2.5 / 3 (and NousResearch's Hermes),

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

parsed into OpenAI's `tool_calls` (ids `call_<random>`, the arguments as a JSON string), whole or
delta by delta, the same either way (the whole answer is its deltas fed at once).

The text outside the calls is the answer's content, without the whitespace that separates it from a
call. A call whose body is not a JSON object with a string `name` (and an object `arguments`) is
left in the content as the model wrote it, never an error; one the length cut short is parsed if its
body is already whole. Streaming holds back only what could still be the start of a call (a cut-short
`<tool_call>`, a call not yet closed) and whitespace that may turn out to precede one.

The parser is chosen from the chat template (it mentions `<tool_call>`: hermes; it renders calls
with their `"parameters"`: Llama 3's JSON, server/llama3_tool_calls.py; `<|tool_call>`: Gemma 4's
`call:name{...}`, server/gemma4_tool_calls.py), or by `--tool-call-parser` (hermes, llama3_json,
gemma4, none).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
PARSERS = ("auto", "hermes", "llama3_json", "gemma4", "none")


def tool_parser_for(template: str | None, choice: str = "auto") -> str | None:
    """The parser for a chat template: "hermes", "llama3_json", "gemma4", or None (no tool calls are parsed)."""
    if choice == "none":
        return None
    if choice in ("hermes", "llama3_json", "gemma4"):
        return choice
    if not template:
        return None
    if "<|tool_call>" in template:  # (Gemma 4's tag, before Hermes's: both name a tool_call)
        return "gemma4"
    if CALL_START in template:
        return "hermes"
    # Llama 3.1 / 3.2: 'Respond in the format {"name": ..., "parameters": ...}', calls rendered so
    if '"parameters"' in template and "tool_call" in template:
        return "llama3_json"
    return None


def make_parser(name: str, parallel: bool = True):
    """The streaming parser of a format tool_parser_for names."""
    if name == "llama3_json":
        from trt_llm.server.llama3_tool_calls import Llama3JsonParser

        return Llama3JsonParser(parallel)
    if name == "gemma4":
        from trt_llm.server.gemma4_tool_calls import Gemma4Parser

        return Gemma4Parser(parallel)
    return HermesParser(parallel)


@dataclass
class ToolCall:
    index: int
    name: str
    arguments: str  # a JSON object's text
    id: str = ""

    def __post_init__(self):
        self.id = self.id or f"call_{secrets.token_hex(12)}"

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(body: str, index: int) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return None
        arguments = decoded
    if not isinstance(arguments, dict):
        return None
    return ToolCall(index, value["name"], json.dumps(arguments, ensure_ascii=False))


def _held(text: str, tag: str) -> int:
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesParser:
    """Content deltas in; (content delta, new calls) out. `parallel`: False keeps the first call only
    (the later ones are dropped, as vLLM drops them). A format of another body between other tags
    (Gemma 4's) is a subclass: its `start`, `end` and `parse`."""

    start, end = CALL_START, CALL_END

    @staticmethod
    def parse(body: str, index: int) -> "ToolCall | None":
        """A call's body (between the tags, stripped) as call `index`; None: not a call."""
        return _call(body, index)

    def __init__(self, parallel: bool = True):
        self.parallel = parallel
        self.buffer = ""  # text not yet looked at: a cut-short tag, or a call's body so far
        self.in_call = False
        self.space = ""  # the current text's trailing whitespace, held back: dropped if a call follows
        self.after_call = False  # the current text follows a call: its leading whitespace is dropped
        self.calls: list[ToolCall] = []
        self.called = False  # a call was parsed (kept or not)

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.buffer += delta
        out, calls = [], []
        while self.buffer:
            if self.in_call:
                end = self.buffer.find(self.end)
                if end < 0:
                    break
                body, self.buffer = self.buffer[:end], self.buffer[end + len(self.end):]
                self.in_call = False
                self._close(body, self.start + body + self.end, out, calls)
                continue
            start = self.buffer.find(self.start)
            if start >= 0:
                self._text(self.buffer[:start], out)
                self.buffer = self.buffer[start + len(self.start):]
                self.in_call = True
                continue
            keep = _held(self.buffer, self.start)
            self._text(self.buffer[:len(self.buffer) - keep], out)
            self.buffer = self.buffer[len(self.buffer) - keep:]
            break
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        out, calls = [], []
        rest, self.buffer = self.buffer, ""
        if self.in_call:  # cut short: a call if its body is whole already
            self.in_call = False
            self._close(rest, self.start + rest, out, calls)
        else:
            self._text(rest, out)
        if not self.called:  # an answer that made a call ends without trailing whitespace
            out.append(self.space)
        self.space = ""
        return "".join(out), calls

    def _text(self, text: str, out: list[str]) -> None:
        if self.after_call:
            text = text.lstrip()
        if not text:
            return
        stripped = text.rstrip()
        if stripped:
            out += [self.space, stripped]
            self.space, self.after_call = text[len(stripped):], False
        else:
            self.space += text

    def _close(self, body: str, raw: str, out: list[str], calls: list[ToolCall]) -> None:
        call = self.parse(body.strip(), len(self.calls))
        if call is None:  # not a call after all: the model's text, as it wrote it
            self._text(raw, out)
            return
        self.space, self.after_call, self.called = "", True, True
        if self.parallel or not self.calls:
            self.calls.append(call)
            calls.append(call)


def parse_tool_calls(text: str, parallel: bool = True, name: str = "hermes") -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole answer."""
    parser = make_parser(name, parallel)
    content, calls = parser.feed(text)
    more, later = parser.finish()
    return content + more, calls + later
