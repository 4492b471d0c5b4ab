"""One engine's caches: a composite of per-kind caches, made from the model's layer specs
(schemas/layer_spec.py), behind the operations the engine core and the decoding strategies use.

    cache = cache_set(layers, batch=4, capacity=512, dtype=np.float32, widest=256)
    cache.reserve(rows, capacity, used)     # grow the pool between steps (used: tokens per active row)
    cache.window(start, stop)               # rows start .. stop - 1 as a cache of their own (same memory)
    cache.keep_rows(rows, used)             # finished rows leave, the rows behind move up
    cache.move_slots(row, sources, start)   # EAGLE: the accepted tree nodes' keys and values, contiguous
    cache.make_room(past_lengths, width)    # before a step: the inputs it needs beyond the step's own
    cache.tensors()                         # (input, output, buffer) of every tensor the engine binds
    cache.finish_step()                     # after an engine call: a recurrent group's new states current
    cache.read(row, start, stop)            # a row's keys and values of tokens start .. stop - 1, per layer
    cache.restore(row, length, parts)       # an empty row from saved parts of a prefix of `length` tokens
    cache.write_row(row, pairs)             # an encoder-decoder row's clip keys and values

Groups (layers of one kind and geometry, `layer_spec.group_key`): `kv_cache.KVCache` for full and
sliding attention, `cross_cache.CrossCache` for an encoder-decoder's cross inputs (its layers' self-
attention is a KV group like any other), `recurrent_cache.RecurrentCache` for recurrent layers' states
(Gated DeltaNet, short convolutions: replaced, not appended to, at every step). The same composite serves the TensorRT backends over device
groups (runtime/cache/device.py), so the engine core and strategies never know which they hold.
Callers speak in tokens: a group maps tokens to its own slots.

Adding a layer kind: its group class with these operations, and its line in `make_groups`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trt_llm.runtime.cache.cross_cache import CrossCache
from trt_llm.runtime.cache.kv_cache import KVCache
from trt_llm.runtime.cache.recurrent_cache import RecurrentCache
from trt_llm.schemas.layer_spec import group_key, owns_cache, window_of


class CacheSet:
    def __init__(self, groups: list, capacity: int, num_layers: int | None = None):
        """num_layers: the model's (None: up to the groups' last; a kv_source reader is in no group)."""
        self.groups = groups
        self._capacity = capacity
        self._num_layers = num_layers

    # -- what every group has -------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return self.groups[0].batch

    @batch.setter
    def batch(self, rows: int) -> None:
        for group in self.groups:
            group.batch = rows

    @property
    def capacity(self) -> int:
        """The tokens a row may hold."""
        return self._capacity

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        for group in self.groups:
            group.keep_rows(rows, used)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        for group in self.groups:
            group.move_slots(row, sources, start)

    def window(self, start: int, stop: int) -> "CacheSet":
        return CacheSet([group.window(start, stop) for group in self.groups], self._capacity, self._num_layers)

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        for group in self.groups:
            group.reserve(rows, capacity, used)
        self._capacity = max(capacity, self._capacity)

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        inputs = {}
        for group in self.groups:
            inputs.update(group.make_room(past_lengths, width))
        return inputs

    def tensors(self) -> list:
        """(input name or None, output name or None, buffer): an attention group's buffer is both
        (written in place), a recurrent group's states are read from one buffer and written to another."""
        return [bound for group in self.groups for bound in group.tensors()]

    def finish_step(self) -> None:
        for group in self.groups:
            if hasattr(group, "finish_step"):
                group.finish_step()

    @property
    def recurrent(self) -> bool:
        """Whether some layers keep a recurrent state (no token slots to cut back or move)."""
        return any(hasattr(group, "snapshot") for group in self.groups)

    @property
    def generation(self) -> int:
        """Changes whenever a group's buffers are replaced (an engine rebinds then)."""
        return sum(group.generation for group in self.groups)

    # -- a row's tokens, layer by layer: what context reuse saves and restores ------------------------
    # Per model layer an array [Hkv, n, D] of keys and one of values (None where a layer keeps none).

    @property
    def num_layers(self) -> int:
        return self._num_layers or 1 + max(layer for group in self.groups for layer in group.layers)

    def needed(self, length: int) -> list[int]:
        """Per layer: the first token a restored prefix of `length` tokens must give it."""
        first = [length] * self.num_layers
        for group in self._attention_groups():
            for layer in group.layers:
                first[layer] = group.needed(length)
        return first

    def read(self, row: int, start: int, stop: int) -> tuple[list, list]:
        """Tokens start .. stop - 1 of `row`: (keys, values) per layer; a sliding layer's hold the ones
        it still holds (None: none of them)."""
        keys, values = [None] * self.num_layers, [None] * self.num_layers
        for group in self._attention_groups():
            held = group.read(row, start, stop)
            if held is not None:
                for layer, k, v in zip(group.layers, *held):
                    keys[layer], values[layer] = k, v
        return keys, values

    def read_prefix(self, row: int, n: int) -> tuple[list, list]:
        """What a prefix of the first n tokens of `row` needs, per layer (the last W - 1 tokens of a
        sliding layer, all n of a full one)."""
        keys, values = [None] * self.num_layers, [None] * self.num_layers
        for group in self._attention_groups():
            for layer, k, v in zip(group.layers, *group.read_prefix(row, n)):
                keys[layer], values[layer] = k, v
        return keys, values

    def restore(self, row: int, length: int, parts: list[tuple[int, list, list]], states: list | None = None) -> None:
        """Fill the empty `row` with a prefix of `length` tokens. parts: (end, keys, values) per
        layer, each array holding the tokens just before `end`; states: the recurrent groups' after
        token length - 1 (`snapshot`), which a model with recurrent layers needs."""
        for group in self._attention_groups():
            group.restore(row, length, [(end, [keys[i] for i in group.layers], [values[i] for i in group.layers])
                                        for end, keys, values in parts])
        if self.recurrent:
            if states is None:
                raise ValueError("a prefix without recurrent states cannot be restored on a recurrent model")
            for group in self._recurrent_groups():
                count = len(group.layers) * len(group.states)
                group.load(row, states[:count])
                states = states[count:]

    def load_states(self, row: int, states: list) -> None:
        """Put back `row`'s recurrent states (a `snapshot`), its keys and values untouched: prompt lookup
        takes a row's states back to before a pass whose last tokens were refused."""
        for group in self._recurrent_groups():
            count = len(group.layers) * len(group.states)
            group.load(row, states[:count])
            states = states[count:]

    def snapshot(self, row: int) -> list | None:
        """Copies of `row`'s recurrent states (every recurrent group's, in order); None without any."""
        if not self.recurrent:
            return None
        return [state for group in self._recurrent_groups() for state in group.snapshot(row)]

    def _recurrent_groups(self) -> list:
        return [group for group in self.groups if hasattr(group, "snapshot")]

    def _attention_groups(self) -> list:
        return [group for group in self.groups if hasattr(group, "read")]

    def write_row(self, row: int, pairs) -> None:
        for group in self.groups:
            if hasattr(group, "write_row"):  # the groups that hold a row's encoder outputs
                group.write_row(row, pairs)


