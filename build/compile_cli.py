"""`trt-llm-compile BUNDLE_DIR --backend BACKEND -o ENGINE_DIR`: a portable bundle -> engine directory.

The second half of a two-stage deployment: `trt-llm-build CONFIG --export-only` writes the bundle
where the training stack lives, this compiles it on the device, without transformers or the
checkpoint loaders. Exit status: 0 written, 2 nothing written (the message says why, in one line).
"""

from __future__ import annotations

import logging
import sys

from trt_llm.build.compile import SUPPORTED_DTYPES, BuildError, CompileOptions, compile_bundle
from trt_llm.build.engine_dir import BundleError
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
            out = compile_bundle(args.bundle, args.output, options, progress=not args.quiet)
        except (BundleError, BuildError, OutputDirError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        except Interrupted as interrupt:
            print(f"{PROG}: interrupted ({interrupt.name}); nothing was written", file=sys.stderr)
            return interrupt.exit_status
    print(f"engine directory written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
