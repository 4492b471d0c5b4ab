"""The keys and values of one group of attention layers (full or sliding-window), for the rows of a
batch: per layer a key and a value buffer [B, Hkv, slots, D], updated in place.

The engine binds each buffer as both its `past_*` input and its `present_*` output, so the attention
op writes the new tokens' keys and values straight into it. When a row finishes, the rows behind it
move up (only their used slots are copied), so the next step runs on a smaller batch: a finished row
costs nothing more.

Callers speak in tokens (a row's first n tokens, token t); the cache maps them to slots. A full
group's slot t holds token t. A sliding group (window W) needs only its last W - 1 tokens before a
step plus the step's own, so it holds `slots` = W - 1 + the widest step (at most the capacity):
slot s of row b holds token s + offset[b], and before a step that would not fit, `make_room` drops
the row's oldest tokens (moves the last W - 1 to the front). Consecutive tokens stay in consecutive
slots, so the attention op's causal and window masks, which count slots, are the tokens' own; the
graph reads the slots each row holds from the group's lengths input (past_lengths_w<W>).
"""

from __future__ import annotations

import numpy as np

from trt_llm.schemas.graph_spec import past, present, window_lengths


def window_slots(window: int, capacity: int, widest: int | None) -> int:
    """The slots a sliding group needs: W - 1 tokens before a step plus its widest step (never more
    than the capacity, where it is a full cache that never drops a token; None: a step may be as
    wide as the capacity)."""
    return capacity if not window or widest is None else min(capacity, window - 1 + widest)


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype=np.float32, layers: list[int] | None = None, window: int = 0, widest: int | None = None):
        """layers: the graph's layer indices of this group (default 0 .. num_layers - 1); window: a
        sliding group's window (0: full attention); widest: the most new tokens a step gives a row
        (a sliding group's slots depend on it; default: the capacity, which never drops a token)."""
        self.layers = list(layers) if layers is not None else list(range(num_layers))
        self.window_size, self.widest = window, widest  # None: the capacity, whatever it grows to
        slots = window_slots(window, capacity, self.widest)
        shape = (batch, kv_heads, slots, head_dim)
        # Zero-filled: slots past a row's length are masked out, but must hold finite numbers.
        self.keys = [np.zeros(shape, dtype) for _ in self.layers]
        self.values = [np.zeros(shape, dtype) for _ in self.layers]
        self.offsets = np.zeros(batch, np.int64)  # per row: tokens dropped from the front (sliding)
        self.batch = batch
        self.capacity = capacity  # tokens a row may hold
        self.generation = 0  # counts the buffers' replacements (reserve), which an engine rebinds

    @property
    def slots(self) -> int:
        return self.keys[0].shape[2]

    def keep_rows(self, rows: list[int], used: list[int]) -> None:
        """Compact to `rows` (ascending), in that order; `used[i]` = tokens in use by rows[i]."""
        for target, (source, length) in enumerate(zip(rows, used)):
            if target != source:
                held = length - int(self.offsets[source])
                for buffer in (*self.keys, *self.values):
                    buffer[target, :, :held] = buffer[source, :, :held]
                self.offsets[target] = self.offsets[source]
        self.offsets[len(rows):] = 0  # the rows freed: the next request there starts from its first token
        self.batch = len(rows)

    def move_slots(self, row: int, sources: list[int], start: int) -> None:
        """Copy tokens `sources` (ascending, each >= its target) of `row` to start, start + 1, ...:
        an EAGLE round keeps its accepted tree nodes' keys and values contiguous."""
        offset = int(self.offsets[row])
        for target, source in enumerate(sources, start):
            if source != target:
                for buffer in (*self.keys, *self.values):
                    buffer[row, :, target - offset] = buffer[row, :, source - offset]

    def window(self, start: int, stop: int) -> "KVCache":
        """Rows start .. stop - 1 as a cache of their own that shares this one's memory: a step over
        some rows only (the prefill of requests admitted while others decode)."""
        part = KVCache.__new__(KVCache)
        part.layers, part.window_size, part.widest = self.layers, self.window_size, self.widest
        part.keys = [k[start:stop] for k in self.keys]
        part.values = [v[start:stop] for v in self.values]
        part.offsets = self.offsets[start:stop]
        part.batch, part.capacity, part.generation = stop - start, self.capacity, 0
        return part

    def reserve(self, rows: int, capacity: int, used: list[int]) -> None:
        """At least `rows` rows for `capacity` tokens each: new buffers when these are smaller, with
        the `used[i]` tokens of each active row i copied over (a pool that grows between steps)."""
        have_rows, heads, have_slots, dim = self.keys[0].shape
        slots = window_slots(self.window_size, max(capacity, self.capacity), self.widest)
        self.capacity = max(capacity, self.capacity)
        if rows <= have_rows and slots <= have_slots:
            return
        shape = (max(rows, have_rows), heads, max(slots, have_slots), dim)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = np.zeros(shape, old.dtype)
                for row, length in enumerate(used):
                    held = length - int(self.offsets[row])
                    new[row, :, :held] = old[row, :, :held]
                buffers[i] = new
        offsets = np.zeros(shape[0], np.int64)
        offsets[: len(self.offsets)] = self.offsets
        self.offsets = offsets
        self.generation += 1

    def make_room(self, past_lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """Before a step that writes `width` new slots after each row's past_lengths[b] tokens: a
        sliding group drops the tokens no later one can see where the step would not fit, and gives
        the slots each row then holds (its lengths input); a full group gives nothing."""
        if not self.window_size:
            return {}
        if self.slots >= self.capacity:  # as many slots as tokens: it never needs to drop one (a restored
            # prefix's row holds only its last W - 1 tokens, from slot 0: `offsets` counts the ones before)
            return {window_lengths(self.window_size): (past_lengths - self.offsets[: len(past_lengths)]).astype(np.int32)}
        if self.window_size - 1 + width > self.slots:
            raise ValueError(f"a step of {width} new tokens needs {self.window_size - 1 + width} slots in the "
                             f"window-{self.window_size} cache, which holds {self.slots}")
        for row, length in enumerate(past_lengths[: self.batch].tolist()):
            held = length - int(self.offsets[row])
            if held + width > self.slots:
                keep = self.window_size - 1
                for buffer in (*self.keys, *self.values):
                    buffer[row, :, :keep] = buffer[row, :, held - keep: held].copy()
                self.offsets[row] = length - keep
        return {window_lengths(self.window_size): (past_lengths - self.offsets[: len(past_lengths)]).astype(np.int32)}

    def tensors(self) -> list[tuple[str, str | None, np.ndarray]]:
        """(input name, output name, buffer) of each tensor the engine binds: the active rows, a
        contiguous view that shares the buffer's memory."""
        bound = []
        for layer, key, value in zip(self.layers, self.keys, self.values):
            bound += [(past("key", layer), present("key", layer), key[: self.batch]),
                      (past("value", layer), present("value", layer), value[: self.batch])]
        return bound

    def needed(self, length: int) -> int:
        """The first token a restored prefix of `length` tokens must give this group: 0 for full
        attention, the window's for a sliding group (its next token sees only the last W - 1)."""
        return max(0, length - (self.window_size - 1)) if self.window_size else 0

    def read(self, row: int, start: int, stop: int) -> tuple[list, list] | None:
        """Copies of tokens start .. stop - 1 of `row`, per layer [Hkv, n, D]: (keys, values). A
        sliding group that no longer holds the first of them gives the ones it holds (the last n),
        None if it holds none."""
        offset = int(self.offsets[row])
        if stop <= offset:
            return None
        span = slice(max(start, offset) - offset, stop - offset)
        return [k[row, :, span].copy() for k in self.keys], [v[row, :, span].copy() for v in self.values]

    def restore(self, row: int, length: int, parts: list[tuple[int, list, list]]) -> None:
        """Fill an empty `row` with a prefix of `length` tokens. parts: (end, keys, values), each
        layer's array [Hkv, n, D] holding the n tokens before `end` (None: not given). What the
        group does not need (`needed`) is skipped; what it needs must be there."""
        offset = self.needed(length)
        self.offsets[row] = offset
        for end, keys, values in parts:
            for buffer_k, buffer_v, k, v in zip(self.keys, self.values, keys, values):
                if k is None or end <= offset:
                    continue
                skip = max(0, offset - (end - k.shape[1]))
                buffer_k[row, :, end - k.shape[1] + skip - offset: end - offset] = k[:, skip:]
                buffer_v[row, :, end - k.shape[1] + skip - offset: end - offset] = v[:, skip:]

    def write_prefix(self, row: int, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Restore saved KV ([Hkv, n, D] per layer, tokens 0 .. n - 1) into `row`."""
        length = keys[0].shape[1]
        self.restore(row, length, [(length, keys, values)])

    def read_prefix(self, row: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """What a prefix of the first n tokens of `row` needs, per layer: (keys, values), each
        [Hkv, m, D], the last m tokens before n (m = n for full attention)."""
        return self.read(row, self.needed(n), n)
