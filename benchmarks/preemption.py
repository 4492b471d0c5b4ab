#!/usr/bin/env python
"""Preemption by pause (runtime/engine/preemption.py): a high-priority request's time to first token on
an idle engine, beside a pool full of low-priority rows (one paused for it), and beside the same full
pool where it has no priority (it waits for a row to free).

SmolLM2-135M-Instruct fp32 on the cpu backend, 4 rows, greedy: the low rows decode long answers (their
end-of-sequence banned); the urgent request arrives once they are 8 tokens in. Timed on the engine
core in this process (no server), rounds alternating; the paused row's tokens are checked against its
answer alone.

    python benchmarks/preemption.py --engine ~/.cache/trt-llm-bench/engine-smollm2-lookup-none [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

LOW = ["Tell me a story about a lighthouse keeper.", "Explain how a rainbow forms.",
       "Write a short poem about the sea.", "Describe a good breakfast."]
URGENT = "What is the capital of France?"
BAN = {"0": -100.0, "1": -100.0, "2": -100.0}  # SmolLM2's end tokens


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--low-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.runtime.text.prompt import PromptFormatter
    from trt_llm.schemas.input_file import parse_input_dict

    runner = Runner(EngineDir.open(args.engine), threads=args.threads, scheduling="continuous")
    formatter = PromptFormatter(runner.tokenizer, True, True, False)
    data = {"temperature": 0.0, "max_generate_length": args.low_tokens,
            "requests": [{"messages": [{"role": "user", "content": t}], "logit_bias": BAN} for t in LOW]
            + [{"messages": [{"role": "user", "content": URGENT}], "priority": 1}]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<benchmark>")

    def fresh():
        out = []
        for index, request in enumerate(loaded.requests):
            r = runner.engine_request(runner.prepare(index, request, loaded.settings, formatter))
            r.priority = request.priority
            out.append(r)
        return out

    def first_token(core, request) -> float:
        started = time.perf_counter()
        core.add_request(request)
        while not request.sequence.generated:
            core.step()
        return time.perf_counter() - started

    def idle() -> float:
        core = runner.engine_core(4, "continuous")
        return first_token(core, fresh()[4])

    def full(priority: int):
        core = runner.engine_core(4, "continuous")
        *low, urgent = fresh()
        urgent.priority = priority
        for r in low:
            core.add_request(r)
        while min(len(r.sequence.generated) for r in low) < 8:
            core.step()
        ttft = first_token(core, urgent)
        core.run_to_completion()
        return ttft, low, core.pauses

    alone = {}
    times = {"idle": [], "full, priority (pause)": [], "full, no priority (wait)": []}
    for _ in range(args.rounds):
        times["idle"].append(idle())
        ttft, low, pauses = full(1)
        assert pauses == 1
        times["full, priority (pause)"].append(ttft)
        times["full, no priority (wait)"].append(full(0)[0])
        for i, r in enumerate(low):  # every low row ends with its answer alone (the paused one included)
            if i not in alone:
                core = runner.engine_core(1, "continuous")
                solo = fresh()[i]
                core.add_request(solo)
                core.run_to_completion()
                alone[i] = solo.sequence.generated
            assert r.sequence.generated == alone[i], i
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {"engine": str(args.engine), "rows": 4, "low_tokens": args.low_tokens, "rounds": args.rounds,
              "threads": args.threads,
              "ttft_ms_median": {k: round(v * 1000, 1) for k, v in medians.items()},
              "ttft_ms_all": {k: [round(x * 1000, 1) for x in v] for k, v in times.items()},
              "ratio_pause_to_idle": round(medians["full, priority (pause)"] / medians["idle"], 3),
              "ratio_wait_to_idle": round(medians["full, no priority (wait)"] / medians["idle"], 3),
              "paused_rows_tokens_identical": True}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
