"""recurrent_cache.RecurrentCache's interface over device memory, for the TensorRT backends: per layer
and named state a buffer [rows, *shape], double-buffered as the device KV groups are
(runtime/cache/device.py): `past_*` is bound to one set and `present_*` to the other, and they swap
after each step (a window's rows are copied back into its pool's current set instead, so the
other rows stay valid). Rows lead, so a window's rows are a contiguous part of its pool's buffers.

Importable without a GPU: every call goes through the `cudart` module handed in (cuda-python's
runtime, or the tests' simulated one).
"""

from __future__ import annotations

import numpy as np

from trt_llm.runtime.cache.device import _check
from trt_llm.schemas.graph_spec import past, present


class DeviceRecurrentCache:
    def __init__(self, cudart, stream, layers: list[int], batch: int, states, dtype):
        self.cudart, self.stream = cudart, stream
        self.layers, self.states = list(layers), list(states)
        dtypes = [np.dtype(dtype) if s.dtype == "model" else np.dtype(np.float32) for s in self.states]
        # one entry per (layer, state), layer by layer: its name, row shape, dtype and bytes a row
        self.tensors = [(s.name, layer, tuple(s.shape), d, int(np.prod(s.shape)) * d.itemsize)
                        for layer in self.layers for s, d in zip(self.states, dtypes)]
        self.batch = self.batch_capacity = batch
        self.capacity = 0  # (holds no tokens)
        self.parent, self._start, self.generation = None, 0, 0
        self.sets = [self._allocate(batch), self._allocate(batch)]
        self.current = 0

    def _allocate(self, rows: int) -> list[int]:
        pointers = []
        for *_, row_bytes in self.tensors:
            ptr = _check(self.cudart, self.cudart.cudaMalloc(rows * row_bytes))
            _check(self.cudart, self.cudart.cudaMemsetAsync(ptr, 0, rows * row_bytes, self.stream))
            pointers.append(ptr)
        return pointers

    def _copy(self, dst: int, src: int, nbytes: int, kind) -> None:
        _check(self.cudart, self.cudart.cudaMemcpyAsync(dst, src, nbytes, kind, self.stream))

    @property
    def _kind(self):
        return self.cudart.cudaMemcpyKind

    def device_bindings(self) -> list[tuple[str, tuple[int, ...] | None, int]]:
        now, following = self.sets[self.current], self.sets[1 - self.current]
        bound = []
        for (name, layer, shape, _, _), read, write in zip(self.tensors, now, following):
            bound += [(past(name, layer), (self.batch, *shape), read), (present(name, layer), None, write)]
        return bound

    def swap(self) -> None:
        """After a step: what the engine wrote as `present` is the rows' state now."""
        if self.parent is None:
            self.current = 1 - self.current
            self.generation += 1
            return
        for (*_, row_bytes), live, written in zip(self.tensors, self.sets[self.current], self.sets[1 - self.current]):
            self._copy(live, written, self.batch * row_bytes, self._kind.cudaMemcpyDeviceToDevice)

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        for target, source in enumerate(rows):
            if target != source:
                for (*_, row_bytes), base in zip(self.tensors, self.sets[self.current]):
                    self._copy(base + target * row_bytes, base + source * row_bytes, row_bytes,
                               self._kind.cudaMemcpyDeviceToDevice)
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        raise ValueError("a recurrent layer's state cannot keep only some of a step's tokens (an EAGLE tree)")

    def window(self, start: int, stop: int) -> DeviceRecurrentCache:
        part = DeviceRecurrentCache.__new__(DeviceRecurrentCache)
        part.__dict__.update({k: v for k, v in self.__dict__.items() if k != "sets"})
        part.sets = [[base + start * t[-1] for base, t in zip(pointers, self.tensors)] for pointers in self.sets]
        part.batch = part.batch_capacity = stop - start
        part.parent, part._start, part.generation = self, start, 0
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        if rows <= self.batch_capacity:
            return
        grown = self._allocate(rows)
        for (*_, row_bytes), new, old in zip(self.tensors, grown, self.sets[self.current]):
            if used:
                self._copy(new, old, len(used) * row_bytes, self._kind.cudaMemcpyDeviceToDevice)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        self.free()
        self.sets, self.current = [grown, self._allocate(rows)], 0
        self.batch_capacity = rows
        self.generation += 1

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict:
        return {}

    def snapshot(self, row: int) -> list[np.ndarray]:
        """Host copies of `row`'s states (context reuse's snapshots)."""
        arrays = []
        for (_, _, shape, dtype, row_bytes), base in zip(self.tensors, self.sets[self.current]):
            array = np.empty(shape, dtype)
            self._copy(array.ctypes.data, base + row * row_bytes, row_bytes, self._kind.cudaMemcpyDeviceToHost)
            arrays.append(array)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        return arrays

    def load(self, row: int, states: list[np.ndarray]) -> None:
        arrays = [np.ascontiguousarray(state, dtype=t[3]) for state, t in zip(states, self.tensors)]
        for (*_, row_bytes), base, array in zip(self.tensors, self.sets[self.current], arrays):
            self._copy(base + row * row_bytes, array.ctypes.data, row_bytes, self._kind.cudaMemcpyHostToDevice)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))  # the host arrays outlive the copies

    def free(self) -> None:
        if self.parent is None:
            for pointers in self.sets:
                for ptr in pointers:
                    self.cudart.cudaFree(ptr)
            self.sets = [[], []]
