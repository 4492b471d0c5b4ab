#!/usr/bin/env python
"""Issue 46's Ray Serve check at its own scale: two replicas, 8 multi-turn conversations of 6 turns, each
with its own long system prompt; routed by prefix (the default), by Ray's power of two choices alone, and
on one plain server as the reference.

A local Ray instance serves the engine with server/ray_app.py's `deployment` (2 engine replicas behind our
proxy), once with routing "prefix" and once "pow2", each on fresh replicas (empty context caches); the
reference is one server of the same app (server/cli.py's `build_app`, the same config) on a loopback port.
Each conversation is a client of its own, all 8 at once: it sends its whole conversation so far every turn
(greedy, a fixed max_tokens, its answers appended), waits a seeded think time, sends the next. Recorded per
later turn (2..6): prompt tokens, `usage.prompt_tokens_details.cached_tokens`, their fraction and the
replica that served it (`X-Replica`). The targets (exit 0 only if all hold):

  - prefix: every later turn has at least 0.8 of its prompt cached;
  - prefix's cached tokens, summed, within 10% of the one replica's;
  - every answer identical on prefix, pow2 and one replica;
  - no context-cache eviction on any server (the budget held every conversation: the figures are routing's).

Power of two choices' figures are reported beside them. By default the engine is a tiny random Qwen3
built as the tests build one (tests/assets.py, the build API), cached under --work-dir; `--engine-dir`
serves another (its limits must hold a sixth turn: prompt + --max-tokens).

    python benchmarks/ray_prefix_routing.py [--engine-dir DIR] [--conversations 8] [--turns 6]
        [--max-tokens 16] [--think-s 0.2] [--threads 1] [--out-dir out/bench/ray_prefix_routing]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shlex
import socket
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.measure import cpu_name, free_port, git_head  # noqa: E402

MODEL = "bench"  # the served model name
# The tiny engine: 8 rows (all 8 conversations decode together on one replica); a sixth turn's prompt is
# ~700 tokens of the tiny tokenizer (a ~440-token system prompt, 6 questions of ~15, 5 answers of 16,
# the template's), so 1,024 input tokens and 1,152 per row leave room for --max-tokens up to ~80.
TINY = {"max_batch_size": 8, "max_input_len": 1024, "max_kv_cache_capacity": 1152}
TARGET_SHARE, TARGET_SPREAD = 0.8, 0.1

HOUSE_STYLE = ("Answer in plain sentences without lists or headings, never more than three sentences, in the "
               "language of the question. If you are not sure, say that you are not sure and name the person or "
               "office who would know. Never invent a price, a date, a name or a reference number, and never "
               "repeat a customer's personal details back to them. Be polite but brief; do not thank the "
               "customer for their question and do not apologise more than once.")
ROLES = [
    ("the dispatcher of a regional freight railway", "Every answer names the train, its origin, its destination "
     "and its expected delay in minutes, in that order. You never guess a platform number and you never promise "
     "a connection to a passenger service."),
    ("the front desk of a mountain hotel with forty rooms", "Check-in starts at three in the afternoon and the "
     "last cable car leaves the valley at half past six. Dogs are welcome in the ground floor rooms only, and "
     "the sauna closes for cleaning every Tuesday morning."),
    ("the help line of a public library in a small town", "Members may borrow twelve items for three weeks and "
     "renew them twice unless someone has reserved them. The reading room is silent, the children's corner is "
     "not, and the scanner on the first floor is free for members."),
    ("the booking office of a sailing school on a lake", "Beginners' courses run for five mornings and need no "
     "experience, only the ability to swim fifty metres. Boats stay ashore when the wind passes five Beaufort, "
     "and life jackets are worn at all times on the water."),
    ("the service desk of a bicycle repair workshop", "A standard service takes two working days and covers "
     "brakes, gears, chain and tyre pressure. Electric bicycles need an appointment, and the workshop keeps a "
     "repaired bicycle for four weeks before it charges for storage."),
    ("the reception of a veterinary practice for small animals", "Emergencies are seen at once and everything "
     "else by appointment. Cats travel in closed baskets, dogs on a short lead, and the practice never gives a "
     "diagnosis over the phone; it books a visit instead."),
    ("the customer line of a municipal water company", "A planned interruption is announced five days ahead on "
     "the notice board of each street. Brown water after works clears within an hour of running the cold tap, "
     "and a burst pipe on the street is reported on the emergency number."),
    ("the office of a community garden with sixty plots", "Plots are let for a year from the first of March, "
     "and the waiting list is kept in the order people joined it. Hoses are shared, bonfires are forbidden and "
     "every member gives four hours a season to the common beds."),
]
QUESTIONS = [
    ["Where is the Basel freight now?", "And how late is it?", "Which crew drives it?",
     "Will it reach the yard before midnight?", "What happens to the wagons for Milan?", "Who do I call about it?"],
    ["Can I arrive at nine in the evening?", "Is there a cable car later?", "Can my dog stay with me?",
     "Is the sauna open on Tuesday?", "Where do I park the car?", "Do you serve breakfast early?"],
    ["How many books can I borrow?", "Can I renew them online?", "What if someone reserved one?",
     "Is the scanner free?", "Can children use the reading room?", "When does the library open?"],
    ["I cannot sail at all. Can I join?", "What if it is very windy?", "Do I need my own life jacket?",
     "How long is the course?", "Can my son come too?", "What should I bring?"],
    ["How long does a service take?", "What does it cover?", "Do you repair electric bicycles?",
     "Can I leave it for a month?", "Do you sell tyres?", "Can you fix it today?"],
    ["My cat is not eating. What is wrong?", "Can you see her today?", "How do I bring her in?",
     "Do you treat rabbits?", "Can I pay by card?", "Is there parking?"],
    ["Why is my water brown?", "How long will it last?", "Was there work on my street?",
     "Where are the works announced?", "There is water on the road. Whom do I call?", "Will my bill go up?"],
    ["How do I get a plot?", "How long is the waiting list?", "Can I have a bonfire?",
     "Are the hoses shared?", "How many hours must I give?", "When does the year start?"],
]


def system_prompt(index: int) -> str:
    """Conversation `index`'s own system prompt: distinct from its first words (~440 tiny-tokenizer tokens)."""
    role, rules = ROLES[index]
    return f"You are {role}. {rules} {HOUSE_STYLE} Remember that you speak for {role} and for nobody else."


