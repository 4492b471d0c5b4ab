"""OrtEngine: the decoder graph on ONNX Runtime, as a named-tensor function with an in-place cache."""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path

import numpy as np

from trt_llm.runtime.cache.cache_set import CacheSet, cache_set
from trt_llm.runtime.engine.step import Step
from trt_llm.schemas.graph_spec import SHARED, past
from trt_llm.schemas.layer_spec import full_layers

log = logging.getLogger(__name__)


# How long an idle intra-op thread spins for more work before it sleeps (ONNX Runtime's
# session.intra_op.spin_duration_us). Its default spins for tens of milliseconds: measured after a run
# on these 2 cores, an idle pool burns about 40 ms of CPU. That is the fastest on a quiet machine, but
# a thread that never sleeps is, to the kernel, a busy process like any other: with other processes
# busy on the same cores it waits out their time slices at every one of the ~150 parallel sections of
# a decode step, and decoding collapses (SmolLM2-135M fp32, 2 threads, batch 1, beside one busy
# process: 28 tok/s spinning, against 56 quiet). Never spinning holds up best under load (40 tok/s
# there) but pays a wake-up per parallel section when quiet: 48 against 56 tok/s, below ONNX Runtime
# GenAI (52, spinning). A short spin keeps the threads awake across the gaps inside one run (a norm
# or an activation between two matmuls, a few to ~25 us) and asleep across anything longer (host work
# between runs, a time slice lost to another process): 54 tok/s quiet, 31 beside one busy process and
# 32 beside two (spinning: 28, 25; GenAI: 26, 24). Interleaved runs, benchmarks/README.md.
SPIN_US = 20
# A quantized engine's weight-only matmuls become ONNX Runtime's MatMulNBits (plugins/
# weight_only_matmul.py); its accuracy level 4 multiplies int8 activations (quantized per block of
# the weights, as llama.cpp's Q8 activations) with the int4 / int8 weights, 2-5x faster than level 1
# (float32 activations), which is slower than the float matmul. Tests set 1 to compare with
# transformers on the dequantized weights exactly.
MATMUL_ACCURACY_LEVEL = 4
# The level the build optimises an engine at: the runtime's default, whatever a test sets the runtime's
# to (tests share their engines: one built while a test ran at level 1 would be level 1's for the rest).
BUILD_ACCURACY_LEVEL = 4

# A quantized engine's graph as ONNX Runtime optimised it at build time (build/cpu_backend.py's
# optimise_offline): `<engine>.opt.onnx` (+ `.data`, every weight it reads) and what it was made with
# (`<engine>.opt.json`: offline_key()). It is the engine itself, the only copy of the weights: loaded
# without optimising it again where the key is this runtime's; else (another ONNX Runtime, machine or
# accuracy level, or OFFLINE_ENV=0) optimised again as it loads, its matmuls set to this runtime's
# accuracy level. (An engine built before that keeps its lowered graph beside the optimised copy.)
OFFLINE_ENV = "TRT_LLM_ORT_OFFLINE"
OPTIMISED_SUFFIX = ".opt.onnx"


def offline_paths(engine_path: Path) -> tuple[Path, Path]:
    """(the optimised graph, its record) of a lowered graph."""
    stem = Path(engine_path).with_suffix("")
    return stem.with_name(stem.name + OPTIMISED_SUFFIX), stem.with_name(stem.name + ".opt.json")


def offline_key(level: int | None = None) -> dict:
    """What an optimised graph was made with (level: its matmuls' accuracy level; default this runtime's)."""
    import platform

    import onnxruntime as ort

    return {"onnxruntime": ort.__version__, "machine": platform.machine(),
            "matmul_accuracy_level": MATMUL_ACCURACY_LEVEL if level is None else level,
            "graph_optimization_level": "extended"}


def _record(path: Path) -> dict | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def offline_graph(engine_path: Path) -> Path | None:
    """The optimised graph to load instead of a lowered `engine_path` (an engine built before the
    optimised graph became the engine), None where there is none this runtime may use."""
    optimised, record = offline_paths(engine_path)
    if os.environ.get(OFFLINE_ENV, "1") == "0" or not optimised.is_file():
        return None
    return optimised if _record(record) == offline_key() else None


