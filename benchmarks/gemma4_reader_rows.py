#!/usr/bin/env python
"""Gemma 4's prefill with its shared-cache layers on the rows logits are asked for (the graph as built:
trt_llm/families/gemma4/decoder.py's run_layers, as transformers' _maybe_slice_kv_shared_inputs does)
against the same layers on every prompt row, in one interleaved run on 2 threads.

    python benchmarks/gemma4_reader_rows.py            # a 1,024-token prompt, batch 1 and 2, 5 rounds
    python benchmarks/gemma4_reader_rows.py --smoke    # 64 tokens, 1 round: the plumbing

The checkpoint is benchmarks/gemma4_shared_cache.py's (E2B's widths, 6 layers of which the last 3 read
another's cache; E2B has 20 such layers of 35). The "every row" engine is built from the same checkpoint
with run_layers' row selection switched off (patched in this process). Per round and batch size, each
engine prefills the prompt and gives its first greedy token (time to first token); both must give the
same tokens. Writes gemma4_reader_rows.json into --out-dir and prints medians with min / max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import gemma4_shared_cache as shared  # noqa: E402 - the checkpoint and the CPU's name


def every_row_engine(model: Path, folder: Path, capacity: int) -> Path:
    """The engine with the readers on every row: run_layers' selection patched away while it builds."""
    if (folder / "manifest.json").is_file():
        return folder
    import torch

    from trt_llm.families.gemma4 import decoder

    def unselected(kept, hidden, per_layer, position_ids, mask, query_lengths):
        return hidden, per_layer, position_ids, mask, query_lengths, torch.zeros_like(query_lengths)

    original_init = decoder.DecoderGraph.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.returns_kept = False

    decoder.DecoderGraph._kept, decoder._rows = staticmethod(unselected), lambda tensor, kept: tensor
    decoder.DecoderGraph.__init__ = init
    return shared.engine(model, folder, capacity)


def first_token(model, batch: int, prompt: int, seed: int) -> tuple[float, list[int]]:
    import numpy as np

    from trt_llm.runtime.engine.generate import generate
    from trt_llm.runtime.engine.sequence import Sequence
    from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

    rng = np.random.default_rng(seed)
    sequences = [Sequence(rng.integers(3, model.vocab_size, prompt).tolist(), 1) for _ in range(batch)]
    started = time.perf_counter()
    generate(model, sequences, Sampler([SamplingParams(temperature=0.0)] * batch))
    return (time.perf_counter() - started) * 1000, [s.generated[0] for s in sequences]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=BENCH.parent / "out" / "bench" / "gemma4-e2b-widths-6l")
    parser.add_argument("--out-dir", type=Path, default=BENCH.parent / "out" / "bench")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.prompt, args.rounds = 64, 1
    from trt_llm.runtime.app.evaluate import open_model
    from trt_llm.runtime.engine_dir import EngineDir

    checkpoint = shared.checkpoint(args.work_dir / "checkpoint")
    folders = {"kept rows": shared.engine(checkpoint, args.work_dir / "engine", 4096),
               "every row": every_row_engine(checkpoint, args.work_dir / "engine-every-row", 4096)}
    models = {name: open_model(EngineDir.open(folder), threads=2) for name, folder in folders.items()}
    times: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        for batch in args.batches:
            tokens = {}
            for name in (list(models) if round_ % 2 == 0 else list(models)[::-1]):
                elapsed, tokens[name] = first_token(models[name], batch, args.prompt, seed=round_)
                times.setdefault((name, batch), []).append(elapsed)
            assert tokens["kept rows"] == tokens["every row"], "the two graphs gave different tokens"
    import onnxruntime

    result = {"machine": shared._cpu(), "onnxruntime": onnxruntime.__version__, "threads": 2, "prompt": args.prompt,
              "rounds": args.rounds, "ttft_ms": {}}
    print(f"time to first token (ms), a {args.prompt}-token prompt; medians [min, max] over {args.rounds} rounds")
    for batch in args.batches:
        row = []
        for name in models:
            values = times[(name, batch)]
            result["ttft_ms"][f"{name}, batch {batch}"] = {"median": statistics.median(values), "min": min(values),
                                                            "max": max(values)}
            row.append(f"{name}: {statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}]")
        ratio = statistics.median(times[("every row", batch)]) / statistics.median(times[("kept rows", batch)])
        result["ttft_ms"][f"every row / kept rows, batch {batch}"] = ratio
        print(f"batch {batch}: " + "; ".join(row) + f"; every row / kept rows {ratio:.2f}x")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gemma4_reader_rows.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
