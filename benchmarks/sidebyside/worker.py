"""One engine in its own process, driven over a pipe, so that its peak RSS is its own.

    python -m sidebyside.worker ENGINE_KEY PATH --threads T --capacity C   (with benchmarks/ on PYTHONPATH)

Protocol: JSON lines. The worker first answers {"ready": true, "loaded_rss_mb": ...}; then each
{"cmd": "run", "prompts": [[ids]], "n": N} gets {"ttft_s", "decode_s", "tokens"}, and {"cmd": "exit"}
gets {"peak_rss_mb": ...} (VmHWM: the peak over the whole life of the process) before it exits. An exception
is answered with {"error": traceback}. The protocol has its own copy of stdout; fd 1 goes to stderr so
that a library printing to stdout cannot corrupt it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine")
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--capacity", type=int, required=True)
    args = parser.parse_args(argv)

    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    from .measure import peak_rss_mb, pin_threads

    pin_threads(args.threads)
    try:
        from . import peers

        engine = peers.load(args.engine)
        os.environ.update(getattr(engine, "ENV", {}))
        runner = engine.Runner(args.path, args.threads, args.capacity)
    except Exception:
        send({"error": traceback.format_exc()})
        return 1
    send({"ready": True, "loaded_rss_mb": peak_rss_mb()})
    for line in sys.stdin:
        message = json.loads(line)
        if message["cmd"] == "exit":
            send({"peak_rss_mb": peak_rss_mb()})
            return 0
        try:
            send(runner.run(message["prompts"], message["n"]))
        except Exception:
            send({"error": traceback.format_exc()})
    return 0


class WorkerError(RuntimeError):
    pass


def drop_unready(workers: dict, warnings: list, doing: str = "") -> None:
    """Wait for each worker to load; one that cannot is killed, removed from `workers` and said in
    `warnings` ("<name> could not load<doing>: <its last line>")."""
    for name in list(workers):
        try:
            workers[name].wait_ready()
        except WorkerError as error:
            warnings.append(f"{name} could not load{doing}: {str(error).splitlines()[-1]}")
            workers.pop(name).kill()


class Worker:
    """The orchestrator's handle on one engine process."""

    def __init__(self, engine: str, path: Path, threads: int, capacity: int, pythonpath: str | None = None):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(BENCHMARKS_DIR), env.get("PYTHONPATH")) if p)
        self.engine = engine
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidebyside.worker", engine, str(path), "--threads", str(threads),
             "--capacity", str(capacity)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.loaded_rss_mb = None

    def _receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            status = self.proc.wait()
            if status < 0:
                import signal

                name = signal.Signals(-status).name
                hint = (" (a native build using an instruction this machine or VM does not enable, e.g. AMX: "
                        "see benchmarks/README.md)" if name == "SIGILL" else "")
                raise WorkerError(f"{self.engine} worker was killed by {name}{hint}")
            raise WorkerError(f"{self.engine} worker exited with status {status} without answering")
        message = json.loads(line)
        if "error" in message:
            raise WorkerError(f"{self.engine} worker failed:\n{message['error']}")
        return message

    def _send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def wait_ready(self) -> None:
        self.loaded_rss_mb = self._receive()["loaded_rss_mb"]

    def run(self, prompts: list[list[int]], n: int) -> dict:
        self._send({"cmd": "run", "prompts": prompts, "n": n})
        return self._receive()

    def close(self) -> float | None:
        """Ends the process; returns its peak RSS in MB (None when it died already)."""
        try:
            self._send({"cmd": "exit"})
            peak = self._receive()["peak_rss_mb"]
        except (WorkerError, BrokenPipeError, OSError, ValueError):
            peak = None
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return peak

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
