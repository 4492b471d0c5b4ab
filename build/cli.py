"""`trt-llm-build CONFIG.yaml`: checkpoint -> ONNX -> engine directory."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from trt_llm.schemas.build_config import BuildConfig, ConfigError, load_build_config

# TensorRT: the graph is exported in this dtype and built strongly typed, so it is the precision.
SUPPORTED_DTYPES = {"cpu": ("fp32", "fp16"), "tensorrt": ("fp32", "fp16", "bf16"),
                    "tensorrt-rtx": ("fp32", "fp16", "bf16")}
TENSORRT_BACKENDS = ("tensorrt", "tensorrt-rtx")


class BuildError(RuntimeError):
    pass


def build_engine(config: BuildConfig, progress: bool = True) -> Path:
    """Build the engine directory described by `config`; returns its path."""
    from trt_llm.build import engine_dir as writer
    from trt_llm.build.checkpoint import TORCH_DTYPES, load_checkpoint
    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.build.eagle_build import export_eagle_draft, load_eagle_draft, manifest_entries
    from trt_llm.build import lora
    from trt_llm.build.decoder import DecoderGraph, ModelDims
    from trt_llm.build.export import export_decoder

    if config.backend not in SUPPORTED_DTYPES:
        raise BuildError(
            f"backend: {config.backend!r} engines cannot be built by this version yet; "
            f"available: {', '.join(SUPPORTED_DTYPES)}")
    if config.dtype not in SUPPORTED_DTYPES[config.backend]:
        raise BuildError(
            f"dtype: {config.dtype!r} is not supported by the {config.backend} backend; "
            f"choose one of {', '.join(SUPPORTED_DTYPES[config.backend])}")
    if config.draft is not None and config.backend != "cpu":
        raise BuildError(f"draft: EAGLE3 drafts are built for the cpu backend only in this version "
                         f"(backend {config.backend!r})")
    tensorrt_version = None
    if config.backend in TENSORRT_BACKENDS:
        # Before the minutes of loading and exporting: a missing TensorRT is a one-line error now.
        from trt_llm.runtime.trt_import import BackendUnavailable, import_tensorrt

        try:
            tensorrt_version = import_tensorrt(config.backend).__version__
        except BackendUnavailable as error:
            raise BuildError(str(error)) from None

    out = Path(config.output_dir)
    # Build into a sibling folder and swap it in at the end: a failed build never leaves a
    # half-written engine directory where a good one was.
    staging = out.with_name(out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "llm").mkdir(parents=True)
    dtype = TORCH_DTYPES[config.dtype]
    steps = tqdm(total=5, desc="build", unit="step", disable=not progress, file=sys.stderr,
                 bar_format="{desc}: {n_fmt}/{total_fmt} {postfix} [{elapsed}]")
    timings = {}

    def step(name):
        steps.set_postfix_str(name)
        timings[name] = time.perf_counter()

    def done(name):
        timings[name] = round(time.perf_counter() - timings[name], 2)
        steps.update(1)

    try:
        step("loading checkpoint")
        checkpoint = load_checkpoint(config.model, config.dtype, config.trust_remote_code)
        done("loading checkpoint")

        step("writing tokenizer and embedding")
        writer.write_tokenizer(checkpoint, staging / "tokenizer")
        writer.write_embedding(checkpoint, staging / "llm" / "embedding.safetensors", dtype)
        checkpoint.model.config.to_json_file(staging / "llm" / "config.json")
        done("writing tokenizer and embedding")

        step("exporting to ONNX")
        lora_layout = None
        if config.lora:
            model_dims = ModelDims(checkpoint.model.config)
            lora_layout = lora.layout(model_dims, checkpoint.model.config.intermediate_size,
                                      config.lora.max_rank, config.lora.target_modules)
        draft = load_eagle_draft(config, checkpoint) if config.draft else None
        graph = DecoderGraph(checkpoint.model, checkpoint.family, config.max_kv_cache_capacity, dtype,
                             [g["name"] for g in lora_layout["groups"]] if lora_layout else [],
                             feature_layers=draft.aux_layer_ids if draft is not None else None)
        dims = graph.dims.to_dict()
        graph_path = export_decoder(graph, staging / "llm" / "model.onnx", dtype, lora_layout)
        draft_graph_path = None
        if draft is not None:
            draft_graph_path = export_eagle_draft(draft, checkpoint, config, staging / "draft", dtype)
        del graph
        done("exporting to ONNX")

        step(f"compiling for {config.backend}")
        if config.backend in TENSORRT_BACKENDS:
            from trt_llm.build.tensorrt_backend import TensorRTBuildError, compile_tensorrt

            def report(phase):
                steps.set_postfix_str(f"compiling for {config.backend}: {phase}")

            try:
                engine_path = compile_tensorrt(graph_path, staging / "llm", config,
                                               rtx=config.backend == "tensorrt-rtx", report=report)
            except TensorRTBuildError as error:
                raise BuildError(str(error)) from None
        else:
            engine_path = compile_cpu(graph_path)
            draft_engine = compile_cpu(draft_graph_path) if draft_graph_path is not None else None
        done(f"compiling for {config.backend}")

        step("writing manifest")
        components = {"llm": {"graph": "llm/model.onnx", "engine": f"llm/{engine_path.name}",
                              "embedding": "llm/embedding.safetensors", "config": "llm/config.json"},
                      "tokenizer": {"dir": "tokenizer"}}
        if tensorrt_version is not None:
            components["llm"]["tensorrt_version"] = tensorrt_version
        eagle = None
        if draft is not None:
            components["draft"], eagle = manifest_entries(draft, config, draft_engine.name)
        writer.write_manifest(staging, build_config=config.model_dump(), checkpoint=checkpoint,
                              dims=dims, components=components, lora_layout=lora_layout, eagle=eagle)
        done("writing manifest")
    except BaseException:
        steps.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    steps.close()
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    logging.getLogger(__name__).info("step timings (s): %s", timings)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trt-llm-build", description="Build an engine directory from a Hugging Face checkpoint.")
    parser.add_argument("config", help="build config (YAML)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from trt_llm.build.checkpoint import CheckpointError
    from trt_llm.build.eagle_build import DraftError
    from trt_llm.build.families import UnsupportedArchitecture

    try:
        config = load_build_config(args.config)
        out = build_engine(config, progress=not args.quiet)
    except (ConfigError, CheckpointError, UnsupportedArchitecture, BuildError, DraftError) as error:
        print(f"trt-llm-build: error: {error}", file=sys.stderr)
        return 2
    print(f"engine directory written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
