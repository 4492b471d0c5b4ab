"""trt-llm int4 on llama.cpp's Q4_0 weights, the same engine as `ours-int4`, on ONNX Runtime's own
MatMulNBits instead of our kernels (TRT_LLM_CPU_KERNELS=0 in its worker): what the kernels change, in
the same run."""

from __future__ import annotations

from . import ours_int4

NAME = "trt-llm-int4-mlas"
BATCHED = True
ENV = {"TRT_LLM_CPU_KERNELS": "0"}  # set in the worker process before the engine loads
Runner = ours_int4.Runner
missing = ours_int4.missing
prepare = ours_int4.prepare
