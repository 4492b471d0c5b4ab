"""Multimodal rotary positions (Qwen2.5-VL, Qwen3-VL): the (time, row, column) position of every
token of a prompt, as transformers' `get_rope_index` computes them.

A text token at running position p is (p, p, p). An image's tokens are its merged grid, (p, p + row,
p + column), and the text after it resumes at p + max(rows, columns): an image advances the position
by its longer side, not by its token count. Generated tokens continue as text: token i of a
sequence (counting the prompt) is at i + delta, delta = the prompt's largest position + 1 - its length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RopePositions:
    prompt: np.ndarray  # [3, L] int32: the prompt's positions
    delta: int  # what a later token's index adds (<= 0 after an image)

    def rows(self, start: int, count: int) -> np.ndarray:
        """Positions [3, count] of the sequence's tokens start .. start + count - 1."""
        index = np.arange(start, start + count)
        out = np.broadcast_to(index + self.delta, (3, count)).astype(np.int32)
        inside = index < self.prompt.shape[1]
        if inside.any():
            out = out.copy()
            out[:, inside] = self.prompt[:, index[inside]]
        return out


def rope_positions(token_ids: list[int], image_token_id: int, grids: list[tuple[int, int, int]],
                   merge: int) -> RopePositions:
    """token_ids: the prompt with each image as its run of `image_token_id` tokens (one run per
    image, in order: grids[i] is image i's (t, h, w) in patches)."""
    ids = np.asarray(token_ids)
    is_image = ids == image_token_id
    # the runs of equal type: starts where the type changes
    edges = np.flatnonzero(np.diff(is_image.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(ids)]])
    parts, position, images = [], 0, iter(grids)
    for start, end in zip(starts, ends):
        if not is_image[start]:
            parts.append(np.broadcast_to(np.arange(end - start) + position, (3, end - start)))
            position += end - start
            continue
        t, h, w = next(images)
        gh, gw = h // merge, w // merge
        if t * gh * gw != end - start:
            raise ValueError(f"an image run of {end - start} tokens does not match its grid {t}x{h}x{w}")
        time, row, col = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([time.reshape(-1), row.reshape(-1), col.reshape(-1)]) + position)
        position += max(h, w) // merge
    prompt = np.concatenate(parts, axis=1).astype(np.int32)
    return RopePositions(prompt, int(prompt.max()) + 1 - len(ids))


def text_positions(length: int) -> RopePositions:
    """A text-only prompt's: every stream the token's index."""
    return RopePositions(np.broadcast_to(np.arange(length, dtype=np.int32), (3, length)), 0)


def span_positions(length: int, spans: list[tuple[int, tuple[int, int, int], float]], merge: int) -> RopePositions:
    """The positions of a prompt of `length` tokens whose vision runs are `spans`: (first token,
    grid (t, h, w) in patches, temporal step), in prompt order; images and video frames alike, as
    transformers 5's get_rope_index gives them. A run's temporal position is its start plus
    trunc(index x step) in float32 (Qwen2.5-VL's tokens_per_second x second_per_grid_t; 1 for an
    image and a Qwen3-VL frame), and the text after it resumes at start + max(rows, columns).

    Generated tokens continue one past the prompt's last position, as transformers' generate steps
    its position_ids: with images only that is the largest position + 1 (`rope_positions`), but a
    Qwen2.5-VL video's scaled temporal positions can pass the text after it."""
    parts, position, cursor = [], 0, 0
    for first, (t, h, w), step in spans:
        if first > cursor:
            parts.append(np.broadcast_to(np.arange(first - cursor) + position, (3, first - cursor)))
            position += first - cursor
        gh, gw = h // merge, w // merge
        times = (np.arange(t, dtype=np.float32) * np.float32(step)).astype(np.int64)
        time, row, col = np.meshgrid(times, np.arange(gh), np.arange(gw), indexing="ij")
        parts.append(np.stack([time.reshape(-1), row.reshape(-1), col.reshape(-1)]) + position)
        position += max(h, w) // merge
        cursor = first + t * gh * gw
    if length > cursor:
        parts.append(np.broadcast_to(np.arange(length - cursor) + position, (3, length - cursor)))
    prompt = np.concatenate(parts, axis=1).astype(np.int32)
    return RopePositions(prompt, int(prompt[:, -1].max()) + 1 - length)
