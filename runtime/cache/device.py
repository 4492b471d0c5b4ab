"""The cache groups of runtime/cache/cache_set.py over GPU memory, for the TensorRT backends: the same
operations as the host groups (kv_cache.KVCache, cross_cache.CrossCache), by cudaMemcpy.

A KV group is double-buffered: `past_*` is bound to one buffer set and `present_*` to the other, and
they swap after each step. The graph (function body or plugin) writes every slot of `present`, so
this is correct whatever TensorRT does with the memory; binding one buffer as both (in place, as the
cpu backend does) saves the copy and half the memory but needs checking on a GPU first. The cross
inputs are single-buffered: the graph only reads them.

Importable without a GPU: every call goes through the `cudart` module handed in (cuda-python's
runtime, or the tests' simulated one).
"""

from __future__ import annotations

import numpy as np

from trt_llm.runtime.cache.cache_set import CacheSet, make_groups
from trt_llm.runtime.cache.kv_cache import window_slots
from trt_llm.schemas.graph_spec import cross, past, present, window_lengths


def _check(cudart, result):
    """cuda-python calls return (err, *values): raise on an error, else return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA error: {cudart.cudaGetErrorString(err)[1].decode()} ({err.name})")
    return values[0] if len(values) == 1 else values


class DeviceBuffer:
    """Device memory that grows on demand (never shrinks): one per small input and for the logits."""

    def __init__(self, cudart):
        self.cudart, self.ptr, self.nbytes = cudart, 0, 0

    def reserve(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.free()
            self.ptr = _check(self.cudart, self.cudart.cudaMalloc(max(nbytes, 256)))
            self.nbytes = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            self.cudart.cudaFree(self.ptr)
            self.ptr, self.nbytes = 0, 0


class DeviceKVCache:
    """kv_cache.KVCache's interface (full or sliding group) over device memory, double-buffered."""

    def __init__(self, cudart, stream, num_layers: int, batch: int, kv_heads: int, capacity: int,
                 head_dim: int, dtype, layers: list[int] | None = None, window: int = 0, widest: int | None = None):
        self.cudart, self.stream = cudart, stream
        self.dtype = np.dtype(dtype)
        self.layers = list(layers) if layers is not None else list(range(num_layers))
        self.window_size, self.widest = window, widest  # None: the capacity, whatever it grows to
        self.slots = window_slots(window, capacity, self.widest)
        self.batch, self.capacity, self.kv_heads, self.head_dim = batch, capacity, kv_heads, head_dim
        self.row_bytes = kv_heads * self.slots * head_dim * self.dtype.itemsize
        self.batch_capacity = batch  # rows allocated; `batch` is the rows in use
        self.offsets = np.zeros(batch, np.int64)  # per row: tokens dropped from the front (sliding)
        self.parent = None  # set on a window (see window())
        self.generation = 0  # counts the buffers' replacements (reserve)
        self.sets = []  # two sets of (keys, values), each a list of device pointers per layer
        for _ in range(2):
            keys, values = [], []
            for _ in self.layers:
                for target in (keys, values):
                    ptr = _check(cudart, cudart.cudaMalloc(batch * self.row_bytes))
                    # Zero-filled: slots past a row's length are masked, but must hold finite numbers.
                    _check(cudart, cudart.cudaMemsetAsync(ptr, 0, batch * self.row_bytes, stream))
                    target.append(ptr)
            self.sets.append((keys, values))
        self.current = 0

    @property
    def keys(self) -> list[int]:
        return self.sets[self.current][0]

    @property
    def values(self) -> list[int]:
        return self.sets[self.current][1]

    @property
    def next_keys(self) -> list[int]:
        return self.sets[1 - self.current][0]

    @property
    def next_values(self) -> list[int]:
        return self.sets[1 - self.current][1]

    def swap(self) -> None:
        """After a step: what the engine wrote as `present` is the cache now."""
        if self.parent is None:
            self.current = 1 - self.current
            return
        # A window: its rows, written into the other set, are copied back into the parent's current.
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for written, live in zip((*self.next_keys, *self.next_values), (*self.keys, *self.values)):
            _check(self.cudart, self.cudart.cudaMemcpyAsync(live, written, self.batch * self.row_bytes, kind,
                                                            self.stream))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv_heads, self.slots, self.head_dim)

    def device_bindings(self) -> list[tuple[str, tuple[int, ...] | None, int]]:
        """(name, shape for an input / None for an output, device address) of each tensor bound."""
        if not self.sets:  # freed
            return []
        bound = []
        for i, layer in enumerate(self.layers):
            for kind, now, following in (("key", self.keys, self.next_keys), ("value", self.values, self.next_values)):
                bound += [(past(kind, layer), self.shape, now[i]), (present(kind, layer), None, following[i])]
        return bound

    def _copy_slots(self, dst: int, src: int, n: int, kind, dst_host: bool = False, src_host: bool = False) -> None:
        """Copy n slots of one row: Hkv runs of n*D elements, `slots` apart on the device side and
        contiguous on a host side ([Hkv, n, D])."""
        pitch = self.slots * self.head_dim * self.dtype.itemsize
        width = n * self.head_dim * self.dtype.itemsize
        _check(self.cudart, self.cudart.cudaMemcpy2DAsync(dst, width if dst_host else pitch, src,
                                                          width if src_host else pitch, width, self.kv_heads,
                                                          kind, self.stream))

    def _slot(self, base: int, row: int, slot: int) -> int:
        return base + row * self.row_bytes + slot * self.head_dim * self.dtype.itemsize

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        """Compact to `rows` (ascending), in that order; `used[i]` = tokens in use by rows[i]."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for target, (source, length) in enumerate(zip(rows, used)):
            held = length - int(self.offsets[source])
            if target != source and held > 0:
                for base in (*self.keys, *self.values):
                    self._copy_slots(self._slot(base, target, 0), self._slot(base, source, 0), held, kind)
            if target != source:
                self.offsets[target] = self.offsets[source]
        self.offsets[len(rows):] = 0  # the rows freed: the next request there starts from its first token
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        """Copy tokens `sources` (ascending, each >= its target) of `row` to start, start + 1, ...: an
        EAGLE round keeps its accepted tree nodes' keys and values contiguous. In stream order, so
        overlapping moves stay right."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        offset = int(self.offsets[row])
        for target, source in enumerate(sources, start):
            if source != target:
                for base in (*self.keys, *self.values):
                    self._copy_slots(self._slot(base, row, target - offset), self._slot(base, row, source - offset), 1,
                                     kind)

    def window(self, start: int, stop: int) -> DeviceKVCache:
        """Rows start .. stop - 1 as a cache of their own over this one's memory (a step over some rows
        only). The engine writes `present` into the other buffer set and swaps; the window's swap
        copies its rows back into this cache's current set instead, so the other rows stay valid."""
        part = DeviceKVCache.__new__(DeviceKVCache)
        part.__dict__.update({k: v for k, v in self.__dict__.items() if k != "sets"})
        offset = start * self.row_bytes
        part.sets = [([k + offset for k in keys], [v + offset for v in values]) for keys, values in self.sets]
        part.batch = part.batch_capacity = stop - start
        part.offsets = self.offsets[start:stop]
        part.parent, part.generation = self, 0
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """At least `rows` rows for `capacity` tokens: new device buffers when these are smaller, with
        the `used[i]` tokens of each active row i copied over (a pool that grows between steps)."""
        have_rows = self.batch_capacity
        capacity = max(capacity, self.capacity)
        slots = window_slots(self.window_size, capacity, self.widest)
        self.capacity = capacity
        if rows <= have_rows and slots <= self.slots:
            return
        rows = max(rows, have_rows)
        grown = DeviceKVCache(self.cudart, self.stream, len(self.layers), rows, self.kv_heads, capacity,
                              self.head_dim, self.dtype, self.layers, self.window_size, self.widest)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        slot = self.head_dim * self.dtype.itemsize
        for new_base, old_base in zip((*grown.keys, *grown.values), (*self.keys, *self.values)):
            for row, length in enumerate(used):
                held = length - int(self.offsets[row])
                if held > 0:
                    _check(self.cudart, self.cudart.cudaMemcpy2DAsync(
                        new_base + row * grown.row_bytes, grown.slots * slot, old_base + row * self.row_bytes,
                        self.slots * slot, held * slot, self.kv_heads, kind, self.stream))
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        self._free_sets()
        self.sets, self.current, grown.sets = grown.sets, grown.current, []
        self.slots, self.row_bytes, self.batch_capacity = grown.slots, grown.row_bytes, rows
        grown.offsets[: len(self.offsets)] = self.offsets
        self.offsets = grown.offsets
        self.generation += 1

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """kv_cache.KVCache.make_room: a sliding row whose step would not fit keeps its last W - 1
        tokens, moved to the front through the other buffer set (free until the step writes it)."""
        if not self.window_size:
            return {}
        if self.slots >= self.capacity:  # as many slots as tokens: it never needs to drop one (a restored
            # prefix's row holds only its last W - 1 tokens, from slot 0: `offsets` counts the ones before)
            return {window_lengths(self.window_size): (past_lengths - self.offsets[: len(past_lengths)]).astype(np.int32)}
        if self.window_size - 1 + width > self.slots:
            raise ValueError(f"a step of {width} new tokens needs {self.window_size - 1 + width} slots in the "
                             f"window-{self.window_size} cache, which holds {self.slots}")
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        keep = self.window_size - 1
        for row, length in enumerate(past_lengths[: self.batch].tolist()):
            held = length - int(self.offsets[row])
            if held + width > self.slots:
                for live, spare in zip((*self.keys, *self.values), (*self.next_keys, *self.next_values)):
                    self._copy_slots(self._slot(spare, row, 0), self._slot(live, row, held - keep), keep, kind)
                    self._copy_slots(self._slot(live, row, 0), self._slot(spare, row, 0), keep, kind)
                self.offsets[row] = length - keep
        return {window_lengths(self.window_size): (past_lengths - self.offsets[: len(past_lengths)]).astype(np.int32)}

    def needed(self, length: int) -> int:
        return max(0, length - (self.window_size - 1)) if self.window_size else 0

    def read(self, row: int, start: int, stop: int) -> tuple[list, list] | None:
        """kv_cache.KVCache.read: copies on the host (a sliding group's held last tokens of them)."""
        offset = int(self.offsets[row])
        if stop <= offset:
            return None
        start = max(start, offset)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        out = []
        for base in (*self.keys, *self.values):
            host = np.empty((self.kv_heads, stop - start, self.head_dim), self.dtype)
            if stop > start:
                self._copy_slots(host.ctypes.data, self._slot(base, row, start - offset), stop - start, kind,
                                 dst_host=True)
            out.append(host)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        layers = len(out) // 2
        return out[:layers], out[layers:]

    def restore(self, row: int, length: int, parts: list[tuple[int, list, list]]) -> None:
        """kv_cache.KVCache.restore over device memory."""
        offset = self.needed(length)
        self.offsets[row] = offset
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        staged = []  # the host arrays outlive the asynchronous copies
        for end, keys, values in parts:
            for i, (k, v) in enumerate(zip(keys, values)):
                if k is None or end <= offset:
                    continue
                skip = max(0, offset - (end - k.shape[1]))
                for base, array in ((self.keys[i], k), (self.values[i], v)):
                    host = np.ascontiguousarray(array[:, skip:], dtype=self.dtype)
                    staged.append(host)
                    self._copy_slots(self._slot(base, row, end - host.shape[1] - offset), host.ctypes.data,
                                     host.shape[1], kind, src_host=True)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))

    def write_prefix(self, row: int, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        length = keys[0].shape[1]
        self.restore(row, length, [(length, keys, values)])

    def read_prefix(self, row: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self.read(row, self.needed(n), n)

    def free(self) -> None:
        if self.parent is not None:  # a window's memory is its parent's
            return
        self._free_sets()

    def _free_sets(self) -> None:
        for keys, values in self.sets:
            for ptr in (*keys, *values):
                self.cudart.cudaFree(ptr)
        self.sets = []

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class DeviceCrossCache:
    """cross_cache.CrossCache's interface over device memory (Whisper): per cross layer a key and a
    value buffer [rows, H, frames, D] of each row's encoded clip, allocated by the first write_row
    (the clip's shape is the encoder's), single-buffered. Rows lead, so a window's are a contiguous
    part of its pool's buffers and its write_row writes into them.

    CUDA graphs: device_bindings gives the addresses and shapes TrtEngine.run binds, which are part of
    a step's key (runtime/backends/cuda_graphs.py), so a graph is never replayed over buffers that
    reserve has replaced, nor over another batch size; what keep_rows and write_row change is the
    buffers' contents, which a replay reads as it runs."""

    def __init__(self, cudart, stream, layers: list[int], batch: int, dtype):
        self.cudart, self.stream = cudart, stream
        self.layers, self.dtype = list(layers), np.dtype(dtype)
        self.buffers: list[int] = []  # device pointers: key, value of the first layer, then the next, ...
        self.shape_of_row: tuple[int, ...] | None = None  # one row's [H, frames, D]
        self.batch = self.batch_capacity = batch
        self.capacity = 0  # (holds no tokens)
        self.parent, self._start, self.generation = None, 0, 0

    @property
    def row_bytes(self) -> int:
        return 0 if self.shape_of_row is None else int(np.prod(self.shape_of_row)) * self.dtype.itemsize

    def write_row(self, row: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Row `row`'s clip: (key, value) host arrays [H, frames, D] per cross layer."""
        if self.parent is not None:  # a window writes into its pool's memory (allocating it there first)
            self.parent.write_row(self._start + row, pairs)
            self.shape_of_row = self.parent.shape_of_row
            self.buffers = [ptr + self._start * self.row_bytes for ptr in self.parent.buffers]
            return
        arrays = [np.ascontiguousarray(array, dtype=self.dtype) for pair in pairs for array in pair]
        if not self.buffers:
            self.shape_of_row = tuple(int(d) for d in arrays[0].shape)
            self.buffers = [self._allocate(self.batch_capacity) for _ in arrays]
            self.generation += 1
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for base, array in zip(self.buffers, arrays):
            if array.nbytes != self.row_bytes:
                raise ValueError(f"write_row: a clip of shape {array.shape}, the cache's are {self.shape_of_row}")
            _check(self.cudart, self.cudart.cudaMemcpyAsync(base + row * self.row_bytes, array.ctypes.data,
                                                            array.nbytes, kind, self.stream))
        # The host arrays must outlive the asynchronous copies.
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))

    def _allocate(self, rows: int) -> int:
        nbytes = rows * self.row_bytes
        ptr = _check(self.cudart, self.cudart.cudaMalloc(nbytes))
        # Zero-filled, as the cpu cache: a row without a clip yet holds finite numbers.
        _check(self.cudart, self.cudart.cudaMemsetAsync(ptr, 0, nbytes, self.stream))
        return ptr

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for target, source in enumerate(rows):
            if target != source:
                for base in self.buffers:
                    _check(self.cudart, self.cudart.cudaMemcpyAsync(
                        base + target * self.row_bytes, base + source * self.row_bytes, self.row_bytes, kind,
                        self.stream))
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        pass  # no token slots

    def window(self, start: int, stop: int) -> DeviceCrossCache:
        part = DeviceCrossCache(self.cudart, self.stream, self.layers, stop - start, self.dtype)
        part.shape_of_row, part.parent, part._start = self.shape_of_row, self, start
        part.buffers = [ptr + start * self.row_bytes for ptr in self.buffers]
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """When the rows grow: new buffers with the first len(used) rows' clips copied over."""
        if rows <= self.batch_capacity:
            return
        if self.buffers:
            kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            grown = []
            for old in self.buffers:
                new = self._allocate(rows)
                if used:
                    _check(self.cudart, self.cudart.cudaMemcpyAsync(new, old, len(used) * self.row_bytes, kind,
                                                                    self.stream))
                grown.append(new)
            _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
            self._free()
            self.buffers = grown
            self.generation += 1
        self.batch_capacity = rows

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict:
        return {}

    def device_bindings(self) -> list[tuple[str, tuple[int, ...] | None, int]]:
        """cross_key_i / cross_value_i of the active rows: [batch, H, frames, D] each (none before
        the first write_row, as the cpu cache)."""
        names = [cross(kind, layer) for layer in self.layers for kind in ("key", "value")]
        shape = (self.batch, *(self.shape_of_row or ()))
        return [(name, shape, ptr) for name, ptr in zip(names, self.buffers)]

    def swap(self) -> None:
        pass  # read only: nothing was written

    def _free(self) -> None:
        for ptr in self.buffers:
            self.cudart.cudaFree(ptr)
        self.buffers = []

    def free(self) -> None:
        if self.parent is None:
            self._free()


class DeviceCacheSet(CacheSet):
    """The composite over device groups: also what TrtEngine.run binds and its after-step swap."""

    @property
    def cudart(self):
        return self.groups[0].cudart

    def device_bindings(self) -> list[tuple[str, tuple[int, ...] | None, int]]:
        return [bound for group in self.groups for bound in group.device_bindings()]

    def swap(self) -> None:
        for group in self.groups:
            group.swap()

    def window(self, start: int, stop: int) -> DeviceCacheSet:
        return DeviceCacheSet([group.window(start, stop) for group in self.groups], self.capacity, self._num_layers)

    def free(self) -> None:
        for group in self.groups:
            group.free()


def device_cache_set(cudart, stream, layers, batch: int, capacity: int, dtype,
                     widest: int | None = None) -> DeviceCacheSet:
    """cache_set.cache_set's composite over device memory."""

    def kv(*args, **kwargs):
        return DeviceKVCache(cudart, stream, *args, **kwargs)

    def crossing(indices, rows, dtype_):
        return DeviceCrossCache(cudart, stream, indices, rows, dtype_)

    def recurrent(indices, rows, states, dtype_):
        from trt_llm.runtime.cache.device_recurrent import DeviceRecurrentCache

        return DeviceRecurrentCache(cudart, stream, indices, rows, states, dtype_)

    return DeviceCacheSet(make_groups(layers, batch, capacity, widest, dtype, kv, crossing, recurrent), capacity,
                          len(layers))
