"""SmolVLM's SigLIP tower and pixel-shuffle connector against transformers', side by side in one run,
interleaved.

A random SmolVLM2 tower with the real 256M / 500M model's widths (SigLIP base: hidden 768, 12 heads,
MLP 3072, frames of 512 pixels in patches of 16, pixel shuffle 4 -> 64 rows a frame, text width 576)
and a few layers, on the same images cut by SmolVLM2's processor settings (longest edge 2048, tiles of
512): ms per image of our vision graph on ONNX Runtime (the cpu engine's, built by the project's
exporter and optimizer) and of transformers' `get_image_features` (sdpa attention, torch on the same
threads), and their largest difference.

    python benchmarks/siglip_tower.py [--layers 2] [--threads 2] [--rounds 3] [--json out.json]

No weights are downloaded: the tower is random.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

# (height, width) -> frames: a 1 x 4 split and its global view; a 4 x 4 split and its global view
SIZES = {"300x1200": (300, 1200), "800x800": (800, 800)}
PREPROCESSOR = {"do_image_splitting": True, "max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
                "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def random_model(layers: int):
    """A random SmolVLM: SmolVLM2-256M's tower widths, a one-layer text model of its width."""
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=12,
                  image_size=512, patch_size=16)
    text = dict(model_type="llama", vocab_size=256, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=9, num_key_value_heads=3)
    torch.manual_seed(0)
    config = SmolVLMConfig(vision_config=vision, text_config=text, scale_factor=4, image_token_id=255)
    return SmolVLMForConditionalGeneration(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import onnxruntime as ort
    import torch
    from PIL import Image

    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.families.smolvlm.processor import TileProcessor
    from trt_llm.families.smolvlm.vision_tower import TiledTower, export_tower

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="siglip-bench-"))
    model = random_model(args.layers)
    graph_path = export_tower(TiledTower(model, torch.float32), work / "vision.onnx", torch.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(compile_cpu(graph_path)), options, providers=["CPUExecutionProvider"])
    processor = TileProcessor.from_config(PREPROCESSOR, 512, 16, 4, 1 << 20)

    rng = np.random.default_rng(0)
    results = {}
    for label, (height, width) in SIZES.items():
        picture = Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))
        frames = processor.preprocess([picture]).pixel_values
        pixels = torch.from_numpy(frames)[None]
        with torch.no_grad():
            reference = model.model.get_image_features(pixels).pooler_output[0].numpy()
        ours = session.run(None, {"pixel_values": frames})[0]
        times = {"ours": [], "transformers": []}
        for _ in range(args.rounds):  # interleaved: the shared machine's load moves both alike
            start = time.perf_counter()
            session.run(None, {"pixel_values": frames})
            times["ours"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch.no_grad():
                model.model.get_image_features(pixels)
            times["transformers"].append(time.perf_counter() - start)
        medians = {k: statistics.median(v) for k, v in times.items()}
        results[label] = {"frames": len(frames), "image_tokens": int(ours.shape[0]),
                          "max_abs_difference": float(np.abs(ours - reference).max()),
                          "max_abs_output": float(np.abs(reference).max()),
                          "ms_per_image": {k: v * 1000 for k, v in medians.items()},
                          "speedup_median": medians["transformers"] / medians["ours"]}
        print(label, json.dumps(results[label]))
    report = {"threads": args.threads, "layers": args.layers, "rounds": args.rounds,
              "torch_attention": model.config.vision_config._attn_implementation, "results": results}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
