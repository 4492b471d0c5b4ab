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

Subscribers (`subscribe`, runtime/cache/kv_events.py) hear of every block that enters the cache and
every block that leaves it (vLLM's KV events: BlockStored with its key, its parent's and its tokens;
BlockRemoved), so that a router can tell which replica holds which prompt blocks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_llm.runtime.cache import kv_events
from trt_llm.schemas.layer_spec import owns_cache

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 1024
BLOCK_TOKENS = 16  # vLLM's default: a prefix is reused to within 15 tokens
DISK_FORMAT = "1"  # a disk record's layout; another is skipped
TEMPORARY_AGE_S = 600  # a temporary file older than this is an interrupted run's, not a live write's


class ContextCacheError(ValueError):
    """The cache's folder cannot be used (one line, before any request runs)."""


@dataclass(frozen=True)
class Layout:
    """What a record of one engine holds, from its layer specs (schemas/layer_spec.py): per layer
    (kv_heads, head_dim) of its keys and values [Hkv, n, D], None for a recurrent layer or one that reads
    another's (kv_source): no tokens of its own;
    the recurrent states' shapes in snapshot order; the draft layers' (kv_heads, head_dim); the
    arrays' dtype (None: not checked)."""
    attention: tuple
    states: tuple
    draft: tuple
    dtype: object

    @classmethod
    def of(cls, layers, dtype: str, draft_layers=()) -> "Layout":
        attention = tuple(None if layer.kind == "recurrent" or not owns_cache(layer) else (layer.kv_heads, layer.head_dim)
                          for layer in layers)
        model = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16)}.get(dtype)
        states = tuple((tuple(state.shape), model if state.dtype == "model" else np.dtype(np.float32))
                       for layer in layers if layer.kind == "recurrent" for state in layer.states)
        return cls(attention, states, tuple((layer.kv_heads, layer.head_dim) for layer in draft_layers), model)

    def problem(self, entry: "Entry") -> str | None:
        """Why `entry` cannot be restored into this engine's caches, or None."""
        if len(entry.keys) != len(self.attention) or len(entry.values) != len(self.attention):
            return f"holds {len(entry.keys)} layers, the engine has {len(self.attention)}"
        for index, (geometry, k, v) in enumerate(zip(self.attention, entry.keys, entry.values)):
            if k is None and v is None:
                continue
            if geometry is None or k is None or v is None:
                return f"has keys and values for layer {index}, which keeps none"
            if why := _array_problem(k, (geometry[0], None, geometry[1]), self.dtype, len(entry.token_ids)) or \
                    _array_problem(v, k.shape, self.dtype, len(entry.token_ids)):
                return f"layer {index}: {why}"
        if entry.states is not None:
            if len(entry.states) != len(self.states):
                return f"holds {len(entry.states)} recurrent states, the engine has {len(self.states)}"
            for index, (state, (shape, dtype)) in enumerate(zip(entry.states, self.states)):
                if why := _array_problem(state, shape, dtype):
                    return f"state {index}: {why}"
        if entry.draft_keys is not None:
            if len(entry.draft_keys) != len(self.draft) or len(entry.draft_values or ()) != len(self.draft):
                return f"holds {len(entry.draft_keys)} draft layers, the engine's draft has {len(self.draft)}"
            for index, (geometry, k, v) in enumerate(zip(self.draft, entry.draft_keys, entry.draft_values)):
                if why := _array_problem(k, (geometry[0], None, geometry[1]), self.dtype, len(entry.token_ids)) or \
                        _array_problem(v, k.shape, self.dtype, len(entry.token_ids)):
                    return f"draft layer {index}: {why}"
        return None


def _array_problem(array, shape, dtype, tokens: int | None = None) -> str | None:
    """Why `array` is not of `shape` (None: any size there; tokens: the most its second axis holds) and `dtype`."""
    if array.ndim != len(shape) or any(want is not None and have != want for have, want in zip(array.shape, shape)):
        return f"shape {list(array.shape)}, the engine's is {[n if n is not None else 'n' for n in shape]}"
    if tokens is not None and not 0 < array.shape[1] <= tokens:
        return f"{array.shape[1]} tokens in a record of {tokens}"
    if dtype is not None and array.dtype != dtype:
        return f"dtype {array.dtype}, the engine's is {dtype}"
    return None


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
    key = digest.hexdigest()[:32]
    if kv_events.PARENTS.on:  # someone listens for KV events: they name each stored block's parent
        kv_events.PARENTS.note(key, parent)
    return key


