"""llama.cpp through its Python binding (`llama-cpp-python`), on an F32 GGUF converted from the same HF
directory (sidebyside/gguf_convert.py, timed as the build). The binding runs one sequence at a time."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from ..artifacts import Artifact, Context, cached_build, source_hash
from ..measure import run_timed

NAME = "llama.cpp"
BATCHED = False
BATCH_NOTE = "llama-cpp-python runs one sequence at a time"
CONVERTER = Path(__file__).resolve().parent.parent / "gguf_convert.py"


def missing(ctx: Context) -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama-cpp-python is not installed (pip install llama-cpp-python; it compiles llama.cpp, "
                "about 5 minutes on 2 cores)")
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is not installed (pip install gguf): no GGUF conversion"
    return None


def prepare(ctx: Context) -> Artifact:
    from importlib import metadata

    out = ctx.work_dir / "model-f32.gguf"

    def build():
        return run_timed([sys.executable, str(CONVERTER), str(ctx.hf_dir), str(out)], ctx.work_dir / "model-f32.log")

    key = {"hf_dir": str(ctx.hf_dir), "converter": source_hash(CONVERTER), "gguf": metadata.version("gguf")}
    info = cached_build(ctx, "model-f32", out, key, build, "HF -> F32 GGUF (gguf_convert.py)")
    return Artifact(path=out, precision="fp32", build=info)


class Runner:
    def __init__(self, path: Path, threads: int, capacity: int):
        from llama_cpp import Llama

        # n_batch / n_ubatch 512 (the defaults): a 512-token prompt is one prefill pass.
        self.llm = Llama(model_path=str(path), n_ctx=capacity, n_batch=512, n_ubatch=512, n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)

    def run(self, prompts: list[list[int]], n: int) -> dict:
        if len(prompts) != 1:
            raise ValueError("llama-cpp-python runs one sequence at a time")
        llm = self.llm
        # Forget the previous run: the binding would otherwise reuse the KV of a shared prompt prefix
        # (the same prompt every round), which no other engine here is allowed to do.
        llm.reset()
        tokens = []
        t0 = time.perf_counter()
        first = None
        # temp 0 = llama.cpp's greedy sampler; generate() never stops at EOS by itself.
        for token in llm.generate(prompts[0], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            tokens.append(int(token))
            if first is None:
                first = time.perf_counter()
            if len(tokens) == n:
                break  # before the generator evaluates one token more
        end = time.perf_counter()
        return dict(ttft_s=first - t0, decode_s=end - first, tokens=[tokens])
