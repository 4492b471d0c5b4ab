"""An encoder component's graph (vision/, audio/) as a plain function of named numpy arrays, on the
engine's backend: an ONNX Runtime session (cpu) or the TensorRT plan (runtime/backends/trt_session.py)."""

from __future__ import annotations

import numpy as np


class OrtSession:
    """An ONNX Runtime session with TrtSession's face: run(feeds) -> outputs in the graph's order,
    input_dtype(name)."""

    def __init__(self, path, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.types = {i.name: i.type for i in self.session.get_inputs()}

    def input_dtype(self, name: str) -> np.dtype:
        return np.dtype(np.float16) if self.types[name] == "tensor(float16)" else np.dtype(np.float32)

    def run(self, feeds: dict) -> list[np.ndarray]:
        return self.session.run(None, feeds)


def encoder_session(engine_dir, component: str, threads: int):
    """The `component` graph of an engine directory on its backend."""
    backend, path = engine_dir.manifest["backend"], engine_dir.component_path(component, "engine")
    if backend == "cpu":
        return OrtSession(path, threads)
    from trt_llm.runtime.backends.trt_session import TrtSession

    return TrtSession(path, backend)