def tiny_engine(work_dir: Path) -> Path:
    """The tiny random Qwen3 of the tests (tests/assets.py: same seed, same weights), built with TINY's
    limits; cached (a marker written last says the build is whole)."""
    folder = work_dir / "ray-prefix-routing-tiny-qwen3"
    engine, done = folder / "engine", folder / "done.json"
    if done.is_file() and json.loads(done.read_text()) == TINY:
        return engine
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.path.insert(0, str(REPO / "tests"))
    import shutil

    import assets

    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    shutil.rmtree(folder, ignore_errors=True)
    model = assets.make_tiny_model("qwen3", folder / "model")
    build_engine(BuildConfig(model=str(model), output_dir=str(engine), **TINY), progress=False)
    done.write_text(json.dumps(TINY))
    return engine


class LocalServer:
    """One server of the app (uvicorn in a thread on a loopback socket it binds itself)."""

    def __init__(self, app):
        import uvicorn

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the one-replica server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


async def conversation(client, url: str, index: int, turns: int, max_tokens: int, think: list[float]) -> list[dict]:
    """One user: its turns one after another, the whole conversation each time. A failed turn ends the
    conversation (its history would be wrong) with the error recorded; the others go on."""
    messages, out = [{"role": "system", "content": system_prompt(index)}], []
    for turn in range(turns):
        await asyncio.sleep(think[turn])
        messages.append({"role": "user", "content": QUESTIONS[index][turn]})
        body = {"model": MODEL, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0}
        started = time.perf_counter()
        try:
            reply = await client.post(f"{url}/v1/chat/completions", json=body)
        except Exception as error:  # noqa: BLE001  (one line in the report, not a lost run)
            out.append({"conversation": index, "turn": turn + 1, "error": f"{type(error).__name__}: {error}"})
            return out
        seconds = time.perf_counter() - started
        if reply.status_code != 200:
            out.append({"conversation": index, "turn": turn + 1, "error": f"HTTP {reply.status_code}: {reply.text[:300]}"})
            return out
        data = reply.json()
        answer = data["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
        usage = data["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        out.append({"conversation": index, "turn": turn + 1, "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": usage["completion_tokens"], "cached_tokens": cached,
                    "fraction": round(cached / usage["prompt_tokens"], 4), "replica": reply.headers.get("x-replica"),
                    "seconds": round(seconds, 3), "answer": answer})
    return out


