"""Ray Serve's request router for the engine replicas, routing by prefix (server/prefix_router.py).

Ray runs it in the caller's process (ray_app.py's proxy, which holds the handle to the engine
deployment) and asks it, for each pending request, for ranks of replicas: Ray probes the first rank's
queue length and sends the request there if it accepts, else tries the next rank. A request whose body
is JSON ranks first the replica PrefixRouter picks (the longest prefix within the load margin, from
the requests in flight Ray's queue length cache reports, else two at random, the less loaded first),
then the others; anything else (an upload's form, a GET) goes to Ray's own power of two choices.
"""

from __future__ import annotations

import json

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

from trt_llm.server.prefix_router import PrefixRouter, body_text


class PrefixRequestRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, min_match: float = 0.1, max_imbalance: int = 4, **kwargs):
        super().initialize_state(**kwargs)
        self.prefixes = PrefixRouter([], min_match=min_match, max_imbalance=max_imbalance)

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        text = _text(pending_request)
        if text is None or not candidate_replicas:
            return await super().choose_replicas(candidate_replicas, pending_request)
        if not hasattr(self, "prefixes"):  # (initialize_state not called: Ray's defaults)
            self.initialize_state()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        self.prefixes.replicas = list(by_id)
        cache = self.replica_queue_len_cache
        loads = {name: (cache.get(r.replica_id) or 0) for name, r in by_id.items()}
        chosen = self.prefixes.choose(text, loads)
        self.prefixes.record(text, chosen)
        return [[by_id[chosen]], [r for name, r in by_id.items() if name != chosen]]


def _text(pending_request) -> str | None:
    """The routed text of a forwarded request (ray_app.py's `forward(request)`: a dict with its body)."""
    if pending_request is None or not pending_request.args:
        return None
    request = pending_request.args[0]
    if not isinstance(request, dict) or request.get("method") != "POST":
        return None
    try:
        body = json.loads(request.get("body") or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return body_text(body) if isinstance(body, dict) else None
