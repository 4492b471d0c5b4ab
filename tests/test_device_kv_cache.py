"""DeviceKVCache (the TensorRT backends' KV cache) against KVCache (the cpu backend's), operation by
operation, on the simulated device of test_cuda_graphs: the EAGLE compaction (move_slots) and the
step-level engine's pool (window, reserve) keep exactly the cpu cache's contents; an encoder-decoder's
cross inputs (its cache set's DeviceCrossCache) keep the cpu cache set's clips, and TrtEngine binds
them (CUDA graphs included)."""

from dataclasses import dataclass

import numpy as np
import pytest
from test_cuda_graphs import DTYPES, HIDDEN, VOCAB, FakeContext, FakeCudart, FakeEngine, FakeTrt, fake_engine
from trt_llm.runtime.backends.trt_engine import TrtEngine
from trt_llm.runtime.cache.cache_set import cache_set
from trt_llm.runtime.cache.device import DeviceCrossCache, DeviceKVCache, device_cache_set
from trt_llm.runtime.cache.kv_cache import KVCache
from trt_llm.runtime.engine.step import Step
from trt_llm.schemas.graph_spec import cross
from trt_llm.schemas.layer_spec import CrossAttention

LAYERS, ROWS, HEADS, CAPACITY, DIM = 2, 3, 2, 8, 4


def filled(seed=0):
    rng = np.random.default_rng(seed)
    host = KVCache(LAYERS, ROWS, HEADS, CAPACITY, DIM)
    device = DeviceKVCache(FakeCudart(), 7, LAYERS, ROWS, HEADS, CAPACITY, DIM, np.float32)
    for row in range(ROWS):
        keys = [rng.standard_normal((HEADS, CAPACITY, DIM)).astype(np.float32) for _ in range(LAYERS)]
        values = [rng.standard_normal((HEADS, CAPACITY, DIM)).astype(np.float32) for _ in range(LAYERS)]
        host.write_prefix(row, keys, values)
        device.write_prefix(row, keys, values)
    return host, device


def assert_same(host: KVCache, device: DeviceKVCache, rows: int, slots: int):
    for row in range(rows):
        keys, values = device.read_prefix(row, slots)
        want_keys, want_values = host.read_prefix(row, slots)
        for got, want in zip((*keys, *values), (*want_keys, *want_values)):
            np.testing.assert_array_equal(got, want)


def test_move_slots_compacts_like_the_cpu_cache():
    host, device = filled()
    for cache in (host, device):
        cache.move_slots(1, [3, 5, 6], 2)  # accepted tree nodes 3, 5, 6 -> slots 2, 3, 4
        cache.move_slots(0, [1, 2], 1)  # already in place: nothing moves
    assert_same(host, device, ROWS, CAPACITY)


def test_keep_rows_then_move_slots():
    host, device = filled(1)
    for cache in (host, device):
        cache.keep_rows([0, 2], [CAPACITY, CAPACITY])
        cache.move_slots(1, [4, 7], 3)
    assert_same(host, device, 2, CAPACITY)


def test_a_window_step_keeps_the_other_rows():
    host, device = filled(2)
    window = device.window(1, 3)
    assert window.batch == 2 and window.shape == (2, HEADS, CAPACITY, DIM)
    # What an engine step over the window does: write every slot of `present` (the other set), swap.
    rng = np.random.default_rng(3)
    written = {}
    for layer in range(LAYERS):
        for kind, target in (("key", window.next_keys[layer]), ("value", window.next_values[layer])):
            data = rng.standard_normal((2, HEADS, CAPACITY, DIM)).astype(np.float32)
            device.cudart.write(target, data.tobytes())
            written[kind, layer] = data
    window.swap()
    host_window = host.window(1, 3)
    for layer in range(LAYERS):
        host_window.keys[layer][...] = written["key", layer]
        host_window.values[layer][...] = written["value", layer]
    assert device.current == 0  # the parent did not swap: its current set holds every row
    assert_same(host, device, ROWS, CAPACITY)
    del window  # a window frees nothing: the memory is its parent's
    assert_same(host, device, ROWS, CAPACITY)


def test_reserve_grows_and_keeps_the_used_slots():
    host, device = filled(4)
    used = [5, 2, 8]
    for cache in (host, device):
        cache.reserve(ROWS + 2, CAPACITY * 2, used)
    assert device.capacity == host.capacity == CAPACITY * 2 and device.batch_capacity == ROWS + 2
    for row, n in enumerate(used):
        keys, values = device.read_prefix(row, n)
        want_keys, want_values = host.read_prefix(row, n)
        for got, want in zip((*keys, *values), (*want_keys, *want_values)):
            np.testing.assert_array_equal(got, want)
    device.reserve(2, 4, [1])  # smaller than what it has: nothing changes
    assert device.capacity == CAPACITY * 2


