"""The `cpu` backend: our ops lowered to ONNX Runtime's fused contrib ops."""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_llm.plugins import attention

ENGINE_NAME = "model.cpu.onnx"


def compile_cpu(graph_path: Path) -> Path:
    """Write the lowered graph beside the portable one; both read the same external weight file.

    The graph is loaded without its weights, so only the node list is rewritten and the weights
    are neither copied nor duplicated on disk.
    """
    model = onnx.load(graph_path, load_external_data=False)
    attention.lower_for_onnxruntime(model)
    engine_path = graph_path.parent / ENGINE_NAME
    onnx.save_model(model, engine_path)
    # Fail at build time, not at run time, if ONNX Runtime cannot load what we wrote.
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])
    return engine_path
