"""Open an engine directory's decoder on the backend it was built for."""

from __future__ import annotations

from trt_llm.runtime.engine_dir import EngineDir


def open_engine(engine_dir: EngineDir, threads: int = 0, component: str = "llm", spinning: bool = True):
    """An OrtEngine (cpu) or a TrtEngine (tensorrt, tensorrt-rtx): the same `run`, `new_cache`.

    threads: CPU threads for the cpu backend (0 = ONNX Runtime's choice); the GPU backends ignore it.
    spinning: whether the cpu backend's idle threads spin briefly for more work (ort_engine.SPIN_US) or never.
    """
    backend = engine_dir.manifest["backend"]
    path = engine_dir.component_path(component, "engine")
    layers = engine_dir.layers(component)
    if backend == "cpu":
        from trt_llm.runtime.backends.ort_engine import OrtEngine

        return OrtEngine(path, layers, threads, spinning)
    from trt_llm.runtime.backends.trt_engine import TrtEngine

    return TrtEngine(path, layers, backend)
