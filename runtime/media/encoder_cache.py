"""Encoded media kept under a hash of the file's bytes, so the same image or clip in many requests
(as a path, a relative path or a data URL alike) is encoded once: a small LRU shared by the vision
and audio encoders. Thread-safe: a server prepares requests on several threads."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence


def content_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class EncoderCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, items: Sequence, run: Callable[[list], list]) -> tuple[list, list]:
        """Each item's encoding (items have a `key`), from the cache or from one call of `run` on
        those not in it (each key once); returns (encodings in item order, the items run encoded)."""
        with self._lock:
            found = {item.key: self.entries[item.key] for item in items if item.key in self.entries}
            missing = list({item.key: item for item in items if item.key not in found}.values())
            if missing:
                found.update(zip([item.key for item in missing], run(missing)))
            for key, encoded in found.items():  # most recently used last
                self.entries[key] = encoded
                self.entries.move_to_end(key)
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
            return [found[item.key] for item in items], missing