async def converse(url: str, conversations: int, turns: int, max_tokens: int, think_s: float, seed: int):
    """All conversations at once, as users would be; (every turn's record, the wall seconds)."""
    import httpx

    rng = random.Random(seed)  # the same think times for every routing
    thinks = [[rng.uniform(0, think_s) for _ in range(turns)] for _ in range(conversations)]
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        done = await asyncio.gather(*(conversation(client, url, c, turns, max_tokens, thinks[c])
                                      for c in range(conversations)))
    return [turn for part in done for turn in part], time.perf_counter() - started


def scrape_cache(url: str, replicas: int) -> dict:
    """Each server's context cache from /metrics (bytes held, evictions), by X-Replica; through Ray's proxy
    a GET goes to a replica at random, so it asks until it has heard from every one (or 60 tries)."""
    import httpx

    seen = {}
    for _ in range(60):
        reply = httpx.get(f"{url}/metrics", timeout=60)
        reply.raise_for_status()
        values = {}
        for name in ("trt_llm_context_cache_bytes", "trt_llm_context_cache_evictions_total"):
            found = re.search(rf"^{name} (\S+)$", reply.text, re.M)
            values[name.removeprefix("trt_llm_context_cache_").removesuffix("_total")] = \
                float(found.group(1)) if found else None
        seen[reply.headers.get("x-replica", "one")] = values
        if len(seen) >= replicas:
            break
    return seen


def summarize(turns: list[dict]) -> dict:
    errors = [t for t in turns if "error" in t]
    later = [t for t in turns if "error" not in t and t["turn"] > 1]
    where = {(t["conversation"], t["turn"]): t["replica"] for t in turns if "error" not in t}
    moved = sum(1 for t in later if where.get((t["conversation"], t["turn"] - 1)) not in (None, t["replica"]))
    fractions = [t["fraction"] for t in later]
    return {"later_turns": len(later), "errors": [f"conversation {t['conversation']} turn {t['turn']}: {t['error']}"
                                                  for t in errors],
            "fraction_min": min(fractions) if fractions else None,
            "fraction_mean": round(sum(fractions) / len(fractions), 4) if fractions else None,
            "cached_tokens_sum": sum(t["cached_tokens"] for t in later),
            "prompt_tokens_sum": sum(t["prompt_tokens"] for t in later),
            "prompt_tokens_max": max((t["prompt_tokens"] for t in turns if "error" not in t), default=None),
            "moved_turns": moved, "replicas_used": len({t["replica"] for t in turns if "error" not in t})}


def verdicts(runs: dict, expected: int, caches: dict) -> dict:
    prefix, one = runs["prefix"]["summary"], runs["one"]["summary"]
    answers = {name: {(t["conversation"], t["turn"]): t["answer"] for t in run["turns"] if "error" not in t}
               for name, run in runs.items()}
    both = set(answers["one"]) & set(answers["prefix"]) & set(answers["pow2"])  # (a failed turn: not answered)
    differ = sorted(key for key in both if not answers["prefix"][key] == answers["pow2"][key] == answers["one"][key])
    complete = all(len(a) == expected for a in answers.values())
    spread = (abs(prefix["cached_tokens_sum"] - one["cached_tokens_sum"]) / one["cached_tokens_sum"]
              if one["cached_tokens_sum"] else None)
    evictions = {name: {r: v["evictions"] for r, v in seen.items()} for name, seen in caches.items()}
    return {
        "prefix_min_fraction_at_least_0.8": prefix["fraction_min"] is not None and prefix["fraction_min"] >= TARGET_SHARE,
        "prefix_cached_within_10pct_of_one_replica": spread is not None and spread <= TARGET_SPREAD,
        "prefix_vs_one_replica_cached_difference": round(spread, 4) if spread is not None else None,
        "answers_identical_prefix_pow2_one": complete and not differ,
        "answers_differing": [f"conversation {c} turn {t}" for c, t in differ],
        "all_turns_answered": complete,
        "no_context_cache_evictions": all(v == 0 for seen in evictions.values() for v in seen.values()),
        "evictions": evictions,
    }


