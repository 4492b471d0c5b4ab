"""The session the cpu kernels' tests compare: ONNX Runtime on a graph as written, or as the cpu backend opens
it with our kernels (runtime/backends/cpu_kernels.adopt)."""

from __future__ import annotations

import onnx
import onnxruntime as ort

from trt_llm.runtime.backends import cpu_kernels


def kernel_session(model: onnx.ModelProto, tmp_path, op: str | None = None, threads: int = 2) -> ort.InferenceSession:
    """A session on `model` with `threads` intra-op threads; op: one of our kernels' ops (trt_llm.cpu), which must
    have taken a node as the graph was adopted; None: the graph as written, on ONNX Runtime's own kernels."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    graph = model.SerializeToString()
    if op is not None:
        graph = cpu_kernels.adopt(graph, options, tmp_path)
        assert isinstance(graph, bytes) and op.encode() in graph
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
