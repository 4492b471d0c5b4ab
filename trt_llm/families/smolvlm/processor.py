"""SmolVLM / Idefics3 image preprocessing in numpy and Pillow (the runtime has no torch): transformers'
`SmolVLMImageProcessorPil` / `Idefics3ImageProcessorPil` step for step, so the frames are equal, not
merely close (tests/test_smolvlm.py compares them).

An image is brought to `size.longest_edge` on its longest side (up or down, the other side even),
then to whole tiles of `max_image_size.longest_edge` on both sides, and cut into rows x columns
tiles, row by row; a downscaled copy of the whole image follows them as the global view. One that is
a single tile after the rounding is sent alone (0 rows, 0 columns). Without splitting, every image
is squeezed to one tile. Each resize is Pillow's on the uint8 picture (Lanczos by default); the bytes
are scaled in float64, stored as float32 and normalized in float32, as transformers does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import Image

from trt_llm.runtime.media.sources import to_rgb
from trt_llm.runtime.media.vision.processor import rescaled

MAX_IMAGE_SIZE = 4096  # transformers' cap on a resized side
LANCZOS = 1  # PIL.Image.Resampling.LANCZOS, the processors' default


class FrameInputs(NamedTuple):
    pixel_values: np.ndarray  # [frames, C, S, S] float32: each image's tiles, then its global view
    image_grid_thw: np.ndarray  # [images, 3] int64: frames, patches a side, patches a side


def _edge(config: dict, key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    edge = value.get("longest_edge") if isinstance(value, dict) else None
    if isinstance(edge, bool) or not isinstance(edge, int) or edge < 1:
        raise ValueError(f'image processor config: {key} must be {{"longest_edge": pixels}}, got {value!r}')
    return edge


def rescaled_to_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """transformers' _resize_output_size_rescale_to_max_len, then its cap at MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def whole_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' resize_for_vision_encoder: both sides rounded up to whole tiles."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


@dataclass(frozen=True)
class TileProcessor:
    tile: int  # max_image_size.longest_edge: a frame's side in pixels
    longest_edge: int | None  # size.longest_edge (None: do_resize false)
    split: bool  # do_image_splitting
    patch_size: int
    merge: int  # the connector's scale_factor
    max_tokens: int  # the build's max_image_tokens_per_image
    resample: int = LANCZOS
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_config(cls, config: dict, image_size: int, patch_size: int, merge: int, max_tokens: int) -> TileProcessor:
        """From a preprocessor_config.json's dict and the tower's geometry (the vision config)."""
        tile = _edge(config, "max_image_size") or image_size
        if tile != image_size:
            raise ValueError(f"image processor config: max_image_size {tile} is not the vision tower's image_size "
                             f"{image_size}: its frames would not give the model's image_seq_len rows")
        longest = _edge(config, "size") if config.get("do_resize", True) else None
        fields = {key: tuple(float(v) for v in ([config[key]] * 3 if isinstance(config[key], (int, float))
                                                else config[key]))
                  for key in ("image_mean", "image_std") if key in config}
        fields.update({key: bool(config[key]) for key in ("do_rescale", "do_normalize") if key in config})
        if "rescale_factor" in config:
            fields["rescale_factor"] = float(config["rescale_factor"])
        if "resample" in config:
            fields["resample"] = int(config["resample"])
        return cls(tile, longest, bool(config.get("do_image_splitting", True)), patch_size, merge, max_tokens,
                   **fields)

    @property
    def frame_tokens(self) -> int:
        return (self.tile // self.patch_size) ** 2 // (self.merge * self.merge)

    def sizes(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int] | None, int, int]:
        """(size after the first resize, size in whole tiles or None, rows, columns) of a picture."""
        if height <= 0 or width <= 0:
            raise ValueError(f"image of {width}x{height} pixels: empty")
        first = rescaled_to_longest(height, width, self.longest_edge) if self.longest_edge else (height, width)
        if not self.split:
            return first, None, 0, 0
        tiled = whole_tiles(*first, self.tile)
        if tiled[0] > self.tile or tiled[1] > self.tile:
            return first, tiled, (tiled[0] - self.tile) // self.tile + 1, (tiled[1] - self.tile) // self.tile + 1
        return first, tiled, 0, 0

    def layout(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of tiles of a picture; (0, 0): one frame, the picture alone."""
        _, _, rows, cols = self.sizes(height, width)
        return rows, cols

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """(frames, patches a side, patches a side) of a picture: a ValueError when its tokens pass the
        build's max_image_tokens_per_image."""
        rows, cols = self.layout(height, width)
        frames = rows * cols + 1 if rows else 1
        if frames * self.frame_tokens > self.max_tokens:
            raise ValueError(f"image of {width}x{height} pixels: {frames} frame(s) of {self.frame_tokens} image tokens "
                             f"each, {frames * self.frame_tokens}, more than the engine's max_image_tokens_per_image "
                             f"{self.max_tokens}")
        side = self.tile // self.patch_size
        return frames, side, side

    def frames(self, image: Image.Image) -> list[Image.Image]:
        """The picture's frames (tiles row by row, then the global view), uint8 RGB."""
        image = to_rgb(image)
        first, tiled, rows, cols = self.sizes(image.height, image.width)
        if self.longest_edge:
            image = image.resize(first[::-1], resample=self.resample)
        if tiled is None:
            return [image.resize((self.tile, self.tile), resample=self.resample)]
        image = image.resize(tiled[::-1], resample=self.resample)
        if not rows:
            return [image]
        t = self.tile
        tiles = [image.crop((c * t, r * t, (c + 1) * t, (r + 1) * t)) for r in range(rows) for c in range(cols)]
        return tiles + [image.resize((t, t), resample=self.resample)]

    def normalized(self, frame: Image.Image) -> np.ndarray:
        return rescaled(self, np.asarray(frame)).transpose(2, 0, 1)  # [3, S, S]

    def preprocess(self, images: list[Image.Image]) -> FrameInputs:
        frames, grids = [], []
        for image in images:
            own = self.frames(image)
            frames += [self.normalized(frame) for frame in own]
            grids.append((len(own), self.tile // self.patch_size, self.tile // self.patch_size))
        return FrameInputs(np.stack(frames), np.asarray(grids, dtype=np.int64))
