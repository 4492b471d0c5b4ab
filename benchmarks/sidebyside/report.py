"""Timed runs -> result rows, ratios to each peer, token check -> Markdown and PNG plots.

Everything here works on plain dicts (the JSON report), so a report can be redrawn from its JSON:
    python -c "import json,sys; sys.path.insert(0,'benchmarks'); from sidebyside import report; \
r=json.load(open('out/bench/decode_speed.json')); print(report.markdown(r)); report.plots(r, 'out/bench')"
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from .measure import CLEAN_LOAD

OURS = "trt-llm"


def result_rows(plan, runs, engines, limits, not_run) -> list[dict]:
    """Per (engine, prompt length, batch): best and median over the clean runs (other processes used
    < CLEAN_LOAD cores meanwhile); with no clean run, over all runs, and the row is marked disturbed."""
    rows = []
    for name, length, b in plan:
        all_runs = runs[(name, length, b)]
        if not all_runs:  # the engine failed before this setting's runs were done
            rows.append(dict(engine=name, precision=engines[name].get("precision"), prompt_len=length, batch=b,
                             status="n/a", reason=f"failed: {engines[name].get('failed', 'no run')}"))
            continue
        clean = [x for x in all_runs if x["other_load_cores"] is None or x["other_load_cores"] < CLEAN_LOAD]
        pool = clean or all_runs
        precision = engines[name]["precision"]
        limit = b * limits[precision] if precision in limits else None
        best = max(x["decode_tok_s"] for x in pool)
        rows.append(dict(
            engine=name, precision=precision, prompt_len=length, batch=b, status="ok",
            decode_tok_s_best=best, decode_tok_s_median=statistics.median(x["decode_tok_s"] for x in pool),
            ttft_ms_best=min(x["ttft_s"] * 1000 for x in pool),
            ttft_ms_median=statistics.median(x["ttft_s"] * 1000 for x in pool),
            bandwidth_limit_tok_s=limit, fraction_of_limit=best / limit if limit else None,
            gap_to_limit=limit / best if limit else None,
            clean_runs=len(clean), disturbed=not clean, runs=all_runs))
    for name, length, b, reason in not_run:
        rows.append(dict(engine=name, precision=engines[name].get("precision"), prompt_len=length, batch=b,
                         status="n/a", reason=reason))
    order = {name: i for i, name in enumerate(engines)}
    rows.sort(key=lambda r: (r["prompt_len"], r["batch"], order[r["engine"]]))
    return rows


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def ratios(rows: list[dict]) -> list[dict]:
    """trt-llm against each peer, per setting; every ratio > 1 means trt-llm is better."""
    by = {(r["engine"], r["prompt_len"], r["batch"]): r for r in rows}
    out = []
    for (name, length, b), peer in by.items():
        ours = by.get((OURS, length, b))
        if name == OURS or ours is None or ours["status"] != "ok":
            continue
        entry = dict(peer=name, peer_precision=peer.get("precision"), prompt_len=length, batch=b)
        if peer["status"] != "ok":
            entry.update(status="n/a", reason=peer["reason"])
        else:
            entry.update(
                status="ok",
                decode_speedup=_ratio(ours["decode_tok_s_best"], peer["decode_tok_s_best"]),
                decode_speedup_median=_ratio(ours["decode_tok_s_median"], peer["decode_tok_s_median"]),
                ttft_speedup=_ratio(peer["ttft_ms_best"], ours["ttft_ms_best"]),
                ttft_speedup_median=_ratio(peer["ttft_ms_median"], ours["ttft_ms_median"]),
                reliable=not (ours["disturbed"] or peer["disturbed"]))
        out.append(entry)
    return out


def engine_ratios(engines: dict) -> list[dict]:
    """Each peer's peak RSS and build time over trt-llm's (> 1: trt-llm uses less / builds faster)."""
    out = []
    mine = engines.get(OURS)
    for name, theirs in engines.items():
        if name == OURS or mine is None or "skipped" in mine:
            continue
        out.append(dict(peer=name, peer_precision=theirs.get("precision"),
                        status="n/a" if "skipped" in theirs else "ok",
                        peak_memory_ratio=_ratio(theirs.get("peak_rss_mb"), mine.get("peak_rss_mb")),
                        build_time_ratio=_ratio((theirs.get("build") or {}).get("seconds"),
                                                (mine.get("build") or {}).get("seconds"))))
    return out


def targets(rows: list[dict], floor_tok_s: float | None = None) -> dict:
    """The project's goals (issues #7, #21): >= 2x transformers and >= GenAI at batch 1, >= GenAI at batch 8,
    batch-8 throughput >= 4x b1.
    floor_tok_s: the batch-1 matmul floor (measure.matmul_floor); a batch-1 goal records the speed it
    needs and that floor, about the fastest an engine on the same kernels can decode."""
    by = {(r["engine"], r["prompt_len"], r["batch"]): r for r in rows if r["status"] == "ok"}
    out = {}
    for length in sorted({r["prompt_len"] for r in rows}):
        for label, a, b, goal in (("trt-llm / transformers, batch 1", (OURS, 1), ("transformers", 1), 2.0),
                                  ("trt-llm / ort-genai, batch 1", (OURS, 1), ("ort-genai", 1), 1.0),
                                  ("trt-llm / ort-genai, batch 8", (OURS, 8), ("ort-genai", 8), 1.0),
                                  ("trt-llm batch-8 / batch-1 throughput", (OURS, 8), (OURS, 1), 4.0)):
            x, y = by.get((a[0], length, a[1])), by.get((b[0], length, b[1]))
            if x and y:
                value = _ratio(x["decode_tok_s_best"], y["decode_tok_s_best"])
                out[f"{label}, prompt {length}"] = dict(
                    best=value, median=_ratio(x["decode_tok_s_median"], y["decode_tok_s_median"]), target=goal,
                    met=value >= goal, reliable=not (x["disturbed"] or y["disturbed"]),
                    needs_tok_s=goal * y["decode_tok_s_best"] if a[1] == b[1] == 1 else None,
                    floor_tok_s=floor_tok_s if a[1] == b[1] == 1 else None)
    return out


def _first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def token_check(tokens: dict, engines: dict, eos: set[int], k: int, tokenizer, warnings: list[str]) -> list[dict]:
    """Each engine's greedy tokens (warm-up run) against trt-llm's, row by row, over the first k tokens and
    up to the first end-of-sequence token of either (transformers and GenAI mask EOS until N tokens, we
    and llama.cpp do not, so what follows an EOS legitimately differs). Equal precision: a mismatch is a
    WARNING. Different precision (llama.cpp on Q4_1): reported, expected."""
    out = []
    for (name, length, b), theirs in tokens.items():
        ours = tokens.get((OURS, length, b))
        if name == OURS or ours is None:
            continue
        same = engines[name].get("precision") == engines[OURS].get("precision")
        firsts, compared = [], []
        for row, (mine, other) in enumerate(zip(ours, theirs)):
            window = k
            for i, (x, y) in enumerate(zip(mine[:k], other[:k])):
                if x in eos or y in eos:
                    window = i
                    break
            at = _first_mismatch(mine[:window], other[:window])
            firsts.append(at)
            compared.append(window)
            if at is not None and same:
                msg = (f"WARNING: {name} p{length} b{b} row {row}: greedy tokens differ from trt-llm at token {at} "
                       f"of {window} compared\n  trt-llm: {tokenizer.decode(mine[:window])!r}\n"
                       f"  {name}: {tokenizer.decode(other[:window])!r}")
                warnings.append(msg)
                print(msg, file=sys.stderr)
        out.append(dict(engine=name, prompt_len=length, batch=b, same_precision=same, rows=len(firsts),
                        rows_matching=sum(f is None for f in firsts), first_mismatch=firsts,
                        compared_tokens=compared))
    return out


# --- Markdown ------------------------------------------------------------------------------------

def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 10e6 else f"{size / 1e6:.3f} MB"


def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def _busy(n: int) -> str:
    return f"{n} busy process" + ("" if n == 1 else "es")


def markdown(r: dict) -> str:
    bw = r["bandwidth"]
    star = lambda row: "*" if row.get("disturbed") else ""  # noqa: E731
    lines = [f"## {r['model']} side by side: {r['threads']} threads, N={r['new_tokens']} new tokens, "
             f"{r['rounds']} round(s), interleaved"
             + (f", LOADED: {_busy(r['load']['processes'])} beside every engine"
                if (r.get("load") or {}).get("processes") else "")
             + (" (SMOKE: tiny model, plumbing only)" if r["smoke"] else ""), ""]
    lines.append(f"CPU: {r['cpu']}, {r['logical_cores']} logical cores; "
                 + ", ".join(f"{k} {v}" for k, v in r["versions"].items()))
    lines.append(f"Prompts: {', '.join(map(str, r['prompt_lengths']))} tokens (every row of a batch the same length, "
                 f"{'chat-formatted' if r['chat_template'] else 'raw text'}); batch sizes "
                 f"{', '.join(map(str, r['batch_sizes']))}; greedy, exactly N tokens per row.")
    lines.append("")
    load = r.get("load") or {}
    if load.get("processes"):
        lines.append(f"**Loaded mode.** {_busy(load['processes'])} ({load['kind']}); every engine "
                     f"keeps {r['threads']} threads. Over the timed rounds they used {_f(load.get('cores'))} cores "
                     f"(median per run {_f(load.get('cores_per_run_median'))}) of {r['logical_cores']}. The "
                     "bandwidth limit and the matmul floor below were measured before they started. \"Clean\" "
                     "below means clean of other processes than these.")
        lines.append("")
    lines.append(f"**Bandwidth limit.** Read bandwidth {bw['read_bytes_s'] / 1e9:.1f} GB/s (fastest of torch sum, "
                 f"torch gemv, numpy gemv over {bw['buffer_mb']} MB, {r['threads']} threads). Weights read per decode "
                 "step: " + "; ".join(
                     f"{p} {_mb(bw['weight_bytes_per_step'][p])} -> limit {bw['limit_steps_s'][p]:.1f} steps/s "
                     f"= B x {bw['limit_steps_s'][p]:.1f} tok/s" for p in bw["weight_bytes_per_step"])
                 + " (KV-cache reads not counted).")
    lines.append("")
    floor = r.get("matmul_floor")
    if floor:
        lines.append(f"**Matmul floor.** ONNX Runtime running only the engine's {floor['matmuls']} matmuls, with its own "
                     f"weights ({_mb(floor['weight_bytes'])}) and one row each, {r['threads']} threads: "
                     f"{floor['ms_per_step']:.1f} ms per step -> {floor['tok_s']:.1f} tok/s at batch 1. A batch-1 "
                     "decode step costs this before attention, norms and sampling, so an engine on these kernels "
                     "decodes at most about this fast (measured once, before the runs: on a shared machine it "
                     "moves as the runs do).")
        lines.append("")

    lines += ["### Decode speed and time to first token", "",
              "| prompt | batch | engine | precision | decode tok/s best | median | TTFT ms best | median "
              "| bandwidth limit tok/s | % of limit | gap to limit | clean runs |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["results"]:
        if row["status"] != "ok":
            lines.append(f"| {row['prompt_len']} | {row['batch']} | {row['engine']} | {row['precision'] or '-'} | "
                         f"n/a | n/a | n/a | n/a | - | - | - | n/a: {row['reason']} |")
            continue
        lines.append(
            f"| {row['prompt_len']} | {row['batch']} | {row['engine']} | {row['precision']} | "
            f"{row['decode_tok_s_best']:.1f}{star(row)} | {row['decode_tok_s_median']:.1f}{star(row)} | "
            f"{row['ttft_ms_best']:.0f}{star(row)} | {row['ttft_ms_median']:.0f}{star(row)} | "
            f"{_f(row['bandwidth_limit_tok_s'], '.1f')} | {_f(row['fraction_of_limit'], '.0%')} | "
            f"{_f(row['gap_to_limit'], '.2f')}x | {row['clean_runs']}/{len(row['runs'])} |")
    lines.append("")
    lines.append(f"Decode tok/s = B x (N - 1) / (time from the first token to the last); TTFT includes the prefill. "
                 f"Best and median over the clean runs (other processes used < {r['clean_load_cores']} cores "
                 "meanwhile); * = no clean run, unreliable. Gap to limit = limit / best (1.00x = at the limit).")
    lines.append("")

    per_setting = r["ratios"]
    if per_setting:
        lines += ["### trt-llm against each peer (> 1: trt-llm is better)", "",
                  "| prompt | batch | peer | peer precision | decode speed: trt-llm / peer (best, median) "
                  "| TTFT: peer / trt-llm (best, median) |", "|---:|---:|---|---|---:|---:|"]
        for x in per_setting:
            if x["status"] != "ok":
                lines.append(f"| {x['prompt_len']} | {x['batch']} | {x['peer']} | {x['peer_precision'] or '-'} | "
                             f"n/a | n/a |")
                continue
            mark = "" if x["reliable"] else "*"
            lines.append(f"| {x['prompt_len']} | {x['batch']} | {x['peer']} | {x['peer_precision']} | "
                         f"{_f(x['decode_speedup'])}x{mark} ({_f(x['decode_speedup_median'])}x) | "
                         f"{_f(x['ttft_speedup'])}x{mark} ({_f(x['ttft_speedup_median'])}x) |")
        lines.append("")

    lines += ["### Memory and build", "",
              "| engine | precision | artifact | build | build s | build peak RSS MB | RSS after load MB "
              "| peak RSS MB | peer / trt-llm: peak RSS | peer / trt-llm: build time |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    totals = {x["peer"]: x for x in r["engine_ratios"]}
    for name, e in r["engines"].items():
        if "skipped" in e:
            lines.append(f"| {name} | - | skipped: {e['skipped']} | | | | | | | |")
            continue
        build = e.get("build")
        what = ("none (loads the HF checkpoint)" if e["key"] == "transformers" else "none") if build is None else (
            build["what"] + (f" (cached, built {build['built_at']})" if build.get("cached") else ""))
        t = totals.get(name, {})
        lines.append(
            f"| {name} | {e['precision']} | `{Path(e['artifact']).name}` | {what} | "
            f"{_f(build and build['seconds'], '.1f')} | {_f(build and build['peak_rss_mb'], '.0f')} | "
            f"{_f(e.get('loaded_rss_mb'), '.0f')} | {_f(e.get('peak_rss_mb'), '.0f')} | "
            f"{_f(t.get('peak_memory_ratio'))}{'x' if t.get('peak_memory_ratio') else ''} | "
            f"{_f(t.get('build_time_ratio'))}{'x' if t.get('build_time_ratio') else ''} |")
    lines.append("")
    lines.append("Each engine runs in its own process: peak RSS = that process's high-water mark (VmHWM) over "
                 "the whole run (Python, libraries and model included; the largest setting dominates); RSS after "
                 "load = the same mark once the model is loaded. A build is timed as its own process, wall clock, "
                 "with its own peak RSS.")
    lines.append("")

    if r["targets"]:
        lines += ["### Targets", ""]
        for label, t in r["targets"].items():
            verdict = "ok" if t["met"] else "BELOW TARGET"
            if not t["reliable"]:
                verdict += " (unreliable: no clean run on one side)"
            if not t["met"] and t.get("needs_tok_s") and t.get("floor_tok_s"):
                verdict += f": it needs {t['needs_tok_s']:.1f} tok/s; the matmul floor is {t['floor_tok_s']:.1f}"
            lines.append(f"- {label}: {t['best']:.2f} (medians {t['median']:.2f}); target >= {t['target']}: {verdict}")
        lines.append("")

    lines += ["### Greedy tokens against trt-llm", ""]
    for c in r["token_check"]:
        what = "same precision" if c["same_precision"] else "different precision: differences expected"
        detail = "" if c["rows_matching"] == c["rows"] else " (first mismatch per row: " + ", ".join(
            "-" if f is None else str(f) for f in c["first_mismatch"]) + ")"
        lines.append(f"- {c['engine']} p{c['prompt_len']} b{c['batch']}: {c['rows_matching']}/{c['rows']} rows "
                     f"identical over {min(c['compared_tokens'])}-{max(c['compared_tokens'])} tokens "
                     f"({what}){detail}")
    if not r["token_check"]:
        lines.append("- nothing to compare")
    lines.append("")
    for note in r["notes"]:
        lines.append(f"- note: {note}")
    for w in r["warnings"]:
        lines.append(f"- {w.splitlines()[0]}")
    if r.get("files"):
        lines.append("")
        lines.append("Files: " + ", ".join(f"`{v}`" for v in r["files"].values()))
    lines.append("")
    lines.append(f"Total time: {r['total_s']:.0f} s")
    return "\n".join(lines) + "\n"


# --- plots ---------------------------------------------------------------------------------------

def plots(r: dict, out_dir) -> dict:
    """decode_speed.png (decode tok/s with the bandwidth limit), ttft.png, memory_build.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n, e in r["engines"].items() if "skipped" not in e]
    colors = {n: plt.cm.tab10(i) for i, n in enumerate(r["engines"])}
    rows = {(x["engine"], x["prompt_len"], x["batch"]): x for x in r["results"] if x["status"] == "ok"}
    lengths, batches = r["prompt_lengths"], r["batch_sizes"]
    width = 0.8 / max(len(names), 1)
    files = {}

    for metric, label, fname, log_scale in (
            ("decode_tok_s_best", "decode tokens/s (best run)", "decode_speed.png", False),
            ("ttft_ms_best", "time to first token, ms (best run)", "ttft.png", True)):
        fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4.2), squeeze=False)
        for ax, b in zip(axes[0], batches):
            for i, name in enumerate(names):
                xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(lengths))]
                ys = [rows[(name, L, b)][metric] if (name, L, b) in rows else 0 for L in lengths]
                bars = ax.bar(xs, ys, width, label=f"{name} ({r['engines'][name]['precision']})", color=colors[name])
                for bar, L in zip(bars, lengths):
                    if (name, L, b) not in rows:
                        ax.annotate("n/a", (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom",
                                    fontsize=7)
            if metric == "decode_tok_s_best":
                for j, L in enumerate(lengths):
                    limits = {x["precision"]: x["bandwidth_limit_tok_s"] for (n, l2, b2), x in rows.items()
                              if l2 == L and b2 == b and x["bandwidth_limit_tok_s"]}
                    for precision, limit in limits.items():
                        ax.hlines(limit, j - 0.45, j + 0.45, colors="k", linestyles="--" if precision == "fp32" else ":")
                        ax.annotate(f"{precision} limit {limit:.0f}", (j, limit), ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(lengths)), [f"prompt {L}" for L in lengths])
            ax.set_title(f"batch {b}")
            ax.set_ylabel(label)
            if log_scale:
                ax.set_yscale("log")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{r['model']}, {r['threads']} threads, N={r['new_tokens']}")
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        files[Path(fname).stem] = out_dir / fname

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    peaks = [r["engines"][n].get("peak_rss_mb") for n in names]
    builds = [(r["engines"][n].get("build") or {}).get("seconds") for n in names]
    for ax, values, label, fmt in ((ax1, peaks, "peak RSS, MB (engine process)", "{:.0f}"),
                                   (ax2, builds, "build / conversion wall time, s", "{:.1f}")):
        bars = ax.bar(names, [v or 0 for v in values], color=[colors[n] for n in names])
        ax.bar_label(bars, ["n/a" if v is None else fmt.format(v) for v in values], fontsize=8)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(f"{r['model']}: memory and build time")
    fig.tight_layout()
    fig.savefig(out_dir / "memory_build.png", dpi=110)
    plt.close(fig)
    files["memory_build"] = out_dir / "memory_build.png"
    return files
