#!/usr/bin/env python
"""trt-llm-serve soaked on loopback: resident memory flat, no lost or wrong answer, no traceback (issue 46).

`trt-llm-serve --port 0` runs as a process of its own (its log captured to a file) on SmolLM2-135M-Instruct
(cpu backend, fp32 or --int4; built once, cached) or on --engine-dir. A quiet pass sends each of a fixed set
of 17 prompts alone, greedy with a fixed max_tokens, through the chat route and through Anthropic's
/v1/messages, and keeps each answer as the right one. Then --clients (8) clients loop over the prompts for
--minutes (20), each request in one of five modes in turn: a chat completion, a streamed one read to its
end, a streamed one the client leaves after 1 to 4 chunks, /v1/messages, and /v1/messages streamed. Nine
of the prompts are three conversations' turns under long system prompts, and the context cache's budget
(--kv-cache-budget) is below what they hold, so it fills, restores and evicts all along.

Counted: wrong (an answer, or a left stream's text so far, that is not the quiet pass's), lost (anything
but 200 with a whole answer or stream, 429 aside: a 429 is counted on its own and expected only with a
small --max-queue). The server's VmRSS is read every --sample-s seconds: after the warm-up (the first 10%
of the run, at least a minute; --smoke's first half) and at the end (each the median over a window of 5% of the
run, at least 3 samples), the maximum, growth % = (end - after warm-up) / after warm-up, and the
least-squares slope in MB per minute over the samples after the warm-up. The log's lines with
"Traceback" and 5xx responses are counted. Passes (exit status 0) when growth < 5%, lost == 0,
wrong == 0, tracebacks == 0 and the server holds no request once the clients are done.

    python benchmarks/server_soak.py [--minutes 20] [--clients 8] [--int4] [--engine-dir DIR]
    python benchmarks/server_soak.py --smoke     # a tiny random model, about 30 s of load

Writes server_soak.json, server_soak.md and server.log into --out-dir (default out/bench/server_soak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.measure import cpu_name, git_head, log, smoke_defaults  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL = "soak"
MODES = ("chat", "stream", "cancel", "messages", "messages-stream")
MB = 1 << 20
QUESTIONS = [
    ("What is the capital of France?", 16), ("Explain how a rainbow forms.", 48),
    ("Write a short poem about the sea.", 64), ("List three uses of copper.", 32),
    ("Why is the sky blue?", 48), ("Describe a good breakfast.", 24),
    ("How do bees make honey?", 64), ("Tell me a story about a lighthouse keeper.", 40),
]
SYSTEMS = [
    "You are the help desk of the Valmont orchard cooperative. The cooperative was founded in 1951 by nineteen "
    "families who grew apples and pears above the river; today it has forty-one members farming about 280 "
    "hectares. It sells juice, cider and dried apple rings in a shop beside the press, open every day from 9 to "
    "18 except Mondays. The blossom festival is in April and the harvest market in October. Answer briefly and "
    "only from these facts; say so when you do not know.",
    "You are a careful Python reviewer. The team writes small functions with type hints, docstrings that say "
    "why rather than what, and tests beside each module. They avoid global state, mutable default arguments, "
    "bare except clauses and print statements in library code; logging goes through the logging module. "
    "Point out one problem at a time, quote the line, and suggest the smallest fix.",
    "You are a travel assistant for the island of Pointe Noire. Ferries leave the mainland port at 8, 12 and "
    "17 and take fifty minutes; bicycles ride free. The lighthouse museum on the western headland is open "
    "from May to September. There are two hotels, the Phare and the Granite, and a campsite by the north "
    "beach. Keep answers to two or three sentences.",
]
TURNS = [  # (user, the assistant's earlier answer as the client sends it back)
    [("When was the cooperative founded?", "It was founded in 1951 by nineteen families."),
     ("Is the shop open on Mondays?", "No, the shop is closed on Mondays."),
     ("What can I buy there?", None)],
    [("def add(items=[]): items.append(1); return items", "The default list is shared between calls."),
     ("How should I fix it?", "Use None as the default and create the list inside the function."),
     ("Anything else in that line?", None)],
    [("How do I get to the island?", "Take a ferry from the mainland port at 8, 12 or 17."),
     ("Can I bring my bicycle?", "Yes, bicycles ride free on the ferry."),
     ("Where can I stay?", None)],
]


def prompts() -> list[dict]:
    """17 prompts (coprime with the 5 modes: every prompt meets every mode): 8 questions and 3 conversations
    of 3 turns, each turn the conversation so far (a prefix of the next turn's prompt: the context cache
    restores it)."""
    out = [{"name": f"q{i}", "messages": [{"role": "user", "content": q}], "max_tokens": n}
           for i, (q, n) in enumerate(QUESTIONS)]
    for c, (system, turns) in enumerate(zip(SYSTEMS, TURNS)):
        messages = [{"role": "system", "content": system}]
        for t, (user, answer) in enumerate(turns):
            messages = [*messages, {"role": "user", "content": user}]
            out.append({"name": f"c{c}t{t}", "messages": messages, "max_tokens": (32, 48, 40)[t]})
            if answer is not None:
                messages = [*messages, {"role": "assistant", "content": answer}]
    return out


# --- the engine and the server -------------------------------------------------------------------

def engine_dir(args, scratch: Path) -> tuple[Path, str]:
    """The engine to serve and how it came to be."""
    if args.engine_dir:
        return args.engine_dir, "given (--engine-dir)"
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    if args.smoke:  # as the other benchmarks' --smoke: tests/assets.py's tiny random Llama
        sys.path.insert(0, str(REPO / "tests"))
        import assets

        out = scratch / "engine"
        build_engine(BuildConfig(model=str(assets.make_tiny_model("llama", scratch / "tiny")), output_dir=str(out),
                                 max_batch_size=args.batch_size, max_input_len=1536, max_kv_cache_capacity=2048),
                     progress=False)
        return out, "tiny random Llama (tests/assets.py), cpu backend, fp32"
    from sidebyside.artifacts import Context
    from sidebyside.measure import lock_work_dir
    from sidebyside.peers import ours

    if not (args.hf_dir / "config.json").is_file():
        raise SystemExit(f"--hf-dir {args.hf_dir}: no config.json (the tests' SmolLM2 checkpoint, tests/assets.py)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    lock_work_dir(args.work_dir)  # held until exit: another soak would rebuild what this one serves
    ctx = Context(hf_dir=args.hf_dir, work_dir=args.work_dir, threads=args.threads, max_batch=args.batch_size,
                  max_input=1024, capacity=2048)
    precision = "int4" if args.int4 else "fp32"
    artifact = ours.prepare(ctx, {"weights": "int4"} if args.int4 else None, name=f"soak-{precision}-b{args.batch_size}",
                            precision=precision)
    built = "cached" if artifact.build.get("cached") else f"built in {artifact.build['seconds']:.0f} s"
    return artifact.path, f"SmolLM2-135M-Instruct ({args.hf_dir}), cpu backend, {precision}, {built}"


def serve_command(engine: Path, args) -> list[str]:
    script = Path(sys.executable).with_name("trt-llm-serve")
    found = str(script) if script.is_file() else shutil.which("trt-llm-serve")
    command = [found] if found else [sys.executable, "-m", "trt_llm.server.cli"]
    # --verbose: uvicorn's access log, one line a request with its status (the 5xx count reads it)
    return command + ["--engine-dir", str(engine), "--port", "0", "--model-name", MODEL, "--threads",
                      str(args.threads), "--max-queue", str(args.max_queue), "--kv-cache-budget",
                      args.kv_cache_budget, "--verbose"]


def start_server(command: list[str], log_path: Path, timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """The server and its address, read from the line it prints once bound (server/cli.py)."""
    with open(log_path, "w") as server_log:
        process = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"trt-llm-serve: listening on (http://\S+)", log_path.read_text(errors="replace"))
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}):\n{log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server did not listen within {timeout:.0f} s")


def stop_server(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGINT)  # uvicorn's graceful stop
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Sampler(threading.Thread):
    """(seconds since start, VmRSS bytes) of `pid` every `interval` seconds until stop()."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval, self.samples = pid, interval, []
        self.start_time = time.monotonic()
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            try:
                self.samples.append((time.monotonic() - self.start_time, vm_rss(self.pid)))
            except (OSError, RuntimeError):  # the server is gone: the clients will say how
                return
            self._done.wait(self.interval)

    def stop(self) -> list[tuple[float, int]]:
        self._done.set()
        self.join()
        return self.samples


