"""trt-llm: our engine directory (cpu backend, fp32), built with `trt-llm-build`, run through the real
runtime (runtime/engine/generate.py: one static batch on the engine core, greedy Sampler)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from ..artifacts import Artifact, Context, cached_build, source_hash
from ..measure import run_timed

NAME = "trt-llm"
BATCHED = True


def missing(ctx: Context) -> str | None:
    return None


def build_command() -> list[str]:
    """The console script beside this interpreter, else the same entry point through -m."""
    script = Path(sys.executable).with_name("trt-llm-build")
    if script.is_file():
        return [str(script)]
    found = shutil.which("trt-llm-build")
    return [found] if found else [sys.executable, "-m", "trt_llm.build.cli"]


def prepare(ctx: Context, quantization: dict | None = None, model: Path | None = None,
            name: str = "trt-llm-engine", precision: str = "fp32") -> Artifact:
    """The engine of ctx.hf_dir (or `model`, e.g. a GGUF file), fp32 or with `quantization:`."""
    import yaml

    import trt_llm.build
    import trt_llm.plugins
    import trt_llm.schemas

    out = ctx.work_dir / name
    config = {"model": str(model or ctx.hf_dir), "output_dir": str(out), "backend": "cpu", "dtype": "fp32",
              "max_batch_size": ctx.max_batch, "max_input_len": ctx.max_input,
              "max_kv_cache_capacity": ctx.capacity}
    if quantization:
        config["quantization"] = quantization
    builder = source_hash(*(Path(p.__file__).parent for p in (trt_llm.build, trt_llm.plugins, trt_llm.schemas)))
    config_path = ctx.work_dir / f"{name}.yaml"

    def build():
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        return run_timed([*build_command(), str(config_path), "--quiet"], ctx.work_dir / f"{name}.log")

    info = cached_build(ctx, name, out, {"config": config, "builder": builder}, build,
                        f"trt-llm-build (cpu backend, {precision})")
    return Artifact(path=out, precision=precision, build=info)


class Runner:
    def __init__(self, path: Path, threads: int, capacity: int):
        from trt_llm.runtime.engine_dir import EngineDir
        from trt_llm.runtime.backends.ort_engine import OrtEngine

        try:
            from trt_llm.runtime.engine.model import Model
        except ImportError:  # a trt-llm before issue 16 (peers/ours_ref.py runs one)
            from trt_llm.runtime.engine.generate import Model

        ed = EngineDir.open(path)
        dims = ed.dims
        try:  # the runtime's own loader (since issue 44 a GGUF engine's embedding may be its LM head's rows)
            from trt_llm.runtime.backends.embedding import engine_embedding

            embedding = engine_embedding(ed)
        except ImportError:  # an older trt-llm (peers/ours_ref.py runs one)
            embedding = self._older_embedding(ed, dims)
        engine = OrtEngine(ed.component_path("llm", "engine"), dims["num_layers"], threads)
        self.model = Model(engine, embedding, dims, [])  # no EOS: every row makes exactly n tokens

    @staticmethod
    def _older_embedding(ed, dims):
        from safetensors.numpy import load_file

        try:  # a quantized engine stores its embedding in fp16 or int8 blocks
            from trt_llm.runtime.backends.embedding import load_embedding

            scale = ed.manifest["model"].get("embedding_scale")  # Gemma's, looked up on the host since issue 42
            return load_embedding(ed.component_path("llm", "embedding"), ed.manifest["model"]["dtype"], dims,
                                  *([scale] if scale else []))
        except ImportError:  # a trt-llm before issue 17
            return load_file(str(ed.component_path("llm", "embedding")))["embedding"]

    def run(self, prompts: list[list[int]], n: int) -> dict:
        from trt_llm.runtime.engine.generate import generate
        from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams

        try:
            from trt_llm.runtime.engine.sequence import Sequence
        except ImportError:  # before issue 16
            from trt_llm.runtime.engine.generate import Sequence

        t0 = time.perf_counter()
        sequences = [Sequence(list(p), n) for p in prompts]
        generate(self.model, sequences, Sampler([SamplingParams(temperature=0.0)] * len(prompts)))
        end = time.perf_counter()
        first = max(s.first_token_time for s in sequences)
        return dict(ttft_s=first - t0, decode_s=end - first, tokens=[s.generated for s in sequences])
