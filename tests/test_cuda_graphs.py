"""CUDA graphs of the TensorRT runtime, without a GPU: the bookkeeping (runtime/backends/cuda_graphs.py) on its
own, and TrtEngine.run driven through the real decode loop on a simulated device.

The simulation (FakeCudart, FakeEngine) keeps device memory as byte arrays; a captured graph keeps
the kernels of the captured step with the device addresses bound at capture time, as CUDA does. So
a graph replayed for a step whose addresses differ (the other parity of the double-buffered cache,
a reallocated buffer) computes from the wrong memory, and the tokens come out different: the
negative control below shows that the comparison catches it."""

from __future__ import annotations

import ctypes
import enum
import logging

import numpy as np
import pytest

from trt_llm.runtime.backends import cuda_graphs, trt_engine
from trt_llm.runtime.backends.cuda_graphs import CAPTURE, PLAIN, REPLAY, GraphCache, step_key
from trt_llm.runtime.engine.generate import generate
from trt_llm.runtime.engine.model import Model
from trt_llm.runtime.engine.sequence import Sequence
from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams
from trt_llm.runtime.backends.trt_engine import GRAPHS_ENV, TrtEngine, cuda_graphs_requested

# --- the bookkeeping -------------------------------------------------------------------------------


def bindings(batch=2, capacity=16, parity=0, embeds_at=100):
    past, present = (1000, 2000) if parity == 0 else (2000, 1000)
    return [("inputs_embeds", (batch, 1, 8), embeds_at), ("past_key_0", (batch, 2, capacity, 4), past),
            ("present_key_0", None, present), ("logits", None, 300)]


def test_only_decode_steps_have_a_key():
    assert step_key(1, bindings(), new_tokens=4) is None
    assert step_key(1, bindings(), new_tokens=1) is not None


def test_key_changes_with_shape_address_parity_and_profile():
    base = step_key(1, bindings(), 1)
    assert base == step_key(1, bindings(), 1)
    assert base != step_key(1, bindings(batch=1), 1)  # a row finished
    assert base != step_key(1, bindings(capacity=32), 1)  # another batch of requests
    assert base != step_key(1, bindings(parity=1), 1)  # past and present swapped
    assert base != step_key(1, bindings(embeds_at=104), 1)  # a buffer was reallocated
    assert base != step_key(0, bindings(), 1)  # another profile's context


def test_a_key_runs_plainly_then_is_captured_then_replays():
    destroyed = []
    cache = GraphCache(destroyed.append)
    key = step_key(1, bindings(), 1)
    assert cache.decide(key) == PLAIN
    assert cache.decide(key) == CAPTURE
    cache.captured(key, "graph-a")
    assert [cache.decide(key) for _ in range(3)] == [REPLAY] * 3
    assert cache.graph(key) == "graph-a"
    assert cache.stats["captures"] == 1 and cache.stats["replays"] == 3
    other = step_key(1, bindings(parity=1), 1)
    assert cache.decide(other) == PLAIN  # the other parity is a graph of its own
    assert cache.decide(None) == PLAIN and cache.decide(None) == PLAIN  # prefill / verification never capture
    assert destroyed == []


def test_disabled_cache_always_runs_plainly():
    cache = GraphCache(lambda graph: None, enabled=False)
    key = step_key(1, bindings(), 1)
    assert {cache.decide(key) for _ in range(5)} == {PLAIN}


def test_failed_capture_runs_plainly_for_good_and_warns_once(caplog):
    cache = GraphCache(lambda graph: None, warmup_runs=0)
    first, second = step_key(1, bindings(), 1), step_key(1, bindings(batch=1), 1)
    with caplog.at_level(logging.WARNING, logger=cuda_graphs.__name__):
        assert cache.decide(first) == CAPTURE
        cache.capture_failed(first, "operation not permitted when stream is capturing")
        assert cache.decide(second) == CAPTURE
        cache.capture_failed(second, "again")
    assert {cache.decide(first) for _ in range(3)} == {PLAIN}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "operation not permitted" in warnings[0].getMessage()
    assert cache.stats["failures"] == 2 and cache.first_failure.startswith("operation")


def test_least_recently_used_graph_is_evicted_and_destroyed():
    destroyed = []
    cache = GraphCache(destroyed.append, max_graphs=2, warmup_runs=0)
    keys = [step_key(1, bindings(batch=b), 1) for b in (1, 2, 3)]
    for name, key in zip("abc", keys[:2]):
        assert cache.decide(key) == CAPTURE
        cache.captured(key, name)
    assert cache.decide(keys[0]) == REPLAY  # "a" is now the most recently used
    assert cache.decide(keys[2]) == CAPTURE
    cache.captured(keys[2], "c")
    assert destroyed == ["b"] and len(cache) == 2 and cache.stats["evictions"] == 1
    assert cache.decide(keys[1]) == CAPTURE  # evicted: captured again (after no more warm-up)
    cache.clear()
    assert sorted(destroyed) == ["a", "b", "c"] and len(cache) == 0


