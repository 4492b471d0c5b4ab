"""Gemma 4 image preprocessing in numpy and Pillow (the runtime has no torch): transformers'
`Gemma4ImageProcessorPil` (image_processing_pil_gemma4.py, 5.25) step for step, so the patches are
equal, not merely close (tests/test_gemma4_vision_parts.py compares them).

An image keeps its aspect: it is resized (bicubic by default) to the largest height and width, both
multiples of k x patch_size (k = pooling_kernel_size, 3 x 16 = 48 pixels), whose patches fit the
budget of max_soft_tokens x k^2 patches (70, 140, 280, 560 or 1120 soft tokens); a side that would
round to 0 becomes one 48-pixel step and the other its aspect's whole multiple of that (at most the
budget's soft tokens of them). The bytes are scaled by 1/255 in float64 and stored as float32, no
normalization (the tower maps [0, 1] to [-1, 1] itself), then cut into 16 x 16 patches of
(row, column, channel) values, row-major over the patch grid, each with its (x, y) in the grid. An
image gives (its patches / k^2) soft tokens: the prompt holds `<|image>` + that many `<|image|>` +
`<image|>` for it.

Two layouts of the same patches:
  preprocess(pictures)   transformers': every image padded to the budget's patch count, padding
                         patches zero at position (-1, -1) (the oracle's layout);
  tower_inputs(pictures) the graph's (vision_tower.py): the images' valid patches packed one after
                         another, each image's in pooled order (each soft token's k x k patches
                         consecutive, the soft tokens row-major), with cu_seqlens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import Image

from trt_llm.runtime.media.sources import to_rgb
from trt_llm.runtime.media.vision.config_values import flag, number, per_channel, positive_int
from trt_llm.runtime.media.vision.processor import rescaled

BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the processor's default
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # transformers' _SUPPORTED_SOFT_TOKENS


class ImagePatches(NamedTuple):
    """transformers' layout: what Gemma4ImageProcessorPil returns."""
    pixel_values: np.ndarray  # [images, max_patches, 3 * P * P] float32, padding rows zero
    image_position_ids: np.ndarray  # [images, max_patches, 2] int64 (x, y), padding (-1, -1)
    num_soft_tokens: np.ndarray  # [images] int64


class TowerInputs(NamedTuple):
    """The vision graph's feeds (vision_tower.py)."""
    pixel_values: np.ndarray  # [N, 3 * P * P] float32, the images' patches packed, each in pooled order
    pixel_position_ids: np.ndarray  # [N, 2] int64 (x, y)
    cu_seqlens: np.ndarray  # [images + 1] int32, image boundaries in patches
    num_soft_tokens: np.ndarray  # [images] int64: the graph gives sum() rows, image by image


