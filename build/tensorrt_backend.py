"""The `tensorrt` and `tensorrt-rtx` backends: the portable ONNX graph compiled into a serialized plan.

TensorRT: our attention op is registered as a `tensorrt.plugin` (facet 4 of plugins/attention.py)
before parsing; the node's `plugin_namespace` attribute makes the parser take the plugin over the
function body. TensorRT-RTX has no plugins: the parser inlines the model-local function body.

The network is strongly typed: the graph was exported in the config's dtype, so its tensor types are
the precision (fp32/fp16/bf16) and no precision flags are set; TensorRT-RTX accepts nothing else.

Two optimization profiles: 0 = prefill (up to max_input_len new tokens), 1 = decode and verification
(up to DECODE_MAX_SEQ new tokens), each over batch 1..max_batch_size and KV capacity
1..max_kv_cache_capacity. The runtime picks one by the step's number of new tokens. An
encoder-decoder's decoder (Whisper) also takes the encoder's keys and values, whose `frames` dim is
the encoder's output length, one number (1,500 for Whisper) in both profiles. An encoder's plan
(vision/, audio/) has one profile of its own (encoder_profiles).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import onnx
from trt_llm.common.trt_import import import_tensorrt, make_logger
from trt_llm.schemas.graph_spec import window_capacity

ENGINE_NAME = "model.plan"
DECODE_MAX_SEQ = 64  # new tokens per row in the decode/verify profile (an EAGLE tree of 60 fits)
DEFAULT_COMPUTE_CAPABILITY = "SM80"  # TensorRT-RTX ahead-of-time target when no GPU is present
log = logging.getLogger(__name__)


class TensorRTBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Where timing caches live across builds (TRT_LLM_CACHE_DIR moves it)."""
    root = os.environ.get("TRT_LLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trt-llm")
    return Path(root)


def profile_shapes(config, decode_max_seq: int = DECODE_MAX_SEQ, frames: int | None = None,
                   windows: tuple[int, ...] = ()) -> list[dict[str, tuple[int, int, int]]]:
    """(min, opt, max) per named dynamic dimension of the graph, one dict per optimization profile.
    frames: an encoder-decoder's encoder output length (decoder_frames), the cross inputs' L;
    windows: the sliding windows of the graph's layers, whose caches hold at most window - 1 slots
    plus the widest step (capacity_w<W>, runtime/cache/)."""
    batch = (1, config.max_batch_size, config.max_batch_size)
    capacity_max = config.max_kv_cache_capacity
    draft = getattr(config, "draft", None)
    trees = (draft.max_verify_tree_size, draft.max_draft_tree_size) if draft is not None else None
    if getattr(config, "mtp", False):  # an MTP head's draft (build/mtp/)
        from trt_llm.build.mtp import TREE_SIZE

        trees = (TREE_SIZE, TREE_SIZE)
    if trees is not None:
        # Under speculation a row's cache also holds the tree being verified (the base) or drafted
        # (the draft) beyond its committed tokens, and one verification pass takes the whole tree.
        capacity_max += max(trees) + 1
        decode_max_seq = max(decode_max_seq, *trees)
    capacity = (1, min(capacity_max, 1024), capacity_max)
    seq_max = config.max_input_len
    prefill = {"batch": batch, "seq": (1, min(seq_max, 256), seq_max), "kept": (1, 1, seq_max),
               "capacity": capacity}
    step_max = min(decode_max_seq, capacity_max)
    decode = {"batch": batch, "seq": (1, 1, step_max), "kept": (1, 1, step_max), "capacity": capacity}
    lora = getattr(config, "lora", None)
    if lora is not None:  # per-adapter rank dims, named lora_rank_<group> by the exporter
        for shapes in (prefill, decode):
            shapes["lora_rank_*"] = (1, lora.max_rank, lora.max_rank)
    for window in windows:
        widest = min(window - 1 + max(seq_max, step_max), capacity_max)
        for shapes in (prefill, decode):
            shapes[window_capacity(window)] = (1, min(widest, 1024), widest)
    if frames is not None:  # every clip is encoded to the same length: a range would only cost build time
        for shapes in (prefill, decode):
            shapes["frames"] = (frames, frames, frames)
    return [prefill, decode]


CONFIG_NAME = "config.json"  # the checkpoint's config, which the bundle writes beside the decoder graph


def decoder_frames(graph_path: Path) -> int:
    """The `frames` of an encoder-decoder's decoder graph: the encoder's output length, which is
    Whisper's max_source_positions (build/models/whisper.WhisperDims.frames), read from the checkpoint
    config beside the graph. The decoder graph leaves it dynamic; the runtime binds exactly it."""
    import json

    path = Path(graph_path).parent / CONFIG_NAME
    try:
        frames = json.loads(path.read_text())["max_source_positions"]
    except (OSError, ValueError, KeyError) as error:
        raise TensorRTBuildError(f"{Path(graph_path).name}: its cross-attention inputs' 'frames' dimension is the "
                                 f"encoder's output length, read from {path} (max_source_positions), which could "
                                 f"not be read: {error}") from None
    return int(frames)


