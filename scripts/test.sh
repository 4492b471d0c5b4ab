#!/usr/bin/env bash
# Installs everything and fetches the tests' assets (scripts/setup.sh --test), then runs the whole test
# suite (tiny models + the real SmolLM2-135M). Every skip is listed with its reason at the end; with CI
# set (.ci/run sets it) one outside tests/skip_allowlist.txt fails the run (tests/skip_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# Two pytest-xdist workers (the CI machine has 2 cores; most tests run one thread). --dist loadfile: a
# file's tests stay on one worker, so its module-scoped engines are built once; the session fixtures'
# models and engines are shared by the workers (tests/conftest.py, shared_build). Serial: pass -n 0.
# --durations: the slowest tests, to keep the suite within its budget.
python3 -m pytest -q -rs --durations=15 -n 2 --dist loadfile "$@"
