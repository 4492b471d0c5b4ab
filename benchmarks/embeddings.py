"""Embedding throughput (issue 46 item 4): a batch of 64 texts embedded by SmolLM2-135M-Instruct on the cpu
backend (fp32), as runtime/requests/embeddings.py does it for the server and the input file.

    python benchmarks/embeddings.py --model HF_DIR [--threads 2] [--rounds 3] [--rows 16 --rows 1] [--transformers]
        [--json out.json]

The 64 texts are the sentences of two passages and runs of two to four of them (9 to 96 tokens, 3,148 in all with SmolLM2's tokenizer). Each round embeds all of
them once per `rows` setting (prompts a prefill pass takes: the engine's max batch, 16 here, against 1),
interleaved, after one warm-up, and with --transformers the same vectors from transformers after them (torch,
the same threads, 16 right-padded prompts a forward: a reference point); reported: texts/s and tokens/s, median and
spread over the rounds, and the smallest cosine between any two settings' vectors.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sidebyside.measure import cpu_name  # noqa: E402

PASSAGES = (
    "The lighthouse at Pointe Noire stands on a granite headland at the western end of the island. It was designed "
    "in 1898 by the engineer Henri Lacaze, who had built three smaller lights on the northern coast. It was finished "
    "in the spring of 1902 after four years of work. The stone was quarried on the island itself and carried to the "
    "site on a narrow railway that the builders laid along the cliff. The tower is 34 metres tall, with 181 steps to "
    "the lantern room. Its first lamp burned kerosene and was turned by a clockwork that the keepers wound every four "
    "hours through the night. In 1934 the lamp was electrified, and a diesel generator was installed in a low "
    "building beside the tower. The light was automated in 1987, when the last keeper moved to the mainland after "
    "twenty-two years on the headland. Today the light reaches 22 nautical miles and flashes white twice every ten "
    "seconds. The keeper's house is a small museum run by volunteers, open from May to September. Visitors can see "
    "the original clockwork, the logbooks of the keepers and a collection of photographs of the ships that were "
    "wrecked on the reef before the light was built",
    "The orchard cooperative of Valmont was founded in 1951 by nineteen families who grew apples and pears on the "
    "slopes above the river. Each family kept its own trees, but they shared a press, a cold store and a lorry, and "
    "they sold their fruit under a single name. By 1970 the cooperative had grown to sixty-four members and built a "
    "second cold store near the railway station. The 1980s were difficult: prices fell, and two hard frosts destroyed "
    "most of the blossom in 1985 and again in 1991. Many younger members left for work in the city. The cooperative "
    "survived by changing what it sold. Instead of shipping fresh fruit to wholesale markets, it began to make juice, "
    "cider and dried apple rings, and it opened a shop beside the press. Today it has forty-one members, who farm "
    "about 280 hectares, and it employs twelve people all year and up to sixty at harvest. About a third of its "
    "income comes from the shop and from visitors, who come for the blossom festival in April and the harvest market "
    "in October. The cooperative has planted old local varieties again, such as the Reinette de Valmont and the "
    "Poire Curé. It keeps a nursery where members can buy young trees grafted from the oldest orchards in the valley",
)


def texts(count: int = 64) -> list[str]:
    """`count` texts: the passages' sentences, then runs of two to four of them, until there are enough."""
    sentences = [s.strip() + "." for p in PASSAGES for s in p.split(". ")]
    runs = [" ".join(sentences[i: i + n]) for n in (2, 3, 4) for i in range(len(sentences) - n + 1)]
    return (sentences + runs)[:count]


def build(model: Path, work_dir: Path, rows: int) -> Path:
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    out = work_dir / f"engine-smollm2-embed-b{rows}"
    config = BuildConfig(model=str(model), output_dir=str(out), max_batch_size=rows, max_input_len=512,
                         max_kv_cache_capacity=1024)
    manifest = out / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["build_config"] == config.model_dump()):
        build_engine(config, progress=False)
    return out