def cache_bytes(layers, itemsize: int) -> dict[str, int]:
    """What one row of a pool holds, from the layer specs (the profile's `cache`): the keys and values
    of a token over every attention layer, and the recurrent layers' states, whatever its length."""
    per_token = sum(2 * layer.kv_heads * layer.head_dim * itemsize for layer in layers
                    if layer.kind != "recurrent" and owns_cache(layer))  # (a kv_source reader holds nothing)
    states = sum(int(np.prod(state.shape)) * (itemsize if state.dtype == "model" else 4)
                 for layer in layers if layer.kind == "recurrent" for state in layer.states)
    return {"attention_bytes_per_token": per_token, "state_bytes_per_row": states,
            "recurrent_layers": sum(layer.kind == "recurrent" for layer in layers)}


def group_layers(layers) -> list[tuple[tuple, list[int]]]:
    """(group key, layer indices) of each cache group, in order of the groups' first layers."""
    groups: dict[tuple, list[int]] = {}
    for index, layer in enumerate(layers):
        if owns_cache(layer):  # (a layer that reads another's keys and values is in no group)
            groups.setdefault(group_key(layer), []).append(index)
    return list(groups.items())


def make_groups(layers, batch: int, capacity: int, widest: int | None, dtype, kv: Callable, cross: Callable,
                recurrent: Callable | None = None) -> list:
    """The cache groups of `layers`, made by `kv` (an attention group's class), `cross` (the cross
    inputs') and `recurrent` (a recurrent group's): the host's or the device's."""
    groups = []
    for key, indices in group_layers(layers):
        first = layers[indices[0]]
        if key[0] == "recurrent":
            if recurrent is None:
                raise ValueError("recurrent layers (their states) are not served on this backend yet")
            groups.append(recurrent(indices, batch, first.states, dtype))
            continue
        groups.append(kv(len(indices), batch, first.kv_heads, capacity, first.head_dim, dtype, layers=indices,
                         window=window_of(first), widest=widest))
    crossing = [i for i, layer in enumerate(layers) if layer.kind == "cross"]
    if crossing:
        groups.append(cross(crossing, batch, dtype))
    return groups


def cache_set(layers, batch: int, capacity: int, dtype, widest: int | None = None) -> CacheSet:
    """The host caches (numpy) of `layers` for `batch` rows of `capacity` tokens; widest: the most new
    tokens one step gives a row (a sliding group's size depends on it; None: the capacity)."""
    return CacheSet(make_groups(layers, batch, capacity, widest, dtype, KVCache, CrossCache, RecurrentCache), capacity,
                    len(layers))