def test_switch_constructor_flag_wins_then_environment(monkeypatch):
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    assert cuda_graphs_requested() is True
    for value, expected in (("0", False), ("off", False), ("false", False), ("1", True), ("on", True)):
        monkeypatch.setenv(GRAPHS_ENV, value)
        assert cuda_graphs_requested() is expected
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert cuda_graphs_requested(True) is True
    monkeypatch.setenv(GRAPHS_ENV, "sometimes")
    with pytest.raises(ValueError, match=f"{GRAPHS_ENV}='sometimes'"):
        cuda_graphs_requested()


# --- a simulated device ----------------------------------------------------------------------------


class FakeCudart:
    """The cudart calls TrtEngine and DeviceKVCache make, over host byte arrays."""

    class cudaError_t(enum.IntEnum):  # noqa: N801 - cudart's names
        cudaSuccess = 0
        cudaErrorStreamCaptureInvalidated = 901

    class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyDeviceToDevice = 3

    class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
        cudaStreamCaptureModeGlobal = 0
        cudaStreamCaptureModeThreadLocal = 1
        cudaStreamCaptureModeRelaxed = 2

    OK = (0,)

    def __init__(self):
        self.memory: dict[int, bytearray] = {}
        self.free_list: list[tuple[int, int]] = []  # freed (base, size): reused first-in first-out
        self.next_base = 1 << 20
        self.capture: list | None = None
        self.launched = self.destroyed = 0

    # memory
    def cudaMalloc(self, size):  # noqa: N802
        for i, (base, freed) in enumerate(self.free_list):  # noqa: B007 - base is the block reused after the break
            if freed == size:
                del self.free_list[i]
                break
        else:
            base, self.next_base = self.next_base, self.next_base + size + (1 << 16)
        self.memory[base] = bytearray(size)
        return 0, base

    def cudaFree(self, ptr):  # noqa: N802
        self.free_list.append((ptr, len(self.memory.pop(ptr))))
        return self.OK

    def _at(self, ptr, size):
        for base, data in self.memory.items():
            if base <= ptr and ptr + size <= base + len(data):
                return data, ptr - base
        raise AssertionError(f"no device memory at {ptr:#x} (+{size})")

    def read(self, ptr, size) -> bytes:
        data, offset = self._at(ptr, size)
        return bytes(data[offset: offset + size])

    def write(self, ptr, payload: bytes) -> None:
        data, offset = self._at(ptr, len(payload))
        data[offset: offset + len(payload)] = payload

    def _not_capturing(self, what):
        assert self.capture is None, f"{what} issued while a graph is being captured"

    def cudaMemsetAsync(self, ptr, value, size, stream):  # noqa: N802
        self._not_capturing("memset")
        self.write(ptr, bytes([value]) * size)
        return self.OK

    def _copy(self, dst, src, size, kind):
        payload = ctypes.string_at(src, size) if kind == self.cudaMemcpyKind.cudaMemcpyHostToDevice \
            else self.read(src, size)
        if kind == self.cudaMemcpyKind.cudaMemcpyDeviceToHost:
            ctypes.memmove(dst, payload, size)
        else:
            self.write(dst, payload)

    def cudaMemcpyAsync(self, dst, src, size, kind, stream):  # noqa: N802
        self._not_capturing("memcpy")
        self._copy(dst, src, size, kind)
        return self.OK

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):  # noqa: N802
        self._not_capturing("memcpy2D")
        for row in range(height):
            self._copy(dst + row * dpitch, src + row * spitch, width, kind)
        return self.OK

    # streams, events
    def cudaStreamCreate(self):  # noqa: N802
        return 0, 7

    def cudaStreamDestroy(self, stream):  # noqa: N802
        return self.OK

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        self._not_capturing("synchronize")
        return self.OK

    def cudaEventCreate(self):  # noqa: N802
        return 0, object()

    def cudaEventRecord(self, event, stream):  # noqa: N802
        self._not_capturing("event record")
        return self.OK

    def cudaEventElapsedTime(self, start, end):  # noqa: N802
        return 0, 0.25

    def cudaGetErrorString(self, err):  # noqa: N802
        return 0, err.name.encode()

    def cudaGetLastError(self):  # noqa: N802
        return self.OK

    # graphs: a graph is the list of the kernels recorded while capturing
    def cudaStreamBeginCapture(self, stream, mode):  # noqa: N802
        assert self.capture is None and mode == self.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self.capture = []
        return self.OK

    def cudaStreamEndCapture(self, stream):  # noqa: N802
        kernels, self.capture = self.capture, None
        if kernels is None or any(k is None for k in kernels):
            return self.cudaError_t.cudaErrorStreamCaptureInvalidated, FakeGraph([])
        return 0, FakeGraph(kernels)

    def cudaGraphInstantiate(self, graph, flags):  # noqa: N802
        return 0, FakeGraph(list(graph.kernels))

    def cudaGraphLaunch(self, graph_exec, stream):  # noqa: N802
        self._not_capturing("graph launch")
        self.launched += 1
        for kernel in graph_exec.kernels:
            kernel()
        return self.OK

    def cudaGraphDestroy(self, graph):  # noqa: N802
        return self.OK

    def cudaGraphExecDestroy(self, graph_exec):  # noqa: N802
        self.destroyed += 1
        return self.OK


