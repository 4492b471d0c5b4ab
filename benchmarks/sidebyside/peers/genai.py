"""ONNX Runtime GenAI: its model builder (`onnxruntime_genai.models.builder`, fp32, cpu) on the same HF
directory, run with its Generator."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from ..artifacts import Artifact, Context, cached_build
from ..measure import run_timed

NAME = "ort-genai"
BATCHED = True
PAD = 0  # written into genai_config.json; rows are never padded here anyway


def missing(ctx: Context) -> str | None:
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return "onnxruntime-genai is not installed (pip install onnxruntime-genai, or the `bench` extra)"
    return None


def prepare(ctx: Context, precision: str = "fp32") -> Artifact:
    import onnxruntime_genai

    name = f"genai-{precision}-cpu"
    out = ctx.work_dir / name
    config_path = out / "genai_config.json"
    # GenAI's `builder --help` crashes on a stray `%`, so the arguments are spelled out.
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ctx.hf_dir), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(ctx.work_dir / "genai-cache")]

    def build():
        return run_timed(cmd, ctx.work_dir / f"{name}.log", env={**os.environ, "HF_HUB_OFFLINE": "1"})

    key = {"hf_dir": str(ctx.hf_dir), "onnxruntime-genai": onnxruntime_genai.__version__}
    info = cached_build(ctx, name, out, key, build, f"onnxruntime_genai.models.builder ({precision}, cpu)")
    # Same thread count as everyone (sessions read it from here), one inter-op thread. SmolLM2's pad id
    # is its EOS (<|im_end|>, 2), which chat prompts contain; <|endoftext|> (0) never appears in one.
    config = json.loads(config_path.read_text())
    session = config["model"]["decoder"].setdefault("session_options", {})
    session["intra_op_num_threads"] = ctx.threads
    session["inter_op_num_threads"] = 1
    config["model"]["pad_token_id"] = PAD
    config_path.write_text(json.dumps(config, indent=4) + "\n")
    return Artifact(path=out, precision=precision, build=info)


class Runner:
    def __init__(self, path: Path, threads: int, capacity: int):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(path))

    def run(self, prompts: list[list[int]], n: int) -> dict:
        import numpy as np

        og = self.og
        ids = np.array(prompts, dtype=np.int32)  # every row has the same length: no padding
        width = ids.shape[1]
        t0 = time.perf_counter()
        params = og.GeneratorParams(self.model)
        # min_length = max_length: no stop at EOS (GenAI masks EOS until then).
        params.set_search_options(do_sample=False, max_length=width + n, min_length=width + n,
                                  batch_size=len(prompts))
        gen = og.Generator(self.model, params)
        gen.append_tokens(ids)  # runs the prefill
        gen.generate_next_token()  # picks the first token
        first = time.perf_counter()
        count = 1
        while not gen.is_done():
            gen.generate_next_token()
            count += 1
        end = time.perf_counter()
        assert count == n, (count, n)
        tokens = [list(gen.get_sequence(row))[-n:] for row in range(len(prompts))]
        return dict(ttft_s=first - t0, decode_s=end - first, tokens=[[int(t) for t in row] for row in tokens])
