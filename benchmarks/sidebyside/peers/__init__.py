"""The engines, one module each. Every module has:

    NAME          the engine's name in the report
    BATCHED       whether it runs more than one sequence per call (if not, BATCH_NOTE says why)
    missing(ctx)  None, or why it cannot run here (then it is skipped with that note)
    prepare(ctx)  -> artifacts.Artifact: builds (or finds) what the runner loads
    Runner(path, threads, capacity).run(prompts, n) -> {ttft_s, decode_s, tokens}
    worker_pythonpath()  optional: a folder its worker process imports first
    ENV           optional: environment variables its worker process sets before the runner loads

Runner.run gets token ids (one list per row, all the same length) and must generate exactly n tokens per
row, greedy, without stopping at an end-of-sequence token, and report: ttft_s = from the call until the
first token is chosen (prefill included), decode_s = from the first token to the last.
"""

from __future__ import annotations

import importlib

# CLI key -> module name; the order is the report's order.
ENGINES = {"ours": "ours", "ours-ref": "ours_ref", "transformers": "hf", "genai": "genai", "llamacpp": "llamacpp",
           "llamacpp-q4": "llamacpp_q4",
           # quantized (benchmarks/quantized_speed.py)
           "ours-int8": "ours_int8", "ours-int4": "ours_int4", "ours-int4-g128": "ours_int4_g128",
           "ours-int4-g32": "ours_int4_g32", "ours-int4-mlas": "ours_int4_mlas",
           "genai-int4": "genai_int4", "llamacpp-q4_0": "llamacpp_q4_0"}


def load(key: str):
    return importlib.import_module(f"{__name__}.{ENGINES[key]}")