class FakeGraph:
    def __init__(self, kernels):
        self.kernels = kernels

    def __int__(self):
        return id(self) if self.kernels else 0


HIDDEN, VOCAB = 4, 16
DTYPES = {"inputs_embeds": "f4", "position_ids": "i4", "past_lengths": "i4", "query_lengths": "i4",
          "logits_indices": "i4", "past_key_0": "f4", "past_value_0": "f4", "present_key_0": "f4",
          "present_value_0": "f4", "logits": "f4"}


class FakeContext:
    """An execution context whose 'kernel' is a toy attention step: it writes each row's new tokens
    into `present` at past_lengths and makes logits from everything cached."""

    def __init__(self, cudart, fail_capture=False):
        self.cudart, self.fail_capture = cudart, fail_capture
        self.shapes, self.addresses = {}, {}

    def set_optimization_profile_async(self, profile, stream):
        return True

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr

    def execute_async_v3(self, stream):
        kernel = self._kernel(dict(self.shapes), dict(self.addresses))  # addresses baked in, like a launch
        if self.cudart.capture is not None:
            if self.fail_capture:
                self.cudart.capture.append(None)  # as if a kernel did something a capture forbids
                return False
            self.cudart.capture.append(kernel)
        else:
            kernel()
        return True

    def _kernel(self, shapes, addresses):
        cudart = self.cudart

        def array(name, shape):
            dtype = np.dtype(DTYPES[name])
            return np.frombuffer(cudart.read(addresses[name], int(np.prod(shape)) * dtype.itemsize), dtype).reshape(shape)

        def run():
            batch, seq, _ = shapes["inputs_embeds"]
            embeds = array("inputs_embeds", shapes["inputs_embeds"])
            past, new = array("past_lengths", (batch,)), array("query_lengths", (batch,))
            picks = array("logits_indices", shapes["logits_indices"])
            cache_shape = shapes["past_key_0"]
            logits = np.zeros((batch, picks.shape[1], VOCAB), np.float32)
            for kind, scale in (("key", 1.0), ("value", 2.0)):
                present = array(f"past_{kind}_0", cache_shape).copy()
                for b in range(batch):
                    present[b, 0, past[b]: past[b] + new[b]] = embeds[b, : new[b]] * scale
                    total = float(present[b, 0, : past[b] + new[b]].sum())
                    for k, pick in enumerate(picks[b]):
                        logits[b, k] += np.cos((total + embeds[b, pick].sum()) * 0.37 * (np.arange(VOCAB) + 1))
                cudart.write(addresses[f"present_{kind}_0"], present.tobytes())
            cudart.write(addresses["logits"], logits.tobytes())

        return run


class FakeEngine:
    num_optimization_profiles = 2
    num_io_tensors = len(DTYPES)

    def __init__(self, cudart, fail_capture=False):
        self.cudart, self.fail_capture = cudart, fail_capture

    def get_tensor_profile_shape(self, name, profile):
        return [(1, 1, HIDDEN), (2, 4, HIDDEN), (4, (32, 4)[profile], HIDDEN)]

    def create_execution_context(self):
        return FakeContext(self.cudart, self.fail_capture)

    def get_tensor_name(self, i):
        return list(DTYPES)[i]

    def get_tensor_dtype(self, name):
        return DTYPES[name]

    def get_tensor_shape(self, name):
        return (-1, 1, -1, HIDDEN)


class FakeTrt:
    @staticmethod
    def nptype(dtype):
        return np.dtype(dtype)


def fake_engine(graphs: bool, fail_capture=False) -> TrtEngine:
    engine = TrtEngine.__new__(TrtEngine)
    cudart = FakeCudart()
    engine._setup(FakeTrt, cudart, FakeEngine(cudart, fail_capture), 1, "tensorrt", graphs)
    return engine


