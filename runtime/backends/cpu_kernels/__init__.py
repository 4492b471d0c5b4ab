"""Kernels of our own for ONNX Runtime's CPU provider (custom ops, domain `trt_llm.cpu`).

`MatMulBlocks8` (`matmul_blocks.c`) stands in for MatMulNBits' 4- and 8-bit blocks (of 32 or a multiple) at accuracy
level 4: the weight-only matmuls of an int4 / int8 engine, most of a decode step. It runs on packed
matrices (`blocks.c`). (A QMoE kernel on them was measured no faster than ONNX Runtime's QMoE at level 4
at decode and slower at prefill: benchmarks/results/2026-12-07/moe_op.txt; not kept.) `CachedAttention`
(`attention.c`) stands in for the GroupQueryAttention our lowering writes, in every float32 engine: a token's
output then has the same bits in a decode step and in a verification pass of several tokens (prompt
lookup, EAGLE), which GroupQueryAttention's matrix products over the whole pass do not give. `MixtureOfExperts`
(`moe.c`) stands in for ONNX Runtime's float32 MoE of SwiGLU experts: the chosen experts' weights read in
place at the memory's speed (a decode step of an fp32 MoE model is bound by them). `SwiGLU` (`swiglu.c`)
stands in for a gated MLP's Split, silu and Mul: one node where a decode step ran three a layer, with their
bits. The engine on disk is unchanged (MatMulNBits, GroupQueryAttention and MoE nodes, their weights); as a
session opens, `adopt` swaps the nodes the kernels take (rewrite.py) and registers the library (library.py,
compiled by scripts/setup.sh into a per-user cache). Where there is no library, the CPU has no AVX-512 VNNI, or
TRT_LLM_CPU_KERNELS=0, the graph runs as written, on ONNX Runtime's own kernels.

TRT_LLM_CPU_KERNELS: auto (the default: used where built and the CPU has VNNI), 0 (never), 1
(always: a FlagError, one line, where there is no library), c (always, on the kernel's plain C path: tests).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from trt_llm.common.cli_args import FlagError

ENV = "TRT_LLM_CPU_KERNELS"
VNNI_FLAGS = {"avx512_vnni", "avx512vl", "avx512bw", "f16c", "fma"}  # /proc/cpuinfo's names

log = logging.getLogger(__name__)


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "0", "1", "c"):
        raise FlagError(f"{ENV} must be auto, 0, 1 or c, got {value!r}")
    return value


@functools.cache
def cpu_supported() -> bool:
    """The CPU has what the kernel's fast path needs (else MLAS' kernels are faster than its C path)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return VNNI_FLAGS <= set(flags)


def library_path() -> Path | None:
    """The library where this run is to use it; None where the graph stays on ONNX Runtime's kernels.
    TRT_LLM_CPU_KERNELS=1 or c without a library raises, naming why."""
    return _choice()[0]


def describe() -> str:
    """One line on what a session here runs its int4 / int8 matmuls, attention and float MoE on (benchmarks
    record it)."""
    path, why = _choice()
    if path is None:
        return f"MatMulNBits, GroupQueryAttention, MoE, Split + silu + Mul ({why})"
    return f"trt_llm.cpu::MatMulBlocks8, CachedAttention, MixtureOfExperts, SwiGLU ({why}, {path.parent.name})"


def _choice() -> tuple[Path | None, str]:
    """(the library this run uses, or None; why: the path it takes, or why not)."""
    from trt_llm.runtime.backends.cpu_kernels.library import LibraryUnavailable, library

    wanted = mode()
    if wanted == "0":
        return None, f"{ENV}=0"
    if wanted == "auto" and not cpu_supported():
        return None, "no AVX-512 VNNI here"
    try:
        path = library()
    except LibraryUnavailable as error:
        if wanted != "auto":
            raise FlagError(f"{ENV}={wanted}: {error}") from None
        _warn_once(str(error))
        return None, f"our kernels not built: {error}"
    return path, "plain C" if wanted == "c" or not cpu_supported() else "AVX-512 VNNI"


@functools.cache
def _warn_once(reason: str) -> None:
    log.info("ONNX Runtime's MatMulNBits serves the int4 / int8 matmuls: our kernels are not built (%s)", reason)


def adopt(graph: Path | bytes, options, weights_folder: Path) -> Path | bytes:
    """The graph a session should load: `graph` (a path, or a serialized model whose weights lie in
    `weights_folder`) with the nodes our kernels take swapped in and the library registered in
    `options`; `graph` itself where none is swapped. `options` is raised to the basic optimisation
    level where fp16 scales stay on MatMulNBits, to fold their Casts."""
    import onnx

    from trt_llm.runtime.backends.cpu_kernels.rewrite import (half_scales, swap_attention, swap_matmuls, swap_moe,
                                                            swap_swiglu)

    path = library_path()
    model = onnx.load(str(graph), load_external_data=False) if isinstance(graph, Path) else onnx.load_from_string(graph)
    matmuls, attention, moes, swiglus = 0, 0, 0, 0
    if path:
        threads = options.intra_op_num_threads or os.cpu_count() or 1  # (0: ONNX Runtime picks, about one a core)
        matmuls, attention, moes = swap_matmuls(model), swap_attention(model, threads), swap_moe(model)
        swiglus = swap_swiglu(model)
    if half_scales(model.graph, {t.name: t for t in model.graph.initializer}):
        # fp16 scales (build/cpu_backend.HALF_SCALES_SUFFIX) that stay MatMulNBits': ONNX Runtime folds
        # their Casts at the basic level (unfolded, MatMulNBits reads a Cast's output wrongly: measured)
        import onnxruntime as ort

        basic = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        if int(options.graph_optimization_level) < int(basic):
            options.graph_optimization_level = basic
    if not matmuls and not attention and not moes and not swiglus:
        return graph
    log.info("%s: %d matmuls, %d attention, %d MoE and %d SwiGLU nodes on trt_llm.cpu's kernels (%s)",
             getattr(graph, "name", "graph"), matmuls, attention, moes, swiglus, path)
    options.register_custom_ops_library(str(path))
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(weights_folder))
    return model.SerializeToString()
