"""The compile stage: a portable bundle -> an engine directory for one backend.

It runs on the device, so it imports neither transformers nor the checkpoint loaders, our torch
forward pass or the exporter (build/checkpoint.py, models/, export.py). `trt-llm-build` runs
the export stage and then this same code on the folder it just exported; `trt-llm-compile` runs it
on a copy of a bundle. Either way the engine directory is the same.

The graph fixed the dtype, the KV cache capacity, LoRA and the draft at export; the compile
chooses the backend, max_batch_size, max_input_len (at most the capacity) and, for TensorRT-RTX,
rtx_compute_capability. Each is checked before any work, with a message that names the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trt_llm.build.engine_dir import ENGINE, read_bundle, tool_versions, write_manifest
from trt_llm.build.progress import Steps
from trt_llm.build.staging import copy_tree, staged
from trt_llm.runtime.decoding.spec_config import tree_defaults_entry
from trt_llm.schemas.build_config import MAX_BATCH_SIZE, BuildConfig, ConfigError, parse_build_config

# TensorRT: the graph is exported in this dtype and built strongly typed, so it is the precision.
SUPPORTED_DTYPES = {"cpu": ("fp32", "fp16"), "tensorrt": ("fp32", "fp16", "bf16"),
                    "tensorrt-rtx": ("fp32", "fp16", "bf16")}
TENSORRT_BACKENDS = ("tensorrt", "tensorrt-rtx")
log = logging.getLogger(__name__)


class BuildError(RuntimeError):
    """The build or compile cannot go on; one line that names the key and the allowed values."""


@dataclass
class CompileOptions:
    """The compile's choices; None keeps the bundle's (the export config's) value."""
    backend: str = "cpu"
    max_batch_size: int | None = None
    max_input_len: int | None = None
    rtx_compute_capability: str | None = None


def check_backend(config: BuildConfig, exported: bool = False) -> None:
    """Refuse a backend that cannot compile what the config (or the bundle, when `exported`) holds."""
    if config.backend not in SUPPORTED_DTYPES:
        raise BuildError(f"backend: {config.backend!r} engines cannot be built by this version yet; "
                         f"available: {', '.join(SUPPORTED_DTYPES)}")
    if config.dtype not in SUPPORTED_DTYPES[config.backend]:
        fixed = f" (the bundle was exported in {config.dtype}; export it again in one of those)" if exported else ""
        raise BuildError(f"dtype: {config.dtype!r} is not supported by the {config.backend} backend; "
                         f"choose one of {', '.join(SUPPORTED_DTYPES[config.backend])}{fixed}")
    check_quantization(config, exported)
    if config.mtp and config.draft is not None:
        raise BuildError("mtp: the checkpoint's MTP head would be the engine's draft, and draft: names another; "
                         "build with one of them")
    if config.draft is not None and config.quantization.weights != "none" and config.backend == "cpu" and not exported:
        # Measured (benchmarks/results/2026-12-01/issue17/spec_decode_int4_base_draft600.json): SmolLM2 int4,
        # a draft of 0.45 top-1, 0.63x vanilla at the default tree, 0.35x at 16 tokens.
        log.warning("draft: EAGLE over a quantized cpu base: its int8 activations round differently in a "
                    "verification pass than in a vanilla step, so the tokens can differ from vanilla decoding's "
                    "(they are exact with float activations), and the quantized base decodes fast enough that "
                    "speculation ran slower than vanilla here (README: Quantization)")
    if config.draft is not None and config.draft.quantization in ("int8", "int4") and config.backend != "cpu":
        raise BuildError(f"draft.quantization: {config.draft.quantization!r} quantizes the draft for the cpu "
                         f"backend (ONNX Runtime's integer matmuls); on {config.backend!r} use 'none' or 'auto'")
    if config.draft is not None and config.draft.quantization in ("int8", "int4") and config.dtype != "fp32":
        raise BuildError(f"draft.quantization: {config.draft.quantization!r} quantizes fp32 weights, and the "
                         f"graph is {config.dtype}; use 'none' or 'auto', or dtype 'fp32'")


def check_quantization(config: BuildConfig, exported: bool = False) -> None:
    """Refuse a `quantization:` the backend cannot run (and, before an export, an unreadable
    calibration file)."""
    quantization = config.quantization
    if quantization.weights == "none":
        return
    if quantization.calibration is not None and not exported:
        from trt_llm.build.quantize.factory import read_calibration

        try:
            read_calibration(quantization.calibration)
        except ValueError as error:
            raise BuildError(str(error)) from None
    if quantization.weights == "fp8":
        if config.backend not in TENSORRT_BACKENDS:
            raise BuildError(f"quantization.weights: fp8 is for the TensorRT backends (fp8 tensor cores); the "
                             f"{config.backend} backend takes int8 or int4")
        if config.backend == "tensorrt-rtx":
            _check_fp8_capability(config.rtx_compute_capability)
    if quantization.weights == "int8" and quantization.group_size is not None and config.backend in TENSORRT_BACKENDS:
        raise BuildError(f"quantization.group_size: TensorRT's int8 weights take one scale per output column; on "
                         f"{config.backend!r} leave group_size out for int8")
    if quantization.zero_point and config.backend in TENSORRT_BACKENDS:
        raise BuildError(f"quantization.zero_point: TensorRT's dequantize takes symmetric weights only; on "
                         f"{config.backend!r} use zero_point: false")
    if config.backend == "cpu" and config.dtype != "fp32":
        raise BuildError(f"quantization.weights: {quantization.weights} on the cpu backend runs fp32 activations "
                         f"(ONNX Runtime's integer kernels); use dtype fp32")


FP8_MIN_SM = 89  # Ada: the first GPUs with fp8 tensor cores


def _check_fp8_capability(name: str) -> None:
    """TensorRT-RTX builds for one architecture; fp8 weights need one that has fp8."""
    if name.lower() == "auto":
        from trt_llm.common.trt_import import cuda_device_count

        if cuda_device_count()[0] > 0:
            return  # the GPU present: its builder says whether it has fp8
        raise BuildError(f"quantization.weights: fp8 ahead of time (no GPU here) needs rtx_compute_capability: "
                         f"SM{FP8_MIN_SM} or later (the default, SM80, has no fp8)")
    if int(name[2:]) < FP8_MIN_SM:
        raise BuildError(f"quantization.weights: fp8 needs a GPU with fp8 (SM{FP8_MIN_SM} and later); "
                         f"rtx_compute_capability is {name}")


def draft_quantization(config: BuildConfig) -> str:
    """What `draft.quantization` means for this config: none, int8 or int4. An MTP head (`mtp:`, no
    `draft:`) stays in the model's dtype."""
    if config.draft is None:
        return "none"
    chosen = config.draft.quantization
    if chosen == "auto":
        return "int8" if config.dtype == "fp32" and config.backend == "cpu" else "none"
    return chosen


def backend_version(config: BuildConfig) -> str | None:
    """The TensorRT version that will build the plan (None for cpu); a missing TensorRT or an
    unknown compute capability is a one-line error now, before minutes of work."""
    if config.backend not in TENSORRT_BACKENDS:
        return None
    from trt_llm.common.trt_import import BackendUnavailable, import_tensorrt

    try:
        trt = import_tensorrt(config.backend)
    except BackendUnavailable as error:
        raise BuildError(str(error)) from None
    if config.backend == "tensorrt-rtx":
        from trt_llm.build.tensorrt_backend import TensorRTBuildError, compute_capability

        try:
            compute_capability(trt, config.rtx_compute_capability)
        except TensorRTBuildError as error:
            raise BuildError(str(error)) from None
    return trt.__version__


def _in_range(key: str, value, low: int, high: int, why: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BuildError(f"{key}: {value!r} is outside [{low}, {high}]{why}")
    return value


def engine_config(manifest: dict, options: CompileOptions, output_dir: Path) -> BuildConfig:
    """The engine's build config: the bundle's, with the compile's choices, all checked."""
    exported, limits = manifest["build_config"], manifest["limits"]
    capacity = limits["max_kv_cache_capacity"]
    max_batch = _in_range("max_batch_size", options.max_batch_size if options.max_batch_size is not None
                          else limits["max_batch_size"], 1, MAX_BATCH_SIZE)
    max_input = _in_range("max_input_len", options.max_input_len if options.max_input_len is not None
                          else limits["max_input_len"], 1, capacity,
                          " (the bundle's max_kv_cache_capacity, fixed at export: the cache must hold a prompt)")
    if options.rtx_compute_capability is not None and options.backend != "tensorrt-rtx":
        raise BuildError(f"rtx_compute_capability: only the tensorrt-rtx backend builds for a compute capability "
                         f"(backend {options.backend!r})")
    data = {**exported, "backend": options.backend, "output_dir": str(output_dir), "max_batch_size": max_batch,
            "max_input_len": max_input}
    if options.rtx_compute_capability is not None:
        data["rtx_compute_capability"] = options.rtx_compute_capability
    try:
        config = parse_build_config(data, "compile")
    except ConfigError as error:
        raise BuildError(" ".join(str(error).split())) from None
    check_backend(config, exported=True)
    return config


def compile_in_place(directory: Path, manifest: dict, config: BuildConfig, steps: Steps,
                     tensorrt_version: str | None) -> dict:
    """Compile the bundle in `directory` for `config.backend` and rewrite its manifest as an
    engine directory's; returns the new manifest. One step of `steps`."""
    components = {name: dict(entry) for name, entry in manifest["components"].items()}
    with steps.step(f"compiling for {config.backend}"):
        engines = {}
        if config.backend in TENSORRT_BACKENDS:
            from trt_llm.build.tensorrt_backend import TensorRTBuildError, compile_tensorrt, encoder_profiles

            try:
                for name in [c for c in ("llm", "draft", "vision", "audio") if c in components]:
                    # The draft's plan has the base's profiles (its dynamic dims have the same names).
                    component_graph = directory / components[name]["graph"]
                    profiles = encoder_profiles(components[name]["adapter"], config,
                                                directory / components[name]["config"]) \
                        if name in ("vision", "audio") else None
                    engines[name] = compile_tensorrt(component_graph, component_graph.parent, config,
                                                     rtx=config.backend == "tensorrt-rtx",
                                                     report=lambda phase, name=name: steps.report(f"compiling {name}: {phase}"),
                                                     profiles=profiles)
                if "draft" in components:
                    components["draft"]["quantization"] = "none"
            except TensorRTBuildError as error:
                raise BuildError(str(error)) from None
        else:
            from trt_llm.build.cpu_backend import compile_cpu

            try:
                engines["llm"] = compile_cpu(directory / components["llm"]["graph"])
            except ValueError as error:  # a graph ONNX Runtime's kernels cannot take: one line
                raise BuildError(f"backend: cpu: {error}") from None
            for encoder in [c for c in ("vision", "audio") if c in components]:
                engines[encoder] = compile_cpu(directory / components[encoder]["graph"])
            if "draft" in components:
                quantization = draft_quantization(config)
                engines["draft"] = compile_cpu(directory / components["draft"]["graph"], quantization)
                components["draft"]["quantization"] = quantization
        if "draft" in components:
            # The tree that pays on this backend (runtime/decoding/spec_config.py); run flags override it.
            draft = components["draft"]
            draft["tree_defaults"] = tree_defaults_entry(config.backend, draft["max_draft_tree_size"],
                                                         draft["max_verify_tree_size"])
        for name, path in engines.items():
            entry = components[name]
            components[name] = {"graph": entry["graph"], "engine": path.relative_to(directory).as_posix(),
                                **{k: v for k, v in entry.items() if k != "graph"}}
        if config.backend == "cpu":  # a head of the embedding's own blocks: one copy (build/tied_embedding.py)
            from trt_llm.build.tied_embedding import share_embedding_with_head

            share_embedding_with_head(directory, components["llm"])
        if tensorrt_version is not None:
            components["llm"]["tensorrt_version"] = tensorrt_version
        engine_manifest = {
            **manifest,
            "kind": ENGINE,
            "backend": config.backend,
            "build_config": config.model_dump(),
            "limits": {"max_batch_size": config.max_batch_size, "max_input_len": config.max_input_len,
                       "max_kv_cache_capacity": config.max_kv_cache_capacity},
            "components": components,
            # The export's tools, updated with those installed here (transformers may be absent).
            "tool_versions": {**manifest.get("tool_versions", {}), **tool_versions()},
        }
        return write_manifest(directory, engine_manifest)


def compile_bundle(bundle_dir: str | Path, output_dir: str | Path, options: CompileOptions,
                   progress: bool = True) -> Path:
    """Compile the bundle in `bundle_dir` into the engine directory `output_dir`; returns its path."""
    bundle, out = Path(bundle_dir).resolve(), Path(output_dir).resolve()
    manifest = read_bundle(bundle)
    if out == bundle or bundle in out.parents or out in bundle.parents:
        raise BuildError(f"output: {str(out)!r} overlaps the bundle {str(bundle)!r}; write the engine directory "
                         "elsewhere (the bundle stays as it is)")
    config = engine_config(manifest, options, out)
    tensorrt_version = backend_version(config)
    steps = Steps(2, "compile", progress)
    try:
        with staged(out, key="-o") as staging:
            with steps.step("copying the bundle"):
                copy_tree(bundle, staging)
            compile_in_place(staging, manifest, config, steps, tensorrt_version)
    finally:
        steps.close()
    return out
