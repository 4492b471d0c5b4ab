"""A layer that reads another's keys and values (`kv_source`: Gemma 4's KV sharing, issue 43) owns no
cache: no cache tensors in the graph's spec, no place in a cache group, nothing in a context record, no
bytes in the pool; its source is an earlier layer of its kind and geometry, or the specs are refused in
one line naming the key. Checked on hand-made specs (the layer kind, before a family declares it)."""

import numpy as np
import pytest

from trt_llm.runtime.cache.cache_set import cache_bytes, cache_set
from trt_llm.runtime.cache.context_cache import Layout
from trt_llm.schemas.graph_spec import decoder_spec
from trt_llm.schemas.layer_spec import FullAttention, SlidingAttention, kv_source_problem, owns_cache


def layers(shared: bool) -> list:
    """Gemma 4's shape, small: sliding layers of 2 heads of 32 beside full ones of 1 head of 64; the last
    two read the last owner of their kind (transformers' kv_sharing_modes) when shared."""
    def sliding(source=None):
        return SlidingAttention(window=8, kv_heads=2, head_dim=32, scale=1.0, kv_source=source)

    def full(source=None):
        return FullAttention(kv_heads=1, head_dim=64, scale=1.0, kv_source=source)

    return [sliding(), full(), sliding(), full(), sliding(2 if shared else None), full(3 if shared else None)]


def test_a_reader_has_no_cache_tensors_in_the_graph():
    names = decoder_spec(layers(shared=True)).input_names
    assert [f"past_key_{i}" in names for i in range(6)] == [True] * 4 + [False] * 2
    assert "past_lengths_w8" in names  # the readers of a sliding layer share its group's lengths
    assert len(decoder_spec(layers(shared=False)).input_names) == len(names) + 4


def test_the_pool_holds_only_the_owners():
    specs = layers(shared=True)
    cache = cache_set(specs, batch=2, capacity=32, dtype=np.float32)
    assert [group.layers for group in cache.groups] == [[0, 2], [1, 3]]
    assert cache.num_layers == 6 and cache.needed(20)[4:] == [20, 20]
    # fp32 bytes a token, keys and values: 2 sliding owners of 2 heads x 32 and 2 full ones of 1 x 64 (shared),
    # 3 of each (not)
    shared, whole = cache_bytes(specs, 4), cache_bytes(layers(shared=False), 4)
    assert shared["attention_bytes_per_token"] == 2 * 4 * (2 * 2 * 32 + 2 * 64)
    assert whole["attention_bytes_per_token"] == 2 * 4 * (3 * 2 * 32 + 3 * 64)
    keys, values = cache.read_prefix(0, 16)
    assert keys[4] is None and values[5] is None and keys[3].shape == (1, 16, 64)


def test_a_context_record_holds_nothing_for_a_reader():
    layout = Layout.of(layers(shared=True), "fp32")
    assert layout.attention == ((2, 32), (1, 64), (2, 32), (1, 64), None, None)
    assert [owns_cache(layer) for layer in layers(shared=True)] == [True] * 4 + [False] * 2


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s.__setitem__(4, s[4].model_copy(update={"kv_source": 4})), "layers[4].kv_source: 4, not an earlier"),
    (lambda s: s.__setitem__(5, s[5].model_copy(update={"kv_source": 4})), "layers[5].kv_source: layer 4 is sliding"),
    (lambda s: s.__setitem__(5, s[5].model_copy(update={"kv_source": 1, "head_dim": 32})),
     "layers[5].kv_source: layer 1's cache is (0, 1, 64), this layer's (0, 1, 32)"),
])
def test_a_source_that_cannot_be_is_one_line(edit, expected):
    specs = layers(shared=True)
    assert kv_source_problem(specs) is None
    edit(specs)
    assert kv_source_problem(specs).startswith(expected)


def test_a_reader_of_a_reader_is_refused():
    specs = layers(shared=True)
    specs.append(SlidingAttention(window=8, kv_heads=2, head_dim=32, scale=1.0, kv_source=4))
    assert kv_source_problem(specs) == "layers[6].kv_source: layer 4 is a reader itself"
