"""Prompt lookup speculation against this project's own vanilla decoding, side by side in one run (issue 45).

SmolLM2-135M-Instruct on the cpu backend (fp32 and int4 engines), greedy, batch 1 and 4, on two workloads:
copying (a summary and an extractive answer over passages of 300-600 tokens, and a code edit that
returns the whole function) and free chat. Vanilla and prompt lookup alternate round by round (the
machine is shared and noisy: read the ratios); every round checks that both gave the same tokens.

    python benchmarks/prompt_lookup.py --model HF_DIR [--threads 2] [--rounds 3] [--new-tokens 128]
        [--quantization none --quantization int4] [--json out.json]

Reported per engine, batch and workload: tokens/s end to end (generated tokens over the run's wall time,
prefill included, as a user of trt-llm-run sees it), median and spread over the rounds, the ratio of the
medians, lookup's proposed / accepted tokens and tokens per verification pass, and what a wider pass cost
on the engine (the slope the cost model fitted from its timed passes). Also the decode phase alone, which
is what speculation changes: each round also times the same requests with one new token (their prefill,
the same code on both sides), and a side's decode rate is its tokens past each request's first over its
run's time less that one (llama.cpp's lookup and speculative examples report this rate: "decoded N
tokens in T s").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.measure import cpu_name  # noqa: E402

LIGHTHOUSE = (
    "The lighthouse at Pointe Noire stands on a granite headland at the western end of the island. It was "
    "designed in 1898 by the engineer Henri Lacaze, who had built three smaller lights on the northern coast, "
    "and it was finished in the spring of 1902 after four years of work. The stone was quarried on the island "
    "itself and carried to the site on a narrow railway that the builders laid along the cliff; parts of that "
    "railway can still be seen below the keeper's house. The tower is 34 metres tall, with 181 steps to the "
    "lantern room. Its first lamp burned kerosene and was turned by a clockwork that the keepers wound every "
    "four hours through the night. In 1934 the lamp was electrified, and a diesel generator was installed in a "
    "low building beside the tower. The light was automated in 1987, when the last keeper, Marthe Dubois, moved "
    "to the mainland after twenty-two years on the headland. Today the light reaches 22 nautical miles and "
    "flashes white twice every ten seconds. The keeper's house is a small museum run by volunteers, open from "
    "May to September, where visitors can see the original clockwork, the logbooks of the keepers from 1902 to "
    "1987, and a collection of photographs of the ships that were wrecked on the reef before the light was "
    "built. The most famous of those wrecks is the Saint-Laurent, a cargo ship that struck the reef in a storm "
    "in November 1896 with the loss of eleven men; it was that wreck that persuaded the government to fund the "
    "lighthouse.")
ORCHARD = (
    "The orchard cooperative of Valmont was founded in 1951 by nineteen families who grew apples and pears on "
    "the slopes above the river. Each family kept its own trees, but they shared a press, a cold store and a "
    "lorry, and they sold their fruit under a single name. By 1970 the cooperative had grown to sixty-four "
    "members and built a second cold store near the railway station. The 1980s were difficult: prices fell, "
    "two hard frosts destroyed most of the blossom in 1985 and again in 1991, and many younger members left for "
    "work in the city. The cooperative survived by changing what it sold. Instead of shipping fresh fruit to "
    "wholesale markets, it began to make juice, cider and dried apple rings, and it opened a shop beside the "
    "press. Today it has forty-one members, who farm about 280 hectares, and it employs twelve people all year "
    "and up to sixty at harvest. About a third of its income comes from the shop and from visitors, who come "
    "for the blossom festival in April and the harvest market in October. The cooperative has planted old "
    "local varieties again, such as the Reinette de Valmont and the Poire Curé, and it keeps a nursery where "
    "members can buy young trees grafted from the oldest orchards in the valley.")
CODE = '''def summarize_orders(orders):
    totals = {}
    for order in orders:
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        if order.get("discount"):
            amount = amount * (1 - order["discount"])
        if customer not in totals:
            totals[customer] = {"count": 0, "amount": 0.0, "items": []}
        totals[customer]["count"] += 1
        totals[customer]["amount"] += amount
        totals[customer]["items"].append(order["item"])
    report = []
    for customer, total in sorted(totals.items()):
        line = f"{customer}: {total['count']} orders, {total['amount']:.2f} in total"
        if total["count"] > 3:
            line += " (frequent customer)"
        report.append(line)
    return "\\n".join(report)
'''
COPYING = [
    f"{LIGHTHOUSE}\n\nSummarize the passage above in five sentences, keeping its names, dates and numbers.",
    f"{ORCHARD}\n\nAnswer from the passage, quoting the sentences you use: when was the cooperative founded, "
    "how did it survive the 1980s, and how many people does it employ?",
    f"Here is a Python function:\n\n{CODE}\nRename the variable `totals` to `by_customer` and return the whole "
    "function with that change, nothing else.",
    f"{LIGHTHOUSE}\n\nWhat happened to the Saint-Laurent, and how tall is the tower? Quote the passage.",
]
FREE = [
    "Explain how a refrigerator keeps food cold.", "Write a limerick about a forgetful wizard.",
    "What should I pack for a weekend trip to the beach?", "Why do cats purr?",
]


def build(model: Path, work_dir: Path, quantization: str) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = work_dir / f"engine-smollm2-lookup-{quantization}"
    config = BuildConfig(model=str(model), output_dir=str(out), max_batch_size=4, max_input_len=1024,
                         max_kv_cache_capacity=1536, quantization=quantization)
    manifest = out / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["build_config"] == config.model_dump()):
        build_engine(config, progress=False)
    return out


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True, help="SmolLM2-135M-Instruct as an HF folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--quantization", action="append", choices=["none", "int8", "int4"],
                        help="the engines' weights (repeatable; default none and int4)")
    parser.add_argument("--batch", action="append", type=int, help="batch sizes (repeatable; default 1 and 4)")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import onnxruntime

    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    results = {}
    for quantization in args.quantization or ["none", "int4"]:
        engine_dir = EngineDir.open(build(args.model, args.work_dir, quantization))
        runners = {"vanilla": Runner(engine_dir, args.threads, speculation="none"),
                   "prompt-lookup": Runner(engine_dir, args.threads, speculation="prompt-lookup")}
        for workload, prompts in (("copying", COPYING), ("free chat", FREE)):
            for batch in args.batch or [1, 4]:
                data = {"temperature": 0.0, "batch_size": batch, "max_generate_length": args.new_tokens,
                        "requests": [{"messages": [{"role": "user", "content": p}]} for p in prompts]}
                loaded = parse_input_dict(data)
                speeds = {name: [] for name in runners}
                tokens, identical = {}, True
                stats = runners["prompt-lookup"].lookup_stats
                before = (stats.rounds, stats.proposed, stats.accepted, stats.emitted)
                first = parse_input_dict({**data, "max_generate_length": 1})  # the prefill, and one token
                decode = {name: [] for name in runners}
                for _ in range(args.rounds):  # interleaved: the machine's load moves both alike
                    start = time.perf_counter()
                    runners["vanilla"].run(first, first.settings)
                    prefill = time.perf_counter() - start
                    for name, runner in runners.items():
                        start = time.perf_counter()
                        responses = runner.run(loaded, loaded.settings).responses
                        elapsed = time.perf_counter() - start
                        generated = sum(r.generated_tokens for r in responses)
                        speeds[name].append(generated / elapsed)
                        decode[name].append((generated - len(responses)) / (elapsed - prefill))
                        tokens[name] = [r.output_token_ids for r in responses]
                    identical = identical and tokens["prompt-lookup"] == tokens["vanilla"]
                rounds, proposed, accepted, emitted = (now - then for now, then in
                                                       zip((stats.rounds, stats.proposed, stats.accepted, stats.emitted),
                                                           before))
                results[f"{quantization} / {workload} / batch {batch}"] = {
                    "vanilla_tok_s": spread(speeds["vanilla"]), "lookup_tok_s": spread(speeds["prompt-lookup"]),
                    "ratio_of_medians": statistics.median(speeds["prompt-lookup"]) / statistics.median(speeds["vanilla"]),
                    "vanilla_decode_tok_s": spread(decode["vanilla"]), "lookup_decode_tok_s": spread(decode["prompt-lookup"]),
                    "decode_ratio_of_medians": statistics.median(decode["prompt-lookup"]) / statistics.median(decode["vanilla"]),
                    "proposed": proposed, "accepted": accepted,
                    "tokens_per_pass_with_a_proposal": emitted / rounds if rounds else 0.0,
                    # what each token of a pass past the first cost, in single-token passes (pass_cost.py's fit)
                    "pass_cost_slope": runners["prompt-lookup"].pass_cost.slope(batch),
                    "identical_tokens": identical}
                print(json.dumps({f"{quantization} / {workload} / batch {batch}":
                                  results[f"{quantization} / {workload} / batch {batch}"]}), flush=True)
    from trt_llm.runtime.backends import cpu_kernels

    report = {"command": "python benchmarks/prompt_lookup.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                         vars(args).items() if v is not None),
              "machine": {"cpu": cpu_name(), "threads": args.threads},
              "versions": {"onnxruntime": onnxruntime.__version__}, "kernels": cpu_kernels.describe(),
              "rounds": args.rounds,
              "new_tokens": args.new_tokens, "results": results}
    print(json.dumps(report, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
