"""Qwen2-VL-family image preprocessing (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in numpy and Pillow, so the
runtime needs neither torch nor torchvision to feed a vision engine.

It repeats transformers' `Qwen2VLImageProcessorPil` step for step, which is what makes the pixels
equal and not merely close (tests/test_image_inputs.py compares them): `smart_resize` picks a size
of whole merge blocks, Pillow resizes the uint8 RGB picture (bicubic), the bytes are scaled in
float64 and stored as float32, normalized in float32, and cut into patches. The patches come out in
merge-block order -- each `merge x merge` square of patches together, row by row within it -- which
the vision tower's merger, and Qwen2.5-VL's window attention, take for granted
(trt_llm/families/qwen_vl/grid.py counts in the same order).

A still image is one temporal patch: the picture is repeated `temporal_patch_size` times, as the
video frames the patch embedding was trained on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import Image

from trt_llm.runtime.media.sources import to_rgb
from trt_llm.runtime.media.vision.config_values import positive_int

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200  # smart_resize refuses anything longer and thinner
BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the processors' default


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) transformers resizes an image to: both multiples of `factor`, the aspect
    kept as nearly as rounding allows, the area brought within [min_pixels, max_pixels].

    Each side is first rounded to the nearest multiple (Python's round: halves to even). An area
    over the maximum is scaled down and floored, one block at least per side, so a very long thin
    image can still end up over `max_pixels`; an area under the minimum is scaled up and ceiled.
    A ValueError for an empty image or one more than 200 times longer than wide (transformers'
    limit), or a size that rounds to nothing (a zero `min_pixels`)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image of {width}x{height} pixels: empty")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(f"image of {width}x{height} pixels: aspect ratio {ratio:.1f}:1 is over "
                         f"{MAX_ASPECT_RATIO}:1, which the Qwen-VL image processor refuses")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar == 0 or w_bar == 0:
        raise ValueError(f"image of {width}x{height} pixels: resizes to {w_bar}x{h_bar} with min_pixels "
                         f"{min_pixels}; min_pixels must be at least one patch block ({factor}x{factor})")
    return h_bar, w_bar


def rescaled(processor, pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels [..., 3] as the model reads them, by a processor's do_rescale, rescale_factor,
    do_normalize, image_mean and image_std (Qwen's, SmolVLM's): scaled in float64 then stored as
    float32 and normalized in float32, transformers' rescale and normalize with the same roundings."""
    if processor.do_rescale:
        pixels = (pixels.astype(np.float64) * processor.rescale_factor).astype(np.float32)
    else:
        pixels = pixels.astype(np.float32)
    if processor.do_normalize:
        pixels = (pixels - np.asarray(processor.image_mean, np.float32)) / np.asarray(processor.image_std, np.float32)
    return pixels


