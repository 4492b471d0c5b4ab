"""Qwen2-Audio's audio encoder against transformers' audio tower, side by side in one run, interleaved.

A random Qwen2-Audio tower with the real 7B model's widths (d_model 1280, 20 heads, FFN 5120, 128 mel
bins, a projector to 4096) and a few layers, on clips of speech-like noise of several lengths: ms per
second of audio of our audio graph on ONNX Runtime (the cpu engine's, built by the project's exporter:
the layers over each clip's valid rows only) and of transformers' tower and projector (sdpa
attention over all 1,500 rows with the padding mask, torch on the same threads), the same features.

    python benchmarks/audio_encoder.py [--layers 4] [--threads 2] [--rounds 5] [--json out.json]

No weights are downloaded: the tower is random.
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

CLIP_SECONDS = (5, 15, 30)


def random_model(layers: int):
    import torch
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    audio = dict(d_model=1280, encoder_attention_heads=20, encoder_ffn_dim=5120, encoder_layers=layers,
                 num_mel_bins=128, max_source_positions=1500)
    text = dict(hidden_size=4096, intermediate_size=64, num_hidden_layers=1, num_attention_heads=32,
                num_key_value_heads=32, vocab_size=256)
    torch.manual_seed(0)
    config = Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=255)
    return Qwen2AudioForConditionalGeneration(config).eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.families.qwen2_audio.audio_tower import AudioTowerGraph, export_audio_tower
    from trt_llm.runtime.media.audio.features import WhisperFeatures
    from trt_llm.families.qwen2_audio.host import packing

    torch.set_num_threads(args.threads)
    model = random_model(args.layers)
    with tempfile.TemporaryDirectory() as folder:
        engine = compile_cpu(export_audio_tower(AudioTowerGraph(model, torch.float32), Path(folder) / "model.onnx",
                                                torch.float32))
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = args.threads, 3
        session = ort.InferenceSession(str(engine), options, providers=["CPUExecutionProvider"])
    extractor = WhisperFeatures(num_mel_bins=128)
    rng = np.random.default_rng(0)
    rows = {"ours": {s: [] for s in CLIP_SECONDS}, "transformers": {s: [] for s in CLIP_SECONDS}}
    agreement = {}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for seconds in CLIP_SECONDS:
            computed = extractor((rng.standard_normal(16000 * seconds) * 0.1).astype(np.float32))
            features, frames = computed.features[None], [computed.num_frames]
            row_index, cu_seqlens, pool_index = packing(frames)
            start = time.perf_counter()
            (ours,) = session.run(None, {"input_features": features, "row_index": row_index, "cu_seqlens": cu_seqlens,
                                         "pool_index": pool_index})
            elapsed_ours = time.perf_counter() - start
            start = time.perf_counter()
            with torch.inference_mode():
                mask = torch.from_numpy(np.arange(3000)[None] < np.array(frames)[:, None])
                conv = (mask.sum(-1) - 1) // 2 + 1
                bias = torch.zeros(1, 1, 1, 1500).masked_fill(torch.arange(1500)[None, None, None] >= conv,
                                                              torch.finfo(torch.float32).min)
                hidden = model.model.audio_tower(torch.from_numpy(features), attention_mask=bias).last_hidden_state
                theirs = model.model.multi_modal_projector(hidden)[0, :ours.shape[0]].numpy()
            elapsed_theirs = time.perf_counter() - start
            if round_:
                rows["ours"][seconds].append(elapsed_ours * 1000 / seconds)
                rows["transformers"][seconds].append(elapsed_theirs * 1000 / seconds)
            agreement[seconds] = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    print(f"Qwen2-Audio tower, {args.layers} layers at the 7B widths, {args.threads} threads, median of {args.rounds}")
    print("| clip | ours ms / s of audio | transformers ms / s | ours vs transformers | max difference / max |")
    print("|---|---:|---:|---:|---:|")
    report = []
    for seconds in CLIP_SECONDS:
        ours, theirs = statistics.median(rows["ours"][seconds]), statistics.median(rows["transformers"][seconds])
        print(f"| {seconds} s | {ours:.1f} | {theirs:.1f} | {theirs / ours:.2f}x | {agreement[seconds]:.1e} |")
        report.append({"seconds": seconds, "ours_ms_per_s": ours, "transformers_ms_per_s": theirs,
                       "relative_difference": agreement[seconds]})
    if args.json:
        args.json.write_text(json.dumps({"layers": args.layers, "threads": args.threads, "rows": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
