"""DeviceKVCache (the TensorRT backends' KV cache) against KVCache (the cpu backend's), operation by
operation, on the simulated device of test_cuda_graphs: the EAGLE compaction (move_slots) and the
step-level engine's pool (window, reserve) keep exactly the cpu cache's contents."""

import numpy as np
import pytest

from test_cuda_graphs import FakeCudart
from trt_llm.runtime.kv_cache import KVCache
from trt_llm.runtime.trt_engine import DeviceKVCache

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
    host, device = filled(5)
    window = device.window(rows[0], rows[-1] + 1)
    for i, row in enumerate(rows):
        got, want = window.read_prefix(i, 3), device.read_prefix(row, 3)
        for a, b in zip((*got[0], *got[1]), (*want[0], *want[1])):
            np.testing.assert_array_equal(a, b)
