"""SmolVLM's SigLIP tower and pixel-shuffle connector against transformers', side by side in one run,
interleaved.

A random SmolVLM2 tower with the real 256M / 500M model's widths (SigLIP base: hidden 768, 12 heads,
MLP 3072, frames of 512 pixels in patches of 16, pixel shuffle 4 -> 64 rows a frame, text width 576)
and a few layers, on the same images cut by SmolVLM2's processor settings (longest edge 2048, tiles of
512): ms per image of our vision graph on ONNX Runtime (the cpu engine's, built by the project's
exporter and lowering, build/cpu_backend.py) and of transformers' `get_image_features` (sdpa
attention, torch on the same threads), and their largest difference. `--before` adds our graph
without the SigLIP lowering (trt_llm/families/siglip_lowering.py) as a third engine in the same
rounds.

The tower is fp32 GEMMs all but a few per cent, so the report also gives its FLOPs per image and
the floor they set: those FLOPs at the rate ONNX Runtime's GEMM reaches on the tower's own fc1
shape here (its best run: a run of it is timed in every round, beside the towers), and the speedup
over transformers' best run that a tower with no other cost would have (`ceiling_speedup`).

Every timed run records the CPU other processes used meanwhile (cores; the machine is shared):
`undisturbed` are the runs with less than 0.3 of a core used by others. `--clock cpu` (one thread
only) times each run by the thread's CPU time, which a neighbour's load does not stretch.

    python benchmarks/siglip_tower.py [--layers 2] [--threads 2] [--rounds 5] [--before]
                                      [--clock wall|cpu] [--wait-idle 60] [--json out.json]

No weights are downloaded: the tower is random.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside.measure import CLEAN_LOAD, LoadMeter, cpu_name  # noqa: E402

# (height, width) -> frames: a 1 x 4 split and its global view; a 4 x 4 split and its global view
SIZES = {"300x1200": (300, 1200), "800x800": (800, 800)}
PREPROCESSOR = {"do_image_splitting": True, "max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
                "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
VISION = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, image_size=512, patch_size=16)
TEXT_HIDDEN, SCALE = 576, 4


def random_model(layers: int):
    """A random SmolVLM: SmolVLM2-256M's tower widths, a one-layer text model of its width."""
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    vision = dict(VISION, num_hidden_layers=layers)
    text = dict(model_type="llama", vocab_size=256, hidden_size=TEXT_HIDDEN, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=9, num_key_value_heads=3)
    torch.manual_seed(0)
    config = SmolVLMConfig(vision_config=vision, text_config=text, scale_factor=SCALE, image_token_id=255)
    return SmolVLMForConditionalGeneration(config).eval()


