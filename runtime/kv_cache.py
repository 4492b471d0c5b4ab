"""The KV cache of one batch: per layer a key and a value buffer [B, Hkv, L, D], updated in place.

The engine binds each buffer as both its `past_*` input and its `present_*` output, so the attention
op writes the new tokens' keys and values straight into it. When a row finishes, the rows behind it
move up (only their used slots are copied), so the next step runs on a smaller batch: a finished row
costs nothing more.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype=np.float32):
        shape = (batch, kv_heads, capacity, head_dim)
        # Zero-filled: slots past a row's length are masked out, but must hold finite numbers.
        self.keys = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.batch = batch
        self.capacity = capacity

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        """Compact to `rows` (ascending), in that order; `used[i]` = slots in use by rows[i]."""
        for target, (source, length) in enumerate(zip(rows, used)):
            if target != source:
                for buffer in (*self.keys, *self.values):
                    buffer[target, :, :length] = buffer[source, :, :length]
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        """Copy slots `sources` (ascending, each >= its target) of `row` to start, start + 1, ...:
        an EAGLE round keeps its accepted tree nodes' keys and values contiguous."""
        for target, source in enumerate(sources, start):
            if source != target:
                for buffer in (*self.keys, *self.values):
                    buffer[row, :, target] = buffer[row, :, source]

    def window(self, start: int, stop: int) -> "KVCache":
        """Rows start .. stop - 1 as a cache of their own that shares this one's memory: a step over
        some rows only (the prefill of requests admitted while others decode)."""
        part = KVCache.__new__(KVCache)
        part.keys = [k[start:stop] for k in self.keys]
        part.values = [v[start:stop] for v in self.values]
        part.batch, part.capacity = stop - start, self.capacity
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """At least `rows` rows of `capacity` slots: new buffers when these are smaller, with the
        `used[i]` slots of each active row i copied over (a pool that grows between steps)."""
        have_rows, heads, have_capacity, dim = self.keys[0].shape
        if rows <= have_rows and capacity <= have_capacity:
            return
        shape = (max(rows, have_rows), heads, max(capacity, have_capacity), dim)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = np.zeros(shape, old.dtype)
                for row, length in enumerate(used):
                    new[row, :, :length] = old[row, :, :length]
                buffers[i] = new
        self.capacity = shape[2]

    def views(self):
        """(key, value) per layer for the active rows: contiguous views that share memory."""
        return [(k[: self.batch], v[: self.batch]) for k, v in zip(self.keys, self.values)]

    def write_prefix(self, row: int, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Restore saved KV ([Hkv, n, D] per layer) into the first n slots of `row`."""
        for buffer, saved in zip((*self.keys, *self.values), (*keys, *values)):
            buffer[row, :, : saved.shape[1]] = saved

    def read_prefix(self, row: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of the first n slots of `row`, per layer: (keys, values), each [Hkv, n, D]."""
        return [k[row, :, :n].copy() for k in self.keys], [v[row, :, :n].copy() for v in self.values]