def open_session(engine_path: Path, options):
    """An ONNX Runtime session on a cpu component's engine graph (`options`: its SessionOptions,
    changed here); returns (session, the graph it runs). Its weight-only matmuls and attention run on our
    kernels where they are built (cpu_kernels.adopt), else on ONNX Runtime's as written."""
    import onnxruntime as ort

    engine_path = Path(engine_path)
    if engine_path.name.endswith(OPTIMISED_SUFFIX):  # optimised at build time: the engine itself
        record = _record(engine_path.with_name(engine_path.name.removesuffix(OPTIMISED_SUFFIX) + ".opt.json"))
        if os.environ.get(OFFLINE_ENV, "1") != "0" and record == offline_key():
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # only its kernels made
            return _adopted_session(engine_path, options), engine_path
        if (record or {}).get("matmul_accuracy_level") == MATMUL_ACCURACY_LEVEL:
            return _adopted_session(engine_path, options), engine_path
        return _adopted_session(_at_accuracy_level(engine_path, options), options, engine_path.parent), engine_path
    offline = offline_graph(engine_path)
    if offline is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return _adopted_session(offline, options), offline
        except Exception as error:  # a damaged optimised copy: the lowered graph still serves
            log.warning("%s: cannot load (%s); optimising %s instead", offline,
                        (str(error).strip().splitlines() or [type(error).__name__])[0][:200], engine_path)
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return _adopted_session(engine_path, options), engine_path


def _adopted_session(graph: Path | bytes, options, weights_folder: Path | None = None):
    """A session on a graph (a path, or a serialized model whose weights lie in `weights_folder`) with the
    nodes our kernels take swapped in (an optimised graph's MatMulNBits, any float32 graph's attention)."""
    from trt_llm.runtime.backends import cpu_kernels

    graph = cpu_kernels.adopt(graph, options, weights_folder or Path(graph).parent)
    return _session(str(graph) if isinstance(graph, Path) else graph, options)


def _session(graph, options):
    import onnxruntime as ort

    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def _at_accuracy_level(path: Path, options) -> bytes:
    """The optimised graph `path` with its MatMulNBits at this runtime's accuracy level (the attribute
    the build's level wrote; tests compare level 1 with transformers exactly), its weights read from
    the files beside it."""
    import onnx

    def set_level(graph):
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                    attribute.i = MATMUL_ACCURACY_LEVEL
                for body in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                    set_level(body)  # a Loop's or If's

    model = onnx.load(str(path), load_external_data=False)
    set_level(model.graph)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(path.parent))
    return model.SerializeToString()


# Session creation prepacks every weight into MLAS's layout, one initializer after another. ONNX
# Runtime can spread it over the intra-op threads (session.prepack.enable_parallel), measured and
# left off: on 2 cores it took SmolLM2's one-request run from 625 to 551 ms of session (fp32) but
# its peak memory from 816 to 1,221 MB (int4: 237 -> 213 ms, 304 -> 353 MB), the originals and
# several packed copies held at once. An edge device has the time, not the memory.

# Measuring knob (benchmarks/cold_start.py): extra session settings for every decoder session, e.g.
# "session.disable_prepacking=1,enable_cpu_mem_arena=0,graph_optimization_level=0": a dotted key is
# a session config entry, another a SessionOptions attribute (an integer or 0 / 1 for a flag).
OPTIONS_ENV = "TRT_LLM_ORT_OPTIONS"


def apply_env_options(options, spec: str | None) -> None:
    """Apply OPTIONS_ENV's `key=value,...` to SessionOptions `options`."""
    import onnxruntime as ort

    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{OPTIONS_ENV}: {item!r} is not key=value")
        if "." in key:
            options.add_session_config_entry(key, value)
        elif key == "graph_optimization_level":
            options.graph_optimization_level = ort.GraphOptimizationLevel(int(value))
        elif isinstance(getattr(options, key, None), bool):
            setattr(options, key, value not in ("0", "false", "False"))
        elif hasattr(options, key):
            setattr(options, key, int(value))
        else:
            raise ValueError(f"{OPTIONS_ENV}: SessionOptions has no {key!r}")