@pytest.mark.parametrize("rows", [[0], [1, 2]])
def test_window_rows_are_the_parents(rows):
    _, device = filled(5)
    window = device.window(rows[0], rows[-1] + 1)
    for i, row in enumerate(rows):
        got, want = window.read_prefix(i, 3), device.read_prefix(row, 3)
        for a, b in zip((*got[0], *got[1]), (*want[0], *want[1])):
            np.testing.assert_array_equal(a, b)


# --- an encoder-decoder's cross-attention keys and values (Whisper) ---------------------------------
# The device cache set of cross layers against the cpu one: same clips per row after every operation
# the step-level engine makes (write_row, keep_rows, window, window of a window, reserve).

FRAMES = 5
CROSS_LAYERS = [CrossAttention(kv_heads=HEADS, head_dim=DIM, scale=DIM ** -0.5, cross_heads=HEADS, cross_head_dim=DIM)
                for _ in range(LAYERS)]


def clip(seed, layers=LAYERS, heads=HEADS, dim=DIM):
    """One encoded clip: (key, value) [H, frames, D] per decoder layer, as the audio encoder gives."""
    rng = np.random.default_rng(100 + seed)
    return [tuple(rng.standard_normal((heads, FRAMES, dim)).astype(np.float32) for _ in range(2))
            for _ in range(layers)]


def cross_caches(rows=ROWS):
    host = cache_set(CROSS_LAYERS, rows, CAPACITY, np.float32)
    device = device_cache_set(FakeCudart(), 7, CROSS_LAYERS, rows, CAPACITY, np.float32)
    return host, device


def bound_inputs(cache) -> dict:
    """The inputs a cache set binds besides the past_* buffers: its cross keys and values (an array
    on the host, a DeviceView on the device)."""
    if hasattr(cache, "device_bindings"):
        return {name: DeviceView(ptr, shape, np.dtype("f4")) for name, shape, ptr in cache.device_bindings()
                if name.startswith("cross_")}
    return {name: array for name, output, array in cache.tensors() if output is None}


@dataclass
class DeviceView:
    """Device memory as the tests read it back: an address, a shape, a dtype."""
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype


def read_view(cudart, view: DeviceView) -> np.ndarray:
    nbytes = int(np.prod(view.shape)) * view.dtype.itemsize
    return np.frombuffer(cudart.read(view.ptr, nbytes), view.dtype).reshape(view.shape)


def assert_same_cross(host, device):
    """The inputs each cache binds: the same names, in order, and the same rows' clips."""
    want, got = bound_inputs(host), bound_inputs(device)
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].shape == array.shape
        np.testing.assert_array_equal(read_view(device.cudart, got[name]), array)


def test_write_cross_binds_each_rows_clip():
    """Nothing is bound before the first clip (its shape is the encoder's); then every layer's key and
    value, [batch, H, frames, D], with a row not written yet zero."""
    host, device = cross_caches()
    assert bound_inputs(device) == bound_inputs(host) == {}
    for cache in (host, device):
        cache.write_row(0, clip(0))
        cache.write_row(2, clip(2))
    assert_same_cross(host, device)
    assert list(bound_inputs(device)) == ["cross_key_0", "cross_value_0", "cross_key_1", "cross_value_1"]
    assert bound_inputs(device)["cross_key_1"].shape == (ROWS, HEADS, FRAMES, DIM)
    with pytest.raises(ValueError, match="write_row"):
        device.write_row(1, [tuple(a[:, :2] for a in pair) for pair in clip(1)])  # another clip length


def test_keep_rows_moves_each_rows_clip_with_its_cache():
    host, device = cross_caches()
    for cache in (host, device):
        for row in range(ROWS):
            cache.write_row(row, clip(row))
        cache.keep_rows([1, 2], [3, 4])
    assert device.batch == 2
    assert_same_cross(host, device)
    np.testing.assert_array_equal(read_view(device.cudart, bound_inputs(device)["cross_value_1"])[0], clip(1)[1][1])


def test_a_window_writes_into_its_pools_memory():
    """Prefill writes an admitted row's clip through its window (and a window of a window: the row by row
    prefill of a window): the pool's row holds it, and the windows see the pool's rows."""
    host, device = cross_caches()
    host_window, device_window = host.window(1, 3), device.window(1, 3)
    for window in (host_window, device_window):  # the pool's first clip: allocated through the window
        window.write_row(0, clip(1))
    assert_same_cross(host, device)
    assert_same_cross(host_window, device_window)
    host_inner, device_inner = host_window.window(1, 2), device_window.window(1, 2)
    for inner in (host_inner, device_inner):
        inner.write_row(0, clip(2))
    for pair in ((host, device), (host_window, device_window), (host_inner, device_inner)):
        assert_same_cross(*pair)
    np.testing.assert_array_equal(read_view(device.cudart, bound_inputs(device)["cross_key_0"])[2], clip(2)[0][0])
    held = dict(device.cudart.memory)
    del device_window, device_inner  # a window frees nothing: the memory is its pool's
    assert device.cudart.memory.keys() == held.keys()