def scrape(url: str) -> dict:
    """The /metrics samples this report reads, summed over labels (requests by status kept apart)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "trt_llm_aborted_requests_total",
              "trt_llm_context_cache_hits_total", "trt_llm_context_cache_misses_total",
              "trt_llm_context_cache_evictions_total", "trt_llm_context_cache_bytes",
              "trt_llm_request_rejections_total", "process_resident_memory_bytes")
    got, statuses = {}, {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for s in family.samples:
            if s.name in wanted:
                got[s.name] = got.get(s.name, 0) + s.value
            elif s.name == "trt_llm_requests_total":
                code = s.labels.get("status", s.labels.get("code", "?"))
                statuses[code] = statuses.get(code, 0) + int(s.value)
    return {**got, "requests_by_status": statuses}


def idle_metrics(url: str, wait: float = 30) -> dict:
    """/metrics once nothing runs or waits (a left stream's row is freed at the next step), or after `wait`."""
    deadline = time.monotonic() + wait
    while True:
        got = scrape(url)
        busy = got.get("vllm:num_requests_running", 0) + got.get("vllm:num_requests_waiting", 0)
        if busy == 0 or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


# --- the clients ---------------------------------------------------------------------------------

def chat_body(prompt: dict, stream: bool) -> dict:
    return {"model": MODEL, "messages": prompt["messages"], "temperature": 0, "max_tokens": prompt["max_tokens"],
            "stream": stream}


def messages_body(prompt: dict, stream: bool) -> dict:
    messages = prompt["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    body = {"model": MODEL, "messages": [m for m in messages if m["role"] != "system"], "temperature": 0,
            "max_tokens": prompt["max_tokens"], "stream": stream}
    return {**body, "system": system} if system else body


ANTHROPIC_STOP = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"}


class Outcome(Exception):
    """A request that gave no whole answer: `kind` is lost or rejected."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


async def send(client, prompt: dict, mode: str, leave_after: int = 0) -> tuple[str, str | None]:
    """(text, finish reason as the chat route names it) of one request; for mode "cancel", the text of the
    first `leave_after` content chunks, then the client closes the connection (finish None)."""
    import httpx

    anthropic = mode.startswith("messages")
    path = "/v1/messages" if anthropic else "/v1/chat/completions"
    stream = mode in ("stream", "cancel", "messages-stream")
    body = (messages_body if anthropic else chat_body)(prompt, stream)
    try:
        if not stream:
            response = await client.post(path, json=body)
            check_status(response.status_code, response.text)
            answer = response.json()
            if anthropic:
                text = "".join(block.get("text", "") for block in answer["content"] if block["type"] == "text")
                return text, ANTHROPIC_STOP.get(answer["stop_reason"], answer["stop_reason"])
            return answer["choices"][0]["message"]["content"] or "", answer["choices"][0]["finish_reason"]
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                check_status(response.status_code, (await response.aread()).decode(errors="replace"))
            return await (read_events(response) if anthropic else read_chunks(response, leave_after))
    except httpx.HTTPError as error:
        raise Outcome("lost", f"{type(error).__name__}: {error}") from None


def check_status(status: int, text: str) -> None:
    if status == 429:
        raise Outcome("rejected", "429")
    if status != 200:
        raise Outcome("lost", f"HTTP {status}: {text[:200]}")


async def read_chunks(response, leave_after: int) -> tuple[str, str | None]:
    text, finish, chunks = "", None, 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            if finish is None:
                raise Outcome("lost", "[DONE] without a finish_reason")
            return text, finish
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise Outcome("lost", f"error in the stream: {chunk['error']}")
        for choice in chunk.get("choices", []):
            if choice["delta"].get("content"):
                text += choice["delta"]["content"]
                chunks += 1
            finish = choice.get("finish_reason") or finish
        if leave_after and chunks >= leave_after:
            return text, None  # leaving the `async with` closes the connection mid-stream
    raise Outcome("lost", f"the stream ended before [DONE] after {chunks} chunks")


async def read_events(response) -> tuple[str, str | None]:
    text, stop = "", None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        kind = event.get("type")
        if kind == "error":
            raise Outcome("lost", f"error event: {event.get('error')}")
        if kind == "content_block_delta" and event["delta"].get("type") == "text_delta":
            text += event["delta"]["text"]
        elif kind == "message_delta":
            stop = event["delta"].get("stop_reason")
        elif kind == "message_stop":
            if stop is None:
                raise Outcome("lost", "message_stop without a stop_reason")
            return text, ANTHROPIC_STOP.get(stop, stop)
    raise Outcome("lost", "the stream ended before message_stop")


def new_counts() -> dict:
    return {mode: {"sent": 0, "ok": 0, "wrong": 0, "lost": 0, "rejected_429": 0} for mode in MODES}


class Tally:
    """Every request's outcome by mode, with the first few wrong and lost ones in full."""

    def __init__(self):
        self.counts, self.examples, self.next = new_counts(), [], 0

    def note(self, mode: str, outcome: str, detail: dict | None = None) -> None:
        self.counts[mode]["sent"] += 1
        self.counts[mode][outcome] += 1
        if detail is not None and len(self.examples) < 10:
            self.examples.append({"mode": mode, "outcome": outcome, **detail})

    def total(self, outcome: str) -> int:
        return sum(c[outcome] for c in self.counts.values())


def judge(tally: Tally, prompt: dict, mode: str, got: tuple[str, str | None], want: tuple[str, str]) -> None:
    if mode == "cancel":
        right = want[0].startswith(got[0])
    else:
        right = got == want
    detail = None if right else {"prompt": prompt["name"], "got": list(got), "want": list(want)}
    tally.note(mode, "ok" if right else "wrong", detail)


async def quiet_pass(url: str, work: list[dict], tally: Tally) -> dict:
    """{(prompt name, api): (text, finish)}: each prompt alone, through both APIs."""
    import httpx

    answers = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for prompt in work:
            for mode, api in (("chat", "openai"), ("messages", "anthropic")):
                try:
                    answers[prompt["name"], api] = await send(client, prompt, mode)
                except Outcome as failed:
                    tally.note(mode, "lost" if failed.kind == "lost" else "rejected_429",
                               {"prompt": prompt["name"], "error": failed.detail, "pass": "quiet"})
    return answers


async def soak(url: str, work: list[dict], answers: dict, clients: int, seconds: float, tally: Tally) -> float:
    """Clients loop until `seconds` have passed (a request under way is finished); the seconds it took."""
    import httpx

    work = [p for p in work if (p["name"], "openai") in answers and (p["name"], "anthropic") in answers]
    started = time.monotonic()

    async def client_loop(client):
        while time.monotonic() - started < seconds:
            j = tally.next  # one event loop: no two clients read the same j
            tally.next += 1
            prompt, mode = work[j % len(work)], MODES[j % len(MODES)]
            want = answers[prompt["name"], "anthropic" if mode.startswith("messages") else "openai"]
            try:
                got = await send(client, prompt, mode, leave_after=1 + (j // len(MODES)) % 4 if mode == "cancel" else 0)
            except Outcome as failed:
                tally.note(mode, "lost" if failed.kind == "lost" else "rejected_429",
                           {"prompt": prompt["name"], "error": failed.detail} if failed.kind == "lost" else None)
                if failed.kind == "rejected":
                    await asyncio.sleep(0.5)
                continue
            judge(tally, prompt, mode, got, want)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return time.monotonic() - started


# --- the report ----------------------------------------------------------------------------------

def memory(samples: list[tuple[float, int]], seconds: float, warmup: float, sample_s: float) -> dict:
    """After warm-up and end (medians over a window), max, growth and the slope after warm-up."""
    window = max(3 * sample_s, 0.05 * seconds)
    after = [rss for t, rss in samples if warmup <= t < warmup + window]
    end = [rss for t, rss in samples if seconds - window <= t <= seconds]
    post = [(t, rss) for t, rss in samples if t >= warmup]
    if not after or not end or len(post) < 2:
        return {"error": f"too few samples ({len(samples)}) for a warm-up of {warmup:.0f} s"}
    after_mb, end_mb = statistics.median(after) / MB, statistics.median(end) / MB
    mean_t = statistics.fmean(t for t, _ in post)
    mean_r = statistics.fmean(r for _, r in post)
    slope = (sum((t - mean_t) * (r - mean_r) for t, r in post)
             / sum((t - mean_t) ** 2 for t, _ in post))  # bytes per second
    return {"warmup_s": round(warmup, 1), "window_s": round(window, 1), "samples": len(samples),
            "first_mb": round(samples[0][1] / MB, 1), "after_warmup_mb": round(after_mb, 1),
            "end_mb": round(end_mb, 1), "max_mb": round(max(r for _, r in samples) / MB, 1),
            "growth_pct": round(100 * (end_mb - after_mb) / after_mb, 2),
            "slope_mb_per_min": round(slope * 60 / MB, 3)}


def log_findings(text: str) -> dict:
    lines = text.splitlines()
    tracebacks = [i for i, line in enumerate(lines) if "Traceback" in line]
    errors_5xx = [line for line in lines if re.search(r'" 5\d\d ', line)]
    errors = [line for line in lines if ": ERROR: " in line]  # the server's own (its traceback follows at INFO)
    return {"lines": len(lines), "tracebacks": len(tracebacks), "responses_5xx": len(errors_5xx),
            "error_lines": len(errors), "first_error": errors[0] if errors else None,
            "first_traceback": "\n".join(lines[tracebacks[0]: tracebacks[0] + 30]) if tracebacks else None,
            "first_5xx": errors_5xx[0] if errors_5xx else None}


def versions() -> dict:
    out = {"trt-llm (git)": git_head(), "python": sys.version.split()[0]}
    for package in ("onnxruntime", "uvicorn", "fastapi", "httpx"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def markdown(r: dict) -> str:
    m, lg, v = r["memory"], r["log"], r["verdicts"]
    lines = [f"# trt-llm-serve soak: {'PASS' if r['passed'] else 'FAIL'}", "",
             f"`{r['command']}`", "",
             f"- engine: {r['engine']}",
             f"- machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, load average "
             f"{r['machine']['loadavg_start']} at the start, {r['machine']['loadavg_end']} at the end",
             "- versions: " + ", ".join(f"{k} {val}" for k, val in r["versions"].items()),
             f"- {r['clients']} clients for {r['seconds'] / 60:.1f} minutes, {len(r['prompts'])} prompts x "
             f"{len(MODES)} modes ({r['requests_per_min']} requests a minute), server threads {r['threads']}, --max-queue {r['max_queue']}, "
             f"--kv-cache-budget {r['kv_cache_budget']}", "",
             "| mode | sent | ok | wrong | lost | 429 |", "|---|---|---|---|---|---|"]
    for mode, c in r["counts"].items():
        lines.append(f"| {mode} | {c['sent']} | {c['ok']} | {c['wrong']} | {c['lost']} | {c['rejected_429']} |")
    q = r["quiet"]
    lines += ["", f"Quiet pass: {q['answers']} answers; the chat route and /v1/messages agree on "
                  f"{q['apis_agree']} of {len(r['prompts'])} prompts; {q['lost']} lost.", ""]
    if "error" in m:
        lines.append(f"Memory: {m['error']}")
    else:
        lines += ["| VmRSS, MB | first sample | after warm-up | end | max | growth | slope after warm-up |",
                  "|---|---|---|---|---|---|---|",
                  f"| server | {m['first_mb']} | {m['after_warmup_mb']} | {m['end_mb']} | {m['max_mb']} | "
                  f"{m['growth_pct']:+.2f} % | {m['slope_mb_per_min']:+.3f} MB/min |", "",
                  f"Warm-up {m['warmup_s']:.0f} s; after warm-up and end are medians over {m['window_s']:.0f} s "
                  f"windows; {m['samples']} samples."]
    s = r["server_metrics"]
    lines += ["", f"Server /metrics once idle: running {s.get('vllm:num_requests_running', '?'):.0f}, waiting "
                  f"{s.get('vllm:num_requests_waiting', '?'):.0f}, aborted {s.get('trt_llm_aborted_requests_total', 0):.0f}"
                  f" (the clients left {r['counts']['cancel']['ok'] + r['counts']['cancel']['wrong']} streams), "
                  f"context cache hits {s.get('trt_llm_context_cache_hits_total', 0):.0f}, misses "
                  f"{s.get('trt_llm_context_cache_misses_total', 0):.0f}, evictions "
                  f"{s.get('trt_llm_context_cache_evictions_total', 0):.0f}, "
                  f"{s.get('trt_llm_context_cache_bytes', 0) / MB:.1f} MB held; requests by status "
                  f"{json.dumps(s.get('requests_by_status', {}))}.",
              f"Log: {lg['lines']} lines, {lg['tracebacks']} with Traceback, {lg['error_lines']} ERROR lines, "
              f"{lg['responses_5xx']} 5xx responses; "
              f"the server exited with {r['server_exit']}.", "", "| verdict | holds |", "|---|---|"]
    lines += [f"| {name} | {'yes' if held else 'NO'} |" for name, held in v.items()]
    for example in r["examples"]:
        lines.append(f"\n- {json.dumps(example, ensure_ascii=False)[:400]}")
    if lg["first_traceback"]:
        lines += ["", "First traceback:", "```", lg["first_traceback"], "```"]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="of load after the quiet pass (default 20)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--engine-dir", type=Path, help="serve this engine (default: SmolLM2-135M-Instruct, built once)")
    p.add_argument("--int4", action="store_true", help="the default engine with int4 weights (groups of 128)")
    p.add_argument("--batch-size", type=int, default=8, help="the built engine's max_batch_size")
    p.add_argument("--threads", type=int, default=2, help="the server's --threads")
    p.add_argument("--max-queue", type=int, default=256, help="the server's --max-queue (429 beyond it)")
    p.add_argument("--kv-cache-budget", default="48M",
                   help="the server's --kv-cache-budget, below what the conversations hold so that the context "
                        "cache evicts (default 48M: about 1,000 of SmolLM2's fp32 tokens)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between VmRSS samples")
    p.add_argument("--hf-dir", type=Path, default=Path.home() / ".cache/trt-llm-tests/SmolLM2-135M-Instruct")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench/server-soak")
    p.add_argument("--out-dir", type=Path, default=Path("out/bench/server_soak"))
    p.add_argument("--smoke", action="store_true", help="a tiny random model, about 30 s of load")
    args = p.parse_args(argv)
    if args.smoke:  # the tiny model's tokens: 2 layers x 2 heads x 16 x 2 x 4 bytes = 512 B each
        smoke_defaults(p, args, {"minutes": 0.5, "sample_s": 1.0, "kv_cache_budget": "160K"})
    if args.minutes <= 0 or args.clients < 1 or args.sample_s <= 0 or args.max_queue < 1 or args.batch_size < 1:
        p.error("--minutes and --sample-s must be > 0; --clients, --max-queue and --batch-size >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not Path("/proc/self/status").is_file():
        log("reads /proc/<pid>/status: Linux only")
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    work = prompts()
    with tempfile.TemporaryDirectory(prefix="server-soak-") as scratch:
        engine, engine_note = engine_dir(args, Path(scratch))
        command = serve_command(engine, args)
        log_path = args.out_dir / "server.log"
        log(f"starting: {shlex.join(command)}")
        process, url = start_server(command, log_path)
        tally, server_exit = Tally(), None
        try:
            log(f"listening on {url}; the quiet pass: {len(work)} prompts x 2 APIs, one at a time")
            answers = asyncio.run(quiet_pass(url, work, tally))
            quiet_counts, tally.counts = tally.counts, new_counts()
            seconds = 60 * args.minutes
            # --smoke's 30 s: the tiny server's RSS still climbs for ~15 s (measured), so half the run
            warmup = 0.5 * seconds if args.smoke else max(0.1 * seconds, 60.0)
            log(f"{args.clients} clients for {args.minutes:g} minutes (warm-up {warmup:.0f} s)")
            sampler = Sampler(process.pid, args.sample_s)
            sampler.start()
            took = asyncio.run(soak(url, work, answers, args.clients, seconds, tally))
            samples = sampler.stop()
            server_metrics = idle_metrics(url)
        finally:
            server_exit = stop_server(process)
    quiet_lost = sum(c["lost"] for c in quiet_counts.values())
    agree = sum(answers.get((p["name"], "openai")) == answers.get((p["name"], "anthropic")) for p in work)
    mem = memory(samples, seconds, warmup, args.sample_s)
    findings = log_findings(log_path.read_text(errors="replace"))
    lost, wrong = tally.total("lost") + quiet_lost, tally.total("wrong")
    verdicts = {"RSS growth after warm-up < 5 %": "error" not in mem and mem["growth_pct"] < 5,
                f"lost == 0 ({lost})": lost == 0, f"wrong == 0 ({wrong})": wrong == 0,
                f"tracebacks in the log == 0 ({findings['tracebacks']})": findings["tracebacks"] == 0,
                "no request held once the clients are done":
                    server_metrics.get("vllm:num_requests_running", 1) == 0
                    and server_metrics.get("vllm:num_requests_waiting", 1) == 0}
    report = {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "engine": f"{engine_note}: {engine}",
              "server_command": command, "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                                                     "loadavg_start": loadavg_start,
                                                     "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
              "versions": versions(), "clients": args.clients, "threads": args.threads, "max_queue": args.max_queue,
              "kv_cache_budget": args.kv_cache_budget, "minutes": args.minutes, "seconds": round(took, 1),
              "prompts": [p["name"] for p in work],
              "quiet": {"answers": len(answers), "lost": quiet_lost, "apis_agree": agree},
              "counts": tally.counts, "requests_per_min": round(sum(c["sent"] for c in tally.counts.values())
                                                                 / (took / 60), 1),
              "memory": mem, "rss_samples": [(round(t, 1), rss) for t, rss in samples], "log": findings,
              "server_metrics": server_metrics, "server_exit": server_exit,
              "examples": tally.examples, "verdicts": verdicts, "passed": all(verdicts.values())}
    (args.out_dir / "server_soak.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    text = markdown(report)
    (args.out_dir / "server_soak.md").write_text(text)
    print(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
