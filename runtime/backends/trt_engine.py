"""TrtEngine: a TensorRT / TensorRT-RTX plan as a named-tensor function, with the KV cache on the GPU.

Same `run(...)` as OrtEngine: numpy inputs in, logits written into a numpy array, the cache updated.
The small inputs are copied host->device each call, the logits device->host; the KV cache stays on
the device (DeviceKVCache, the same keep_rows / views / write_prefix / read_prefix as KVCache). An
encoder-decoder's cache (Whisper: DeviceCrossAttentionCache, the cpu CrossAttentionCache's interface)
also holds each row's cross-attention keys and values on the device, written once when the row is
admitted and bound as inputs at every step (`bound_inputs`).

The cache is double-buffered: `past_*` is bound to one buffer set and `present_*` to the other, and
they swap after each step. The graph (function body or plugin) writes every slot of `present`, so
this is correct whatever TensorRT does with the memory; binding one buffer as both (in place, as the
cpu backend does) saves the copy and half the memory but needs checking on a GPU first.

CUDA graphs (on unless `cuda_graphs=False` or TRT_LLM_CUDA_GRAPHS=0): decode steps (one new token
per row) are captured with cudart stream capture around execute_async_v3 and replayed, one graph
per (profile, input shapes, bound device addresses); runtime/backends/cuda_graphs.py holds the keys and the
policy. The small inputs are copied into their fixed device buffers before the launch and the
outputs copied back after it, outside the graph. TensorRT-RTX engines use TensorRT-RTX's own
whole-graph capture on the decode context instead (its JIT swaps in shape-specialized kernels, which
a capture of ours would freeze at whatever ran first). A capture that fails costs only speed.

Importable without a GPU or TensorRT; constructing a TrtEngine there raises BackendUnavailable with
one line saying what is missing.
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trt_llm.runtime.backends.cuda_graphs import CAPTURE, REPLAY, GraphCache, step_key
from trt_llm.runtime.engine.step import Step
from trt_llm.common.trt_import import (
    BackendUnavailable,
    cuda_device_count,
    import_cudart,
    import_tensorrt,
    make_logger,
)
from trt_llm.schemas import graph_spec

GRAPHS_ENV = "TRT_LLM_CUDA_GRAPHS"
log = logging.getLogger(__name__)


def cuda_graphs_requested(flag: bool | None = None) -> bool:
    """The constructor flag when given, else TRT_LLM_CUDA_GRAPHS (default on; 0/false/off/no = off)."""
    if flag is not None:
        return bool(flag)
    value = os.environ.get(GRAPHS_ENV, "1").strip().lower()
    if value in ("1", "true", "on", "yes", ""):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{GRAPHS_ENV}={value!r}: expected 1/true/on/yes or 0/false/off/no")


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


@dataclass
class DeviceView:
    """The active rows of a device buffer [B, Hkv, L, D]: rows lead, so they are a contiguous prefix."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype


class DeviceKVCache:
    """KVCache's interface over device memory, double-buffered (see the module docstring)."""

    def __init__(self, cudart, stream, num_layers: int, batch: int, kv_heads: int, capacity: int,
                 head_dim: int, dtype):
        self.cudart, self.stream = cudart, stream
        self.dtype = np.dtype(dtype)
        self.batch, self.capacity, self.kv_heads, self.head_dim = batch, capacity, kv_heads, head_dim
        self.row_bytes = kv_heads * capacity * head_dim * self.dtype.itemsize
        self.batch_capacity = batch  # rows allocated; `batch` is the rows in use
        self.parent = None  # set on a window (see window())
        self.sets = []  # two sets of (keys, values), each a list of device pointers per layer
        for _ in range(2):
            keys, values = [], []
            for _ in range(num_layers):
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
        return (self.batch, self.kv_heads, self.capacity, self.head_dim)

    def views(self) -> list[tuple[DeviceView, DeviceView]]:
        return [(DeviceView(k, self.shape, self.dtype), DeviceView(v, self.shape, self.dtype))
                for k, v in zip(self.keys, self.values)]

    def _copy_slots(self, dst: int, src: int, n: int, kind) -> None:
        """Copy slots [0, n) of one row: Hkv runs of n*D elements, `capacity` apart on the device side."""
        pitch = self.capacity * self.head_dim * self.dtype.itemsize
        width = n * self.head_dim * self.dtype.itemsize
        host_pitch = width  # host arrays are [Hkv, n, D], contiguous
        dpitch = host_pitch if kind == self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost else pitch
        spitch = host_pitch if kind == self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice else pitch
        _check(self.cudart, self.cudart.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, self.kv_heads,
                                                          kind, self.stream))

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        """Compact to `rows` (ascending), in that order; `used[i]` = slots in use by rows[i]."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for target, (source, length) in enumerate(zip(rows, used)):
            if target != source and length > 0:
                for base in (*self.keys, *self.values):
                    self._copy_slots(base + target * self.row_bytes, base + source * self.row_bytes, length, kind)
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        """Copy slots `sources` (ascending, each >= its target) of `row` to start, start + 1, ...: an
        EAGLE round keeps its accepted tree nodes' keys and values contiguous. One slot is Hkv runs of
        D elements, `capacity` slots apart; in stream order, so overlapping moves stay right."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        slot = self.head_dim * self.dtype.itemsize
        pitch = self.capacity * slot
        for target, source in enumerate(sources, start):
            if source != target:
                for base in (*self.keys, *self.values):
                    at = base + row * self.row_bytes
                    _check(self.cudart, self.cudart.cudaMemcpy2DAsync(at + target * slot, pitch, at + source * slot,
                                                                      pitch, slot, self.kv_heads, kind, self.stream))

    def window(self, start: int, stop: int) -> DeviceKVCache:
        """Rows start .. stop - 1 as a cache of their own over this one's memory (a step over some rows
        only). The engine writes `present` into the other buffer set and swaps; the window's swap
        copies its rows back into this cache's current set instead, so the other rows stay valid."""
        part = DeviceKVCache.__new__(type(self))
        part.cudart, part.stream, part.dtype = self.cudart, self.stream, self.dtype
        part.batch, part.capacity, part.kv_heads, part.head_dim = stop - start, self.capacity, self.kv_heads, self.head_dim
        part.row_bytes = self.row_bytes
        offset = start * self.row_bytes
        part.sets = [([k + offset for k in keys], [v + offset for v in values]) for keys, values in self.sets]
        part.current, part.parent, part.batch_capacity = self.current, self, stop - start
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """At least `rows` rows of `capacity` slots: new device buffers when these are smaller, with
        the `used[i]` slots of each active row i copied over (a pool that grows between steps)."""
        have_rows = self.batch_capacity
        if rows <= have_rows and capacity <= self.capacity:
            return
        rows, capacity = max(rows, have_rows), max(capacity, self.capacity)
        grown = DeviceKVCache(self.cudart, self.stream, len(self.keys), rows, self.kv_heads, capacity,
                              self.head_dim, self.dtype)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        slot = self.head_dim * self.dtype.itemsize
        for new_base, old_base in zip((*grown.keys, *grown.values), (*self.keys, *self.values)):
            for row, length in enumerate(used):
                if length > 0:
                    _check(self.cudart, self.cudart.cudaMemcpy2DAsync(
                        new_base + row * grown.row_bytes, capacity * slot, old_base + row * self.row_bytes,
                        self.capacity * slot, length * slot, self.kv_heads, kind, self.stream))
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        self._free_sets()  # only the old KV buffers: a subclass's other buffers stay
        self.sets, self.current, grown.sets = grown.sets, grown.current, []
        self.capacity, self.row_bytes, self.batch_capacity = capacity, grown.row_bytes, rows

    def write_prefix(self, row: int, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for base, saved in zip((*self.keys, *self.values), (*keys, *values)):
            saved = np.ascontiguousarray(saved, dtype=self.dtype)
            self._copy_slots(base + row * self.row_bytes, saved.ctypes.data, saved.shape[1], kind)
        # The host arrays must outlive the asynchronous copies.
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))

    def read_prefix(self, row: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        out = []
        for base in (*self.keys, *self.values):
            host = np.empty((self.kv_heads, n, self.head_dim), self.dtype)
            self._copy_slots(host.ctypes.data, base + row * self.row_bytes, n, kind)
            out.append(host)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        layers = len(out) // 2
        return out[:layers], out[layers:]

    def bound_inputs(self) -> dict[str, DeviceView]:
        """Graph inputs other than the past_* buffers that live with the rows (KVCache.bound_inputs):
        none here; an encoder-decoder's cross-attention keys and values in DeviceCrossAttentionCache."""
        return {}

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


class DeviceCrossAttentionCache(DeviceKVCache):
    """CrossAttentionCache's interface over device memory (Whisper): DeviceKVCache's self-attention
    cache, plus per decoder layer a key and a value buffer [rows, H, frames, D] of each row's encoded
    clip. They are allocated by the first write_cross (the clip's shape is the encoder's), for every
    row allocated, and single-buffered: the graph only reads them, so they do not swap. Rows lead, so a
    window's are a contiguous part of its pool's buffers and its write_cross writes into them.

    CUDA graphs: bound_inputs gives the addresses and shapes TrtEngine.run binds, which are part of a
    step's key (runtime/backends/cuda_graphs.py), so a graph is never replayed over buffers that reserve has
    replaced, nor over another batch size; what keep_rows and write_cross change is the buffers'
    contents, which a replay reads as it runs."""

    def __init__(self, cudart, stream, num_layers: int, batch: int, kv_heads: int, capacity: int,
                 head_dim: int, dtype, cross_names: list[tuple[str, str]]):
        super().__init__(cudart, stream, num_layers, batch, kv_heads, capacity, head_dim, dtype)
        self.cross_names = cross_names  # (key input, value input) per layer
        self.cross: list[int] = []  # device pointers: key, value of layer 0, then of layer 1, ...
        self.cross_shape: tuple[int, ...] | None = None  # one row's [H, frames, D]
        self._start = 0  # a window's first row in its parent

    @property
    def cross_row_bytes(self) -> int:
        return 0 if self.cross_shape is None else int(np.prod(self.cross_shape)) * self.dtype.itemsize

    def write_cross(self, row: int, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Row `row`'s clip: (key, value) host arrays [H, frames, D] per decoder layer."""
        if self.parent is not None:  # a window writes into its pool's memory (allocating it there first)
            self.parent.write_cross(self._start + row, pairs)
            self.cross_shape = self.parent.cross_shape
            self.cross = [ptr + self._start * self.cross_row_bytes for ptr in self.parent.cross]
            return
        arrays = [np.ascontiguousarray(array, dtype=self.dtype) for pair in pairs for array in pair]
        if not self.cross:
            self.cross_shape = tuple(int(d) for d in arrays[0].shape)
            self.cross = [self._allocate_cross(self.batch_capacity) for _ in arrays]
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for base, array in zip(self.cross, arrays):
            if array.nbytes != self.cross_row_bytes:
                raise ValueError(f"write_cross: a clip of shape {array.shape}, the cache's are {self.cross_shape}")
            _check(self.cudart, self.cudart.cudaMemcpyAsync(base + row * self.cross_row_bytes, array.ctypes.data,
                                                            array.nbytes, kind, self.stream))
        # The host arrays must outlive the asynchronous copies.
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))

    def _allocate_cross(self, rows: int) -> int:
        nbytes = rows * self.cross_row_bytes
        ptr = _check(self.cudart, self.cudart.cudaMalloc(nbytes))
        # Zero-filled, as the cpu cache: a row without a clip yet holds finite numbers.
        _check(self.cudart, self.cudart.cudaMemsetAsync(ptr, 0, nbytes, self.stream))
        return ptr

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for target, source in enumerate(rows):
            if target != source:
                for base in self.cross:
                    _check(self.cudart, self.cudart.cudaMemcpyAsync(
                        base + target * self.cross_row_bytes, base + source * self.cross_row_bytes,
                        self.cross_row_bytes, kind, self.stream))
        super().keep_rows(rows, used)

    def window(self, start: int, stop: int) -> DeviceCrossAttentionCache:
        part = super().window(start, stop)
        part.cross_names, part.cross_shape, part._start = self.cross_names, self.cross_shape, start
        part.cross = [ptr + start * self.cross_row_bytes for ptr in self.cross]
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """DeviceKVCache.reserve, and when the rows grow, new cross buffers with the first len(used)
        rows' clips copied over."""
        if self.cross and rows > self.batch_capacity:
            kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            grown = []
            for old in self.cross:
                new = self._allocate_cross(rows)
                if used:
                    _check(self.cudart, self.cudart.cudaMemcpyAsync(new, old, len(used) * self.cross_row_bytes, kind,
                                                                    self.stream))
                grown.append(new)
            _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
            self._free_cross()
            self.cross = grown
        super().reserve(rows, capacity, used)

    def bound_inputs(self) -> dict[str, DeviceView]:
        """cross_key_i / cross_value_i of the active rows: [batch, H, frames, D] each (none before the
        first write_cross, as the cpu cache)."""
        names = [name for pair in self.cross_names for name in pair]
        shape = (self.batch, *(self.cross_shape or ()))
        return {name: DeviceView(ptr, shape, self.dtype) for name, ptr in zip(names, self.cross)}

    def _free_cross(self) -> None:
        for ptr in self.cross:
            self.cudart.cudaFree(ptr)
        self.cross = []

    def free(self) -> None:
        if self.parent is None:
            self._free_cross()
        super().free()