def test_reserve_grows_the_rows_and_keeps_the_clips():
    """A pool that grows: the active rows' clips are copied into the new buffers (whose addresses are
    new, so a CUDA graph of the old ones never replays); more slots only leave the clips where they are."""
    host, device = cross_caches()
    for cache in (host, device):
        for row in range(ROWS):
            cache.write_row(row, clip(row))
    before = {name: view.ptr for name, view in bound_inputs(device).items()}
    for cache in (host, device):
        cache.reserve(ROWS, CAPACITY * 2, [2, 2, 2])  # more slots only
    assert {name: view.ptr for name, view in bound_inputs(device).items()} == before
    for cache in (host, device):
        cache.reserve(ROWS + 2, CAPACITY * 2, [3, 1])  # two active rows
        cache.batch = ROWS + 2
        cache.write_row(4, clip(4))
    assert_same_cross(host, device)
    assert not {view.ptr for view in bound_inputs(device).values()} & set(before.values())
    for row, n in enumerate([3, 1]):  # the self-attention cache moved as before
        for got, want in zip(device.read_prefix(row, n)[0], host.read_prefix(row, n)[0]):
            np.testing.assert_array_equal(got, want)


def test_free_releases_the_cross_buffers():
    _, device = cross_caches()
    device.write_row(0, clip(0))
    device.free()
    assert device.cudart.memory == {} and bound_inputs(device) == {}


# --- TrtEngine binds them: a toy engine whose logits read the cross inputs ---------------------------

CROSS_INPUTS = [cross("key", 0), cross("value", 0)]


class CrossContext(FakeContext):
    """test_cuda_graphs' toy step, whose logits also depend on each row's cross keys and values (read at
    the addresses bound when the 'kernel' was made, as a captured graph does)."""

    def _kernel(self, shapes, addresses):
        step, cudart = super()._kernel(shapes, addresses), self.cudart

        def run():
            step()
            batch, kept = shapes["logits_indices"]
            logits = read_view(cudart, DeviceView(addresses["logits"], (batch, kept, VOCAB), np.dtype("f4"))).copy()
            for scale, name in enumerate(CROSS_INPUTS, 1):
                rows = read_view(cudart, DeviceView(addresses[name], shapes[name], np.dtype("f4")))
                logits += np.sin(rows.reshape(batch, -1).sum(1) * scale * np.arange(1, VOCAB + 1)[:, None]).T[:, None]
            cudart.write(addresses["logits"], logits.tobytes())

        return run


class CrossEngine(FakeEngine):
    names = (*DTYPES, *CROSS_INPUTS)
    num_io_tensors = len(names)

    def create_execution_context(self):
        return CrossContext(self.cudart)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_dtype(self, name):
        return DTYPES.get(name, "f4")


def cross_engine(graphs: bool) -> TrtEngine:
    engine = TrtEngine.__new__(TrtEngine)
    cudart = FakeCudart()
    layer = CrossAttention(kv_heads=1, head_dim=HIDDEN, scale=HIDDEN ** -0.5, cross_heads=1, cross_head_dim=HIDDEN)
    engine._setup(FakeTrt, cudart, CrossEngine(cudart), [layer], "tensorrt", graphs)
    return engine


def serve(engine) -> list[np.ndarray]:
    """The step-level engine's pool through admissions, decode steps, a finished row and a growth: every
    step's logits. Clips are written through the admitted rows' window, as prefill does."""
    rng = np.random.default_rng(0)
    cache = engine.new_cache(3, 8)
    lengths = np.zeros(5, np.int32)
    seen = []

    def admit(start, stop, clips):
        cache.batch = stop
        window = cache.window(start, stop)
        for row, c in enumerate(clips):
            window.write_row(row, c)
        batch = stop - start
        step = Step(rng.normal(size=(batch, 2, HIDDEN)).astype(np.float32), np.tile(np.arange(2, dtype=np.int32),
                    (batch, 1)), np.zeros(batch, np.int32), np.full(batch, 2, np.int32), np.ones((batch, 1), np.int32),
                    np.empty((batch, 1, VOCAB), np.float32))
        seen.append(engine.run(step, window).copy())
        lengths[start:stop] = 2

    def decode(steps):
        for _ in range(steps):
            batch = cache.batch
            step = Step.decode(rng.normal(size=(batch, 1, HIDDEN)).astype(np.float32), lengths[:batch].copy(),
                               np.empty((batch, 1, VOCAB), np.float32))
            seen.append(engine.run(step, cache).copy())
            lengths[:batch] += 1

    one = [(rng.normal(size=(1, FRAMES, HIDDEN)).astype(np.float32),) * 2 for _ in range(5)]
    clips = [[(k, k * 2)] for (k, _) in one]
    admit(0, 2, clips[:2])
    decode(6)
    cache.reserve(3, 16, list(lengths[:2]))  # more slots for the next request: a new KV cache, the same clips
    admit(2, 3, clips[2:3])
    decode(6)
    cache.keep_rows([0, 2], list(lengths[[0, 2]]))  # row 1 finished
    lengths[:2] = lengths[[0, 2]]
    decode(6)
    admit(2, 3, clips[3:4])  # a new clip into row 2: the batch-3 graphs replay over it
    decode(6)
    cache.reserve(5, 16, list(lengths[:3]))  # more rows: new cross buffers
    admit(3, 4, clips[4:5])
    decode(6)
    return seen


