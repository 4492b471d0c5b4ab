"""What the server's memory metrics read (server/metrics.py): the process's peak resident set and the
bytes a cache set (runtime/cache/cache_set.py) has allocated.

A pool's bytes are what its buffers were allocated with, not what is resident: numpy's zero-filled
host buffers are mapped lazily, so slots no request has written yet cost address space only.
Double-buffered device groups (runtime/cache/device.py) count both of their sets.
"""

from __future__ import annotations

import sys

import numpy as np


def peak_resident_bytes(status: str = "/proc/self/status") -> int | None:
    """The process's high-water resident set: Linux's VmHWM, else getrusage's ru_maxrss (None where
    neither exists)."""
    try:
        with open(status) as lines:
            for line in lines:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def engine_pools(core) -> list[tuple[str, object]]:
    """(name, cache set) of an EngineCore's pools that exist yet: the base model's (made at the first
    admission) and an EAGLE draft's."""
    if core is None:
        return []
    pools = [("base", core.cache), ("draft", getattr(core.strategy, "cache", None))]
    return [(name, cache) for name, cache in pools if cache is not None]


def pool_bytes(cache) -> dict[str, int]:
    """{"host": bytes, "device": bytes} a cache set's groups have allocated."""
    host = device = 0
    for group in cache.groups:
        on_device = _device_bytes(group)
        if on_device is None:
            host += _host_bytes(group)
        else:
            device += on_device
    return {"host": host, "device": device}


def _host_bytes(group) -> int:
    """Every numpy buffer a host group owns (its keys and values, states, clips, row offsets),
    whatever its kind: attributes holding an array or a list of arrays; a view counts its base once."""
    owners = {}
    for value in list(vars(group).values()):  # a copy: the engine thread may set attributes meanwhile
        for array in value if isinstance(value, list) else [value]:
            if isinstance(array, np.ndarray):
                base = array if array.base is None else array.base
                owners[id(base)] = base.nbytes
    return sum(owners.values())


def _device_bytes(group) -> int | None:
    """A device group's allocations (None: a host group)."""
    from trt_llm.runtime.cache.device import DeviceCrossCache, DeviceKVCache
    from trt_llm.runtime.cache.device_recurrent import DeviceRecurrentCache

    # Counted by the pointers held, so a freed group (no pointers) counts nothing.
    if isinstance(group, DeviceKVCache):  # two sets of a key and a value buffer per layer
        return sum(len(keys) + len(values) for keys, values in group.sets) * group.batch_capacity * group.row_bytes
    if isinstance(group, DeviceRecurrentCache):  # two sets of a buffer per state
        return group.batch_capacity * sum(row_bytes for pointers in group.sets
                                          for (*_, row_bytes), _ in zip(group.tensors, pointers))
    if isinstance(group, DeviceCrossCache):  # a buffer per cross key and value, once the first clip came
        return len(group.buffers) * group.batch_capacity * group.row_bytes
    return None
