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
        part = KVCache.__new__(type(self))  # a subclass's window is one of its own kind
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

    def bound_inputs(self) -> dict[str, np.ndarray]:
        """Graph inputs other than the past_* buffers that live with the rows (an encoder-decoder's
        cross-attention keys and values); bound with the cache."""
        return {}


class CrossAttentionCache(KVCache):
    """An encoder-decoder's cache (Whisper): the self-attention KV above, plus per decoder layer the
    cross-attention keys and values of each row's encoded clip [B, H, frames, D], written once when
    the row is admitted (write_cross) and moved with the row, so a decode step binds them in place."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype, cross_names: list[tuple[str, str]]):
        super().__init__(num_layers, batch, kv_heads, capacity, head_dim, dtype)
        self.cross_names = cross_names  # (key input, value input) per layer
        self.cross: list[np.ndarray] = []  # allocated by the first clip written: its shape is the encoder's
        self._pool, self._start = None, 0  # a window's pool and first row

    def write_cross(self, row: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        if self._pool is not None:  # a window writes into its pool's memory
            self._pool.write_cross(self._start + row, pairs)
            self.cross = [buffer[self._start: self._start + self.batch] for buffer in self._pool.cross]
            return
        if not self.cross:
            rows = self.keys[0].shape[0]
            self.cross = [np.zeros((rows, *array.shape), self.keys[0].dtype) for pair in pairs for array in pair]
        for i, (key, value) in enumerate(pairs):
            self.cross[2 * i][row], self.cross[2 * i + 1][row] = key, value

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        for target, source in enumerate(rows):
            if target != source:
                for buffer in self.cross:
                    buffer[target] = buffer[source]
        super().keep_rows(rows, used)

    def window(self, start: int, stop: int) -> "CrossAttentionCache":
        part = super().window(start, stop)
        part.cross_names, part.cross = self.cross_names, [buffer[start:stop] for buffer in self.cross]
        part._pool, part._start = self, start
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        if self.cross and rows > self.cross[0].shape[0]:
            for i, old in enumerate(self.cross):
                new = np.zeros((rows, *old.shape[1:]), old.dtype)
                new[:len(used)] = old[:len(used)]
                self.cross[i] = new
        super().reserve(rows, capacity, used)

    def bound_inputs(self) -> dict[str, np.ndarray]:
        names = [name for pair in self.cross_names for name in pair]
        return {name: buffer[: self.batch] for name, buffer in zip(names, self.cross)}
