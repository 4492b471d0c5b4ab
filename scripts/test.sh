#!/usr/bin/env bash
# Installs everything, then runs the whole test suite (tiny models + the real SmolLM2-135M).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
python -m pytest -q --durations=15 "$@"  # the slowest tests, to keep the suite within its budget