def tower_gflop(frames: int, layers: int) -> float:
    """Multiply-adds x 2 of the tower per image: the patch embedding, each layer's four projections,
    q k^T and p v, the MLP, and the connector's projection."""
    d, mlp = VISION["hidden_size"], VISION["intermediate_size"]
    patch = VISION["patch_size"]
    length = (VISION["image_size"] // patch) ** 2
    per_layer = 4 * length * d * d + 2 * length * length * d + 2 * length * d * mlp
    per_frame = length * d * 3 * patch * patch + layers * per_layer + length * d * TEXT_HIDDEN
    return 2 * frames * per_frame / 1e9


def gemm(frames: int, threads: int):
    """ONNX Runtime's MatMul on the tower's fc1 shape [F * L, 768] x [768, 3072]: (a run, its GFLOP)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = frames * (VISION["image_size"] // VISION["patch_size"]) ** 2, VISION["hidden_size"], VISION["intermediate_size"]
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [weight])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    session.run(None, {"x": x})
    return (lambda: session.run(None, {"x": x})), 2 * m * k * n / 1e9


def _timed(fn, clock) -> float:
    start = clock()
    fn()
    return clock() - start


def build_graphs(model, work: Path, before: bool) -> dict[str, Path]:
    """Our cpu engine's vision graph; with `before`, also the one compiled without the SigLIP lowering."""
    import torch

    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.families import siglip_lowering
    from trt_llm.families.smolvlm.vision_tower import TiledTower, export_tower

    graph = export_tower(TiledTower(model, torch.float32), work / "vision.onnx", torch.float32)
    graphs = {}
    if before:
        (work / "before").mkdir()
        for name in (graph.name, graph.name + ".data"):
            shutil.copy(work / name, work / "before" / name)
        with mock.patch.object(siglip_lowering, "lower_for_onnxruntime", lambda model: {}):
            graphs["ours_before"] = compile_cpu(work / "before" / graph.name)
    graphs["ours"] = compile_cpu(graph)
    return graphs


def summary(runs: list[dict]) -> dict:
    ms = [r["ms"] for r in runs]
    quiet = [r["ms"] for r in runs if r["other_cores"] is not None and r["other_cores"] < CLEAN_LOAD]
    return {"median": statistics.median(ms), "best": min(ms), "worst": max(ms),
            "undisturbed_median": statistics.median(quiet) if quiet else None, "undisturbed_runs": len(quiet),
            "runs": [{k: round(v, 3) if v is not None else None for k, v in r.items()} for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", action="store_true", help="also our graph without the SigLIP lowering")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the calling thread's CPU time (only with --threads 1)")
    parser.add_argument("--wait-idle", type=float, default=0.0,
                        help="before each round, wait up to this many seconds for the neighbours to go quiet")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu times the calling thread alone: use it with --threads 1")

    import onnxruntime as ort
    import torch
    import transformers
    from PIL import Image

    from trt_llm.families.smolvlm.processor import TileProcessor

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    meter = LoadMeter()
    model = random_model(args.layers)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    sessions = {name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                for name, path in build_graphs(model, Path(tempfile.mkdtemp(prefix="siglip-bench-")), args.before).items()}
    processor = TileProcessor.from_config(PREPROCESSOR, 512, 16, 4, 1 << 20)

    rng = np.random.default_rng(0)
    results = {}
    for label, (height, width) in SIZES.items():
        picture = Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))
        frames = processor.preprocess([picture]).pixel_values
        pixels = torch.from_numpy(frames)[None]

        def theirs(pixels=pixels):
            with torch.no_grad():
                return model.model.get_image_features(pixels).pooler_output[0].numpy()

        engines = {name: (lambda s=s, frames=frames: s.run(None, {"pixel_values": frames})[0])
                   for name, s in sessions.items()}
        engines["transformers"] = theirs
        reference = theirs()
        differences = {name: float(np.abs(run() - reference).max()) for name, run in engines.items() if name != "transformers"}
        gemm_run, gemm_gflop = gemm(len(frames), args.threads)
        times = {name: [] for name in engines}
        gemm_seconds = []
        for _ in range(args.rounds):  # interleaved: the shared machine's load moves every engine alike
            meter.wait_idle(args.wait_idle)
            for name, run in engines.items():
                before = meter.snapshot()
                elapsed = _timed(run, clock)
                times[name].append({"ms": elapsed * 1000, "other_cores": meter.other_cores(before, meter.snapshot())})
            gemm_seconds.append(_timed(gemm_run, clock))
        stats = {name: summary(runs) for name, runs in times.items()}
        gflop = tower_gflop(len(frames), args.layers)
        rate = gemm_gflop / min(gemm_seconds)
        floor_ms = gflop / rate * 1000
        theirs_ms = stats["transformers"]
        results[label] = {
            "frames": len(frames), "image_tokens": int(reference.shape[0]),
            "max_abs_difference": differences, "max_abs_output": float(np.abs(reference).max()),
            "ms_per_image": stats,
            "speedup": {name: {"median": theirs_ms["median"] / s["median"], "best": theirs_ms["best"] / s["best"],
                               "undisturbed_median": (theirs_ms["undisturbed_median"] / s["undisturbed_median"]
                                                      if s["undisturbed_median"] and theirs_ms["undisturbed_median"] else None)}
                        for name, s in stats.items() if name != "transformers"},
            "gflop_per_image": gflop, "gemm_gflop_s": rate, "gemm_floor_ms": floor_ms,
            "ceiling_speedup": theirs_ms["best"] / floor_ms,
        }
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "ms_per_image"}), flush=True)
        for name, s in stats.items():
            print(f"  {name:13s} median {s['median']:8.1f}  best {s['best']:8.1f}  worst {s['worst']:8.1f}  "
                  f"undisturbed median {s['undisturbed_median'] or float('nan'):8.1f} ({s['undisturbed_runs']} runs)")
    report = {"machine": {"cpu": cpu_name(), "logical_cores": __import__("os").cpu_count(), "python": platform.python_version()},
              "versions": {"onnxruntime": ort.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                           "numpy": np.__version__},
              "threads": args.threads, "clock": args.clock, "wait_idle_s": args.wait_idle, "layers": args.layers, "rounds": args.rounds,
              "torch_attention": model.config.vision_config._attn_implementation, "results": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
