"""`trt-llm-compile BUNDLE_DIR --backend BACKEND -o ENGINE_DIR`: a portable bundle -> engine directory.

The second half of a two-stage deployment: `trt-llm-build CONFIG --export-only` writes the bundle
where the training stack lives, this compiles it on the device, without transformers or the
checkpoint loaders. Exit status: 0 written, 2 nothing written (the message says why, in one line).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from trt_llm.build.compile import SUPPORTED_DTYPES, BuildError, CompileOptions, compile_bundle
from trt_llm.build.engine_dir import BundleError, read_bundle
from trt_llm.build.staging import OutputDirError
from trt_llm.common.cli_args import Interrupted, OneLineParser, signals_interrupt

PROG = "trt-llm-compile"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description="Compile a bundle from trt-llm-build --export-only into an engine "
                     "directory for one backend.")
    parser.add_argument("bundle", help="bundle directory (trt-llm-build CONFIG --export-only)")
    parser.add_argument("--backend", default="cpu", help=f"{', '.join(SUPPORTED_DTYPES)} (default: cpu)")
    parser.add_argument("-o", "--output", required=True, help="the engine directory to write")
    parser.add_argument("--max-batch-size", type=int, help="largest batch a run may use (default: the bundle's)")
    parser.add_argument("--max-input-len", type=int,
                        help="longest prompt in tokens, at most the bundle's max_kv_cache_capacity "
                             "(default: the bundle's)")
    parser.add_argument("--rtx-compute-capability",
                        help="tensorrt-rtx: the GPU architecture to build for (SM75 ... SM121, or auto)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    options = CompileOptions(args.backend, args.max_batch_size, args.max_input_len, args.rtx_compute_capability)
    with signals_interrupt():
        try:
            if args.backend not in SUPPORTED_DTYPES:
                raise BuildError(f"backend: {args.backend!r} is not a backend; choose one of "
                                 f"{', '.join(SUPPORTED_DTYPES)}")
            check_graphs(args.bundle, read_bundle(args.bundle))
            out = compile_bundle(args.bundle, args.output, options, progress=not args.quiet)
        except (BundleError, BuildError, OutputDirError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        except Interrupted as interrupt:
            print(f"{PROG}: interrupted ({interrupt.name}); nothing was written", file=sys.stderr)
            return interrupt.exit_status
    print(f"engine directory written: {out}", file=sys.stderr)
    return 0


def check_graphs(bundle: str | Path, manifest: dict) -> None:
    """Every graph of the bundle whole before anything is compiled: a graph file that does not parse,
    or a weights file shorter than its tensors need (a copy cut short), is a BundleError naming the
    file, not an ONNX or protobuf traceback from deep inside the compile."""
    import onnx

    bundle = Path(bundle)
    for name, entry in manifest["components"].items():
        relative = entry.get("graph") if isinstance(entry, dict) else None
        if relative is None:
            continue
        damaged = f"{bundle}: {relative} ({name} graph) is damaged"
        try:
            model = onnx.load(str(bundle / relative), load_external_data=False)
        except Exception as error:  # protobuf's DecodeError and the like: the file is cut short or corrupt
            reason = " ".join(str(error).split()) or type(error).__name__
            raise BundleError(f"{damaged}: {reason}; export the bundle again") from None
        sizes: dict[str, int] = {}
        for tensor in model.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            location = (bundle / relative).parent / info.get("location", "")
            if location not in sizes:
                sizes[location] = os.path.getsize(location) if location.is_file() else -1
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            if end > sizes[location]:
                where = os.path.relpath(location, bundle)
                raise BundleError(f"{bundle}: {where} ({name} weights) is damaged: tensor {tensor.name!r} ends at "
                                  f"byte {end:,}, the file has {max(sizes[location], 0):,}; export the bundle again")


if __name__ == "__main__":
    sys.exit(main())
