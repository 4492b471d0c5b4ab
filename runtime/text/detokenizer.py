"""Incremental detokenization with stop strings, one generated token at a time.

The output is the UTF-8 decode of the concatenated token bytes (special tokens skipped, but
the markup a parser reads: `keep`, Gemma 4's thought channel and tool-call tags, which its
tokenizer makes special tokens), so a character split across tokens comes out whole. Stop strings are matched on the
decoded text, each step only in the window where a new match can be.
"""

from __future__ import annotations

import codecs

from .token_bytes import TokenBytes


class IncrementalDetokenizer:
    """Feed token ids with `add`; read `text`, or `finish()` once generation is over; `delta()`
    hands out the new final text for streaming.

    Stop rule: generation halts at the first token after which some stop string occurs in
    the decoded text; among the stop strings present then, the earliest start wins, and the
    text is cut right before it.
    """

    def __init__(self, token_bytes: TokenBytes, stop: str | list[str] | tuple[str, ...] = (),
                 keep: frozenset[int] = frozenset()):
        self._tb = token_bytes
        self._keep_ids = keep  # special tokens written out all the same (markup_ids)
        if isinstance(stop, str):  # the input format allows a single string
            stop = [stop]
        # An empty stop string would match before any output; it is ignored.
        self._stops = [s for s in dict.fromkeys(stop) if s]
        # A new match ends in the new text, so it starts at most max_len-1 chars before it.
        self._keep = max(map(len, self._stops), default=1) - 1
        # The incremental decoder holds back an incomplete trailing sequence and replaces
        # invalid bytes exactly like bytes.decode(errors="replace") on the whole stream.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chunks: list[str] = []  # decoded text, joined only when read
        self._length = 0  # characters in _chunks
        self._tail = ""  # last `_keep` characters of the decoded text
        self._cut: int | None = None  # where the text ends once a stop string matched
        self._finished: str | None = None
        self._streamed = 0  # characters handed out by delta()
        self.matched_stop: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched_stop is not None

    def add(self, token_id: int) -> bool:
        """Append one generated token; True once a stop string appeared (halt generation)."""
        if self.stopped:
            return True
        if not self._tb.is_special(token_id) or token_id in self._keep_ids:
            self._append(self._decoder.decode(self._tb.bytes_of(token_id)))
        return self.stopped

    def _append(self, new: str) -> None:
        if not new:
            return
        if self._stops:
            window = self._tail + new
            offset = self._length - len(self._tail)  # absolute position of window[0]
            # (start, end) orders by earliest start, then the one completed first.
            found = [(i, i + len(s), s) for s in self._stops if (i := window.find(s)) >= 0]
            if found:
                start, _, self.matched_stop = min(found)
                self._cut = offset + start
            self._tail = window[max(0, len(window) - self._keep):] if self._keep else ""
        self._chunks.append(new)
        self._length += len(new)

    @property
    def text(self) -> str:
        """The output text so far (complete characters only; cut before a matched stop).

        Joins the decoded chunks, so it costs O(length): read it when needed, not every step.
        """
        if self._finished is not None:
            return self._finished
        text = "".join(self._chunks)
        self._chunks = [text]
        return text if self._cut is None else text[: self._cut]

    def delta(self) -> str:
        """The output text new since the last call, for streaming: only text that is final, so the
        deltas joined are always a prefix of the final text and, after finish(), all of it. The end
        of the text that could still begin a stop string is held back until it cannot (or is cut)."""
        text = self.text
        stable = len(text)
        if self._finished is None and not self.stopped:
            stable -= self._possible_stop_start(text)
        out = text[self._streamed:stable]
        self._streamed = max(self._streamed, stable)
        return out

    def _possible_stop_start(self, text: str) -> int:
        """How many trailing characters of `text` are a proper prefix of some stop string."""
        for k in range(min(self._keep, len(text)), 0, -1):
            if any(stop.startswith(text[-k:]) for stop in self._stops):
                return k
        return 0

    def finish(self) -> str:
        """Final text: held-back incomplete bytes become U+FFFD; a stop string is cut off."""
        if self._finished is None:
            if not self.stopped:
                # The flushed U+FFFD is text too: a stop string may end in it.
                self._append(self._decoder.decode(b"", final=True))
            self._finished = self.text
        return self._finished


# Tags a chat template's answers are parsed by (runtime/text/reasoning.py, server/gemma4_tool_calls.py)
# that a tokenizer may make special tokens (Gemma 4's): written out when the template mentions them.
MARKUP = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>')


def markup_ids(tokenizer) -> frozenset[int]:
    """The ids of the MARKUP tags some template of `tokenizer` mentions and its vocabulary has."""
    templates = "".join(getattr(tokenizer, "templates", {}).values())
    ids = (tokenizer.token_to_id(tag) for tag in MARKUP if tag in templates)
    return frozenset(i for i in ids if i is not None)
