"""Import TensorRT / TensorRT-RTX and cuda-python lazily, and say in one line what is missing.

Both the build (`trt_llm.build.tensorrt_backend`) and the runtime (`engine_dir`, `trt_engine`) go through
here, so nothing imports TensorRT unless a TensorRT backend is used, and every refusal reads the same.
"""

from __future__ import annotations

import importlib
import logging

MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
INSTALL = {"tensorrt": "pip install 'trt-llm[tensorrt]'", "tensorrt-rtx": "pip install 'trt-llm[tensorrt-rtx]'"}
CUDA_INSTALL = "pip install cuda-python"


class BackendUnavailable(ImportError):
    """A TensorRT backend was asked for on a machine that cannot serve it; the message is one line."""


def import_tensorrt(backend: str):
    """The `tensorrt` or `tensorrt_rtx` module, or BackendUnavailable naming what to install."""
    module = MODULES[backend]
    try:
        return importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - a stub wheel or a missing shared library raises anything
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BackendUnavailable(
            f"backend {backend!r} needs the Python module {module!r}, which cannot be imported "
            f"({reason}); install it with: {INSTALL[backend]}") from None


def import_cudart():
    """cuda-python's runtime bindings (importable without a GPU), or BackendUnavailable."""
    try:
        from cuda.bindings import runtime as cudart
    except Exception:  # noqa: BLE001
        try:  # cuda-python before 12.6 exposes the same module as `cuda.cudart`
            from cuda import cudart
        except Exception:  # noqa: BLE001
            raise BackendUnavailable(f"the TensorRT runtime needs cuda-python; install it with: {CUDA_INSTALL}") from None
    return cudart


def cuda_device_count() -> tuple[int, str]:
    """(number of CUDA devices, why none when 0). Never raises: without a driver the call returns an
    error code (cudaGetDeviceCount does not raise, unlike cuInit)."""
    try:
        cudart = import_cudart()
    except BackendUnavailable as error:
        return 0, str(error)
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception as error:  # noqa: BLE001
        return 0, f"no CUDA device: {error}"
    if err != cudart.cudaError_t.cudaSuccess:
        return 0, f"no CUDA device ({getattr(err, 'name', err)})"
    if count == 0:
        return 0, "no CUDA device"
    return int(count), ""


def runtime_missing(backend: str) -> str | None:
    """Why an engine of `backend` cannot run on this machine, or None when it can."""
    try:
        import_tensorrt(backend)
    except BackendUnavailable as error:
        return str(error)
    count, why = cuda_device_count()
    if count == 0:
        return f"backend {backend!r} engines run on an NVIDIA GPU; {why}"
    return None


def make_logger(trt, min_severity=None):
    """TensorRT's messages through Python logging, without the per-layer "node named nX already
    exists" warnings: the parser inlines one function body per layer and its node names repeat."""
    min_severity = trt.Logger.WARNING if min_severity is None else min_severity
    levels = {trt.Logger.INTERNAL_ERROR: logging.CRITICAL, trt.Logger.ERROR: logging.ERROR,
              trt.Logger.WARNING: logging.WARNING, trt.Logger.INFO: logging.INFO,
              trt.Logger.VERBOSE: logging.DEBUG}

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if int(severity) > int(min_severity) or "already exists, the output tensors" in msg:
                return
            logging.getLogger("tensorrt").log(levels.get(severity, logging.WARNING), "%s", msg)

    return Logger()
