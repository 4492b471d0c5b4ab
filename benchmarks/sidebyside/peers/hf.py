"""Hugging Face transformers `generate` on the fp32 checkpoint itself (nothing to build)."""

from __future__ import annotations

import time
from pathlib import Path

from ..artifacts import Artifact, Context

NAME = "transformers"
BATCHED = True


def missing(ctx: Context) -> str | None:
    return None


def prepare(ctx: Context) -> Artifact:
    return Artifact(path=ctx.hf_dir, precision="fp32", build=None)  # loads the checkpoint itself


class Runner:
    def __init__(self, path: Path, threads: int, capacity: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def run(self, prompts: list[list[int]], n: int) -> dict:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        class Clock(LogitsProcessor):
            # Called once per step right after the forward pass: the first call marks the first
            # token (prefill done), the calls after it one decode step each.
            def __init__(self):
                self.times = []

            def __call__(self, input_ids, scores):
                self.times.append(time.perf_counter())
                return scores

        ids = torch.tensor(prompts, dtype=torch.long)  # every row has the same length: no padding
        clock = Clock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            # min_new_tokens = max_new_tokens: no stop at EOS (EOS is masked until then).
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                                      logits_processor=LogitsProcessorList([clock]))
        end = time.perf_counter()
        assert len(clock.times) == n, (len(clock.times), n)
        return dict(ttft_s=clock.times[0] - t0, decode_s=end - clock.times[0],
                    tokens=out[:, ids.shape[1]:].tolist())
