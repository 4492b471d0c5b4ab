"""Build progress: one tqdm line of named steps on stderr, and the time each step took."""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager

from tqdm import tqdm

log = logging.getLogger(__name__)


class Steps:
    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = tqdm(total=total, desc=desc, unit="step", disable=not enabled, file=sys.stderr,
                        bar_format="{desc}: {n_fmt}/{total_fmt} {postfix} [{elapsed}]")
        self.timings: dict[str, float] = {}

    @contextmanager
    def step(self, name: str):
        self.bar.set_postfix_str(name)
        started = time.perf_counter()
        yield
        self.timings[name] = round(time.perf_counter() - started, 2)
        self.bar.update(1)

    def report(self, phase: str) -> None:
        """A sub-phase of the current step (TensorRT's build phases)."""
        self.bar.set_postfix_str(phase)

    def close(self) -> None:
        self.bar.close()
        log.info("step timings (s): %s", self.timings)