_LOADED = {}


def transformers_vectors(model_dir: Path, prompts: list[list[int]], rows: int, threads: int, pooling: str):
    """The same vectors from transformers (torch on `threads` threads): model.model's last_hidden_state
    (after the final norm), `rows` right-padded prompts a forward with their attention mask."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    if str(model_dir) not in _LOADED:  # loaded once: its load is not the forward's time
        _LOADED[str(model_dir)] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _LOADED[str(model_dir)]
    out = []
    with torch.no_grad():
        for start in range(0, len(prompts), rows):
            chunk = prompts[start: start + rows]
            width = max(map(len, chunk))
            ids = torch.tensor([p + [0] * (width - len(p)) for p in chunk])
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in chunk])
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
            for row, p in enumerate(chunk):
                v = hidden[row, len(p) - 1] if pooling == "last" else hidden[row, : len(p)].mean(axis=0)
                out.append(v / np.linalg.norm(v))
    return np.array(out)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True, help="SmolLM2-135M-Instruct as an HF folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", action="append", type=int, help="prompts a pass (repeatable; default 16 and 1)")
    parser.add_argument("--pooling", default="last", choices=["last", "mean"])
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache/trt-llm-bench")
    parser.add_argument("--transformers", action="store_true", help="also transformers' own forward (torch)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import numpy as np
    import onnxruntime

    from trt_llm.build.engine_dir import tool_versions
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.embeddings import Embedder
    from trt_llm.runtime.requests.loaded_engine import LoadedEngine

    row_settings = args.rows or [16, 1]
    loaded = LoadedEngine(EngineDir.open(build(args.model, args.work_dir, max(row_settings))), args.threads)
    embedders = {rows: Embedder.of(loaded) for rows in row_settings}
    for rows, embedder in embedders.items():
        embedder.max_batch = rows
    prompts = [loaded.tokenizer.encode(t) for t in texts()]
    tokens = sum(map(len, prompts))
    vectors = {}
    runs = {f"{rows} prompts a pass": (lambda e=embedder: e.embed(prompts, args.pooling))
            for rows, embedder in embedders.items()}
    if args.transformers:
        runs["transformers, 16 prompts a forward"] = lambda: transformers_vectors(args.model, prompts, 16, args.threads,
                                                                                   args.pooling)
    speeds = {name: [] for name in runs}
    # Ours interleaved (the machine's load moves all alike), transformers' after them: torch's idle OpenMP
    # threads spin for a while after each forward and would take the cores from the run after it.
    for group in ([n for n in runs if not n.startswith("transformers")], [n for n in runs if n.startswith("transformers")]):
        for round_ in range(args.rounds + 1):  # the first is a warm-up
            for name in group:
                start = time.perf_counter()
                vectors[name] = runs[name]()
                elapsed = time.perf_counter() - start
                if round_:
                    speeds[name].append(elapsed)
    first = next(iter(vectors.values()))
    cosine = min(float(np.min(np.sum(first * v, axis=1))) for v in vectors.values())
    results = {name: {"texts_per_s": spread([len(prompts) / t for t in times]),
                                          "tokens_per_s": spread([tokens / t for t in times]),
                                          "seconds": spread(times)} for name, times in speeds.items()}
    report = {"command": "python benchmarks/embeddings.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
              "model": "SmolLM2-135M-Instruct, fp32, cpu backend", "texts": len(prompts), "tokens": tokens,
              "token_lengths": {"min": min(map(len, prompts)), "max": max(map(len, prompts))},
              "pooling": args.pooling, "min_cosine_between_settings": cosine,
              "machine": {"cpu": cpu_name(), "threads": args.threads, "python": platform.python_version()},
              "versions": {**tool_versions(), "onnxruntime": onnxruntime.__version__}, "rounds": args.rounds,
              "results": results}
    print(json.dumps(report, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
