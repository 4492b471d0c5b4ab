"""The system-prompt KV cache: saved prefixes' keys and values, reused by later requests.

An entry is the KV of one templated system prompt under one adapter, keyed by its exact token ids.
A request whose prompt starts with those tokens restores them into its batch row and prefills only
the rest. Entries live in memory under a byte budget, least recently used out first; with a
directory they are also written to disk, keyed by the engine's identity, so a restarted process
starts warm. A disk entry that is corrupt or from another engine is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 1024


@dataclass
class Entry:
    token_ids: tuple[int, ...]
    keys: list[np.ndarray]  # per layer [Hkv, n, D]
    values: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))


def entry_key(adapter: str | None, token_ids) -> str:
    digest = hashlib.sha256(json.dumps([adapter, list(token_ids)]).encode()).hexdigest()
    return digest[:32]


class PrefixCache:
    def __init__(self, engine_identity: str, budget_bytes: int = DEFAULT_BUDGET_MB << 20,
                 directory: str | Path | None = None):
        self.engine_identity = engine_identity
        self.budget_bytes = budget_bytes
        self.directory = Path(directory) if directory else None
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self.size_bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, adapter: str | None, token_ids) -> Entry | None:
        key = entry_key(adapter, token_ids)
        entry = self._entries.get(key)
        if entry is None and self.directory:
            entry = self._load(key, adapter, tuple(token_ids))
            if entry is not None:
                self._insert(key, entry)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, adapter: str | None, entry: Entry) -> None:
        key = entry_key(adapter, entry.token_ids)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if entry.nbytes > self.budget_bytes:
            log.warning("system prompt of %d tokens (%.1f MB of KV) exceeds the prompt cache budget "
                        "(%.1f MB); not cached", len(entry.token_ids), entry.nbytes / 2**20, self.budget_bytes / 2**20)
            return
        self._insert(key, entry)
        if self.directory:
            self._save(key, adapter, entry)

    def _insert(self, key: str, entry: Entry) -> None:
        self._entries[key] = entry
        self.size_bytes += entry.nbytes
        while self.size_bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size_bytes -= evicted.nbytes
            self.evictions += 1

    # --- on disk: one safetensors file per entry, its metadata naming engine, adapter and tokens ---

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    def _save(self, key: str, adapter: str | None, entry: Entry) -> None:
        from safetensors.numpy import save_file

        tensors = {}
        for i, (k, v) in enumerate(zip(entry.keys, entry.values)):
            tensors[f"key_{i}"], tensors[f"value_{i}"] = np.ascontiguousarray(k), np.ascontiguousarray(v)
        metadata = {"engine": self.engine_identity, "adapter": json.dumps(adapter),
                    "token_ids": json.dumps(list(entry.token_ids))}
        path = self._path(key)
        temporary = path.with_suffix(".tmp")
        save_file(tensors, str(temporary), metadata=metadata)
        temporary.replace(path)  # readers never see half an entry

    def _load(self, key: str, adapter: str | None, token_ids: tuple[int, ...]) -> Entry | None:
        from safetensors import safe_open

        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                if metadata.get("engine") != self.engine_identity:
                    log.warning("prompt cache entry %s belongs to another engine; ignored", path.name)
                    return None
                if (json.loads(metadata["adapter"]) != adapter
                        or tuple(json.loads(metadata["token_ids"])) != token_ids):
                    log.warning("prompt cache entry %s does not match its key; ignored", path.name)
                    return None
                layers = len([name for name in f.keys() if name.startswith("key_")])
                keys = [f.get_tensor(f"key_{i}") for i in range(layers)]
                values = [f.get_tensor(f"value_{i}") for i in range(layers)]
        except Exception as error:  # a truncated or foreign file: never use it
            log.warning("prompt cache entry %s is unreadable (%s); ignored", path.name, error)
            return None
        if any(k.shape[1] != len(token_ids) or k.shape != v.shape for k, v in zip(keys, values)):
            log.warning("prompt cache entry %s has wrong shapes; ignored", path.name)
            return None
        return Entry(token_ids, keys, values)