class OrtEngine:
    def __init__(self, engine_path: Path, layers, threads: int = 0, spinning: bool = True):
        """layers: the graph's layer specs (schemas/layer_spec.py; an int n: n full attention layers,
        their geometry read from the graph). spinning: ONNX Runtime's idle intra-op threads spin
        SPIN_US for more work before they sleep (see SPIN_US). False: they never spin, for two sessions
        that alternate with host work in between (EAGLE's base and draft), where one pool's spinning
        would take the cores from the other."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        if spinning:
            options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
        else:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(MATMUL_ACCURACY_LEVEL))
        options.log_severity_level = 3
        options.intra_op_num_threads = threads  # 0 = ONNX Runtime's choice (all physical cores)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        apply_env_options(options, os.environ.get(OPTIONS_ENV))
        self._ort = ort
        self.session, self.graph_path = open_session(engine_path, options)  # graph_path: the graph it runs
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}[inputs["inputs_embeds"].type]
        if isinstance(layers, int):
            shape = inputs[past("key", 0)].shape
            layers = full_layers(layers, shape[1], shape[3])
        self.layers = list(layers)
        self.num_layers = len(self.layers)
        # A layer reading another's cache (kv_source) outputs its present under a shared name
        # (graph_spec.shared_present), bound to the source's buffer: updated in place, never copied.
        self._shared: dict[str, list[str]] = {}
        for output in self.session.get_outputs():
            if SHARED in output.name:
                self._shared.setdefault(output.name.split(SHARED)[0], []).append(output.name)
        self._binding = self.session.io_binding()
        self._bound = None  # what the cache bindings point at now: (cache ref, batch, generation, extra)
        self._step_outputs: set[str] = set()  # the step outputs bound by the last run
        # The decoder's outputs: a step may fetch final_hidden_states only where the graph has it (an engine
        # built before it, or Gemma 4 with shared caches, has none)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def provides(self, output: str) -> bool:
        """Whether the graph has `output` (final_hidden_states: not in an engine built before it)."""
        return output in self.output_names

    def new_cache(self, batch: int, capacity: int, widest: int | None = None) -> CacheSet:
        """The caches this engine binds (runtime/cache/cache_set.py), in the graph's dtype; widest:
        the most new tokens one step gives a row."""
        return cache_set(self.layers, batch, capacity, self.dtype, widest)

    def run(self, step: Step, cache, lora: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One forward pass (runtime/engine/step.py); writes the new tokens into `cache` (a CacheSet,
        or one of its groups), the logits into step.logits and the step's other outputs into their
        arrays. lora: the LoRA inputs, which stay the same while the batch does and are bound with
        the cache."""
        binding = self._binding
        room = cache.make_room(step.past_lengths, step.inputs_embeds.shape[1])  # a sliding group's lengths
        for name, array in (*step.named_inputs(), *room.items()):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        # The outputs are bound every call (the logits' width changes with each EAGLE verification);
        # the cache bindings only when the batch does: re-binding 2 x layers buffers every step would
        # cost more than the small inputs above (about 1.5 ms a verification pass on 30 layers).
        outputs = step.named_outputs()
        if not self._step_outputs <= outputs.keys():
            # an output the last step fetched (final_hidden_states for embeddings) and this one does not:
            # unbound, so that ONNX Runtime neither writes into the old array nor copies it out again
            binding.clear_binding_outputs()
            self._bound = None
        self._step_outputs = set(outputs)
        for name, array in outputs.items():
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        # The cache is recognised by identity (a weak reference: a new cache at a recycled id() must not
        # pass for the old one) and its generation, which changes when its buffers are replaced. Reading
        # 60 buffer addresses through .ctypes every step instead cost 60-100 us a step (cProfile), the
        # largest host-side cost of a batch-1 step.
        extra = lora or {}
        extra_key = tuple((n, a.__array_interface__["data"][0], a.shape) for n, a in extra.items())
        state = (cache.batch, cache.generation, extra_key)
        if self._bound is None or self._bound[0]() is not cache or self._bound[1:] != state:
            for name, output, buffer in cache.tensors():
                # An attention cache: the same memory as past input and present output (the op updates
                # it in place); a recurrent state: one or the other (runtime/cache/recurrent_cache.py).
                if name is not None:
                    binding.bind_input(name, "cpu", 0, buffer.dtype, buffer.shape, buffer.ctypes.data)
                for bound in ([output, *self._shared.get(output, ())] if output is not None else ()):
                    binding.bind_output(bound, "cpu", 0, buffer.dtype, buffer.shape, buffer.ctypes.data)
            for name, array in extra.items():
                binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            self._bound = (weakref.ref(cache), *state)
        self.session.run_with_iobinding(binding)
        if hasattr(cache, "finish_step"):
            cache.finish_step()
        return step.logits
