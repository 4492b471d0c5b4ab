"""A video's resized frames -> the vision tower's patches, as transformers' Qwen-VL video processors
cut them: the frames padded to whole temporal patches with copies of the last one, each patch holding
`temporal_patch_size` consecutive frames ([C, T, P, P] flattened), the patches in merge-block order
within each temporal patch. The pixels are rescaled and normalized in the image processor's arithmetic
(runtime/media/vision/processor.py), so a still frame here equals that frame as an image."""

from __future__ import annotations

import numpy as np

from trt_llm.runtime.media.vision.processor import ImageProcessor, rescaled


def video_patches(frames: np.ndarray, processor: ImageProcessor) -> tuple[np.ndarray, tuple[int, int, int]]:
    """frames [F, H, W, 3] uint8, H and W multiples of patch_size * merge_size -> (pixel values
    [t * h * w, C * T * P * P] float32, the grid (t, h, w) in patches)."""
    p, m, temporal = processor.patch_size, processor.merge_size, processor.temporal_patch_size
    pixels = rescaled(processor, frames)  # as the image processor does
    if pad := -len(pixels) % temporal:
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], pad, axis=0)])
    count, height, width, channels = pixels.shape
    grid_t, grid_h, grid_w = count // temporal, height // p, width // p
    # [temporal patch, frame in it, block row, row in block, pixel row, block column, column in block,
    #  pixel column, C] -> [temporal patch, block row, block column, row in block, column in block, C,
    #  frame in it, pixel row, pixel column]: transformers' patchify order
    blocks = pixels.reshape(grid_t, temporal, grid_h // m, m, p, grid_w // m, m, p, channels)
    blocks = blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    values = np.ascontiguousarray(blocks.reshape(grid_t * grid_h * grid_w, channels * temporal * p * p))
    return values, (grid_t, grid_h, grid_w)
