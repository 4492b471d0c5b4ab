"""The vision component's graph (trt_llm/families/qwen_vl/vision_tower.py, exported and lowered for ONNX Runtime)
against transformers' own vision tower on the same patches: within 1e-4, for Qwen2.5-VL (windows and
full-attention blocks) and Qwen3-VL (learned position table, deepstack features), on one image,
several of different sizes in one request, the smallest image and a large one.

Oracle: `model.model.visual(pixel_values, grid_thw)` of transformers, which computes its own rotary
ids, windows and segments from the grid: so this also checks trt_llm/families/qwen_vl/grid.py's inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import vlm_assets
from trt_llm.build.cpu_backend import compile_cpu
from trt_llm.families.qwen_vl.vision_tower import VisionGraph, export_tower
from trt_llm.families.qwen_vl import grid as vision_grid

GRIDS = [[[1, 8, 6]], [[1, 8, 6], [1, 16, 20], [1, 4, 4]], [[1, 2, 2]], [[1, 30, 40]]]


@pytest.fixture(scope="module", params=vlm_assets.VLM_FAMILIES)
def tower(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText

    folder = vlm_assets.make_tiny_vlm(request.param, tmp_path_factory.mktemp(request.param))
    visual = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval().model.visual
    graph = VisionGraph(visual, torch.float32)
    engine = compile_cpu(export_tower(graph, folder / "vision.onnx", torch.float32))
    return visual, graph, ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"])


def feeds_for(graph: VisionGraph, grid, pixel_values: np.ndarray) -> dict:
    feeds = {"pixel_values": pixel_values, "rotary_ids": vision_grid.rotary_position_ids(grid, graph.merge),
             "cu_seqlens": vision_grid.cu_seqlens(grid)}
    if graph.windowed:
        feeds["window_index"], feeds["cu_window_seqlens"] = vision_grid.window_index(
            grid, graph.merge, graph.window_size, graph.patch_embed.patch_size)
    else:
        feeds["position_taps"], feeds["position_weights"] = vision_grid.interpolation_taps(
            grid, graph.grid_per_side, graph.merge)
    return feeds


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_vision_graph_equals_transformers_tower(tower, grid):
    visual, graph, session = tower
    config = visual.config
    patches = sum(t * h * w for t, h, w in grid)
    pixel_values = torch.randn(patches, config.in_channels * config.temporal_patch_size * config.patch_size ** 2,
                               generator=torch.Generator().manual_seed(patches))
    with torch.no_grad():
        expected = visual(pixel_values, grid_thw=torch.tensor(grid))
    outputs = session.run(None, feeds_for(graph, grid, pixel_values.numpy()))
    assert outputs[0].shape == (patches // 4, config.out_hidden_size)
    np.testing.assert_allclose(outputs[0], expected.pooler_output.numpy(), atol=1e-4, rtol=0)
    deepstack = getattr(expected, "deepstack_features", None)
    assert (len(outputs) == 2) == bool(deepstack)
    for got, want in zip(outputs[1:] and outputs[1], deepstack or []):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=0)
