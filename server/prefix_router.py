"""Routing by prefix across replicas (issue 46 item 3): send a request to the replica whose context cache
most likely holds the longest prefix of its prompt, else to the less loaded of two picked at random.

The router sees request bodies, not tokens: a router in front of replicas has no tokenizer or chat
template (Ray's proxy, an HTTP balancer), and a tokenizer a request costs more than routing should. So,
as Ray Serve LLM's PrefixCacheAffinityRouter does, it matches characters: a body's text (`body_text`:
the model, then each message's role and content, or the raw prompt) is cut into CHUNK-character pieces
chained by hash (a piece's key covers every piece before it, as the context cache's block keys do over
tokens), and each key remembers the replicas it was sent to. The match is the leading run of keys a
replica holds; a conversation's next turn resends the earlier turns whole, so its text starts with the
previous turn's and matches where that turn ran, which holds its blocks.

    choose(text, loads)  the replica with the longest match when it covers at least `min_match` of the
                         text and its load (requests in flight) is within `max_imbalance` of the least
                         loaded one; otherwise power of two choices (the less loaded of two at random)
    record(text, replica) remember where it went (the keys, least recently used out past `capacity`)
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict

CHUNK = 64  # characters a key covers: about 16 tokens of English, the context cache's block


def body_text(body: dict) -> str:
    """What a request's prompt starts with, as text: the model (an adapter has a cache of its own), then
    the system prompt and the messages in order (any API's shape), or the raw prompt."""
    parts = [str(body.get("model", "")), "\x00"]
    if body.get("system") is not None:  # Anthropic's
        parts += ["system\x00", json.dumps(body["system"]), "\x01"]
    for message in body.get("messages") or ():
        content = message.get("content")
        parts += [str(message.get("role", "")), "\x00",
                  content if isinstance(content, str) else json.dumps(content), "\x01"]
    prompt = body.get("prompt")
    if prompt is not None:
        parts.append(prompt if isinstance(prompt, str) else json.dumps(prompt))
    return "".join(parts)


def chunk_keys(text: str, chunk: int = CHUNK) -> list[str]:
    """The chained keys of the text's whole chunks."""
    keys, parent = [], ""
    for start in range(0, len(text) - chunk + 1, chunk):
        parent = hashlib.blake2b((parent + text[start:start + chunk]).encode(), digest_size=12).hexdigest()
        keys.append(parent)
    return keys


class PrefixRouter:
    def __init__(self, replicas, min_match: float = 0.1, max_imbalance: int = 4, capacity: int = 1 << 18,
                 chunk: int = CHUNK, seed: int | None = None):
        self.replicas = list(replicas)
        self.min_match, self.max_imbalance, self.capacity, self.chunk = min_match, max_imbalance, capacity, chunk
        self._held: OrderedDict[str, set] = OrderedDict()  # chunk key -> the replicas it was sent to
        self._random = random.Random(seed)

    def matches(self, text: str) -> dict:
        """Characters of the text's leading chunks each replica holds."""
        found = {}
        alive = set(self.replicas)
        for index, key in enumerate(chunk_keys(text, self.chunk)):
            holders = self._held.get(key, set()) & alive
            if not holders:
                break
            for replica in holders:
                found[replica] = (index + 1) * self.chunk
            alive = holders
        return found

    def choose(self, text: str, loads: dict | None = None) -> str:
        loads = loads or {}
        load = {r: loads.get(r, 0) for r in self.replicas}
        found = self.matches(text)
        if found:
            best = max(found, key=lambda r: (found[r], -load[r]))
            if found[best] >= self.min_match * len(text) and load[best] <= min(load.values()) + self.max_imbalance:
                return best
        return self.least_loaded(load)

    def least_loaded(self, load: dict) -> str:
        """Power of two choices: the less loaded of two replicas picked at random."""
        if len(self.replicas) == 1:
            return self.replicas[0]
        a, b = self._random.sample(self.replicas, 2)
        return a if load.get(a, 0) <= load.get(b, 0) else b

    def record(self, text: str, replica: str) -> None:
        for key in chunk_keys(text, self.chunk):
            holders = self._held.setdefault(key, set())
            holders.add(replica)
            self._held.move_to_end(key)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A replica went away (or restarted with an empty cache)."""
        for holders in self._held.values():
            holders.discard(replica)
