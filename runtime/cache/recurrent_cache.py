"""The states of one group of recurrent layers (Gated DeltaNet, short convolutions): per layer and
per named state a buffer [B, *shape] for the rows of a batch, whatever their lengths.

A state is replaced, not appended to, at every step: the graph reads past_<state>_i and writes
present_<state>_i, the whole of it. Binding both to one buffer (as the attention op's in-place
caches are) would let ONNX Runtime write a state while another node still reads it, so the group
keeps two buffers per state: the step reads `current` and writes `spare`, and `finish_step` makes
what was written current (the pool swaps the two and rebinds; a window over some of its rows, whose
other rows did not step, copies its rows back instead).

A row's state is only valid for the row's own tokens: the graph treats a row whose past length is
0 as a new sequence (its past state as zeros, trt_llm/families/qwen3_5/decoder.py), so a row freed and taken
again needs no clearing. Nothing here holds per-token slots: `move_slots` (EAGLE's tree) cannot be
served, and the build refuses a draft on a recurrent model.
"""

from __future__ import annotations

import numpy as np

from trt_llm.schemas.graph_spec import past, present


class RecurrentCache:
    def __init__(self, layers: list[int], batch: int, states, dtype):
        """layers: the graph's layer indices of this group; states: their StateTensor specs (one
        geometry for the group); dtype: the model's, for states of dtype "model"."""
        self.layers, self.states = list(layers), list(states)
        self.dtypes = [np.dtype(dtype) if s.dtype == "model" else np.dtype(np.float32) for s in self.states]
        self.current = self._zeros(batch)
        self.spare = self._zeros(batch)
        self.rows = batch  # rows the buffers are allocated for
        self.batch = batch
        self.capacity = 0  # (holds no tokens)
        self._generation = 0  # counts swaps and reallocations, which an engine rebinds
        self._pool: RecurrentCache | None = None  # a window's pool, its first row
        self._start = 0

    def _zeros(self, rows: int) -> list[np.ndarray]:
        return [np.zeros((rows, *s.shape), d) for _ in self.layers for s, d in zip(self.states, self.dtypes)]

    def _names(self) -> list[tuple[str, int]]:
        return [(s.name, layer) for layer in self.layers for s in self.states]

    @property
    def generation(self) -> int:
        return self._pool.generation if self._pool is not None else self._generation

    def _buffers(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(current, spare) of this group's rows: a window's are views of its pool's, taken now (the
        pool's two lists swap at every pool step)."""
        if self._pool is None:
            return self.current, self.spare
        rows = slice(self._start, self._start + self.batch)
        return [b[rows] for b in self._pool.current], [b[rows] for b in self._pool.spare]

    # -- the group operations (runtime/cache/cache_set.py) ----------------------------------------

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        current, _ = self._buffers()
        for target, source in enumerate(rows):
            if target != source:
                for buffer in current:
                    buffer[target] = buffer[source]
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        raise ValueError("a recurrent layer's state cannot keep only some of a step's tokens (an EAGLE tree)")

    def window(self, start: int, stop: int) -> "RecurrentCache":
        part = RecurrentCache.__new__(RecurrentCache)
        part.layers, part.states, part.dtypes = self.layers, self.states, self.dtypes
        part.rows = part.batch = stop - start
        part.capacity, part._generation = 0, 0
        pool = self._pool or self
        part._pool, part._start = pool, self._start + start
        part.current = part.spare = None  # read through the pool (_buffers)
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        if rows <= self.rows:
            return
        current = self._zeros(rows)
        for new, old in zip(current, self.current):
            new[: len(used)] = old[: len(used)]
        self.current, self.spare, self.rows = current, self._zeros(rows), rows
        self._generation += 1

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict:
        return {}

    def tensors(self) -> list[tuple[str | None, str | None, np.ndarray]]:
        """Each state's current buffer as its past_* input, its spare as its present_* output."""
        current, spare = self._buffers()
        bound = []
        for (name, layer), read, write in zip(self._names(), current, spare):
            bound += [(past(name, layer), None, read[: self.batch]), (None, present(name, layer), write[: self.batch])]
        return bound

    def finish_step(self) -> None:
        """After an engine call: what it wrote (spare) becomes the rows' state."""
        if self._pool is None:
            self.current, self.spare = self.spare, self.current
            self._generation += 1
            return
        current, spare = self._buffers()
        for read, write in zip(current, spare):
            read[:] = write

    # -- a row's states: what context reuse snapshots and restores --------------------------------

    def snapshot(self, row: int) -> list[np.ndarray]:
        """Copies of `row`'s states, layer by layer, state by state."""
        current, _ = self._buffers()
        return [buffer[row].copy() for buffer in current]

    def load(self, row: int, states: list[np.ndarray]) -> None:
        current, _ = self._buffers()
        for buffer, state in zip(current, states):
            buffer[row] = state
