"""What the suite skipped, and why, in its summary; under CI (the CI environment variable set, as
`.ci/run` and CI services do) a skip that tests/skip_allowlist.txt does not name fails the run.

A skip that nobody reads hides a check that never runs: a missing package or asset is a failure of
the set-up (`bash scripts/setup.sh --test`), not a reason to pass. tests/conftest.py loads these hooks;
`-p skip_report` loads them into any pytest run (tests/test_ci_contract.py). TRT_LLM_SKIP_ALLOWLIST
names another allow-list file. Under pytest-xdist they run in the controller, which gets the workers' reports.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import NamedTuple

import pytest

ALLOWLIST = Path(__file__).with_name("skip_allowlist.txt")


class Allowed(NamedTuple):
    pattern: str  # a test id, fnmatch-style
    reason: str  # text the skip's own reason must contain
    why: str  # why it cannot run on the CI machine


def load_allowlist(path: Path) -> list[Allowed]:
    """The entries of an allow-list file (`test id | reason contains | why`; # comments)."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split("|")]
        if len(fields) != 3 or not all(fields):
            raise pytest.UsageError(f"{path}:{number}: expected 'test id | reason contains | why', got {line!r}")
        entries.append(Allowed(*fields))
    return entries


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _allowed_by(nodeid: str, reason: str, allowlist: list[Allowed]) -> Allowed | None:
    return next((entry for entry in allowlist
                 if fnmatch.fnmatchcase(nodeid, entry.pattern) and entry.reason in reason), None)


class SkipReport:
    """The plugin: collects each skip with its reason, prints them, and under CI fails the run on one
    outside the allow-list."""

    def __init__(self):
        self.allowlist = load_allowlist(Path(os.environ.get("TRT_LLM_SKIP_ALLOWLIST", ALLOWLIST)))
        self.enforce = under_ci()
        self.seen: list[tuple[str, str, Allowed | None]] = []  # (test id, reason, its allow-list entry)

    @property
    def outside(self) -> list[tuple[str, str, Allowed | None]]:
        return [skip for skip in self.seen if skip[2] is None]

    def _add(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = _reason(report)
            self.seen.append((report.nodeid, reason, _allowed_by(report.nodeid, reason, self.allowlist)))

    def pytest_runtest_logreport(self, report):
        self._add(report)

    def pytest_collectreport(self, report):
        self._add(report)  # a module that skipped whole (pytest.importorskip at its top)

    def pytest_sessionfinish(self, session, exitstatus):
        # before the exit status is returned: pytest exits with session.exitstatus as set here
        if self.enforce and self.outside and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        # always, "skipped: 0" included: a CI log shows the count either way
        write = terminalreporter.write_line
        terminalreporter.section(f"skipped: {len(self.seen)}, {len(self.outside)} outside tests/skip_allowlist.txt")
        for nodeid, reason, allowed in self.seen:
            if allowed is not None:
                write(f"allowed  {nodeid}: {reason} ({allowed.why})")
        for nodeid, reason, _ in self.outside:
            write(f"NOT ALLOWED  {nodeid}: {reason}")
        if self.outside:
            verdict = "fail this run (CI is set)" if self.enforce else "would fail it under CI (CI=true)"
            write(f"{len(self.outside)} skip(s) outside the allow-list {verdict}: install what they need "
                  f"(bash scripts/setup.sh --test) or allow-list them with the reason", red=True)


NAME = "trt-llm-skip-report"


def register(config) -> None:
    # Under pytest-xdist the controller sees every worker's test and collection reports (the hooks above
    # run there), and it alone prints the summary and sets the run's exit status: not on the workers.
    if hasattr(config, "workerinput"):
        return
    if not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.register(SkipReport(), NAME)


def pytest_configure(config):  # as `-p skip_report`
    register(config)
