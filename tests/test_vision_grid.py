"""trt_llm/families/qwen_vl/grid.py against transformers' own helpers (transformers.vision_utils), which the
Qwen2.5-VL and Qwen3-VL towers call: equal bit for bit, on grids of every shape the image processor
makes (one image, several of different sizes, tiny and extreme aspect ratios, a two-frame grid)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import vision_utils

from trt_llm.families.qwen_vl import grid as vision_grid

GRIDS = [
    [[1, 4, 4]],
    [[1, 36, 52]],                          # one ordinary image (504 x 728 pixels at patch 14)
    [[1, 16, 22], [1, 8, 8], [1, 98, 4]],   # several images, one thin
    [[1, 2, 2]],                            # the smallest image
    [[2, 12, 8]],                           # two frames (a video's grid)
    [[1, 8, 8], [1, 16, 16]],               # windows that divide the grid exactly
]


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_grid_helpers_equal_transformers(grid):
    thw = torch.tensor(grid)
    np.testing.assert_array_equal(vision_grid.cu_seqlens(grid), vision_utils.get_vision_cu_seqlens(thw).numpy())
    np.testing.assert_array_equal(vision_grid.rotary_position_ids(grid, 2),
                                  vision_utils.get_vision_position_ids(thw, 2).numpy())
    order, bounds = vision_grid.window_index(grid, merge=2, window_size=112, patch_size=14)
    hf_order, hf_bounds = vision_utils.get_vision_window_index(thw, 2, 112, 14)
    np.testing.assert_array_equal(order, hf_order.numpy())
    np.testing.assert_array_equal(bounds, hf_bounds.numpy())
    for side in (48, 4):  # Qwen3-VL's table (2,304 rows), and a tiny one
        taps, weights = vision_grid.interpolation_taps(grid, side, merge=2)
        hf_taps, hf_weights = vision_utils.get_vision_interpolation_indices_and_weights(
            thw, side, mode="bilinear", align_corners=True, spatial_merge_size=2)
        np.testing.assert_array_equal(taps, hf_taps.numpy())
        np.testing.assert_array_equal(weights, hf_weights.numpy())
