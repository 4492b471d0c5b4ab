"""A TensorRT / TensorRT-RTX plan as a plain function of named numpy arrays: an encoder's engine
(the vision component's), which has no cache and runs once per request.

`run(feeds)` copies the inputs to the device, sets their shapes, asks the context for the outputs'
shapes, runs and copies the outputs back: the same contract as an ONNX Runtime session's
`run(None, feeds)`, so the encoders take either. One optimization profile (the vision graph has one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_llm.runtime.cache.device import DeviceBuffer, _check
from trt_llm.common.trt_import import BackendUnavailable, cuda_device_count, import_cudart, import_tensorrt, make_logger


class TrtSession:
    def __init__(self, engine_path: Path, backend: str):
        trt = import_tensorrt(backend)
        count, why = cuda_device_count()
        if count == 0:
            raise BackendUnavailable(f"backend {backend!r} engines run on an NVIDIA GPU; {why}")
        if backend == "tensorrt":
            from trt_llm.plugins import register_tensorrt_plugins

            register_tensorrt_plugins()  # the vision attention plugin, to deserialize
        self.trt, self.cudart = trt, import_cudart()
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{engine_path}: {backend} could not deserialize the plan")
        self.context = self.engine.create_execution_context()
        self.stream = _check(self.cudart, self.cudart.cudaStreamCreate())
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.inputs = [n for n in names if is_input[n]]
        self.outputs = [n for n in names if not is_input[n]]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self._buffers = {n: DeviceBuffer(self.cudart) for n in names}

    def input_dtype(self, name: str) -> np.dtype:
        return self.dtypes[name]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        cudart, context = self.cudart, self.context
        staged = []  # host arrays stay referenced until the synchronize: the copies are asynchronous
        for name in self.inputs:
            array = np.ascontiguousarray(feeds[name], dtype=self.dtypes[name])
            ptr = self._buffers[name].reserve(array.nbytes)
            _check(cudart, cudart.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes,
                                                  cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))
            context.set_input_shape(name, array.shape)
            context.set_tensor_address(name, ptr)
            staged.append(array)
        results = []
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            host = np.empty(shape, self.dtypes[name])
            context.set_tensor_address(name, self._buffers[name].reserve(host.nbytes))
            results.append(host)
        if not context.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT errors above)")
        for name, host in zip(self.outputs, results):
            _check(cudart, cudart.cudaMemcpyAsync(host.ctypes.data, self._buffers[name].ptr, host.nbytes,
                                                  cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))
        _check(cudart, cudart.cudaStreamSynchronize(self.stream))
        del staged
        return results
