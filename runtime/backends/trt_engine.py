"""TrtEngine: a TensorRT / TensorRT-RTX plan as a named-tensor function, with the caches on the GPU.

Same `run(...)` as OrtEngine: numpy inputs in, logits written into a numpy array, the cache updated.
The small inputs are copied host->device each call, the logits device->host; the caches stay on the
device (runtime/cache/device.py: the cache set of the plan's layer specs over device memory, double-
buffered; an encoder-decoder's cross inputs among them, written once when a row is admitted).

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
from pathlib import Path

import numpy as np
from trt_llm.runtime.backends.cuda_graphs import CAPTURE, REPLAY, GraphCache, step_key
from trt_llm.runtime.cache.device import DeviceBuffer, DeviceCacheSet, _check, device_cache_set
from trt_llm.runtime.engine.step import Step
from trt_llm.common.trt_import import (
    BackendUnavailable,
    cuda_device_count,
    import_cudart,
    import_tensorrt,
    make_logger,
)
from trt_llm.schemas import graph_spec
from trt_llm.schemas.layer_spec import full_layers

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
    def __init__(self, engine_path: Path, layers, backend: str = "tensorrt", cuda_graphs: bool | None = None):
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
        self._setup(trt, cudart, engine, layers, backend, graphs)

    def _setup(self, trt, cudart, engine, layers, backend: str, graphs: bool) -> None:
        """Everything after deserializing (separate so that tests can drive it with fakes). layers:
        the plan's layer specs (schemas/layer_spec.py; an int n: n full attention layers, their
        geometry read from the plan)."""
        self.trt, self.cudart, self.engine = trt, cudart, engine
        self.backend = backend
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
        if isinstance(layers, int):
            shape = engine.get_tensor_shape(graph_spec.past("key", 0))  # [-1, Hkv, -1, D]
            layers = full_layers(layers, int(shape[1]), int(shape[3]))
        self.layers = list(layers)
        self.num_layers = len(self.layers)
        self._buffers: dict[str, DeviceBuffer] = {}
        self.timer = CudaTimer(self.cudart, self.stream)
        self.last_step_ms = 0.0

    def provides(self, output: str) -> bool:
        """Whether the plan has `output` (final_hidden_states: not in an engine built before it)."""
        return output in self.dtypes

    def new_cache(self, batch: int, capacity: int, widest: int | None = None) -> DeviceCacheSet:
        """The caches this plan binds (runtime/cache/device.py), on the device, in the plan's dtype."""
        return device_cache_set(self.cudart, self.stream, self.layers, batch, capacity,
                                self.dtypes["inputs_embeds"], widest)  # the model's dtype

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

    def run(self, step: Step, cache: DeviceCacheSet, lora: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One forward pass (runtime/engine/step.py); the new tokens go into `cache`, the outputs into the
        step's host arrays (the same contract as OrtEngine.run)."""
        cudart = self.cudart
        seq = step.inputs_embeds.shape[1]
        index = self._context_index(seq)
        # (name, shape for an input / None for an output, device address) of every tensor bound.
        bindings: list[tuple[str, tuple[int, ...] | None, int]] = []
        staged = []  # host arrays stay referenced until the synchronize below: the copies are asynchronous
        room = cache.make_room(step.past_lengths, seq)  # a sliding group's lengths
        for name, array in (*step.named_inputs(), *room.items(), *(lora or {}).items()):
            host, ptr = self._upload(name, array)
            staged.append(host)
            bindings.append((name, host.shape, ptr))
        bindings += cache.device_bindings()  # past and present of every layer, an encoder-decoder's cross inputs
        outputs = step.named_outputs()
        sizes = {}
        for name, host in outputs.items():
            sizes[name] = host.size * self.dtypes[name].itemsize
            ptr = self._buffers.setdefault(name, DeviceBuffer(cudart)).reserve(sizes[name])
            bindings.append((name, None, ptr))
        # TensorRT writes every output: one the step does not fetch (final_hidden_states [B, S, H] where no
        # embedding or MTP head asks) gets a device buffer of its own, never copied back.
        unasked = graph_spec.FINAL_HIDDEN
        if unasked in self.dtypes and unasked not in outputs:
            scratch = step.inputs_embeds.size * self.dtypes[unasked].itemsize
            bindings.append((unasked, None, self._buffers.setdefault(unasked, DeviceBuffer(cudart)).reserve(scratch)))

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

    def _capture(self, key, context, cache: DeviceCacheSet) -> None:
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
