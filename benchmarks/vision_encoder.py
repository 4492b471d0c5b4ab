"""The vision encoder against transformers' vision tower, side by side in one run, interleaved.

A random Qwen2.5-VL tower with the real 3B model's widths (hidden 1280, 16 heads, MLP 3420, output
2048; its window size, full-attention blocks every 8th) and a few blocks, on the same images: ms per
image token of our vision graph on ONNX Runtime (the cpu engine's, built by the project's exporter)
and of transformers' `model.model.visual` (sdpa attention, torch on the same threads). Then time to
first token of one image request on a tiny decoder with that tower: trt-llm-run's path (decode the
file, preprocess, encode, prefill; the profile's number) against transformers (its processor and
`generate` for one token).

    python benchmarks/vision_encoder.py [--blocks 4] [--threads 2] [--rounds 5] [--json out.json]

No weights are downloaded: the towers are random (the tokenizer is the npm Qwen tokenizer's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SIZES = {"448x448": (448, 448), "672x896": (672, 896), "1008x1344": (1008, 1344)}  # 256, 768, 1728 tokens


def tower_config(blocks: int) -> dict:
    # Qwen2.5-VL-3B's vision_config, with fewer blocks (full attention at the last one, as its 7, 15, ...)
    return dict(depth=blocks, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                spatial_merge_size=2, temporal_patch_size=2, patch_size=14, window_size=112,
                fullatt_block_indexes=[blocks - 1], hidden_act="silu", in_channels=3)


def random_model(vlm_assets, blocks: int, out_hidden: int):
    """A random Qwen2.5-VL: the tiny decoder of the tests, a tower of the 3B widths."""
    import torch
    from transformers import AutoModelForImageTextToText

    config = vlm_assets.vlm_config("qwen2_5_vl")
    for key, value in {**tower_config(blocks), "out_hidden_size": out_hidden}.items():
        setattr(config.vision_config, key, value)
    config.text_config.hidden_size = out_hidden
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import onnxruntime as ort
    import torch
    from PIL import Image

    import assets
    import vlm_assets
    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.families.qwen_vl.vision_tower import VisionGraph, export_tower
    from trt_llm.families.qwen_vl import grid as vision_grid
    from trt_llm.runtime.media.vision.processor import ImageProcessor

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="vision-bench-"))
    visual = random_model(vlm_assets, args.blocks, out_hidden=2048).model.visual
    graph_path = export_tower(VisionGraph(visual, torch.float32), work / "vision.onnx", torch.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(compile_cpu(graph_path)), options, providers=["CPUExecutionProvider"])
    processor = ImageProcessor.from_config(vlm_assets.PREPROCESSOR["qwen2_5_vl"])

    rng = np.random.default_rng(0)
    results = {}
    for label, (height, width) in SIZES.items():
        picture = Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))
        inputs = processor.preprocess([picture])
        grid = [tuple(int(v) for v in inputs.image_grid_thw[0])]
        feeds = {"pixel_values": inputs.pixel_values, "rotary_ids": vision_grid.rotary_position_ids(grid, 2),
                 "cu_seqlens": vision_grid.cu_seqlens(grid)}
        feeds["window_index"], feeds["cu_window_seqlens"] = vision_grid.window_index(grid, 2, 112, 14)
        tokens = inputs.pixel_values.shape[0] // 4
        pixels, grid_thw = torch.from_numpy(inputs.pixel_values), torch.from_numpy(inputs.image_grid_thw)
        with torch.no_grad():
            reference = visual(pixels, grid_thw=grid_thw).pooler_output.numpy()
        ours = session.run(None, feeds)[0]
        times = {"ours": [], "transformers": []}
        for _ in range(args.rounds):  # interleaved: the shared machine's load moves both alike
            start = time.perf_counter()
            session.run(None, feeds)
            times["ours"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch.no_grad():
                visual(pixels, grid_thw=grid_thw)
            times["transformers"].append(time.perf_counter() - start)
        medians = {k: statistics.median(v) for k, v in times.items()}
        results[label] = {"image_tokens": tokens, "max_abs_difference": float(np.abs(ours - reference).max()),
                          "max_abs_output": float(np.abs(reference).max()),  # random weights: large outputs
                          "ms_per_image_token": {k: v * 1000 / tokens for k, v in medians.items()},
                          "speedup_median": medians["transformers"] / medians["ours"]}
        print(label, json.dumps(results[label]))

    # The decoder of the tiny models (hidden 64), the tower's output made its width: a 2048-wide
    # decoder's embedding alone would be 1.2 GB for 151,936 tokens.
    model = random_model(vlm_assets, args.blocks, out_hidden=64)
    results["time_to_first_token"] = time_to_first_token(model, work, args, assets, vlm_assets)
    report = {"threads": args.threads, "tower": tower_config(args.blocks), "rounds": args.rounds, "results": results}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def time_to_first_token(model, work: Path, args, assets, vlm_assets) -> dict:
    """One 672x896 image request: our run's profile TTFT against transformers' processor + generate."""
    import shutil

    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    from trt_llm.build.cli import build_engine
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.engine.profiler import Profiler
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.build_config import BuildConfig
    from trt_llm.schemas.input_file import load_input_file

    folder = work / "model"
    model.save_pretrained(folder)
    tokenizer_dir = assets.npm_tokenizer_dir("qwen3", Path.home() / ".cache" / "trt-llm")
    for name in ("tokenizer.json",):
        shutil.copy(tokenizer_dir / name, folder / name)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = vlm_assets.CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "preprocessor_config.json").write_text(json.dumps(vlm_assets.PREPROCESSOR["qwen2_5_vl"]))
    engine = build_engine(BuildConfig(model=str(folder), output_dir=str(work / "engine"), max_batch_size=1,
                                      max_input_len=1024, max_kv_cache_capacity=1100), progress=False)
    picture = work / "photo.png"
    Image.fromarray((np.random.default_rng(1).random((672, 896, 3)) * 255).astype(np.uint8)).save(picture)
    request = {"messages": [{"role": "user", "content": [{"type": "image", "image": "photo.png"},
                                                         {"type": "text", "text": "Describe it."}]}]}
    (work / "input.json").write_text(json.dumps({"temperature": 0.0, "max_generate_length": 1, "requests": [request]}))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    settings = {k: v for k, v in vlm_assets.PREPROCESSOR["qwen2_5_vl"].items() if k != "image_processor_type"}
    hf_processor = Qwen2VLImageProcessorPil(**{**settings, "max_pixels": 512 * 28 * 28})
    times = {"ours": [], "transformers": []}
    for _ in range(args.rounds):
        profiler = Profiler()
        runner = Runner(EngineDir.open(engine), threads=args.threads, profiler=profiler)  # a fresh encoder cache
        loaded = load_input_file(work / "input.json")
        runner.run(loaded, loaded.settings)
        times["ours"].append(profiler.summary().time_to_first_token.median_ms)
        start = time.perf_counter()
        image = Image.open(picture).convert("RGB")
        processed = hf_processor(images=[image], return_tensors="pt")
        text = tokenizer.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
        text = text.replace("<|image_pad|>", "<|image_pad|>" * (int(processed["image_grid_thw"].prod()) // 4))
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                           pixel_values=processed["pixel_values"], image_grid_thw=processed["image_grid_thw"],
                           mm_token_type_ids=(ids == vlm_assets.IMAGE_TOKEN).long())
        times["transformers"].append((time.perf_counter() - start) * 1000)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"image": "672x896 (768 tokens)", "median_ms": medians, "speedup_median": medians["transformers"] / medians["ours"]}


if __name__ == "__main__":
    main()
