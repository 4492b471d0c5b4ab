"""TrtEngine: a TensorRT / TensorRT-RTX plan as a named-tensor function, with the KV cache on the GPU.

Same `run(...)` as OrtEngine: numpy inputs in, logits written into a numpy array, the cache updated.
The small inputs are copied host->device each call, the logits device->host; the KV cache stays on
the device (DeviceKVCache, the same keep_rows / views / write_prefix / read_prefix as KVCache).

The cache is double-buffered: `past_*` is bound to one buffer set and `present_*` to the other, and
they swap after each step. The graph (function body or plugin) writes every slot of `present`, so
this is correct whatever TensorRT does with the memory; binding one buffer as both (in place, as the
cpu backend does) saves the copy and half the memory but needs checking on a GPU first.

Importable without a GPU or TensorRT; constructing a TrtEngine there raises BackendUnavailable with
one line saying what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_llm.runtime.trt_import import (BackendUnavailable, cuda_device_count, import_cudart, import_tensorrt,
                                        make_logger)

SMALL_INPUTS = ("inputs_embeds", "position_ids", "past_lengths", "query_lengths", "logits_indices")


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
        self.current = 1 - self.current

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

    def free(self) -> None:
        for keys, values in self.sets:
            for ptr in (*keys, *values):
                self.cudart.cudaFree(ptr)
        self.sets = []

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


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
    def __init__(self, engine_path: Path, num_layers: int, backend: str = "tensorrt"):
        trt = import_tensorrt(backend)
        count, why = cuda_device_count()
        if count == 0:
            raise BackendUnavailable(f"backend {backend!r} engines run on an NVIDIA GPU; {why}")
        if backend == "tensorrt":
            # The plan's attention layers are our Python plugin: it must be registered to deserialize.
            from trt_llm.plugins.attention import register_tensorrt_plugin

            register_tensorrt_plugin()
        self.trt, self.cudart = trt, import_cudart()
        self.num_layers = num_layers
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{engine_path}: {backend} could not deserialize the plan (built for "
                               f"another GPU or TensorRT version? see the TensorRT errors above)")
        self.stream = _check(self.cudart, self.cudart.cudaStreamCreate())
        self._stream_handle = int(self.stream)
        # One execution context per optimization profile (0 = prefill, 1 = decode/verify): switching
        # a single context's profile costs more than holding a second context.
        self.contexts, self.profile_max_seq = [], []
        for profile in range(self.engine.num_optimization_profiles):
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(profile, self._stream_handle)
            self.contexts.append(context)
            self.profile_max_seq.append(self.engine.get_tensor_profile_shape("inputs_embeds", profile)[2][1])
        _check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream))
        self.dtypes = {name: np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
                       for name in (self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors))}
        cache_shape = self.engine.get_tensor_shape("past_key_0")  # [-1, Hkv, -1, D]
        self.kv_heads, self.head_dim = int(cache_shape[1]), int(cache_shape[3])
        self._buffers: dict[str, DeviceBuffer] = {}
        self.timer = CudaTimer(self.cudart, self.stream)
        self.last_step_ms = 0.0

    def new_cache(self, batch: int, capacity: int) -> DeviceKVCache:
        return DeviceKVCache(self.cudart, self.stream, self.num_layers, batch, self.kv_heads, capacity,
                             self.head_dim, self.dtypes["past_key_0"])

    def _context_for(self, seq: int):
        """The profile with the smallest range that holds `seq` new tokens per row."""
        fitting = [(max_seq, i) for i, max_seq in enumerate(self.profile_max_seq) if seq <= max_seq]
        if not fitting:
            raise ValueError(f"{seq} new tokens per row exceed the engine's largest profile "
                             f"({max(self.profile_max_seq)})")
        return self.contexts[min(fitting)[1]]

    def _upload(self, context, name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtypes[name])
        buffer = self._buffers.setdefault(name, DeviceBuffer(self.cudart))
        ptr = buffer.reserve(array.nbytes)
        _check(self.cudart, self.cudart.cudaMemcpyAsync(
            ptr, array.ctypes.data, array.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))
        context.set_input_shape(name, array.shape)
        context.set_tensor_address(name, ptr)
        return array  # kept alive by the caller until the stream is synchronized

    def run(self, inputs_embeds: np.ndarray, position_ids: np.ndarray, past_lengths: np.ndarray,
            query_lengths: np.ndarray, logits_indices: np.ndarray, cache: DeviceKVCache,
            logits_out: np.ndarray, extra: dict[str, np.ndarray] | None = None,
            step_inputs: dict[str, np.ndarray] | None = None,
            step_outputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One forward pass; the new tokens go into `cache`, the logits into `logits_out` (float32 [B, K, V]).

        extra, step_inputs: more inputs by name; step_outputs: more outputs by name, copied into
        the given host arrays (the same contract as OrtEngine.run)."""
        cudart = self.cudart
        context = self._context_for(inputs_embeds.shape[1])
        # Host arrays stay referenced until the synchronize below: the copies are asynchronous.
        staged = [self._upload(context, name, array) for name, array in zip(
            SMALL_INPUTS, (inputs_embeds, position_ids, past_lengths, query_lengths, logits_indices))]
        staged += [self._upload(context, name, array)
                   for name, array in (*(extra or {}).items(), *(step_inputs or {}).items())]
        for i in range(self.num_layers):
            for kind, past, present in (("key", cache.keys, cache.next_keys),
                                        ("value", cache.values, cache.next_values)):
                context.set_input_shape(f"past_{kind}_{i}", cache.shape)
                context.set_tensor_address(f"past_{kind}_{i}", past[i])
                context.set_tensor_address(f"present_{kind}_{i}", present[i])
        outputs = {"logits": logits_out, **(step_outputs or {})}
        device = {}
        for name, host in outputs.items():
            buffer = self._buffers.setdefault(name, DeviceBuffer(cudart))
            device[name] = (buffer, host.size * self.dtypes[name].itemsize)
            context.set_tensor_address(name, buffer.reserve(device[name][1]))
        with self.timer:
            if not context.execute_async_v3(self._stream_handle):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT errors above)")
        converted = []
        for name, host in outputs.items():
            buffer, size = device[name]
            # Straight into the caller's array when the dtypes agree; else through a staging array.
            target = host if self.dtypes[name] == host.dtype else np.empty(host.shape, self.dtypes[name])
            _check(cudart, cudart.cudaMemcpyAsync(target.ctypes.data, buffer.ptr, size,
                                                  cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))
            if target is not host:
                converted.append((host, target))
        _check(cudart, cudart.cudaStreamSynchronize(self.stream))
        for host, target in converted:
            host[...] = target
        del staged
        cache.swap()
        self.last_step_ms = self.timer.elapsed_ms()
        return logits_out

    def close(self) -> None:
        for buffer in self._buffers.values():
            buffer.free()
        self._buffers = {}
        if getattr(self, "stream", None) is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