class ImageInputs(NamedTuple):
    pixel_values: np.ndarray  # [total patches, C * T * P * P] float32, the images one after another
    image_grid_thw: np.ndarray  # [images, 3] int64: temporal patches, patch rows, patch columns


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _per_channel(key: str, value) -> tuple[float, float, float]:
    values = [value] * 3 if _is_number(value) else value
    if not isinstance(values, (list, tuple)) or len(values) != 3 or not all(_is_number(v) for v in values):
        raise ValueError(f"image processor config: {key} must be a number or three (R, G, B), got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class ImageProcessor:
    """The settings of a `preprocessor_config.json`; the defaults are transformers' class defaults
    (Qwen2-VL's), used for any key the file leaves out."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = BICUBIC

    @classmethod
    def from_config(cls, config: dict) -> ImageProcessor:
        """From a preprocessor_config.json's dict. The pixel bounds come as `min_pixels` /
        `max_pixels` (Qwen2-VL, Qwen2.5-VL) or `size: {shortest_edge, longest_edge}` (Qwen3-VL,
        where the "edges" are areas); where both are given the first wins, as in transformers."""
        if not config.get("do_resize", True):
            raise ValueError("image processor config: do_resize false is not supported: the patch grid needs "
                             "sides that are multiples of patch_size * merge_size, which the resize makes")
        fields = {key: positive_int(key, config[key]) for key in ("patch_size", "temporal_patch_size", "merge_size")
                  if key in config}
        fields.update({key: _per_channel(key, config[key]) for key in ("image_mean", "image_std") if key in config})
        fields.update({key: bool(config[key]) for key in ("do_rescale", "do_normalize") if key in config})
        if "rescale_factor" in config:
            if not _is_number(config["rescale_factor"]):
                raise ValueError(f"image processor config: rescale_factor must be a number, "
                                 f"got {config['rescale_factor']!r}")
            fields["rescale_factor"] = float(config["rescale_factor"])
        if "resample" in config:
            fields["resample"] = config["resample"]
        size = config.get("size")
        if size is not None:
            if not isinstance(size, dict) or not size.get("shortest_edge") or not size.get("longest_edge"):
                raise ValueError('image processor config: size must be {"shortest_edge": min pixels, '
                                 f'"longest_edge": max pixels}}, got {size!r}')
            fields["min_pixels"], fields["max_pixels"] = size["shortest_edge"], size["longest_edge"]
        fields.update({key: config[key] for key in ("min_pixels", "max_pixels") if config.get(key) is not None})
        for key in ("min_pixels", "max_pixels"):
            if key in fields:
                positive_int(key, fields[key])
        return cls(**fields)

    def __post_init__(self):
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"image processor: min_pixels {self.min_pixels} is over max_pixels {self.max_pixels}")
        if self.resample not in (r.value for r in Image.Resampling):
            raise ValueError(f"image processor: resample {self.resample!r} is not a PIL resampling filter")

    @property
    def factor(self) -> int:
        """The side of one merged token, in pixels: resized sides are multiples of it."""
        return self.patch_size * self.merge_size

    def with_token_limits(self, min_tokens: int, max_tokens: int) -> ImageProcessor:
        """These settings with the pixel bounds set from image-token bounds (a token is one merge
        block, (patch_size * merge_size)^2 pixels). smart_resize keeps the count within them up to its
        rounding of each side to whole blocks: scaling down floors (the count can fall under
        `min_tokens` when the bounds are close), scaling up ceils (it can pass `max_tokens` when they
        are close), and a side keeps one block at least, so an image more than `max_tokens` times
        longer than wide passes `max_tokens`. With the build's defaults, 4 and 512, every size the
        processor accepts lands within them."""
        for name, value in (("min_tokens", min_tokens), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"image token limits: {name} must be a positive integer, got {value!r}")
        if min_tokens > max_tokens:
            raise ValueError(f"image token limits: min_tokens {min_tokens} is over max_tokens {max_tokens}")
        block = self.factor * self.factor
        return dataclasses.replace(self, min_pixels=min_tokens * block, max_pixels=max_tokens * block)

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to."""
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The patch grid (t, h, w) of an image of this size."""
        resized_height, resized_width = self.resized_size(height, width)
        return 1, resized_height // self.patch_size, resized_width // self.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """How many image tokens (`<|image_pad|>`) an image of this size becomes: one per merge block."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w // (self.merge_size * self.merge_size)

    def _patches(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        image = to_rgb(image)
        resized_height, resized_width = self.resized_size(image.height, image.width)
        # Pillow hands back an unchanged copy when the size is already right, as transformers gets.
        image = image.resize((resized_width, resized_height), resample=self.resample)
        pixels = rescaled(self, np.asarray(image))  # [H, W, 3]

        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = resized_height // p, resized_width // p
        channels = pixels.shape[-1]
        # [block row, row in block, pixel row in patch, block column, column in block, pixel column, C]
        blocks = pixels.reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
        # -> [block row, block column, row in block, column in block, C, pixel row, pixel column]
        blocks = blocks.transpose(0, 3, 1, 4, 6, 2, 5)
        # each patch's pixels repeated for the temporal patch: [..., C, T, pixel row, pixel column]
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
        return frames.reshape(grid_h * grid_w, channels * t * p * p), (1, grid_h, grid_w)

    def preprocess(self, images: Sequence[Image.Image]) -> ImageInputs:
        """The vision tower's inputs for these pictures (converted to RGB as transformers converts them
        when not RGB already), one image after another in the order given."""
        patches, grids = [], []
        for image in images:
            rows, grid = self._patches(image)
            patches.append(rows)
            grids.append(grid)
        width = 3 * self.temporal_patch_size * self.patch_size * self.patch_size
        pixel_values = np.concatenate(patches) if patches else np.zeros((0, width), np.float32)
        return ImageInputs(np.ascontiguousarray(pixel_values, dtype=np.float32),
                           np.asarray(grids, dtype=np.int64).reshape(-1, 3))
