"""KV events: what the context cache (context_cache.py) tells a router about the blocks it holds.

The events are vLLM's (vllm.distributed.kv_events, which llm-d's kv-cache-manager and NVIDIA Dynamo
consume), as plain dicts with vLLM's field names:

    {"type": "BlockStored", "block_hashes": [KEY], "parent_block_hash": KEY | None, "token_ids": [...],
     "block_size": 16, "lora_id": None, "lora_name": NAME | None, "medium": "CPU", "chain_root": KEY}
    {"type": "BlockRemoved", "block_hashes": [KEY, ...], "medium": "CPU"}
    {"type": "AllBlocksCleared"}

A KEY is the block's context cache key (32 hex digits: the first 128 bits of a SHA-256 chain over
the parent's key and the block's token ids as little-endian int64, and the media its tokens show);
`parent_block_hash` is None for a prompt's first block, whose chain starts from `chain_root` (the
engine and the LoRA adapter: ContextCache.root), an extension that lets a router recompute the keys of
a prompt's blocks from its token ids. `medium` is CPU: the cache holds its blocks in host memory.

A block's key is computed from its parent's before the block is stored, so its parent is remembered
here (PARENTS) from the moment someone subscribes: chain_key notes every key it makes, in a bounded
table (a key names its parent whatever cache made it, so one table serves every cache of the process).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MEDIUM = "CPU"
REMEMBERED_KEYS = 1 << 16  # keys whose parent is remembered: far more than one step computes


def block_stored(key: str, parent: str | None, token_ids, block_size: int, lora_name: str | None,
                 root: str | None = None) -> dict:
    return {"type": "BlockStored", "block_hashes": [key], "parent_block_hash": parent,
            "token_ids": [int(t) for t in token_ids], "block_size": block_size, "lora_id": None,
            "lora_name": lora_name, "medium": MEDIUM, "chain_root": root}


def block_removed(keys: list[str]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(keys), "medium": MEDIUM}


def all_blocks_cleared() -> dict:
    return {"type": "AllBlocksCleared"}


class Parents:
    """key -> (its parent's key, the root key its chain starts from), noted by chain_key while
    anyone listens (the newest REMEMBERED_KEYS)."""

    def __init__(self, size: int = REMEMBERED_KEYS):
        self.size = size
        self._listeners = 0
        self._table: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()  # engines of several caches may compute keys at once

    @property
    def on(self) -> bool:
        return self._listeners > 0

    def listen(self) -> None:
        with self._lock:
            self._listeners += 1

    def leave(self) -> None:
        with self._lock:
            self._listeners -= 1
            if not self._listeners:
                self._table.clear()

    def note(self, key: str, parent: str) -> None:
        with self._lock:
            known = self._table.get(parent)
            # A root key's parent is no key (the engine and adapter's names): the chain starts at it.
            self._table[key] = (parent, known[1] if known is not None else key)
            self._table.move_to_end(key)
            while len(self._table) > self.size:
                self._table.popitem(last=False)

    def lineage(self, key: str) -> tuple[str | None, str | None]:
        """(parent, root) of `key`; (None, None) when it was not noted (made before anyone listened)."""
        with self._lock:
            return self._table.get(key, (None, None))


PARENTS = Parents()
