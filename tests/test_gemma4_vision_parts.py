"""Gemma 4's vision parts (issue 43, docs/plans/gemma4.md step 8) against transformers 5.25, before the
family face uses them:

- trt_llm/families/gemma4/processor.py against transformers' Gemma4ImageProcessorPil (the class this
  project's transformers runs: no torchvision): the same float32 patches bit for bit, the same
  positions and the same soft-token counts, for square, wide, tall, tiny, large and strip pictures
  at every soft-token budget;
- trt_llm/families/gemma4/vision_tower.py (the torch module, and its exported graph lowered for and
  run by ONNX Runtime) against transformers' Gemma4Model.get_image_features, the rows transformers
  scatters into the text embeddings, for images of different sizes in one call: within 1e-5.

The tiny checkpoint is the plan's vision config (hidden 32, 2 layers of 2 heads of 16, pooling 3,
patch 16, a position table of 64, standardize on) with clipped linears on, on a tiny text model (no
audio). What init leaves trivial is made random: norm weights (ones), the position table (ones),
std_bias / std_scale (zeros / ones), the clip bounds (infinite); the linears get a spread that keeps
the attention far from uniform.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

import family_assets
from helpers import random_pictures
from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.families.gemma4.processor import SOFT_TOKEN_BUDGETS, Gemma4ImageProcessor
from trt_llm.families.gemma4.vision_tower import DEFAULT_PREPROCESSOR, Gemma4Tower, export_tower

# (height, width): square, wide, tall, tiny (scaled up), large (scaled down), and strips whose short side
# rounds to no 48-pixel step (transformers' edge case: one step, the long side its aspect's multiple)
PROCESSOR_SIZES = {"square.png": (300, 300), "wide.png": (200, 640), "tall.png": (700, 180), "tiny.png": (10, 7),
                   "large.png": (1200, 1600), "strip.png": (20, 2000), "column.png": (1500, 12)}
# the tower's pictures at a budget of 70: different grids and counts (8 x 8, 10 x 6, 18 x 3 soft tokens), every
# patch grid side (at most 54) under the tiny position table's 64
TOWER_SIZES = {"a.png": (120, 120), "b.png": (100, 150), "c.png": (80, 400)}


def tiny_gemma4_vlm(kv_heads: int = 2):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    text = Gemma4TextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                            hidden_size_per_layer_input=8, num_kv_shared_layers=0)
    vision = Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=kv_heads, head_dim=16, pooling_kernel_size=3, patch_size=16,
                                position_embedding_size=64, standardize=True, use_clipped_linears=True)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text, vision_config=vision,
                                                        audio_config=None)).eval()
    tower = model.model.vision_tower
    family_assets.gemma4_tower_nontrivial(tower)
    with torch.no_grad():
        for name, bound in tower.named_buffers():  # tight enough to clip some inputs and outputs
            if name.endswith(("_min", "_max")):
                bound.fill_(-1.5 if name.endswith("_min") else 1.5)
    return model


def transformers_rows(model, processor: Gemma4ImageProcessor, pictures) -> tuple[np.ndarray, list[int]]:
    """The soft-token rows transformers scatters into the prompt (all images' in order) and their counts."""
    inputs = processor.preprocess(pictures)
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(inputs.pixel_values),
                                             torch.from_numpy(inputs.image_position_ids), return_dict=True)
    return torch.cat(out.pooler_output).numpy(), [len(rows) for rows in out.pooler_output]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4_pictures")
    paths = random_pictures(folder, {**PROCESSOR_SIZES, **TOWER_SIZES})
    return {name: Image.open(path) for name, path in paths.items()}


@pytest.mark.parametrize("budget", SOFT_TOKEN_BUDGETS)
def test_the_processor_gives_transformers_patches_and_counts(pictures, budget):
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    images = [pictures[name] for name in PROCESSOR_SIZES]
    expected = Gemma4ImageProcessorPil(max_soft_tokens=budget)(images, return_tensors="np")
    ours = Gemma4ImageProcessor(max_soft_tokens=budget).preprocess(images)
    assert ours.pixel_values.dtype == expected["pixel_values"].dtype == np.float32
    np.testing.assert_array_equal(ours.pixel_values, expected["pixel_values"])
    np.testing.assert_array_equal(ours.image_position_ids, expected["image_position_ids"])
    assert ours.num_soft_tokens.tolist() == list(expected["num_soft_tokens_per_image"])
    processor = Gemma4ImageProcessor(max_soft_tokens=budget)
    assert [processor.soft_tokens(image.height, image.width) for image in images] == ours.num_soft_tokens.tolist()
    assert max(ours.num_soft_tokens) <= budget