def decode(engine, prompts, max_new, seed=0):
    """The real decode loop on the engine; the generated tokens and every step's logits."""
    embedding = np.random.default_rng(seed).normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    seen = []
    run = engine.run

    def recording_run(*args, **kwargs):
        logits = run(*args, **kwargs)
        seen.append(logits.copy())
        return logits

    engine.run = recording_run
    try:
        model = Model(engine, embedding, {"vocab_size": VOCAB}, eos_token_ids=[VOCAB + 1])
        sequences = [Sequence(list(p), n) for p, n in zip(prompts, max_new)]
        generate(model, sequences, Sampler([SamplingParams(temperature=0.0)] * len(prompts), [0] * len(prompts)))
    finally:
        del engine.run
    return [s.generated for s in sequences], seen


PROMPTS = [[3, 1, 4], [1, 5], [9, 2, 6, 5], [3]]
# Rows finish at different steps (a middle row first): the batch shrinks 4 -> 3 -> 2 -> 1, and each
# batch size lasts long enough to capture both parities' graphs and replay them.
MAX_NEW = [16, 8, 32, 24]


def test_simulated_decode_with_graphs_equals_plain_execution():
    plain, plain_logits = decode(fake_engine(graphs=False), PROMPTS, MAX_NEW)
    engine = fake_engine(graphs=True)
    tokens, logits = decode(engine, PROMPTS, MAX_NEW)
    assert len({tuple(t) for t in plain}) > 1  # the toy model's tokens depend on what is cached
    assert tokens == plain
    for got, expected in zip(logits, plain_logits):
        np.testing.assert_array_equal(got, expected)
    stats = engine.graphs.stats
    # Two parities per batch size; every replay went through cudaGraphLaunch.
    assert stats["captures"] == 8 and stats["replays"] >= 12 and stats["failures"] == 0
    assert engine.cudart.launched == stats["replays"]


def test_replaying_a_graph_whose_addresses_differ_is_caught(monkeypatch):
    """Negative control: a key without the device addresses replays the other parity's graph."""
    plain, _ = decode(fake_engine(graphs=False), PROMPTS, MAX_NEW)

    def shapes_only(index, bound, new_tokens):
        return None if new_tokens != 1 else (index, tuple((name, shape) for name, shape, _ in bound))

    monkeypatch.setattr(trt_engine, "step_key", shapes_only)
    engine = fake_engine(graphs=True)
    tokens, _ = decode(engine, PROMPTS, MAX_NEW)
    assert engine.graphs.stats["replays"] > 0
    assert tokens != plain


def test_graphs_are_reused_by_a_later_batch_with_the_same_shapes_and_addresses():
    engine, reference = fake_engine(graphs=True), fake_engine(graphs=False)
    decode(engine, PROMPTS, MAX_NEW)
    captures, replays = engine.graphs.stats["captures"], engine.graphs.stats["replays"]
    other = [[7, 7, 1], [2, 8], [4, 4, 4, 4], [5]]  # same lengths: same shapes; freed memory comes back
    tokens, _ = decode(engine, other, MAX_NEW, seed=1)
    assert tokens == decode(reference, other, MAX_NEW, seed=1)[0]
    assert engine.graphs.stats["captures"] == captures and engine.graphs.stats["replays"] > replays
    longer = [[1] * 9, [2] * 3, [3] * 5, [4] * 2]  # a longer prefill reallocates inputs_embeds: new keys
    tokens, _ = decode(engine, longer, MAX_NEW, seed=2)
    assert tokens == decode(reference, longer, MAX_NEW, seed=2)[0]
    assert engine.graphs.stats["captures"] > captures


def test_failed_capture_falls_back_to_plain_execution(caplog):
    plain, _ = decode(fake_engine(graphs=False), PROMPTS, MAX_NEW)
    engine = fake_engine(graphs=True, fail_capture=True)
    with caplog.at_level(logging.WARNING):
        tokens, _ = decode(engine, PROMPTS, MAX_NEW)
    assert tokens == plain
    assert engine.graphs.stats["failures"] >= 2 and engine.graphs.stats["replays"] == 0
    assert sum("CUDA graph capture failed" in r.getMessage() for r in caplog.records) == 1


def test_graphs_off_never_captures_and_close_destroys_the_graphs():
    engine = fake_engine(graphs=False)
    decode(engine, PROMPTS, MAX_NEW)
    assert engine.graphs.stats["captures"] == 0 and engine.cudart.launched == 0
    engine = fake_engine(graphs=True)
    decode(engine, PROMPTS, MAX_NEW)
    held = len(engine.graphs)
    assert held > 0
    engine.close()
    assert engine.cudart.destroyed == held
