"""`trt-llm-build CONFIG.yaml [--export-only]`: checkpoint -> ONNX -> engine directory.

The build is two stages: export (build/bundle.py: checkpoint -> portable bundle) and compile
(build/compile.py: bundle -> engine for the config's backend), run here one after the other on the
same folder. `--export-only` stops after the first and leaves the bundle in output_dir, for
`trt-llm-compile` on the device.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from trt_llm.build.compile import BuildError, CompileOptions, backend_version, check_backend, compile_in_place, engine_config
from trt_llm.build.engine_dir import ENGINE, MANIFEST
from trt_llm.build.progress import Steps
from trt_llm.build.staging import OutputDirError, staged
from trt_llm.common.cli_args import Interrupted, OneLineParser, signals_interrupt
from trt_llm.schemas.build_config import BuildConfig, ConfigError, load_build_config

log = logging.getLogger(__name__)


def refuse_engine_for_bundle(out: Path) -> None:
    """--export-only never replaces an engine directory with a bundle (a rebuilt bundle, yes)."""
    try:
        kind = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("kind")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return  # no manifest of ours: staging's own check says what it is
    if kind == ENGINE:
        raise OutputDirError(f"output_dir: {os.path.abspath(out)!r} holds an engine, which --export-only would "
                             "replace with a bundle; nothing was touched. Choose another output_dir for the bundle")


def drop_unused_sections(config: BuildConfig) -> BuildConfig:
    """`vision:` / `audio:` on a model without that encoder: one warning each, and the section set
    back to its defaults (the manifest records no limits the engine does not have). Read from the
    checkpoint's config alone, before any weights load; only when the config sets one."""
    given = [key for key in ("vision", "audio") if key in config.model_fields_set]
    if not given:
        return config
    from trt_llm.build.checkpoint import model_family

    family = model_family(config.model, config.trust_remote_code)
    has = {"vision": family.vision is not None, "audio": family.audio is not None}
    unused = [key for key in given if not has[key]]
    for key in unused:
        log.warning("%s: ignored: %s has no %s encoder", key, family.architecture, key)
    return config.model_copy(update={key: type(getattr(config, key))() for key in unused}) if unused else config


def build_engine(config: BuildConfig, progress: bool = True, export_only: bool = False) -> Path:
    """Build the engine directory described by `config` (or only its bundle); returns its path."""
    from trt_llm.build.bundle import export_bundle
    from trt_llm.build.eagle.stage import check_draft_source
    from trt_llm.build.pooling import write_pooling

    tensorrt_version = None
    if export_only:
        refuse_engine_for_bundle(Path(config.output_dir))
    else:
        # Before the minutes of loading and exporting: a backend that cannot take this config, or a
        # missing TensorRT, is a one-line error now.
        check_backend(config)
        tensorrt_version = backend_version(config)
    out = Path(config.output_dir)
    steps = Steps(3 if export_only else 4, "export" if export_only else "build", progress)
    try:
        with staged(out) as staging:
            # Before the checkpoint loads: a draft folder that is not there, sections the model has no use for.
            check_draft_source(config)
            config = drop_unused_sections(config)
            manifest = export_bundle(config, staging, steps)
            write_pooling(config.model, staging / "tokenizer")  # embeddings' default (build/pooling.py)
            if not export_only:
                # the export's max_input_len: an encoder-decoder's is cut to its decoder positions
                options = CompileOptions(config.backend, config.max_batch_size, manifest["limits"]["max_input_len"],
                                         config.rtx_compute_capability if config.backend == "tensorrt-rtx" else None)
                compile_in_place(staging, manifest, engine_config(manifest, options, out), steps, tensorrt_version)
    finally:
        steps.close()
    return out


def quiet_transformers() -> None:
    """--quiet: no progress bars from transformers or the hub while a checkpoint loads."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # A GGUF's conversion bar is tqdm's own, past disable_progress_bar: transformers' wrapper, which
    # honours it, takes its place.
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_loading
    except ImportError:  # a transformers without it has no such bar either
        return
    gguf_loading.tqdm = hf_logging.tqdm


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="trt-llm-build", description="Build an engine directory from a Hugging Face checkpoint.")
    parser.add_argument("config", help="build config (YAML)")
    parser.add_argument("--export-only", action="store_true",
                        help="stop after the export: write a portable bundle (no engine) to output_dir, "
                             "for trt-llm-compile; the config's backend is not used")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    from trt_llm.build.checkpoint import CheckpointError
    from trt_llm.build.eagle.stage import DraftError
    from trt_llm.families.registry import UnsupportedArchitecture

    if args.quiet:
        quiet_transformers()
    with signals_interrupt():
        try:
            config = load_build_config(args.config)
            out = build_engine(config, progress=not args.quiet, export_only=args.export_only)
        except (ConfigError, CheckpointError, UnsupportedArchitecture, BuildError, DraftError,
                OutputDirError) as error:
            print(f"trt-llm-build: error: {error}", file=sys.stderr)
            return 2
        except Interrupted as interrupt:  # the staging folder is gone, the old engine untouched
            print(f"trt-llm-build: interrupted ({interrupt.name}); nothing was written", file=sys.stderr)
            return interrupt.exit_status
    if args.export_only:
        print(f"bundle written: {out} (compile it with: trt-llm-compile {out} --backend BACKEND -o ENGINE_DIR)",
              file=sys.stderr)
    else:
        print(f"engine directory written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
