"""What a Qwen-VL vision tower needs besides the pixels, computed from the images' patch grids in numpy.

Every value here depends on the grid sizes (t, h, w per image, in patches), which vary per request;
computed on the host, they reach the vision graph as plain inputs, so one graph serves any number and
size of images (a graph cannot loop over a tensor's values, and transformers' own helpers do). Each
function equals its transformers counterpart in `transformers.vision_utils` bit for bit
(tests/test_vision_grid.py); the names follow them.

Patches arrive in merge-block order (the image processor emits each `merge x merge` block of patches
together, runtime/media/vision/processor.py), and every index below counts in that order.
"""

from __future__ import annotations

import numpy as np


def _grids(grid_thw) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in row) for row in np.asarray(grid_thw).reshape(-1, 3)]


def cu_seqlens(grid_thw) -> np.ndarray:
    """Segment boundaries of full attention: each frame of each image attends to itself [S + 1] int32."""
    lengths = [h * w for t, h, w in _grids(grid_thw) for _ in range(t)]
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def rotary_position_ids(grid_thw, merge: int) -> np.ndarray:
    """The (row, column) of every patch in its image [N, 2] int64, in merge-block order."""
    out = []
    for t, h, w in _grids(grid_thw):
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        out.append(np.tile(np.stack([rows, cols], axis=-1), (t, 1)))
    return np.concatenate(out).astype(np.int64)


def window_index(grid_thw, merge: int, window_size: int, patch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window attention: the order of the merged tokens [N / merge^2] int64 that puts
    each window's tokens together, and the windows' boundaries in patches [W + 1] int32.

    A window is `window_size` pixels square (112: 4 x 4 merged tokens of 28 pixels); windows at an
    image's right and bottom edges are partial, and an empty one adds no boundary."""
    side = window_size // merge // patch_size
    unit = merge * merge
    order, bounds, first = [], [0], 0
    for t, h, w in _grids(grid_thw):
        gh, gw = h // merge, w // merge
        index = np.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = side - gh % side, side - gw % side  # a whole window more when it divides, as HF
        padded = np.full((t, gh + pad_h, gw + pad_w), -100, dtype=np.int64)
        padded[:, :gh, :gw] = index
        windows_h, windows_w = (gh + pad_h) // side, (gw + pad_w) // side
        padded = padded.reshape(t, windows_h, side, windows_w, side).transpose(0, 1, 3, 2, 4)
        padded = padded.reshape(t, windows_h * windows_w, side * side)
        sizes = (padded != -100).sum(axis=-1).reshape(-1)
        flat = padded.reshape(-1)
        order.append(flat[flat != -100] + first)
        bounds.extend((np.cumsum(sizes) * unit + bounds[-1]).tolist())
        first += t * gh * gw
    bounds = np.asarray(bounds, dtype=np.int32)
    keep = np.concatenate([[True], bounds[1:] != bounds[:-1]])  # torch.unique_consecutive
    return np.concatenate(order).astype(np.int64), bounds[keep]


def interpolation_taps(grid_thw, grid_per_side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL's learned position embeddings: the square table of `grid_per_side`^2 rows resampled
    bilinearly (align_corners) to each image's grid. Per patch, in merge-block order, the four
    table rows [N, 4] int64 and their weights [N, 4] float32; the embedding is their weighted sum."""
    taps, weights = [], []
    for t, h, w in _grids(grid_thw):
        within = np.arange(h * w)
        blocks_w = w // merge
        row = (within // (merge * merge * blocks_w)) * merge + (within // merge) % merge
        col = ((within // (merge * merge)) % blocks_w) * merge + within % merge
        h_taps, h_weights = _axis_taps(row, h, grid_per_side)
        w_taps, w_weights = _axis_taps(col, w, grid_per_side)
        index = (h_taps[:, :, None] * grid_per_side + w_taps[:, None, :]).reshape(-1, 4)
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
        taps.append(np.tile(index, (t, 1)))
        weights.append(np.tile(weight, (t, 1)))
    return np.concatenate(taps).astype(np.int64), np.concatenate(weights).astype(np.float32)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """The two neighbours on one axis of position `index` of `size`, stretched onto `side` table
    positions with their ends aligned, and their linear weights (float32 as torch computes them)."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    return taps, np.clip(np.float32(1) - distance, 0, None).astype(np.float32)
