"""Command-line parsing shared by the tools: every bad flag is one line and exit status 2."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger(__name__)


class FlagError(ValueError):
    """A flag's value that the run cannot use; the message names the flag."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is `PROG: error: MESSAGE` alone, without the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _parsed(value: str, kind: type, what: str):
    """`value` as an int or a float, or the flag's one-line error."""
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None


def positive_int(value: str) -> int:
    number = _parsed(value, int, "an integer")
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return number


def non_negative_int(value: str) -> int:
    number = _parsed(value, int, "an integer")
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return number


def positive_float(value: str) -> float:
    """A finite number above 0 (seconds, say)."""
    number = _parsed(value, float, "a number")
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return number


def port_number(value: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port)."""
    number = _parsed(value, int, "an integer")
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 65535]")
    return number


def steps_above_one(value: str) -> float:
    """A latency target in decode steps: a number above 1 (a step itself takes one)."""
    number = _parsed(value, float, "a number")
    if not number > 1:
        raise argparse.ArgumentTypeError(f"{value} is not above 1 (a decode step itself takes one)")
    return number


_UNITS = {"": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # a bare number is MiB


def byte_size(value: str) -> int:
    """A size such as 512M, 2G, 1.5GB or 300 (MiB), in bytes."""
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in "KMGT" and text[-1:] else ""
    try:
        number = float(text[: len(text) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size (say 512M, 2G or a number of MiB)") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive size")
    return int(number * _UNITS[unit])


def available_cores() -> int:
    """The CPUs this process may run on (its affinity, e.g. a container's share), not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def capped_threads(requested: int | None, option: str = "--threads") -> int | None:
    """`requested` threads, capped at the cores there are: more threads than cores only take turns
    (64 threads on 2 cores decoded over 50x slower). None keeps the engine's default."""
    cores = available_cores()
    if requested is not None and requested > cores:
        log.warning("%s %d is more than the %d cores this process can use; using %d", option, requested, cores, cores)
        return cores
    return requested


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no `except
    Exception` on the way (a failing batch is caught that way) swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.name = signal.Signals(signum).name
        self.exit_status = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextmanager
def signals_interrupt() -> Iterator[Callable[[], None]]:
    """Within: SIGINT and SIGTERM raise Interrupted (SIGTERM would otherwise end the process on the
    spot, with no chance to clean up or write what is done). Yields a function that ignores both
    from then on, for the last writes; the previous handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield lambda: None
        return
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in signums}

    def ignore() -> None:
        for signum in signums:
            signal.signal(signum, signal.SIG_IGN)

    try:
        yield ignore
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
