"""Who sent a request, for fair share between API keys (the engine core's round robin between clients
of one priority, runtime/engine/engine_core.py's Scheduler).

A request's client is a digest of the key it offered (`Authorization: Bearer KEY` or `x-api-key`),
whether or not the server checks keys, else "anonymous". The ASGI middleware sets it for the request's
task; the routes read it (`CLIENT`) when they queue the request. The key itself is kept nowhere.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

ANONYMOUS = "anonymous"
CLIENT: ContextVar[str] = ContextVar("trt_llm_client", default=ANONYMOUS)


def client_of(headers: dict[bytes, bytes]) -> str:
    scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
    key = given.strip() if scheme.lower() == b"bearer" else headers.get(b"x-api-key", b"").strip()
    return hashlib.sha256(key).hexdigest()[:16] if key else ANONYMOUS


class ClientKey:
    """Sets CLIENT for each HTTP request (pure ASGI: the route runs in this task and sees it)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            CLIENT.set(client_of(dict(scope["headers"])))
        return await self.app(scope, receive, send)
