"""One run of native `llama-bench` (sidebyside/native_llamacpp.py builds it): prompt and decode speed on a
GGUF file, by llama.cpp's own timing.

`llama-bench -m FILE -p 64,512 -n 64 -t T -r R -o json`: pp64 / pp512 = a batch-1 prompt of that many
tokens in one pass (its default -b 2048 / -ub 512: 512 tokens are one ubatch), tg64 = 64 tokens decoded one
at a time from an empty context; each test runs once untimed, then R times; avg_ts = the mean of the R
samples' tokens/s. Its input tokens are random ids (it measures speed only: no text comes out).
"""

from __future__ import annotations

import json
import subprocess


def command(bench: str, gguf: str, threads: int, prompts: list[int], new_tokens: int, reps: int) -> list[str]:
    return [bench, "-m", gguf, "-p", ",".join(map(str, prompts)), "-n", str(new_tokens), "-t", str(threads),
            "-r", str(reps), "-o", "json"]


def run(cmd: list[str], timeout: float = 600) -> dict:
    """{"pp64": tok/s, "pp512": ..., "tg64": ..., "records": llama-bench's JSON}; raises on failure."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"llama-bench exit {done.returncode}: {tail}")
    records = json.loads(done.stdout)
    out = {"records": records}
    for rec in records:
        if rec["n_gen"] == 0:
            out[f"pp{rec['n_prompt']}"] = rec["avg_ts"]
        elif rec["n_prompt"] == 0:
            out[f"tg{rec['n_gen']}"] = rec["avg_ts"]
    return out
