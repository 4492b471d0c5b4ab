#!/usr/bin/env python
"""What the cpu backend's caches hold for a model with sliding-window layers: Gemma-3-1B's layer
layout (26 layers, five sliding of window 512 to one global, 1 KV head of 256), the runtime's own
cache set (runtime/cache/cache_set.py), measured as allocated bytes and the process's resident memory.

ONNX Runtime's GroupQueryAttention attends over a plain buffer of `total_sequence_length` slots per
row, causal and windowed by slot index (local_window_size); it has no ring buffer. Our window
groups keep consecutive tokens in consecutive slots and drop a row's oldest when a step would not
fit, so GQA runs on window - 1 + the widest step slots with their own lengths input; what a sliding
layer costs then depends on the widest step: the prefill chunk, or a whole prompt.

    python benchmarks/window_cache_memory.py [--batch 4] [--capacity 4096] [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

import numpy as np


def layers(window: int, sliding: bool):
    from trt_llm.schemas.layer_spec import FullAttention, SlidingAttention

    common = dict(kv_heads=1, head_dim=256, scale=256 ** -0.5)
    return [SlidingAttention(window=window, **common) if sliding and (i + 1) % 6 else FullAttention(**common)
            for i in range(26)]


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(cache_set, specs, batch: int, capacity: int, dtype, widest) -> dict:
    """One cache set's bytes: allocated, and resident once every page is touched (as the engine's
    writes touch them); freed when this returns."""
    before = resident_mb()
    cache = cache_set(specs, batch, capacity, dtype, widest)
    buffers = [b for g in cache.groups for b in (*g.keys, *g.values)]
    for buffer in buffers:
        buffer.fill(1)
    return {"allocated_mb": round(sum(b.nbytes for b in buffers) / 2**20, 1),
            "resident_mb": round(resident_mb() - before, 1), "slots": sorted({g.slots for g in cache.groups})}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp16")
    args = parser.parse_args(argv)

    from trt_llm.runtime.cache.cache_set import cache_set

    dtype = {"fp32": np.float32, "fp16": np.float16}[args.dtype]
    rows = {}
    for name, sliding, widest in (("every layer global (the whole capacity)", False, None),
                                  ("sliding, whole prompts of 1,024", True, 1024),
                                  ("sliding, prefill chunks of 512", True, 512),
                                  ("sliding, prefill chunks of 64", True, 64)):
        rows[name] = measure(cache_set, layers(args.window, sliding), args.batch, args.capacity, dtype, widest)
    full = rows["every layer global (the whole capacity)"]["allocated_mb"]
    for row in rows.values():
        row["of_global"] = round(row["allocated_mb"] / full, 3)
    print(json.dumps({"batch": args.batch, "capacity": args.capacity, "window": args.window, "dtype": args.dtype,
                      "layers": "26: 22 sliding, 4 global, 1 KV head of 256", "caches": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