def encoder_profiles(adapter_name: str, config, settings_path: Path) -> list[dict[str, tuple[int, int, int]]]:
    """The profiles of an encoder component's plan (vision/, audio/): its runtime adapter's
    (trt_llm/families/adapters.py, named by the manifest's entry) over the build config's limits and the
    component's config.json. One profile: the encoders run once per request."""
    import json

    from trt_llm.families.adapters import adapter_class

    settings = json.loads(Path(settings_path).read_text())
    return [adapter_class(adapter_name).tensorrt_profile(config, settings)]


def _graph_inputs(graph_path: Path) -> dict[str, list[int | str]]:
    """Each graph input's dims: an int, or the name of a dynamic dimension."""
    model = onnx.load(graph_path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in initializers}


def input_profiles(graph_path: Path, build_config, profiles=None) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Each optimization profile as (min, opt, max) shapes per graph input: `profiles` (per named
    dimension) or the decoder's (profile_shapes, with `frames` when the graph has cross inputs) applied
    to the graph's inputs. Plain data, so tests check a plan's profiles without a GPU."""
    graph_path = Path(graph_path)
    inputs = _graph_inputs(graph_path)
    if not profiles:
        named = {dim for dims in inputs.values() for dim in dims if isinstance(dim, str)}
        windows = tuple(sorted(int(dim.removeprefix("capacity_w")) for dim in named if dim.startswith("capacity_w")))
        profiles = profile_shapes(build_config, frames=decoder_frames(graph_path) if "frames" in named else None,
                                  windows=windows)
    shaped = []
    for shapes in profiles:
        bounds_of = {}
        for name, dims in inputs.items():
            bounds = []
            for dim in dims:
                if isinstance(dim, str):
                    if dim.startswith("lora_rank_") and "lora_rank_*" in shapes:
                        dim = "lora_rank_*"
                    if dim not in shapes:
                        raise TensorRTBuildError(
                            f"{graph_path.name}: input {name!r} has a dynamic dimension {dim!r} the "
                            f"TensorRT backend has no range for (known: {', '.join(shapes)})")
                    bounds.append(shapes[dim])
                else:
                    bounds.append((dim, dim, dim))
            bounds_of[name] = tuple(tuple(b[k] for b in bounds) for k in range(3))
        shaped.append(bounds_of)
    return shaped


def _add_profiles(trt, builder, config_trt, graph_path: Path, build_config, profiles=None) -> None:
    for shapes in input_profiles(graph_path, build_config, profiles):
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            profile.set_shape(name, low, opt, high)
        config_trt.add_optimization_profile(profile)


def _progress_monitor(trt, report: Callable[[str], None]):
    """A TensorRT IProgressMonitor that reports each top-level phase; None if the module has none."""
    if not hasattr(trt, "IProgressMonitor"):
        return None

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self._started: dict[str, float] = {}
            self._parents: dict[str, str | None] = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self._started[phase_name] = time.perf_counter()
            self._parents[phase_name] = parent_phase
            if parent_phase is None:
                report(f"{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step):
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            started = self._started.pop(phase_name, None)
            if self._parents.pop(phase_name, None) is None and started is not None:
                log.info("TensorRT phase %r: %.2f s", phase_name, time.perf_counter() - started)

    return Monitor()


def _load_timing_cache(config_trt, path: Path):
    data = path.read_bytes() if path.is_file() else b""
    cache = config_trt.create_timing_cache(data)
    if cache is None or not config_trt.set_timing_cache(cache, ignore_mismatch=True):
        log.warning("timing cache %s could not be used; building without it", path)
        return None
    return cache


def _save_timing_cache(config_trt, path: Path) -> None:
    cache = config_trt.get_timing_cache()
    if cache is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(bytes(memoryview(cache.serialize())))
        os.replace(tmp, path)  # atomic: concurrent builds never see half a cache
    except OSError as error:
        log.warning("timing cache not saved to %s: %s", path, error)


def compute_capability(trt, name: str | None):
    """The TensorRT-RTX ComputeCapability to build for: `name` (e.g. "SM86"), else the GPU present,
    else DEFAULT_COMPUTE_CAPABILITY."""
    if name is None or name.lower() == "auto":
        from trt_llm.common.trt_import import cuda_device_count

        name = "CURRENT" if cuda_device_count()[0] > 0 else DEFAULT_COMPUTE_CAPABILITY
    key = name.upper()
    members = trt.ComputeCapability.__members__
    if key not in members or key == "NONE":
        raise TensorRTBuildError(f"rtx_compute_capability: {name!r} is not one TensorRT-RTX builds for; "
                                 f"choose one of {', '.join(m for m in members if m != 'NONE')}")
    return members[key]


def compile_tensorrt(graph_path: Path, engine_dir_llm: Path, build_config, rtx: bool,
                     report: Callable[[str], None] | None = None, profiles: list[dict] | None = None) -> Path:
    """Parse `graph_path` (external weights beside it), build, write `engine_dir_llm/model.plan`.
    profiles: (min, opt, max) per dynamic dimension, one dict per optimization profile (default
    the decoder's, profile_shapes)."""
    backend = "tensorrt-rtx" if rtx else "tensorrt"
    trt = import_tensorrt(backend)
    report = report or (lambda message: log.info("%s: %s", backend, message))
    graph_path, engine_dir_llm = Path(graph_path), Path(engine_dir_llm)

    logger = make_logger(trt)
    if not rtx:
        # Before the parser exists: it looks plugins up in the registry when it meets the node,
        # whose plugin_namespace attribute names the plugin's namespace.
        from trt_llm.plugins import register_tensorrt_plugins

        register_tensorrt_plugins()
    return _build(trt, logger, graph_path, engine_dir_llm, build_config, backend, rtx, report, profiles)


def _build(trt, logger, graph_path: Path, engine_dir_llm: Path, build_config,
           backend: str, rtx: bool, report, profiles=None) -> Path:
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    report("parsing ONNX")
    # From the path, not the bytes: the parser resolves model.onnx.data relative to the file.
    if not parser.parse_from_file(str(graph_for_tensorrt(graph_path))):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TensorRTBuildError(f"{backend}: the ONNX parser rejected {graph_path.name}: " + "; ".join(errors))

    config_trt = builder.create_builder_config()
    if rtx:
        config_trt.num_compute_capabilities = 1
        config_trt.set_compute_capability(compute_capability(trt, getattr(build_config, "rtx_compute_capability", None)), 0)
    if build_config.dtype == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        # fp32 engines are checked against transformers to 1e-3; TF32 matmuls drift past that.
        config_trt.clear_flag(trt.BuilderFlag.TF32)
    _add_profiles(trt, builder, config_trt, graph_path, build_config, profiles)
    monitor = _progress_monitor(trt, report)
    if monitor is not None:
        config_trt.progress_monitor = monitor
    # Kernel timings need a GPU: an ahead-of-time TensorRT-RTX build without one times nothing, and
    # TensorRT cannot even read a cache then. The file is per tool version; TensorRT keys entries
    # by device itself.
    from trt_llm.common.trt_import import cuda_device_count

    timing_cache = None
    cache_path = cache_dir() / f"timing-{backend}-{getattr(trt, '__version__', 'unknown')}.cache"
    if cuda_device_count()[0] > 0:
        timing_cache = _load_timing_cache(config_trt, cache_path)

    report("building the engine")
    started = time.perf_counter()
    plan = builder.build_serialized_network(network, config_trt)
    if plan is None:
        raise TensorRTBuildError(f"{backend}: building the engine failed (see the TensorRT errors above)")
    log.info("%s: engine built in %.1f s", backend, time.perf_counter() - started)
    if timing_cache is not None:
        _save_timing_cache(config_trt, cache_path)

    engine_path = engine_dir_llm / ENGINE_NAME
    with open(engine_path, "wb") as f:
        f.write(memoryview(plan))
    return engine_path


TENSORRT_GRAPH_NAME = "model.trt.onnx"


def graph_for_tensorrt(graph_path: Path) -> Path:
    """The graph TensorRT parses: `graph_path` itself, or, when an op rewrites its nodes for TensorRT
    (plugins.lower_for_tensorrt), that rewrite beside it, reading the same weight file."""
    from trt_llm import plugins

    model = onnx.load(graph_path, load_external_data=False)
    if not plugins.lower_for_tensorrt(model):
        return graph_path
    rewritten = graph_path.parent / TENSORRT_GRAPH_NAME
    onnx.save_model(model, rewritten)
    return rewritten


def describe_network(graph_path: Path, rtx: bool = True) -> dict:
    """Parse the graph (no build) and return its IO tensors: name -> (shape, dtype name, is_input).

    For tests and inspection on machines without a GPU."""
    trt = import_tensorrt("tensorrt-rtx" if rtx else "tensorrt")
    logger = make_logger(trt, trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(graph_for_tensorrt(graph_path))):
        raise TensorRTBuildError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    tensors = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        tensors[t.name] = (tuple(t.shape), t.dtype.name, True)
    for i in range(network.num_outputs):
        t = network.get_output(i)
        tensors[t.name] = (tuple(t.shape), t.dtype.name, False)
    return tensors
