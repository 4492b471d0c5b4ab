#!/usr/bin/env bash
# Installs everything and fetches the tests' assets (scripts/setup.sh --test), then runs the whole test
# suite (tiny models + the real SmolLM2-135M). Every skip is listed with its reason at the end; with CI
# set (.ci/run sets it) one outside tests/skip_allowlist.txt fails the run (tests/skip_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
python3 -m pytest -q -rs --durations=15 "$@"  # the slowest tests, to keep the suite within its budget