@dataclass(frozen=True)
class Gemma4ImageProcessor:
    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 280
    resample: int = BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = False
    image_mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    image_std: tuple[float, ...] = (1.0, 1.0, 1.0)

    def __post_init__(self):
        if self.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"image processor config: max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS}, "
                             f"got {self.max_soft_tokens!r}")

    @classmethod
    def from_config(cls, preprocessor: dict) -> Gemma4ImageProcessor:
        """From a preprocessor_config.json's dict; a key absent or null takes transformers' default.
        do_convert_rgb is not read: every picture is made RGB."""
        config = {key: value for key, value in preprocessor.items() if value is not None}
        if config.get("do_resize", True) is not True:
            raise ValueError(f"image processor config: do_resize must be true (the patch budget needs the resize), "
                             f"got {config['do_resize']!r}")
        fields = {key: positive_int(key, config[key])
                  for key in ("patch_size", "pooling_kernel_size", "max_soft_tokens") if key in config}
        if "resample" in config:
            if isinstance(config["resample"], bool) or config["resample"] not in [r.value for r in Image.Resampling]:
                raise ValueError(f"image processor config: resample must be a PIL resampling filter (0-5), "
                                 f"got {config['resample']!r}")
            fields["resample"] = int(config["resample"])
        fields.update({key: flag(key, config[key]) for key in ("do_rescale", "do_normalize") if key in config})
        if "rescale_factor" in config:
            fields["rescale_factor"] = number("rescale_factor", config["rescale_factor"])
        fields.update({key: per_channel(key, config[key]) for key in ("image_mean", "image_std") if key in config})
        if any(s == 0 for s in fields.get("image_std", ())):
            raise ValueError(f"image processor config: image_std must not be 0, got {config['image_std']!r}")
        return cls(**fields)

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the picture is resized to: transformers' get_aspect_ratio_preserving_size."""
        if height <= 0 or width <= 0:
            raise ValueError(f"image of {width}x{height} pixels: empty")
        step = self.pooling_kernel_size * self.patch_size
        factor = math.sqrt(self.max_patches * self.patch_size ** 2 / (height * width))
        target_h = int(math.floor(factor * height / step)) * step
        target_w = int(math.floor(factor * width / step)) * step
        longest = (self.max_patches // self.pooling_kernel_size ** 2) * step
        if target_h == 0 and target_w == 0:  # (not reachable for a non-empty picture: the budget is >= 1 step^2)
            raise ValueError(f"image of {width}x{height} pixels resizes to nothing")
        if target_h == 0:
            target_h, target_w = step, min(int(math.floor(width / height)) * step, longest)
        elif target_w == 0:
            target_h, target_w = min(int(math.floor(height / width)) * step, longest), step
        return target_h, target_w

    def soft_tokens(self, height: int, width: int) -> int:
        """The soft tokens (the prompt's `<|image|>` count) a picture of this size gives."""
        target_h, target_w = self.target_size(height, width)
        return (target_h // self.patch_size) * (target_w // self.patch_size) // self.pooling_kernel_size ** 2

    def patches(self, picture: Image.Image) -> tuple[np.ndarray, np.ndarray]:
        """One picture's patches [n, 3 * P * P] float32 and positions [n, 2] int64 (x, y), row-major."""
        image = to_rgb(picture)
        height, width = self.target_size(image.height, image.width)
        if (height, width) != (image.height, image.width):  # transformers skips the resize where the size is right
            image = image.resize((width, height), resample=self.resample)
        pixels = rescaled(self, np.asarray(image))  # [H, W, 3] float32
        p = self.patch_size
        rows, cols = height // p, width // p
        patches = pixels.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, -1)
        grid_x, grid_y = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
        return patches, np.stack([grid_x, grid_y], axis=-1).reshape(-1, 2).astype(np.int64)

    def _checked(self, pictures: list) -> None:
        for index, picture in enumerate(pictures):
            if not isinstance(picture, Image.Image):
                raise ValueError(f"image {index}: expected a decoded picture (PIL image), got {type(picture).__name__}")

    def preprocess(self, pictures: list) -> ImagePatches:
        """transformers' layout for these pictures (see ImagePatches)."""
        self._checked(pictures)
        width = 3 * self.patch_size ** 2
        values = np.zeros((len(pictures), self.max_patches, width), np.float32)
        positions = np.full((len(pictures), self.max_patches, 2), -1, np.int64)
        counts = []
        for index, picture in enumerate(pictures):
            patches, places = self.patches(picture)
            values[index, :len(patches)], positions[index, :len(patches)] = patches, places
            counts.append(len(patches) // self.pooling_kernel_size ** 2)
        return ImagePatches(values, positions, np.asarray(counts, np.int64))

    def tower_inputs(self, pictures: list) -> TowerInputs:
        """The vision graph's feeds for these pictures, in the order given (see TowerInputs)."""
        self._checked(pictures)
        k = self.pooling_kernel_size
        values, positions, bounds = [], [], [0]
        for picture in pictures:
            patches, places = self.patches(picture)
            cols, rows = int(places[-1, 0]) + 1, int(places[-1, 1]) + 1
            # pooled order: (soft-token row, soft-token column, row in the k x k block, column in it)
            order = np.arange(rows * cols).reshape(rows // k, k, cols // k, k).transpose(0, 2, 1, 3).reshape(-1)
            values.append(patches[order])
            positions.append(places[order])
            bounds.append(bounds[-1] + len(order))
        width = 3 * self.patch_size ** 2
        return TowerInputs(np.concatenate(values) if values else np.zeros((0, width), np.float32),
                           np.concatenate(positions) if positions else np.zeros((0, 2), np.int64),
                           np.asarray(bounds, np.int32),
                           np.diff(np.asarray(bounds, np.int64)) // (k * k))