class ContextCache:
    def __init__(self, engine_identity: str, budget_bytes: int = DEFAULT_BUDGET_MB << 20,
                 directory: str | Path | None = None, block_tokens: int = BLOCK_TOKENS):
        self.engine_identity = engine_identity
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.directory = Path(directory) if directory else None
        self.layout: Layout | None = None  # what this engine's records hold (expect); None: not checked
        if self.directory:
            self._open_directory()
        self._kept: OrderedDict[str, Entry] = OrderedDict()
        self._blocks: OrderedDict[str, Entry] = OrderedDict()
        self._refused: set[Path] = set()  # disk files already warned about
        self._unwritable: set[Path] = set()
        self.size_bytes = 0
        self.evictions = 0
        # hits / misses: requests that restored tokens / looked up and found none; saved: kept
        # entries made; fallbacks: prompts whose system prompt could not be kept (requests.prepare)
        self.stats = {"hits": 0, "misses": 0, "saved": 0, "fallbacks": 0}
        self._subscribers: list = []  # KV event callbacks (subscribe)
        self._roots: dict[str, str | None] = {}  # a chain's root key -> its adapter identity (root)
        self.adapter_names: dict[str, str] = {}  # an adapter's digest -> the name it is served as (KV events)

    def expect(self, engine_dir) -> None:
        """Check every record read from disk against `engine_dir`'s layers (runtime/engine_dir.EngineDir):
        one that does not fit is skipped with one warning and removed, never restored."""
        components = engine_dir.manifest["components"]
        draft = engine_dir.layers("draft") if components.get("draft") else ()
        self.layout = Layout.of(engine_dir.layers(), engine_dir.manifest["model"]["dtype"], draft)

    def _open_directory(self) -> None:
        """The folder is checked as the manifest is: one line for a folder that cannot be the cache
        (a file in place of it or of its blocks/ folder, an engine directory), one warning for the
        temporary files an interrupted run left."""
        where = f"--kv-cache-dir {str(self.directory)!r}"
        if (self.directory / "manifest.json").exists():
            raise ContextCacheError(f"{where}: holds manifest.json (an engine directory or bundle); give the "
                                    "context cache a folder of its own")
        for folder in (self.directory, self.directory / "blocks"):
            if folder.exists() and not folder.is_dir():
                raise ContextCacheError(f"{where}: {str(folder)!r} is a file, not a folder; move it away or "
                                        "choose another --kv-cache-dir")
        try:
            (self.directory / "blocks").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ContextCacheError(f"{where}: cannot make its blocks folder: {error.strerror or error}") from None
        stale = time.time() - TEMPORARY_AGE_S
        leftovers = [p for folder in (self.directory, self.directory / "blocks") for p in folder.glob("*.tmp")
                     if p.is_file() and p.stat().st_mtime < stale]
        for path in leftovers:
            path.unlink(missing_ok=True)
        if leftovers:
            log.warning("context cache: removed %d temporary files an interrupted run left in %s", len(leftovers),
                        self.directory)

    def __len__(self) -> int:
        return len(self._kept) + len(self._blocks)

    def root(self, adapter_identity: str | None) -> str:
        """The key a request's block chain starts from: the engine and its adapter."""
        key = chain_key(f"{self.engine_identity}/{adapter_identity}", [])
        self._roots[key] = adapter_identity
        return key

    # -- KV events (runtime/cache/kv_events.py) --------------------------------------------------------

    def subscribe(self, callback, replay: bool = True):
        """Call `callback(event)` (a kv_events dict: BlockStored, BlockRemoved) for every block that enters
        or leaves the cache from now on, on the thread that changes it (the engine's); replay: first a
        BlockStored for each block held now, oldest first. Returns the function that unsubscribes it."""
        kv_events.PARENTS.listen()
        if replay:
            for key, entry in list(self._blocks.items()):
                callback(self._stored(key, entry))
        self._subscribers.append(callback)

        def unsubscribe():
            if callback in self._subscribers:
                self._subscribers.remove(callback)
                kv_events.PARENTS.leave()
        return unsubscribe

    def _stored(self, key: str, entry: Entry) -> dict:
        parent, root = kv_events.PARENTS.lineage(key)
        identity = self._roots.get(root)
        name = None if identity is None else self.adapter_names.get(identity.split("/")[0], identity)
        return kv_events.block_stored(key, None if parent == root else parent, entry.token_ids, self.block_tokens,
                                      name, root)

    def _publish(self, event: dict) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a subscriber's failure is its own: the cache goes on
                log.exception("context cache: a KV event subscriber failed")

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
        if self._subscribers:
            self._publish(self._stored(key, entry))
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
        if records is self._blocks and self._subscribers:  # a block read back from disk is held again
            self._publish(self._stored(key, entry))
        self._evict()

    def _evict(self) -> None:
        while self.size_bytes > self.budget_bytes:
            victims = self._blocks or self._kept  # blocks first: a kept entry is what a user asked to keep
            key, evicted = victims.popitem(last=False)
            self.size_bytes -= evicted.nbytes
            self.evictions += 1
            if victims is self._blocks and self._subscribers:
                self._publish(kv_events.block_removed([key]))

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
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")  # another process's write is its own
        try:
            save_file(tensors, str(temporary), metadata=metadata)
            temporary.replace(path)  # readers never see half a record
        except OSError as error:
            temporary.unlink(missing_ok=True)
            if path not in self._unwritable:  # (a folder in place of the record: once, not at every commit)
                self._unwritable.add(path)
                log.warning("context cache: cannot write %s (%s); kept in memory only", path,
                            error.strerror or error)

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
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return self._refuse(path, f"is unreadable ({first[:200]})", remove=True)
        if any((k is None) != (v is None) or (k is not None and (k.ndim != 3 or k.shape != v.shape
                                                                  or not 0 < k.shape[1] <= len(token_ids)))
               for k, v in zip(keys, values)):
            return self._refuse(path, "has wrong shapes", remove=True)
        entry = Entry(token_ids, keys, values, draft_keys, draft_values, states)
        why = self.layout.problem(entry) if self.layout is not None else None
        if why is not None:
            return self._refuse(path, f"does not fit this engine ({why})", remove=True)
        arrays = (*keys, *values, *(draft_keys or ()), *(draft_values or ()), *(states or ()))
        if not all(np.isfinite(a).all() for a in arrays if a is not None and a.dtype.kind == "f"):
            return self._refuse(path, "holds NaN or infinite values", remove=True)
        return entry

    def _refuse(self, path: Path, why: str, remove: bool = False) -> None:
        """Never use the file at `path`: one warning. remove: it is broken (no engine could use it),
        so it goes; a record of another engine or format is left to it."""
        self._refused.add(path)
        if remove:
            try:
                path.unlink()
                self._refused.discard(path)
            except OSError:
                pass
        log.warning("context cache: record %s %s; %s", path.name, why, "removed" if remove else "ignored")
        return None
