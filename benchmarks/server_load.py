#!/usr/bin/env python
"""trt-llm-serve under load: in-flight batching against one request at a time, on one engine.

16 clients x 8 requests of mixed lengths (chat, greedy, streamed) on loopback against SmolLM2-135M
(fp32, cpu backend). Two servers in this process share nothing but the engine directory: one decodes
up to --batch-size requests together (in-flight batching), the other one at a time (--batch-size 1:
what a server without batching gives). Rounds alternate between them (the machine is shared and
noisy: read the ratios). Reports throughput, time to first token and inter-token latency (p50 / p99,
measured by the clients from the stream), and checks that every answer equals the same request's
answer from the one-at-a-time server.

    python benchmarks/server_load.py [--clients 16] [--per-client 8] [--rounds 2] [--batch-size 8]
    python benchmarks/server_load.py --smoke     # a tiny random model, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from continuous_batching import QUESTIONS, build  # noqa: E402


def prompts(count: int) -> list[tuple[str, int]]:
    """(question, max_tokens): short, middling and long answers mixed."""
    return [(f"{QUESTIONS[i % len(QUESTIONS)]} ({i})", (16, 48, 128)[i % 3]) for i in range(count)]


class Server:
    def __init__(self, engine_dir, rows: int, threads: int, **config):
        """config: more ServerConfig fields (save_prefixes, prefill_chunk, ...)."""
        import uvicorn

        from trt_llm.runtime.requests.runner import Runner
        from trt_llm.server.app import ServerConfig, create_app

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        runner = Runner(engine_dir, threads=threads, scheduling="continuous")
        app = create_app(runner, ServerConfig(model_name="smollm2", max_rows=rows, max_waiting=1024, **config))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=60)


async def one_request(client, question: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    stamps, text = [], ""
    stream = await client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True})
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"text": text, "tokens": tokens, "ttft": stamps[0] - started if stamps else None, "gaps": gaps}


async def load(port: int, work: list[tuple[str, int]], clients: int) -> tuple[float, list[dict]]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)

    async def client_loop(mine):
        return [(i, await one_request(client, *work[i])) for i in mine]

    started = time.perf_counter()
    done = await asyncio.gather(*(client_loop(range(c, len(work), clients)) for c in range(clients)))
    seconds = time.perf_counter() - started
    await client.close()
    results = dict(item for part in done for item in part)
    return seconds, [results[i] for i in range(len(work))]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 1 round, 4 x 2 requests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.clients, args.per_client = 1, 4, 2

    from trt_llm.runtime.engine_dir import EngineDir

    engine_dir = EngineDir.open(build(args.work_dir, args.smoke, args.batch_size))
    work = prompts(args.clients * args.per_client)
    servers = {"in-flight": Server(engine_dir, args.batch_size, args.threads),
               "one at a time": Server(engine_dir, 1, args.threads)}
    rows, answers = [], {}
    try:
        for server in servers.values():  # warm-up, untimed
            asyncio.run(load(server.port, work[: args.clients], args.clients))
        for round_number in range(1, args.rounds + 1):
            for name, server in servers.items():
                seconds, results = asyncio.run(load(server.port, work, args.clients))
                tokens = sum(r["tokens"] for r in results)
                ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
                gaps = [g for r in results for g in r["gaps"]]
                rows.append({"round": round_number, "server": name, "seconds": round(seconds, 2), "tokens": tokens,
                             "tokens_per_s": round(tokens / seconds, 1),
                             "ttft_ms": {"p50": round(1000 * percentile(ttfts, 50), 1),
                                         "p99": round(1000 * percentile(ttfts, 99), 1)},
                             "inter_token_ms": {"p50": round(1000 * percentile(gaps, 50), 1),
                                                "p99": round(1000 * percentile(gaps, 99), 1)}})
                answers[name] = [r["text"] for r in results]
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for server in servers.values():
            server.close()
    speed = {name: [r["tokens_per_s"] for r in rows if r["server"] == name] for name in servers}
    ratios = [a / b for a, b in zip(speed["in-flight"], speed["one at a time"])]
    report = {"requests": len(work), "clients": args.clients, "batch_size": args.batch_size, "threads": args.threads,
              "rounds": rows, "in_flight_over_one_at_a_time": {"per_round": [round(r, 2) for r in ratios],
                                                               "median": round(statistics.median(ratios), 2)},
              "identical_answers": answers["in-flight"] == answers["one at a time"]}
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["identical_answers"] else 1


if __name__ == "__main__":
    sys.exit(main())
