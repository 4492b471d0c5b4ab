"""Which TensorRT steps run as a replayed CUDA graph: the keys and the decisions, in plain Python.

A captured graph replays the kernels of the step it was captured from, with everything that step
baked in: the execution context (its optimization profile and scratch memory), every input shape and
every device address bound (the small inputs, the outputs, and both buffer sets of the
double-buffered KV cache). So a step may replay a graph only when all of those are the same, and
the key of a step is exactly that: (context, ((name, shape, address), ...)). Nothing else needs
invalidating: a key that no longer matches is simply never replayed, and a graph whose addresses
were freed and handed out again replays correctly, because a matching key means every named tensor
sits at the address the graph was captured with.

What that means for the decode loop:
- the double-buffered cache swaps `past` and `present` after every step, so each decode shape has
  two keys (one per parity) and two graphs;
- the batch shrinks when rows finish (new shapes), and each batch of requests gets a cache of its
  own capacity (new shapes and addresses): the graphs are per (batch size, KV capacity, parity);
- a realloc of a growing input or output buffer (a longer prefill than before) moves its address.

Policy: only decode steps (one new token per row) are candidates. The first time a key is seen the
step runs plainly; the next time it runs plainly and is then captured (the plain run right before
the capture flushes any deferred shape work TensorRT does on a shape change, and is the step's
result: the capture itself executes nothing); from then on it replays. A key whose capture failed
runs plainly for good, and the first failure is logged once. At most `max_graphs` graphs are held,
least recently used out first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Hashable, Iterable

PLAIN, CAPTURE, REPLAY = "plain", "capture", "replay"

log = logging.getLogger(__name__)


def step_key(context_index: int, bindings: Iterable[tuple[str, tuple[int, ...] | None, int]],
             new_tokens: int) -> tuple | None:
    """The graph key of one step, or None when the step is no decode step (new_tokens != 1).

    bindings: (tensor name, shape for an input or None for an output, device address)."""
    if new_tokens != 1:
        return None
    return (context_index, tuple((name, None if shape is None else tuple(int(d) for d in shape), int(address))
                                 for name, shape, address in bindings))


class GraphCache:
    """The captured graphs of one engine and the plain runs seen so far, by step key.

    destroy: frees a graph handle (cudaGraphExecDestroy), called on eviction and clear().
    warmup_runs: plain runs of a key before it is captured.
    """

    def __init__(self, destroy: Callable[[object], None], enabled: bool = True, max_graphs: int = 64,
                 warmup_runs: int = 1):
        if max_graphs < 1 or warmup_runs < 0:
            raise ValueError("max_graphs must be >= 1 and warmup_runs >= 0")
        self.destroy, self.enabled = destroy, enabled
        self.max_graphs, self.warmup_runs = max_graphs, warmup_runs
        self._graphs: OrderedDict[Hashable, object] = OrderedDict()
        self._runs: OrderedDict[Hashable, int] = OrderedDict()  # plain runs of keys not captured yet
        self._failed: OrderedDict[Hashable, None] = OrderedDict()
        self.stats = {"captures": 0, "replays": 0, "failures": 0, "evictions": 0}
        self.first_failure: str | None = None

    def __len__(self) -> int:
        return len(self._graphs)

    def decide(self, key) -> str:
        """PLAIN, CAPTURE (run plainly, then capture) or REPLAY for a step with this key."""
        if key is None or not self.enabled or key in self._failed:
            return PLAIN
        if key in self._graphs:
            self._graphs.move_to_end(key)
            self.stats["replays"] += 1
            return REPLAY
        runs = self._runs.pop(key, 0)
        if runs >= self.warmup_runs:
            return CAPTURE
        self._runs[key] = runs + 1
        _trim(self._runs, 4 * self.max_graphs)
        return PLAIN

    def graph(self, key):
        """The graph to replay, after decide(key) said REPLAY."""
        return self._graphs[key]

    def captured(self, key, graph) -> None:
        old = self._graphs.pop(key, None)
        if old is not None:
            self.destroy(old)
        self._graphs[key] = graph
        self.stats["captures"] += 1
        while len(self._graphs) > self.max_graphs:
            _, evicted = self._graphs.popitem(last=False)
            self.destroy(evicted)
            self.stats["evictions"] += 1

    def capture_failed(self, key, reason: str) -> None:
        """This key runs plainly from now on; the first failure of the engine is logged."""
        self._failed[key] = None
        _trim(self._failed, 4 * self.max_graphs)
        self.stats["failures"] += 1
        if self.first_failure is None:
            self.first_failure = reason
            log.warning("CUDA graph capture failed, decode steps of that shape run without a graph: %s", reason)

    def clear(self) -> None:
        """Destroy every graph (the engine is closing)."""
        graphs, self._graphs = list(self._graphs.values()), OrderedDict()
        self._runs.clear()
        for graph in graphs:
            self.destroy(graph)


def _trim(entries: OrderedDict, limit: int) -> None:
    while len(entries) > limit:
        entries.popitem(last=False)
