"""What a speech upload may cost the server before it is decoded: its duration, read from the file's
header (`--max-audio-seconds`, 1,800 s by default), and the memory its decode takes, counted with every
other decode running against one budget (`--audio-decode-budget`, 256 MB by default).

The duration limit is lower than trt-llm-run's (`whisper.max_audio_seconds`, 7,200 s): an input file
is the operator's own, an upload anyone's. 30 minutes is where hosted speech APIs draw the line for one
synchronous request (OpenAI's 25 MB upload holds about that much compressed speech), and a Whisper
transcription of it already keeps an engine row busy for minutes; a longer recording is the batch
runner's job. A clip over it is refused with a 400 naming the limit, its samples never decoded.

The budget bounds what concurrent decodes hold together. A decode's memory is measured, not guessed
(tracemalloc's peak, benchmarks/results/2026-12-06/audio_memory.json): a Whisper clip decoded as a
stream (over 30 s, timestamps or VAD: runtime/media/audio/streaming.py) holds some 19 MB whatever its
length (STREAMED_BYTES); a clip decoded whole (a Whisper clip of at most 30 s, a Qwen3-ASR clip) about
830 KB a second of audio, its features included (WHOLE_BYTES_PER_SECOND). A decode waits, first come
first served, until its cost fits beside those running (one larger than the whole budget runs alone);
a wait costs nothing but the upload already on disk. More than `max_waiting` decodes waiting
(--max-queue, the engine queue's bound) is a 429, as a full engine queue is.
"""

from __future__ import annotations

import asyncio
import collections
import math
from contextlib import asynccontextmanager

from trt_llm.server.app import HttpError

DEFAULT_MAX_AUDIO_SECONDS = 1800.0
DEFAULT_DECODE_BUDGET = 256 << 20
STREAMED_BYTES = 24 << 20  # measured 18.7 MB for 2 to 10 minutes at 16 and 44.1 kHz: a block's spectra
WHOLE_BYTES_PER_SECOND = 1 << 20  # measured 830 KB/s (30 s at 16 kHz mono and 44.1 kHz stereo)
WHISPER_WINDOW_SECONDS = 30.0


def decode_cost(seconds: float, streamed: bool) -> int:
    """The bytes a decode of `seconds` of audio is counted for."""
    whole = math.ceil(seconds * WHOLE_BYTES_PER_SECOND)
    return min(whole, STREAMED_BYTES) if streamed else whole


def refuse_long(seconds: float, limit: float, filename: str) -> None:
    if seconds > limit:
        raise HttpError(400, f"file: {filename!r} is {seconds:.2f} s long, over the server's limit of {limit:g} s "
                             "(--max-audio-seconds)", "file", "audio_too_long")


class DecodeBudget:
    """Bytes that the decodes running hold together; `hold(cost)` waits its turn (FIFO) until they fit."""

    def __init__(self, total: int, max_waiting: int):
        self.total, self.max_waiting = total, max_waiting
        self.used = 0
        self._queue: collections.deque[asyncio.Future] = collections.deque()

    def _admit(self) -> None:
        """Wake the waiters at the head of the line whose cost fits now."""
        while self._queue:
            head = self._queue[0]
            if head.done():  # given up (its client left): out of the line
                self._queue.popleft()
                continue
            if self.used + head.cost > self.total and self.used:
                return
            self._queue.popleft()
            self.used += head.cost
            head.set_result(None)

    @asynccontextmanager
    async def hold(self, cost: int):
        cost = min(cost, self.total)  # a decode larger than the whole budget runs alone
        if not self._queue and self.used + cost <= self.total:
            self.used += cost
        else:
            if len(self._queue) >= self.max_waiting:
                raise HttpError(429, f"file: {len(self._queue)} audio decodes are already waiting for memory "
                                     f"(--audio-decode-budget {self.total / (1 << 20):g} MB); try again later",
                                "file", "decode_budget_full")
            waiter = asyncio.get_running_loop().create_future()
            waiter.cost = cost
            self._queue.append(waiter)
            try:
                await waiter
            except BaseException:  # its client left while it waited
                if waiter.done() and not waiter.cancelled():  # admitted as it was cancelled: give it back
                    self.used -= cost
                self._admit()  # those behind it may fit now
                raise
        try:
            yield
        finally:
            self.used -= cost
            self._admit()
