"""The context cache: computed keys and values of earlier prompts (and their generated tokens), which
later requests that start the same way restore instead of prefilling.

Two kinds of records, under one byte budget:

- blocks (context reuse): a row's keys and values for `block_tokens` consecutive tokens, addressed
  by a hash chain: a block's key covers its own tokens, the images and audio clips whose tokens it
  holds (their content hashes and places), and its parent's key, which starts from the engine and
  the LoRA adapter (`root`). Equal keys mean equal states, so a request restores the longest chain
  of its prompt's blocks that is cached, whoever computed it (vLLM's automatic prefix caching is the
  model). Least recently used out first.
- kept entries (`save_system_prompt_kv_cache`): the KV of one templated system prompt under one
  adapter, by its exact token ids, reused by a prompt that starts with exactly them. Evicted only
  when no block is left to evict.

Each record holds, per layer, the keys and values [Hkv, n, D] of its last n tokens (None where a
layer keeps none: a sliding-window layer keeps only what its window still sees, a recurrent layer
keeps no tokens), and a hybrid model's recurrent states after its last token where they were
snapshotted there (runtime/cache/reuse.py). With a directory,
records are also written to disk (one safetensors file each, named by key, its metadata naming the
format version and the engine), so a restarted process starts warm. A file that is corrupt, of
another version or of another engine is skipped with one warning and never trusted.
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
BLOCK_TOKENS = 16  # vLLM's default: a prefix is reused to within 15 tokens
DISK_FORMAT = "1"  # a disk record's layout; another is skipped


@dataclass
class Entry:
    token_ids: tuple[int, ...]
    keys: list[np.ndarray | None]  # per layer [Hkv, n, D]: the last n tokens of token_ids
    values: list[np.ndarray | None]
    # A block of an EAGLE base: its draft's keys and values (per draft layer [Hkv, B, D]) at the block's
    # positions, whose features the block's tokens gave (added when the request leaves: runtime/decoding/eagle.py)
    draft_keys: list[np.ndarray] | None = None
    draft_values: list[np.ndarray] | None = None
    # A hybrid model's recurrent states after the record's last token (cache_set.CacheSet.snapshot),
    # where its row was snapshotted there; a recurrent layer cannot resume from a record without them.
    states: list[np.ndarray] | None = None

    @property
    def nbytes(self) -> int:
        arrays = (*self.keys, *self.values, *(self.draft_keys or ()), *(self.draft_values or ()), *(self.states or ()))
        return sum(a.nbytes for a in arrays if a is not None)


def entry_key(adapter: str | None, token_ids) -> str:
    digest = hashlib.sha256(json.dumps([adapter, list(token_ids)]).encode()).hexdigest()
    return digest[:32]


def chain_key(parent: str, token_ids, media: tuple = ()) -> str:
    """A block's key: its parent's, its tokens', and the media whose tokens it holds ((first token
    of the span relative to the block, tokens, content hash) each)."""
    digest = hashlib.sha256(parent.encode())
    digest.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    for item in media:
        digest.update(repr(item).encode())
    return digest.hexdigest()[:32]


class ContextCache:
    def __init__(self, engine_identity: str, budget_bytes: int = DEFAULT_BUDGET_MB << 20,
                 directory: str | Path | None = None, block_tokens: int = BLOCK_TOKENS):
        self.engine_identity = engine_identity
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.directory = Path(directory) if directory else None
        if self.directory:
            (self.directory / "blocks").mkdir(parents=True, exist_ok=True)
        self._kept: OrderedDict[str, Entry] = OrderedDict()
        self._blocks: OrderedDict[str, Entry] = OrderedDict()
        self._refused: set[Path] = set()  # disk files already warned about
        self.size_bytes = 0
        self.evictions = 0
        # hits / misses: requests that restored tokens / looked up and found none; saved: kept
        # entries made; fallbacks: prompts whose system prompt could not be kept (requests.prepare)
        self.stats = {"hits": 0, "misses": 0, "saved": 0, "fallbacks": 0}

    def __len__(self) -> int:
        return len(self._kept) + len(self._blocks)

    def root(self, adapter_identity: str | None) -> str:
        """The key a request's block chain starts from: the engine and its adapter."""
        return chain_key(f"{self.engine_identity}/{adapter_identity}", [])

    # -- kept entries -------------------------------------------------------------------------------

    def get(self, adapter: str | None, token_ids) -> Entry | None:
        key = entry_key(adapter, token_ids)
        entry = self._kept.get(key)
        if entry is None and self.directory:
            entry = self._load(self.directory / f"{key}.safetensors", {"adapter": json.dumps(adapter),
                                                                       "token_ids": json.dumps(list(token_ids))})
            if entry is not None:
                self._insert(self._kept, key, entry)
        if entry is not None:
            self._kept.move_to_end(key)
        return entry

    def put(self, adapter: str | None, entry: Entry) -> None:
        key = entry_key(adapter, entry.token_ids)
        if key in self._kept:
            self._kept.move_to_end(key)
            return
        if entry.nbytes > self.budget_bytes:
            log.warning("system prompt of %d tokens (%.1f MB of KV) exceeds the prompt cache budget "
                        "(%.1f MB); not cached", len(entry.token_ids), entry.nbytes / 2**20, self.budget_bytes / 2**20)
            return
        self._insert(self._kept, key, entry)
        if self.directory:
            self._save(self.directory / f"{key}.safetensors", entry,
                       {"adapter": json.dumps(adapter), "token_ids": json.dumps(list(entry.token_ids))})

    # -- blocks -------------------------------------------------------------------------------------

    def block(self, key: str) -> Entry | None:
        entry = self._blocks.get(key)
        if entry is None and self.directory:
            entry = self._load(self._block_path(key), {"key": key})
            if entry is not None:
                self._insert(self._blocks, key, entry)
        if entry is not None:
            self._blocks.move_to_end(key)
        return entry

    def has_block(self, key: str) -> bool:
        if key in self._blocks:
            return True
        path = self._block_path(key)
        return path is not None and path not in self._refused and path.is_file()

    def _block_path(self, key: str) -> Path | None:
        return self.directory / "blocks" / f"{key}.safetensors" if self.directory else None

    def add_block(self, key: str, entry: Entry) -> None:
        """Add a block; the budget holds again after `touch` and `trim` (a row commits several)."""
        if key in self._blocks:
            return
        self._blocks[key] = entry
        self.size_bytes += entry.nbytes
        if self.directory:
            path = self._block_path(key)
            self._save(path, entry, {"key": key})  # over a file refused before, if any
            self._refused.discard(path)

    def attach_draft(self, key: str, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Give a cached block its draft's keys and values (nothing when it is gone or has them)."""
        block = self.block(key)
        if block is None or block.draft_keys is not None:
            return
        block.draft_keys, block.draft_values = keys, values
        self.size_bytes += sum(a.nbytes for a in (*keys, *values))
        if self.directory:
            self._save(self._block_path(key), block, {"key": key})

    def attach_states(self, key: str, states: list[np.ndarray]) -> None:
        """Give a cached block the recurrent states at its end (nothing when it is gone or has them)."""
        block = self.block(key)
        if block is None or block.states is not None:
            return
        block.states = states
        self.size_bytes += sum(a.nbytes for a in states)
        if self.directory:
            self._save(self._block_path(key), block, {"key": key})

    def touch(self, keys: list[str]) -> None:
        """A chain's blocks were used: give the keys in reverse chain order (its last block first),
        so that the budget evicts a chain from its tail and the prefix others share stays."""
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def trim(self) -> None:
        self._evict()

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    # -- the budget ---------------------------------------------------------------------------------

    def _insert(self, records: OrderedDict, key: str, entry: Entry) -> None:
        records[key] = entry
        self.size_bytes += entry.nbytes
        self._evict()

    def _evict(self) -> None:
        while self.size_bytes > self.budget_bytes:
            victims = self._blocks or self._kept  # blocks first: a kept entry is what a user asked to keep
            _, evicted = victims.popitem(last=False)
            self.size_bytes -= evicted.nbytes
            self.evictions += 1

    # -- on disk: one safetensors file per record -----------------------------------------------------

    def _save(self, path: Path, entry: Entry, metadata: dict) -> None:
        from safetensors.numpy import save_file

        tensors = {}
        for i, (k, v) in enumerate(zip(entry.keys, entry.values)):
            if k is not None:
                tensors[f"key_{i}"], tensors[f"value_{i}"] = np.ascontiguousarray(k), np.ascontiguousarray(v)
        for i, (k, v) in enumerate(zip(entry.draft_keys or (), entry.draft_values or ())):
            tensors[f"draft_key_{i}"], tensors[f"draft_value_{i}"] = np.ascontiguousarray(k), np.ascontiguousarray(v)
        for i, state in enumerate(entry.states or ()):
            tensors[f"state_{i}"] = np.ascontiguousarray(state)
        metadata = {**metadata, "engine": self.engine_identity, "format": DISK_FORMAT,
                    "layers": str(len(entry.keys)), "draft_layers": str(len(entry.draft_keys or ())),
                    "states": str(len(entry.states or ())),
                    "token_ids": json.dumps(list(entry.token_ids))}
        temporary = path.with_suffix(".tmp")
        try:
            save_file(tensors, str(temporary), metadata=metadata)
            temporary.replace(path)  # readers never see half a record
        except OSError as error:
            log.warning("context cache: cannot write %s (%s); kept in memory only", path, error)

    def _load(self, path: Path, expected: dict) -> Entry | None:
        from safetensors import safe_open

        if path in self._refused or not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                if metadata.get("engine") != self.engine_identity:
                    return self._refuse(path, "belongs to another engine")
                if metadata.get("format") != DISK_FORMAT:
                    return self._refuse(path, f"has format {metadata.get('format')!r}, this runtime reads {DISK_FORMAT}")
                if any(metadata.get(name) != value for name, value in expected.items()):
                    return self._refuse(path, "does not match its key")
                names = set(f.keys())
                layers = int(metadata["layers"])
                keys = [f.get_tensor(f"key_{i}") if f"key_{i}" in names else None for i in range(layers)]
                values = [f.get_tensor(f"value_{i}") if f"value_{i}" in names else None for i in range(layers)]
                drafts = range(int(metadata.get("draft_layers", 0)))
                draft_keys = [f.get_tensor(f"draft_key_{i}") for i in drafts] or None
                draft_values = [f.get_tensor(f"draft_value_{i}") for i in drafts] or None
                states = [f.get_tensor(f"state_{i}") for i in range(int(metadata.get("states", 0)))] or None
                token_ids = tuple(json.loads(metadata["token_ids"]))
        except Exception as error:  # a truncated or foreign file: never use it
            return self._refuse(path, f"is unreadable ({error})")
        if any((k is None) != (v is None) or (k is not None and (k.shape != v.shape or k.shape[1] > len(token_ids)))
               for k, v in zip(keys, values)):
            return self._refuse(path, "has wrong shapes")
        return Entry(token_ids, keys, values, draft_keys, draft_values, states)

    def _refuse(self, path: Path, why: str) -> None:
        self._refused.add(path)
        log.warning("prompt cache entry %s %s; ignored", path.name, why)
        return None