def test_the_tower_inputs_are_each_images_patches_in_pooled_order(pictures):
    processor = Gemma4ImageProcessor(max_soft_tokens=70)
    images = [pictures[name] for name in TOWER_SIZES]
    padded, packed = processor.preprocess(images), processor.tower_inputs(images)
    assert packed.num_soft_tokens.tolist() == padded.num_soft_tokens.tolist()
    assert packed.cu_seqlens.dtype == np.int32 and packed.cu_seqlens.tolist() == [0, 576, 1116, 1602]
    for index in range(len(images)):
        start, end = packed.cu_seqlens[index], packed.cu_seqlens[index + 1]
        places = packed.pixel_position_ids[start:end]
        # each run of 9 patches is one 3 x 3 block, the blocks row-major (y / 3, x / 3)
        blocks = (places // 3).reshape(-1, 9, 2)
        assert (blocks == blocks[:, :1]).all()
        columns = int(places[:, 0].max()) // 3 + 1
        assert (blocks[:, 0, 0] + columns * blocks[:, 0, 1]).tolist() == list(range(len(blocks)))
        # the same patches as transformers' row-major layout, each at its own position
        valid = padded.image_position_ids[index, :, 0] >= 0
        rows = places[:, 1] * columns * 3 + places[:, 0]
        np.testing.assert_array_equal(packed.pixel_values[start:end], padded.pixel_values[index][valid][rows])


def test_the_processor_config_and_its_refusals():
    assert Gemma4ImageProcessor.from_config(DEFAULT_PREPROCESSOR["gemma4"]) == Gemma4ImageProcessor()
    assert Gemma4ImageProcessor.from_config({"max_soft_tokens": 1120, "resample": None}).max_soft_tokens == 1120
    with pytest.raises(ValueError, match=r"max_soft_tokens must be one of \(70, 140, 280, 560, 1120\), got 300"):
        Gemma4ImageProcessor.from_config({"max_soft_tokens": 300})
    with pytest.raises(ValueError, match="do_resize must be true"):
        Gemma4ImageProcessor.from_config({"do_resize": False})
    with pytest.raises(ValueError, match="image 1: expected a decoded picture"):
        Gemma4ImageProcessor().preprocess([Image.new("RGB", (48, 48)), b"bytes"])


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["heads", "grouped"])
def test_the_tower_module_gives_transformers_rows(pictures, kv_heads):
    model = tiny_gemma4_vlm(kv_heads)
    processor = Gemma4ImageProcessor(max_soft_tokens=70)
    images = [pictures[name] for name in TOWER_SIZES]
    expected, counts = transformers_rows(model, processor, images)
    assert counts == [64, 60, 54]
    feeds = processor.tower_inputs(images)
    tower = Gemma4Tower(model, torch.float32).eval()
    with torch.no_grad():
        got = tower(*(torch.from_numpy(x) for x in feeds[:3])).numpy()
    assert got.shape == (sum(counts), 64)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    # the clip bounds bite: without them transformers' rows move by far more than the tolerance
    tower_buffers = [b for name, b in model.model.vision_tower.named_buffers() if name.endswith(("_min", "_max"))]
    saved = [b.clone() for b in tower_buffers]
    with torch.no_grad():
        for bound in tower_buffers:
            bound.fill_(float("inf") if bound > 0 else float("-inf"))
        unclipped, _ = transformers_rows(model, processor, images)
        for bound, value in zip(tower_buffers, saved):
            bound.copy_(value)
    assert np.abs(unclipped - expected).max() > 1e-2


def test_the_exported_tower_gives_transformers_rows_in_onnxruntime(pictures, tmp_path):
    """And its graph builds a tensorrt-rtx plan ahead of time (no GPU), from one image of 1 soft token
    to 8 of the largest budget."""
    from trt_llm.build.tensorrt_backend import compile_tensorrt
    from trt_llm.schemas.build_config import BuildConfig

    model = tiny_gemma4_vlm()
    processor = Gemma4ImageProcessor(max_soft_tokens=70)
    tower = Gemma4Tower(model, torch.float32).eval()
    graph = export_tower(tower, tmp_path / "model.onnx", torch.float32)
    engine = compile_cpu(graph)
    session = ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("pixel_values", "tensor(float)", ["patches", 768]), ("pixel_position_ids", "tensor(int64)", ["patches", 2]),
        ("cu_seqlens", "tensor(int32)", ["images_plus_one"])]
    for names in (list(TOWER_SIZES), ["b.png"]):  # several images of different sizes in one call; one alone
        images = [pictures[name] for name in names]
        expected, _ = transformers_rows(model, processor, images)
        feeds = processor.tower_inputs(images)
        (got,) = session.run(None, dict(zip(["pixel_values", "pixel_position_ids", "cu_seqlens"], feeds[:3])))
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    (tmp_path / "plan").mkdir()
    profile = {"patches": (9, 9 * 280, 8 * 9 * 1120), "images_plus_one": (2, 2, 9)}
    plan = compile_tensorrt(graph, tmp_path / "plan", BuildConfig(model="tiny", output_dir=str(tmp_path / "out")),
                            rtx=True, profiles=[profile])
    assert plan.stat().st_size > 100_000
