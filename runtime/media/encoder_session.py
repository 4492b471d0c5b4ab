"""An encoder component's graph (vision/, audio/) as a plain function of named numpy arrays, on the
engine's backend: an ONNX Runtime session (cpu) or the TensorRT plan (runtime/backends/trt_session.py)."""

from __future__ import annotations

import numpy as np


class OrtSession:
    """An ONNX Runtime session with TrtSession's face: run(feeds) -> outputs in the graph's order,
    input_dtype(name)."""

    def __init__(self, path, threads: int):
        from pathlib import Path

        import onnxruntime as ort

        from trt_llm.runtime.backends.ort_engine import MATMUL_ACCURACY_LEVEL, open_session

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(MATMUL_ACCURACY_LEVEL))
        # A quantized encoder's graph is the one ONNX Runtime optimised at build time (as the decoder's,
        # runtime/backends/ort_engine.py), loaded without fusing its matmuls again (int8 Whisper's
        # encoder: 89 -> 28 ms). A float encoder has none.
        self.session, _ = open_session(Path(path), options)
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
