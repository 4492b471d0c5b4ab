"""Function calls in a chat answer: Gemma 4's format (its chat template renders calls so, vLLM's
`gemma4` parser reads them),

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,metric:true}<tool_call|>

several in a row without a separator, parsed into OpenAI's `tool_calls` (tool_calls.ToolCall) whole or
delta by delta, the same either way: tool_calls.HermesParser's streaming and whitespace rules between
these tags. Inside the braces: keys unquoted, strings between `<|"|>` marks (the string-escape token:
its text may hold quotes, braces and commas), numbers, true / false / null, nested {...} objects and
[...] arrays. A body that is not `call:<name>{...}` or whose arguments do not parse is left in the
content as the model wrote it, never an error. tool_choice `required` and a named function make the answer
such calls with a grammar (server/gemma4_tool_grammar.py: the arguments as the template writes them).

The tags are special tokens in Gemma 4's vocabulary: the detokenizer writes them out because the
template mentions them (runtime/text/detokenizer.markup_ids).
"""

from __future__ import annotations

import json
import re

from trt_llm.server.tool_calls import HermesParser, ToolCall

TOOL_CALL_START, TOOL_CALL_END, STRING = "<|tool_call>", "<tool_call|>", '<|"|>'
_CALL = re.compile(r"call:([\w.\-]+)\{(.*)\}", re.DOTALL)
_BARE = {"true": True, "false": False, "null": None}


class _Arguments:
    """A recursive-descent reader of the value syntax above; ValueError where it is not that."""

    def __init__(self, text: str):
        self.text, self.at = text, 0

    def _space(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def _expect(self, char: str) -> None:
        self._space()
        if not self.text.startswith(char, self.at):
            raise ValueError(f"expected {char!r} at {self.at}")
        self.at += len(char)

    def value(self):
        self._space()
        if self.text.startswith(STRING, self.at):
            end = self.text.find(STRING, self.at + len(STRING))
            if end < 0:
                raise ValueError("a string that does not end")
            value, self.at = self.text[self.at + len(STRING): end], end + len(STRING)
            return value
        if self.text.startswith("{", self.at):
            return self.object()
        if self.text.startswith("[", self.at):
            return self.array()
        match = re.compile(r"[^,\]}]+").match(self.text, self.at)
        if match is None:
            raise ValueError(f"no value at {self.at}")
        self.at = match.end()
        bare = match.group().strip()
        if bare in _BARE:
            return _BARE[bare]
        try:
            number = json.loads(bare)
        except ValueError:
            raise ValueError(f"{bare!r} is not a value") from None
        if not isinstance(number, (int, float)):
            raise ValueError(f"{bare!r} is not a value")
        return number

    def object(self) -> dict:
        self._expect("{")
        result = {}
        self._space()
        while not self.text.startswith("}", self.at):
            if result:
                self._expect(",")
            self._space()
            key = self.value() if self.text.startswith(STRING, self.at) else self._key()
            self._expect(":")
            result[key] = self.value()
            self._space()
        self.at += 1
        return result

    def _key(self) -> str:
        match = re.compile(r"[^:,{}\[\]]+").match(self.text, self.at)
        if match is None or not match.group().strip():
            raise ValueError(f"no key at {self.at}")
        self.at = match.end()
        return match.group().strip()

    def array(self) -> list:
        self._expect("[")
        result = []
        self._space()
        while not self.text.startswith("]", self.at):
            if result:
                self._expect(",")
            result.append(self.value())
            self._space()
        self.at += 1
        return result


def parse_arguments(text: str) -> dict:
    """`{...}` in Gemma 4's syntax as a dict; ValueError where it is not."""
    reader = _Arguments(text)
    result = reader.object()
    reader._space()
    if reader.at != len(text):
        raise ValueError(f"text after the arguments at {reader.at}")
    return result


class Gemma4Parser(HermesParser):
    start, end = TOOL_CALL_START, TOOL_CALL_END

    @staticmethod
    def parse(body: str, index: int) -> ToolCall | None:
        match = _CALL.fullmatch(body)
        if match is None:
            return None
        try:
            arguments = parse_arguments("{" + match.group(2) + "}")
        except ValueError:
            return None
        return ToolCall(index, match.group(1), json.dumps(arguments, ensure_ascii=False))