def test_trt_engine_binds_the_clips_and_cuda_graphs_replay_them_correctly():
    """new_cache of a plan with cross inputs is the cross-attention cache, run binds its clips, and
    decode steps replayed as CUDA graphs (after keep_rows, a new clip in a row, a growth) give the plain
    run's logits: the cross buffers' addresses and shapes are part of each graph's key."""
    engine = cross_engine(graphs=True)
    assert [type(group) for group in engine.new_cache(1, 4).groups] == [DeviceKVCache, DeviceCrossCache]
    assert [type(group) for group in fake_engine(graphs=False).new_cache(1, 4).groups] == [DeviceKVCache]
    got, want = serve(engine), serve(cross_engine(graphs=False))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    stats = engine.graphs.stats
    # Both parities captured for each of the four (batch, capacity, buffers) the pool goes through; the
    # batch-3 graphs replay over the clip admitted into row 2 after row 1 finished.
    assert stats["captures"] == 8 and stats["replays"] == 14 and stats["failures"] == 0
    for key in engine.graphs._graphs:
        bound = {name: shape for name, shape, _ in key[1]}
        assert bound[cross("key", 0)] == (bound["inputs_embeds"][0], 1, FRAMES, HIDDEN)


def test_a_device_recurrent_group_keeps_the_host_groups_states():
    """DeviceRecurrentCache against RecurrentCache: states loaded, a pool step (present written into
    the other buffers, then the swap), a window's step over one row (copied back: the other rows
    keep theirs), rows leaving, the pool growing; snapshots equal throughout."""
    from trt_llm.runtime.cache.device_recurrent import DeviceRecurrentCache
    from trt_llm.runtime.cache.recurrent_cache import RecurrentCache
    from trt_llm.schemas.layer_spec import StateTensor

    states = [StateTensor(name="conv", shape=[6, 3]), StateTensor(name="delta", shape=[2, 4, 4], dtype="float32")]
    cudart = FakeCudart()
    host, device = RecurrentCache([0, 2], ROWS, states, np.float16), DeviceRecurrentCache(cudart, 7, [0, 2], ROWS,
                                                                                          states, np.float16)
    rng = np.random.default_rng(1)

    def random_states():
        return [rng.standard_normal(shape).astype(dtype) for shape, dtype in
                [((6, 3), np.float16), ((2, 4, 4), np.float32)] * 2]

    def assert_same(rows):
        for row in range(rows):
            for got, want in zip(device.snapshot(row), host.snapshot(row), strict=True):
                np.testing.assert_array_equal(got, want)

    for row in range(ROWS):
        loaded = random_states()
        host.load(row, loaded)
        device.load(row, loaded)
    assert_same(ROWS)

    def step(host_cache, device_cache):
        """An engine call: every present_* written with new values, then the after-step exchange."""
        outputs = {}
        for _, output, buffer in host_cache.tensors():
            if output is not None:
                outputs[output] = rng.standard_normal(buffer.shape).astype(buffer.dtype)
                buffer[...] = outputs[output]
        for name, shape, ptr in device_cache.device_bindings():
            if shape is None:
                cudart.write(ptr, outputs[name].tobytes())
        host_cache.finish_step()
        device_cache.swap()

    step(host, device)
    assert_same(ROWS)
    step(host.window(1, 2), device.window(1, 2))  # one row's prefill: rows 0 and 2 keep theirs
    assert_same(ROWS)
    host.keep_rows([0, 2], [5, 5])
    device.keep_rows([0, 2], [5, 5])
    assert_same(2)
    host.reserve(ROWS + 2, 0, [5, 5])
    device.reserve(ROWS + 2, 0, [5, 5])
    assert_same(2)
    step(host, device)
    assert_same(2)
    with pytest.raises(ValueError, match="recurrent"):
        device.move_slots(0, [1], 0)