def markdown(report: dict) -> str:
    runs, v, s = report["runs"], report["verdicts"], report["settings"]
    ok = lambda flag: "PASS" if flag else "FAIL"  # noqa: E731
    lines = [f"# Ray Serve prefix routing: {s['conversations']} conversations x {s['turns']} turns, 2 replicas", "",
             f"`{report['command']}`", "",
             f"Engine: {report['engine']} ({s['engine_limits']}); max_tokens {s['max_tokens']}, greedy; think time "
             f"0..{s['think_s']} s; {s['threads']} thread(s) a server; context-cache budget "
             f"{s['kv_cache_budget_mb']} MB a server, max_rows {s['max_rows']}. The longest prompt: "
             f"{runs['one']['summary']['prompt_tokens_max']} tokens. One replica holds all the conversations in "
             f"{(next(iter(report['caches']['one'].values()))['bytes'] or 0) / 2**20:.1f} MB of context cache; "
             "each Ray replica has the same budget.",
             f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, load average at start "
             f"{report['machine']['load_average_start']}. Versions: "
             + ", ".join(f"{k} {v_}" for k, v_ in report["versions"].items()) + ".", "",
             "| routing | min fraction | mean fraction | cached / prompt tokens (turns 2..) | turns moved | replicas | "
             "wall s | cache MB per server | evictions |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in ("prefix", "pow2", "one"):
        sm, cache = runs[name]["summary"], report["caches"][name]
        mb = " / ".join(f"{(c['bytes'] or 0) / 2**20:.1f}" for c in cache.values())
        ev = " / ".join(f"{c['evictions']:.0f}" if c["evictions"] is not None else "?" for c in cache.values())
        label = {"prefix": "prefix (2 replicas)", "pow2": "pow2 (2 replicas)", "one": "one replica"}[name]
        lines.append(f"| {label} | {sm['fraction_min']} | {sm['fraction_mean']} | {sm['cached_tokens_sum']} / "
                     f"{sm['prompt_tokens_sum']} | {sm['moved_turns']} of {sm['later_turns']} | {sm['replicas_used']} | "
                     f"{runs[name]['seconds']:.1f} | {mb} | {ev} |")
    one_sum = runs["one"]["summary"]["cached_tokens_sum"] or 1
    lines += ["", "Verdicts:", "",
              f"- prefix: every later turn at least {TARGET_SHARE} cached: {ok(v['prefix_min_fraction_at_least_0.8'])} "
              f"(min {runs['prefix']['summary']['fraction_min']})",
              f"- prefix's cached tokens within 10% of one replica's: "
              f"{ok(v['prefix_cached_within_10pct_of_one_replica'])} (difference "
              f"{v['prefix_vs_one_replica_cached_difference']}; pow2 has "
              f"{runs['pow2']['summary']['cached_tokens_sum'] / one_sum:.3f} of one replica's)",
              f"- answers identical on prefix, pow2 and one replica: {ok(v['answers_identical_prefix_pow2_one'])}"
              + (f" (differ: {', '.join(v['answers_differing'])})" if v["answers_differing"] else "")
              + ("" if v["all_turns_answered"] else " (not every turn answered)"),
              f"- no context-cache eviction on any server: {ok(v['no_context_cache_evictions'])}",
              f"- every turn answered: {ok(v['all_turns_answered'])}", ""]
    errors = [f"- {name}: {error}" for name in ("prefix", "pow2", "one") for error in runs[name]["summary"]["errors"]]
    lines += [*errors, ""] if errors else []
    lines += ["Per later turn: prompt tokens, then cached fraction @ replica (replicas numbered in order of first "
              "use in each run).", "", "| conv | turn | prompt | one replica | prefix | pow2 |", "|---|---|---|---|---|---|"]
    names = {name: {} for name in runs}
    for name, run in runs.items():
        for t in run["turns"]:
            if "error" not in t:
                names[name].setdefault(t["replica"], f"r{len(names[name])}")
    rows = {name: {(t["conversation"], t["turn"]): t for t in run["turns"] if "error" not in t}
            for name, run in runs.items()}
    for key in sorted(rows["one"]):
        if key[1] == 1:
            continue
        cells = []
        for name in ("one", "prefix", "pow2"):
            t = rows[name].get(key)
            cells.append(f"{t['fraction']:.3f} @ {names[name][t['replica']]}" if t else "-")
        lines.append(f"| {key[0]} | {key[1]} | {rows['one'][key]['prompt_tokens']} | " + " | ".join(cells) + " |")
    lines += ["", f"Result: {'PASS' if report['passed'] else 'FAIL'}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-dir", type=Path, help="serve this engine (default: the tiny random Qwen3, built once)")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--think-s", type=float, default=0.2, help="each turn waits a seeded time up to this first")
    parser.add_argument("--threads", type=int, default=1, help="threads of each server (a replica takes as many CPUs)")
    parser.add_argument("--kv-budget-mb", type=int, default=1024, help="each server's context-cache budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--out-dir", type=Path, default=Path("out/bench/ray_prefix_routing"))
    args = parser.parse_args(argv)
    if not 1 <= args.conversations <= len(ROLES):
        parser.error(f"--conversations: {args.conversations}, expected 1 to {len(ROLES)}")
    if not 2 <= args.turns <= len(QUESTIONS[0]):
        parser.error(f"--turns: {args.turns}, expected 2 to {len(QUESTIONS[0])}")
    if args.max_tokens < 1 or args.threads < 1 or args.kv_budget_mb < 1 or args.think_s < 0:
        parser.error("--max-tokens, --threads and --kv-budget-mb at least 1, --think-s at least 0")

    import ray
    from ray import serve

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.server.app import ServerConfig
    from trt_llm.server.cli import build_app
    from trt_llm.server.ray_app import deployment

    load_start = os.getloadavg()
    engine = args.engine_dir or tiny_engine(args.work_dir)
    limits = EngineDir.open(engine).manifest["limits"]
    # All conversations decode together where the engine allows; the budget is the server's default 1 GiB,
    # far above what 8 conversations hold (the one-replica figure below); an eviction fails the run.
    config = ServerConfig(model_name=MODEL, max_rows=min(args.conversations, limits["max_batch_size"]),
                          kv_cache_budget=args.kv_budget_mb << 20)
    shape = (args.conversations, args.turns, args.max_tokens, args.think_s, args.seed)
    runs, caches = {}, {}

    print("one replica ...", file=sys.stderr, flush=True)
    one = LocalServer(build_app(EngineDir.open(engine), config, args.threads))
    try:
        turns, seconds = asyncio.run(converse(one.url, *shape))
        caches["one"] = scrape_cache(one.url, 1)
    finally:
        one.close()
    runs["one"] = {"turns": turns, "seconds": seconds}

    port = free_port()
    # A local instance of its own (never a cluster named by RAY_ADDRESS); logical CPUs: 2 replicas and room.
    ray.init(address="local", num_cpus=2 * args.threads + 2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for routing in ("prefix", "pow2"):  # each on fresh replicas: empty context caches
            print(f"{routing}: 2 replicas ...", file=sys.stderr, flush=True)
            serve.run(deployment(str(engine), config, replicas=2, threads=args.threads, routing=routing),
                      name=routing, route_prefix=f"/{routing}")
            url = f"http://127.0.0.1:{port}/{routing}"
            turns, seconds = asyncio.run(converse(url, *shape))
            caches[routing] = scrape_cache(url, 2)
            runs[routing] = {"turns": turns, "seconds": seconds}
            serve.delete(routing)
    finally:
        serve.shutdown()
        ray.shutdown()

    for run in runs.values():
        run["summary"] = summarize(run["turns"])
        run["seconds"] = round(run["seconds"], 2)
    verdict = verdicts(runs, args.conversations * args.turns, caches)
    passed = all(verdict[k] for k in ("prefix_min_fraction_at_least_0.8", "prefix_cached_within_10pct_of_one_replica",
                                      "answers_identical_prefix_pow2_one", "no_context_cache_evictions",
                                      "all_turns_answered"))
    report = {
        "command": shlex.join(["python", *sys.argv]),
        "engine": str(engine) if args.engine_dir else "tiny random Qwen3 (tests/assets.py, seed 0)",
        "settings": {"conversations": args.conversations, "turns": args.turns, "max_tokens": args.max_tokens,
                     "think_s": args.think_s, "threads": args.threads, "seed": args.seed,
                     "kv_cache_budget_mb": args.kv_budget_mb, "max_rows": config.max_rows,
                     "engine_limits": {k: limits[k] for k in ("max_batch_size", "max_input_len", "max_kv_cache_capacity")}},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average_start": [round(x, 2) for x in load_start]},
        "versions": {"ray": ray.__version__, "trt-llm (git)": git_head()},
        "targets": {"prefix_min_fraction": TARGET_SHARE, "prefix_vs_one_replica_cached": TARGET_SPREAD},
        "verdicts": verdict, "passed": passed, "caches": caches,
        "runs": {name: runs[name] for name in ("prefix", "pow2", "one")},
    }
    text = markdown(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ray_prefix_routing.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out_dir / "ray_prefix_routing.md").write_text(text)
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
