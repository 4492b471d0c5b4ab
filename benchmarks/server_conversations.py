#!/usr/bin/env python
"""trt-llm-serve with 16 clients each holding a multi-turn conversation: context reuse against none.

Each client sends its conversation turn after turn (a shared ~400-token system prompt, its own
questions, the model's streamed answers appended), as chat clients do: the whole conversation every
turn. One server restores each conversation's earlier turns (the default), the other computes every
prompt whole (--no-prefix-cache); both do in-flight batching with chunked prefill. Rounds alternate
between them in one process (the machine is shared and noisy: read the ratios). Reports throughput,
time to first token (p50 / p99, measured by the clients), the tokens the server restored, and checks
that both servers give every turn the same answer.

    python benchmarks/server_conversations.py [--clients 16] [--turns 4] [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chunked_prefill import build  # noqa: E402
from prompt_cache_ttft import system_prompt  # noqa: E402
from server_load import Server, percentile  # noqa: E402

TOPICS = ["glazes", "shipping", "returns", "gift cards", "linen", "glassware", "workshops", "colours"]


async def conversation(client, system: str, client_index: int, turns: int, answer_tokens: int) -> list[dict]:
    messages, out = [{"role": "system", "content": system}], []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Client {client_index}, question {turn + 1}: tell me about "
                                                    f"{TOPICS[(client_index + turn) % len(TOPICS)]}."})
        started, stamps, text, usage = time.perf_counter(), [], "", None
        stream = await client.chat.completions.create(model="smollm2", messages=list(messages), temperature=0,
                                                      max_tokens=answer_tokens, stream=True,
                                                      stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        messages.append({"role": "assistant", "content": text})
        details = getattr(usage, "prompt_tokens_details", None)
        out.append({"text": text, "tokens": usage.completion_tokens, "ttft": stamps[0] - started if stamps else None,
                    "cached": getattr(details, "cached_tokens", 0) or 0, "prompt": usage.prompt_tokens})
    return out


async def load(port: int, system: str, clients: int, turns: int, answer_tokens: int):
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    started = time.perf_counter()
    done = await asyncio.gather(*(conversation(client, system, c, turns, answer_tokens) for c in range(clients)))
    seconds = time.perf_counter() - started
    await client.close()
    return seconds, [turn for part in done for turn in part]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.text.tokenizer import Tokenizer

    engine_dir = EngineDir.open(build(args.work_dir))
    system = system_prompt(Tokenizer.from_dir(engine_dir.tokenizer_dir), 400)
    servers = {"reuse": Server(engine_dir, args.batch_size, args.threads),
               "no reuse": Server(engine_dir, args.batch_size, args.threads, save_prefixes=False)}
    rows, answers = [], {}
    try:
        for server in servers.values():  # warm-up, untimed
            asyncio.run(load(server.port, system, 2, 1, 4))
        for round_number in range(1, args.rounds + 1):
            order = list(servers) if round_number % 2 else list(servers)[::-1]
            for name in order:
                seconds, turns = asyncio.run(load(servers[name].port, system, args.clients, args.turns,
                                                  args.answer_tokens))
                tokens = sum(t["tokens"] for t in turns)
                ttfts = [t["ttft"] for t in turns if t["ttft"] is not None]
                rows.append({"round": round_number, "server": name, "seconds": round(seconds, 2),
                             "tokens_per_s": round(tokens / seconds, 1),
                             "ttft_ms": {"p50": round(1000 * percentile(ttfts, 50), 1),
                                         "p99": round(1000 * percentile(ttfts, 99), 1)},
                             "cached_tokens": sum(t["cached"] for t in turns),
                             "prompt_tokens": sum(t["prompt"] for t in turns)})
                answers[name] = [t["text"] for t in turns]
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for server in servers.values():
            server.close()
    by = {name: [r for r in rows if r["server"] == name] for name in servers}
    report = {"clients": args.clients, "turns": args.turns, "answer_tokens": args.answer_tokens,
              "batch_size": args.batch_size, "threads": args.threads, "rounds": rows,
              "throughput_reuse_over_none": [round(a["tokens_per_s"] / b["tokens_per_s"], 2)
                                             for a, b in zip(by["reuse"], by["no reuse"])],
              "ttft_p50_reuse_over_none": [round(a["ttft_ms"]["p50"] / b["ttft_ms"]["p50"], 2)
                                           for a, b in zip(by["reuse"], by["no reuse"])],
              "ttft_p99_reuse_over_none": [round(a["ttft_ms"]["p99"] / b["ttft_ms"]["p99"], 2)
                                           for a, b in zip(by["reuse"], by["no reuse"])],
              "identical_answers": answers["reuse"] == answers["no reuse"]}
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["identical_answers"] else 1


if __name__ == "__main__":
    sys.exit(main())
