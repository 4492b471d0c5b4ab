"""What the one-op benchmarks (attention_op.py, matmul_op.py) share: timing a call, and a row's columns for
our op against the stock op it stands in for and, with --baseline, against another build of our library."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time


def library_file(text: str):
    """--baseline's value: an existing file (argparse says so in one line where it is not)."""
    from pathlib import Path

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such library file: {text}")
    return path


def quiet_options(threads: int):
    """Session options for an op timed beside others: `threads` intra-op threads that stop spinning at the end
    of each run. (Spinning on, a session's idle workers held the cores for milliseconds into the next op's
    timing: measured, the same library timed 1.1-1.3x slower after another session's runs than after its own.)"""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def timed(call, seconds: float) -> float:
    """The mean seconds of `call`, repeated for about `seconds` after one untimed call."""
    call()
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        call()
        n += 1
    return (time.perf_counter() - started) / n


def rounds(calls: dict[str, dict[str, object]], count: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """{setting: {op: one mean a round}}: every setting's ops timed in turn, round after round (the machine's
    load moves them alike)."""
    times = {setting: {op: [] for op in ops} for setting, ops in calls.items()}
    for r in range(count):
        for setting, ops in calls.items():
            for op, call in ops.items():
                times[setting][op].append(timed(call, seconds))
        print(f"round {r + 1}/{count} done", file=sys.stderr)
    return times


def run_record(args, kernels: str, onnxruntime_version: str) -> dict:
    """What a results file records of the run: its command, commit, machine, settings and kernels."""
    from sidebyside.measure import cpu_name, git_head

    return {"command": " ".join(sys.argv), "git_head": git_head(), "cpu": cpu_name(), "machine": platform.machine(),
            "cores": os.cpu_count(), "threads": args.threads, "rounds": args.rounds, "onnxruntime": onnxruntime_version,
            "kernels": kernels, "baseline": str(args.baseline) if args.baseline else None}


def comparison(name: str, theirs: list[float], ours: list[float]) -> dict:
    """`name`_us and ours_us (medians, us), the per-round speed-up's median and spread, every round's time."""
    ratios = [t / o for t, o in zip(theirs, ours)]
    return {f"{name}_us": statistics.median(theirs) * 1e6, "ours_us": statistics.median(ours) * 1e6,
            "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            f"{name}_us_all": [t * 1e6 for t in theirs], "ours_us_all": [t * 1e6 for t in ours]}


def over_baseline(base: list[float], ours: list[float]) -> dict:
    """The baseline library's median (us) and ours' per-round speed-up over it."""
    over = [b / o for b, o in zip(base, ours)]
    return {"baseline_us": statistics.median(base) * 1e6, "over_baseline_median": statistics.median(over),
            "over_baseline_min": min(over), "over_baseline_max": max(over), "baseline_us_all": [t * 1e6 for t in base]}


def baseline_header(baseline) -> tuple[str, str]:
    """The table's extra header and rule cells where a baseline ran."""
    return (" baseline us | ours over it |", "---:|---:|") if baseline else ("", "")


def baseline_cells(row: dict) -> str:
    """A row's extra cells where a baseline ran, else nothing."""
    if "baseline_us" not in row:
        return ""
    return (f" {row['baseline_us']:.0f} | {row['over_baseline_median']:.2f}x "
            f"({row['over_baseline_min']:.2f}-{row['over_baseline_max']:.2f}) |")
