"""Function calls in a chat answer: Llama 3.1 / 3.2's JSON format (vLLM's `llama3_json` parser),

    {"name": "get_weather", "parameters": {"city": "Paris"}}

an answer that is nothing but a call, or several separated by `;`, optionally after the
`<|python_tag|>` token, as those templates ask ('Respond in the format {"name": function name,
"parameters": dictionary of argument name and its value}') and render an assistant's own calls.
Parsed into OpenAI's `tool_calls` (tool_calls.ToolCall), whole or delta by delta, the same either way.

An answer whose first non-space text is neither `{` nor the tag is content, passed on as it comes.
One that starts like a call is held: each JSON object is a call once it is whole (and has a string
`name` and an object `parameters`, or `arguments`); what follows the calls, or an answer that turns
out not to be calls at all, is content as the model wrote it.
"""

from __future__ import annotations

import json

from trt_llm.server.tool_calls import ToolCall, _call

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser:
    """tool_calls.HermesParser's interface: content deltas in; (content delta, new calls) out."""

    def __init__(self, parallel: bool = True):
        self.parallel = parallel
        self.raw = ""  # the answer so far, as written
        self.mode: str | None = None  # None: undecided; "text": content; "calls": calls so far
        self.at = 0  # calls: where in `raw` the next call may start
        self.calls: list[ToolCall] = []
        self.parsed = 0  # calls parsed (kept or not)

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        self.raw += delta
        if self.mode is None:
            head = self.raw.lstrip()
            if not head or PYTHON_TAG.startswith(head):  # (whitespace, or a tag cut short: wait)
                return "", []
            self.mode = "calls" if head.startswith(("{", PYTHON_TAG)) else "text"
            if self.mode == "text":
                return self.raw, []
            self.at = len(self.raw) - len(head) + (len(PYTHON_TAG) if head.startswith(PYTHON_TAG) else 0)
        if self.mode == "text":
            return delta, []
        return "", self._calls()

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.mode == "text":
            return "", []
        if self.mode is None:
            return self.raw, []
        calls = self._calls()
        rest = self.raw[self.at:].strip().lstrip(";").strip()
        if not self.parsed:  # not calls after all: the model's text, as it wrote it
            return self.raw, calls
        return rest, calls

    def _calls(self) -> list[ToolCall]:
        """The calls whole since the last look."""
        decoder, found = json.JSONDecoder(), []
        while True:
            start = self.at
            while start < len(self.raw) and (self.raw[start].isspace() or self.raw[start] == ";"):
                start += 1
            if start >= len(self.raw) or self.raw[start] != "{":
                return found
            try:
                value, end = decoder.raw_decode(self.raw, start)
            except ValueError:  # not whole yet (or never: then it is content at the end)
                return found
            call = _call(json.dumps(value), len(self.calls)) if isinstance(value, dict) else None
            if call is None:
                return found
            self.at, self.parsed = end, self.parsed + 1
            if self.parallel or not self.calls:
                self.calls.append(call)
                found.append(call)