class CudaTimer:
    """GPU time of the last step, from two CUDA events on the engine's stream."""

    def __init__(self, cudart, stream):
        self.cudart, self.stream = cudart, stream
        self.start = _check(cudart, cudart.cudaEventCreate())
        self.end = _check(cudart, cudart.cudaEventCreate())

    def __enter__(self):
        _check(self.cudart, self.cudart.cudaEventRecord(self.start, self.stream))
        return self

    def __exit__(self, *exc):
        _check(self.cudart, self.cudart.cudaEventRecord(self.end, self.stream))

    def elapsed_ms(self) -> float:
        """After the stream has been synchronized."""
        return float(_check(self.cudart, self.cudart.cudaEventElapsedTime(self.start, self.end)))


class TrtEngine:
    def __init__(self, engine_path: Path, num_layers: int, backend: str = "tensorrt",
                 cuda_graphs: bool | None = None):
        """cuda_graphs: capture and replay decode steps (None: TRT_LLM_CUDA_GRAPHS, default on)."""
        graphs = cuda_graphs_requested(cuda_graphs)
        trt = import_tensorrt(backend)
        count, why = cuda_device_count()
        if count == 0:
            raise BackendUnavailable(f"backend {backend!r} engines run on an NVIDIA GPU; {why}")
        if backend == "tensorrt":
            # The plan's attention layers are our Python plugins: they must be registered to deserialize.
            from trt_llm.plugins import register_tensorrt_plugins

            register_tensorrt_plugins()
        cudart = import_cudart()
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if engine is None:
            raise RuntimeError(f"{engine_path}: {backend} could not deserialize the plan (built for "
                               f"another GPU or TensorRT version? see the TensorRT errors above)")
        self._setup(trt, cudart, engine, num_layers, backend, graphs)

    def _setup(self, trt, cudart, engine, num_layers: int, backend: str, graphs: bool) -> None:
        """Everything after deserializing (separate so that tests can drive it with fakes)."""
        self.trt, self.cudart, self.engine = trt, cudart, engine
        self.num_layers, self.backend = num_layers, backend
        self.stream = _check(self.cudart, self.cudart.cudaStreamCreate())
        self._stream_handle = int(self.stream)
        self.profile_max_seq = [int(engine.get_tensor_profile_shape(graph_spec.STEP_INPUTS[0], p)[2][1])
                                for p in range(engine.num_optimization_profiles)]
        decode_profile = min(range(len(self.profile_max_seq)), key=lambda p: (self.profile_max_seq[p], p))
        native = graphs and backend == "tensorrt-rtx" and hasattr(engine, "create_runtime_config") \
            and hasattr(trt, "CudaGraphStrategy")
        self.graph_mode = "native" if native else "capture" if graphs else "off"
        # One execution context per optimization profile (0 = prefill, 1 = decode/verify): switching
        # a single context's profile costs more than holding a second context.
        self.contexts, self._runtime_configs = [], []
        for profile in range(engine.num_optimization_profiles):
            if native and profile == decode_profile:
                config = engine.create_runtime_config()
                config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
                self._runtime_configs.append(config)  # kept for the context's life
                context = engine.create_execution_context(config)
            else:
                context = engine.create_execution_context()
            context.set_optimization_profile_async(profile, self._stream_handle)
            self.contexts.append(context)
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        if native:
            log.info("CUDA graphs: TensorRT-RTX whole-graph capture on the decode context (profile %d)",
                     decode_profile)
        self.graphs = GraphCache(self._destroy_graph, enabled=self.graph_mode == "capture")
        self._torch_pool = None  # the torch memory pool of the plugin's work memory in captured graphs
        self.dtypes = {name: np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
                       for name in (engine.get_tensor_name(i) for i in range(engine.num_io_tensors))}
        cache_shape = engine.get_tensor_shape(graph_spec.past("key", 0))  # [-1, Hkv, -1, D]
        self.kv_heads, self.head_dim = int(cache_shape[1]), int(cache_shape[3])
        self._buffers: dict[str, DeviceBuffer] = {}
        self.timer = CudaTimer(self.cudart, self.stream)
        self.last_step_ms = 0.0

    def new_cache(self, batch: int, capacity: int) -> DeviceKVCache:
        """A cache this engine binds: an encoder-decoder's (the plan takes cross-attention inputs) holds
        each row's encoded clip too."""
        args = (self.cudart, self.stream, self.num_layers, batch, self.kv_heads, capacity, self.head_dim,
                self.dtypes[graph_spec.past("key", 0)])
        if graph_spec.cross("key", 0) in self.dtypes:
            names = [(graph_spec.cross("key", i), graph_spec.cross("value", i)) for i in range(self.num_layers)]
            return DeviceCrossAttentionCache(*args, names)
        return DeviceKVCache(*args)

    def _context_index(self, seq: int) -> int:
        """The profile with the smallest range that holds `seq` new tokens per row."""
        fitting = [(max_seq, i) for i, max_seq in enumerate(self.profile_max_seq) if seq <= max_seq]
        if not fitting:
            raise ValueError(f"{seq} new tokens per row exceed the engine's largest profile "
                             f"({max(self.profile_max_seq)})")
        return min(fitting)[1]

    def _upload(self, name: str, array: np.ndarray) -> tuple[np.ndarray, int]:
        """Copy a host input into its device buffer (asynchronously); returns (the host array to keep
        alive until the stream is synchronized, the device address)."""
        array = np.ascontiguousarray(array, dtype=self.dtypes[name])
        ptr = self._buffers.setdefault(name, DeviceBuffer(self.cudart)).reserve(array.nbytes)
        _check(self.cudart, self.cudart.cudaMemcpyAsync(
            ptr, array.ctypes.data, array.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))
        return array, ptr

    def run(self, step: Step, cache: DeviceKVCache, lora: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One forward pass (runtime/engine/step.py); the new tokens go into `cache`, the outputs into the
        step's host arrays (the same contract as OrtEngine.run)."""
        cudart = self.cudart
        seq = step.inputs_embeds.shape[1]
        index = self._context_index(seq)
        # (name, shape for an input / None for an output, device address) of every tensor bound.
        bindings: list[tuple[str, tuple[int, ...] | None, int]] = []
        staged = []  # host arrays stay referenced until the synchronize below: the copies are asynchronous
        for name, array in (*step.named_inputs(), *(lora or {}).items()):
            host, ptr = self._upload(name, array)
            staged.append(host)
            bindings.append((name, host.shape, ptr))
        for i in range(self.num_layers):
            for kind, past, present in (("key", cache.keys, cache.next_keys),
                                        ("value", cache.values, cache.next_values)):
                bindings.append((graph_spec.past(kind, i), cache.shape, past[i]))
                bindings.append((graph_spec.present(kind, i), None, present[i]))
        for name, view in cache.bound_inputs().items():  # an encoder-decoder's cross keys and values
            bindings.append((name, view.shape, view.ptr))
        outputs = step.named_outputs()
        sizes = {}
        for name, host in outputs.items():
            sizes[name] = host.size * self.dtypes[name].itemsize
            ptr = self._buffers.setdefault(name, DeviceBuffer(cudart)).reserve(sizes[name])
            bindings.append((name, None, ptr))

        key = step_key(index, bindings, seq) if self.graph_mode == "capture" else None
        action = self.graphs.decide(key)
        context = self.contexts[index]
        with self.timer:
            if action == REPLAY:
                _check(cudart, cudart.cudaGraphLaunch(self.graphs.graph(key), self.stream))
            else:
                for name, shape, ptr in bindings:
                    if shape is not None:
                        context.set_input_shape(name, shape)
                    context.set_tensor_address(name, ptr)
                if not context.execute_async_v3(self._stream_handle):
                    raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT errors above)")
        if action == CAPTURE:
            # After the plain run of this very step (which flushed TensorRT's work for the shapes):
            # recording executes nothing, so the step's results are the plain run's.
            self._capture(key, context, cache)
        converted = []
        for name, host in outputs.items():
            # Straight into the caller's array when the dtypes agree; else through a staging array.
            target = host if self.dtypes[name] == host.dtype else np.empty(host.shape, self.dtypes[name])
            _check(cudart, cudart.cudaMemcpyAsync(target.ctypes.data, self._buffers[name].ptr, sizes[name],
                                                  cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))
            if target is not host:
                converted.append((host, target))
        _check(cudart, cudart.cudaStreamSynchronize(self.stream))
        for host, target in converted:
            host[...] = target
        del staged
        cache.swap()
        self.last_step_ms = self.timer.elapsed_ms()
        return step.logits

    def _capture(self, key, context, cache: DeviceKVCache) -> None:
        """Record the context's execution with its current bindings as a graph for `key`."""
        cudart = self.cudart
        capturable = getattr(context, "is_stream_capturable", None)
        if capturable is not None and not capturable(self._stream_handle):
            self.graphs.capture_failed(key, "TensorRT reports that this execution context cannot be captured")
            return
        graph = None
        try:
            with self._capture_allocations():
                # Thread-local: only this thread's unsafe calls (a synchronize in a kernel) break the capture.
                _check(cudart, cudart.cudaStreamBeginCapture(
                    self.stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
                try:
                    executed = context.execute_async_v3(self._stream_handle)
                finally:
                    err, graph = cudart.cudaStreamEndCapture(self.stream)
            if not executed:
                raise RuntimeError("execute_async_v3 failed while capturing")
            _check(cudart, (err,))
            graph_exec = _check(cudart, cudart.cudaGraphInstantiate(graph, 0))
        except Exception as error:  # noqa: BLE001 - any failure means: this shape runs without a graph
            cudart.cudaGetLastError()  # capture errors are not sticky; leave no error pending
            self.graphs.capture_failed(key, str(error) or type(error).__name__)
            return
        finally:
            if graph is not None and int(graph) != 0:
                cudart.cudaGraphDestroy(graph)
        self.graphs.captured(key, graph_exec)
        log.info("CUDA graph captured: decode step, batch %d, KV capacity %d (%d graphs held)",
                 cache.batch, cache.capacity, len(self.graphs))

    def _capture_allocations(self):
        """Where torch allocates while a graph is captured: the `tensorrt` plugin's kernel is torch, and
        the work memory a captured graph writes must stay its own. A private pool, kept for the
        engine's life, is never handed to allocations outside captures (nor freed by empty_cache)."""
        if self.backend != "tensorrt":
            return nullcontext()
        import torch

        if not torch.cuda.is_available():
            return nullcontext()
        if self._torch_pool is None:
            self._torch_pool = torch.cuda.MemPool()
        return torch.cuda.use_mem_pool(self._torch_pool)

    def _destroy_graph(self, graph_exec) -> None:
        self.cudart.cudaGraphExecDestroy(graph_exec)

    def close(self) -> None:
        if getattr(self, "graphs", None) is not None:
            self.graphs.clear()
        for buffer in self._buffers.values():
            buffer.free()
        self._buffers = {}
        if getattr(self, "stream", None) is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
