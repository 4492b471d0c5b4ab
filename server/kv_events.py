"""GET /v1/kv_events: the context cache's KV events (runtime/cache/kv_events.py) as a stream a router
reads, newline-delimited JSON, one batch a line (vLLM's KVEventBatch, with a sequence number):

    {"seq": 7, "ts": 1733500000.1, "replay": false, "events": [{"type": "BlockStored", ...}]}

A subscriber that connects first gets one batch with "replay": true: a BlockStored for every block
the cache holds at that moment (oldest first), its "seq" the last event that picture includes; then
every event after it, one a line, seq counting up by one from there (a gap means events were lost:
reconnect for a new replay). A subscriber that falls more than MAX_BEHIND batches behind is dropped
(its stream ends) rather than holding the server's memory.

The events come from the engine thread (where the cache changes); `KvEventHub` keeps the cache's
picture (the blocks held, by key) under a lock beside the sequence number, so a new subscriber's
replay and its live events meet without a gap or a repeat.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from fastapi.responses import StreamingResponse

MAX_BEHIND = 4096  # batches queued for one subscriber before it is dropped
KEEPALIVE_S = 15.0  # an empty line this often keeps an idle stream's proxies from closing it


class KvEventHub:
    def __init__(self, cache):
        self.seq = 0
        self._held: dict[str, dict] = {}  # key -> its BlockStored event, in the order stored
        self._subscribers: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = []
        self._lock = threading.Lock()
        self.unsubscribe = cache.subscribe(self._on_event, replay=True)

    def _on_event(self, event: dict) -> None:
        """The cache's callback (the engine thread)."""
        with self._lock:
            if event["type"] == "BlockStored":
                for key in event["block_hashes"]:
                    self._held[key] = event
            elif event["type"] == "BlockRemoved":
                for key in event["block_hashes"]:
                    self._held.pop(key, None)
            else:
                self._held.clear()
            self.seq += 1
            batch = {"seq": self.seq, "ts": time.time(), "replay": False, "events": [event]}
            for loop, queue in list(self._subscribers):
                try:
                    loop.call_soon_threadsafe(_offer, queue, batch)
                except RuntimeError:  # its event loop is closed: nobody reads it any more
                    self._subscribers.remove((loop, queue))

    def open(self) -> tuple[dict, asyncio.Queue]:
        """A new subscriber (on the event loop): its replay batch and the queue of the batches after it."""
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            replay = {"seq": self.seq, "ts": time.time(), "replay": True, "events": list(self._held.values())}
            self._subscribers.append((asyncio.get_running_loop(), queue))
        return replay, queue

    def close(self, queue: asyncio.Queue) -> None:
        with self._lock:
            self._subscribers = [(loop, q) for loop, q in self._subscribers if q is not queue]


def _offer(queue: asyncio.Queue, batch: dict) -> None:
    if queue.qsize() < MAX_BEHIND:
        queue.put_nowait(batch)
    elif queue.qsize() == MAX_BEHIND:
        queue.put_nowait(None)  # the end of its stream (nothing after it): it reconnects for a replay


def add_kv_events(app, cache) -> KvEventHub:
    """The route, on `cache` (a ContextCache); behind the API key like every route but /health."""
    hub = KvEventHub(cache)

    @app.get("/v1/kv_events", include_in_schema=False)  # a stream without end: no schema case to generate
    async def kv_events():
        replay, queue = hub.open()

        async def lines():
            try:
                yield json.dumps(replay) + "\n"
                while True:
                    try:
                        batch = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield "\n"
                        continue
                    if batch is None:
                        return
                    yield json.dumps(batch) + "\n"
            finally:
                hub.close(queue)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return hub
