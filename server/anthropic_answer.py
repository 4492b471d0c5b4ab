"""The chat route's answer (app.py's `_Answer`: the reasoning split, then the tool-call parser,
update by update) as Anthropic's message: its content blocks and the stream events that build them,
made by the same `Blocks`, so that the whole message is exactly its stream assembled."""

from __future__ import annotations

import json
import uuid

from trt_llm.runtime.engine.sequence import MAX_LENGTH, STOP_WORDS, TIMEOUT
from trt_llm.server.engine import Update


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


class Blocks:
    """The answer's content blocks as they grow, and the stream events that grow them: `feed` takes
    one update's (reasoning, content, calls) deltas from the chat route's `_Answer`."""

    def __init__(self, show_thinking: bool):
        self.show_thinking = show_thinking
        self.blocks: list[dict] = []
        self.open = False  # the last block is still being written
        self.pinged = False

    def feed(self, reasoning: str, content: str, calls) -> list[tuple[str, dict]]:
        events = []
        if reasoning:
            self._write("thinking", reasoning, events)
        if content:
            self._write("text", content, events)
        for call in calls:
            self._close(events)
            block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
            self._start(block, events)
            block["input"] = json.loads(call.arguments)  # the parser's JSON object text
            events.append(("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": call.arguments}}))
        return events

    def finish(self) -> list[tuple[str, dict]]:
        events = []
        self._close(events)
        self._ping(events)
        return events

    def _write(self, kind: str, text: str, events: list) -> None:
        if not (self.open and self.blocks[-1]["type"] == kind):
            if kind == "text" and self.blocks and self.blocks[-1]["type"] == "thinking":
                # The newlines between </think> and the answer separate the blocks (as those around a
                # call do): held back until the text itself begins, never a block of their own.
                text = text.lstrip()
                if not text:
                    return
            self._close(events)
            self._start({"type": "text", "text": ""} if kind == "text" else
                        {"type": "thinking", "thinking": "", "signature": ""}, events)
        if kind == "thinking" and not self.show_thinking:  # display "omitted": the block, not its text
            return
        self.blocks[-1][kind] += text
        events.append(("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1,
                                               "delta": {"type": f"{kind}_delta", kind: text}}))

    def _start(self, block: dict, events: list) -> None:
        self.blocks.append(block)
        self.open = True
        events.append(("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                               "content_block": dict(block)}))
        self._ping(events)  # as Anthropic's published stream: after the first block's start

    def _ping(self, events: list) -> None:
        if not self.pinged:
            self.pinged = True
            events.append(("ping", {"type": "ping"}))

    def _close(self, events: list) -> None:
        if self.open:
            self.open = False
            events.append(("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1}))


class AnthropicMessage:
    """One request's message: the chat route's answer (app.py's `_Answer`, which splits the reasoning
    and parses the calls) rendered as Anthropic's blocks and events."""

    def __init__(self, answer, model: str, show_thinking: bool):
        self.answer, self.model = answer, model
        self.id = f"msg_{uuid.uuid4().hex}"
        self.blocks = Blocks(show_thinking)

    def add(self, update: Update) -> list[tuple[str, dict]]:
        self.answer.add(update)
        events = self.blocks.feed(*self.answer._delta)  # the update's reasoning, content and new calls
        if update.finished:
            events += self.blocks.finish()
        return events

    def _stop(self) -> tuple[str, str | None]:
        s = self.answer.sequence
        if self.answer.tool_calls:
            return "tool_use", None
        if s.finish_reason == MAX_LENGTH:
            return "max_tokens", None
        if s.finish_reason == TIMEOUT:  # its body's timeout passed: the answer so far (ours, beyond Anthropic's)
            return "timeout", None
        if s.finish_reason == STOP_WORDS:
            return "stop_sequence", s.detokenizer.matched_stop
        return "end_turn", None

    def _head(self, content: list, stop: tuple[str | None, str | None], output_tokens: int) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": {"input_tokens": len(self.answer.sequence.prompt_ids), "output_tokens": output_tokens}}

    def whole(self) -> dict:
        return self._head(self.blocks.blocks, self._stop(), len(self.answer.sequence.generated))

    def start(self) -> tuple[str, dict]:
        return "message_start", {"type": "message_start", "message": self._head([], (None, None), 0)}

    def end(self) -> list[tuple[str, dict]]:
        reason, sequence = self._stop()
        return [("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": {"output_tokens": len(self.answer.sequence.generated)}}),
                ("message_stop", {"type": "message_stop"})]


def sse(event: str, payload: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
