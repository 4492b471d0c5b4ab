"""`python -m trt_llm.runtime.backends.cpu_kernels`: fetch the header and compile our kernels (what
scripts/setup.sh runs); prints the library or why there is none. Exit status 0 either way unless
--require: an engine runs on ONNX Runtime's own kernels without them."""

import sys

from trt_llm.runtime.backends import cpu_kernels
from trt_llm.runtime.backends.cpu_kernels.library import LibraryUnavailable, library


def main() -> int:
    try:
        path = library(download=True)
    except LibraryUnavailable as error:
        print(f"cpu kernels: not built ({error}); engines use ONNX Runtime's MatMulNBits", file=sys.stderr)
        return 1 if "--require" in sys.argv[1:] else 0
    used = "used" if cpu_kernels.cpu_supported() else "built, not used: this CPU has no AVX-512 VNNI"
    print(f"cpu kernels: {path} ({used})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
