"""An encoder-decoder's cross-attention inputs (Whisper): per cross layer the keys and values of
each row's encoded clip [B, H, frames, D], written once when the row is admitted (`write_row`) and
moved with the row, so a decode step binds them in place. The layers only read them: nothing is
written at a step, and they are no part of a token prefix (context reuse reads the attention
groups only)."""

from __future__ import annotations

import numpy as np

from trt_llm.schemas.graph_spec import cross


class CrossCache:
    def __init__(self, layers: list[int], batch: int, dtype):
        self.layers, self.dtype = list(layers), np.dtype(dtype)
        self.buffers: list[np.ndarray] = []  # key, value of each layer; allocated by the first clip written
        self.rows = batch  # rows the buffers are allocated for
        self.batch = batch
        self.capacity = 0  # (holds no tokens)
        self.generation = 0  # counts the buffers' (re)allocations, which an engine rebinds
        self._pool, self._start = None, 0  # a window's pool and first row

    def write_row(self, row: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Row `row`'s clip: (key, value) [H, frames, D] per cross layer."""
        if self._pool is not None:  # a window writes into its pool's memory
            self._pool.write_row(self._start + row, pairs)
            self.buffers = [b[self._start: self._start + self.batch] for b in self._pool.buffers]
            return
        if not self.buffers:
            self.buffers = [np.zeros((self.rows, *array.shape), self.dtype) for pair in pairs for array in pair]
            self.generation += 1
        for i, (key, value) in enumerate(pairs):
            self.buffers[2 * i][row], self.buffers[2 * i + 1][row] = key, value

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        for target, source in enumerate(rows):
            if target != source:
                for buffer in self.buffers:
                    buffer[target] = buffer[source]
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        pass  # no token slots

    def window(self, start: int, stop: int) -> "CrossCache":
        part = CrossCache(self.layers, stop - start, self.dtype)
        part.buffers = [b[start:stop] for b in self.buffers]
        part._pool, part._start = self, start
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        if rows <= self.rows:
            return
        for i, old in enumerate(self.buffers):
            new = np.zeros((rows, *old.shape[1:]), old.dtype)
            new[: len(used)] = old[: len(used)]
            self.buffers[i] = new
        self.rows = rows
        self.generation += 1

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict:
        return {}

    def tensors(self) -> list[tuple[str, str | None, np.ndarray]]:
        """cross_key_i / cross_value_i of the active rows (none before the first clip is written)."""
        names = [cross(kind, layer) for layer in self.layers for kind in ("key", "value")]
        return [(name, None, buffer[: self.batch]) for name, buffer in zip(names, self.buffers)]
