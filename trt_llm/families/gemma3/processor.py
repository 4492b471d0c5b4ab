"""Gemma 3 image preprocessing in numpy and Pillow (the runtime has no torch): transformers'
`Gemma3ImageProcessorPil` step for step, so the frames are equal, not merely close
(tests/test_gemma3_processor.py compares them).

Which transformers class this is: `AutoProcessor` / `AutoImageProcessor` pick the torchvision
`Gemma3ImageProcessor` where torchvision is installed and `Gemma3ImageProcessorPil` where it is not
(transformers 5.24, `_resolve_backend`). This project installs no torchvision, so the PIL class is what
its transformers runs, and the only one whose resize is Pillow's. The torchvision class resizes
the uint8 tensor with its own antialiased bilinear filter and fuses rescale and normalize into one
float32 multiply-add: measured against this on photo-like and noise pictures of 10x7 to 1600x1200
(torchvision 0.28, with and without crops), a frame's values differ by up to 2 uint8 levels (0.0157
after the 0.5 / 0.5 normalization) on up to 17% of them (the most where a picture is scaled down;
none where it is not resized), and by one float32 rounding (6e-8) everywhere else; its crops and
counts are the same.

An image is resized to `size` (image_size x image_size, bilinear by default) whole, squeezed whatever
its aspect. With pan-and-scan on, an image whose long side is at least
`pan_and_scan_min_ratio_to_activate` times its short side is also cut along its long side into 2 to
`pan_and_scan_max_num_crops` crops of equal size (the last one shorter where the side does not
divide), about as many as the aspect ratio rounded half up, fewer where a crop would be under
`pan_and_scan_min_crop_size`; none where even so a crop is under that size. Each crop is cut from the
original picture and resized to a frame on its own; the frames are the whole image, then its crops,
left to right or top to bottom. The bytes are scaled in float64, stored as float32 and normalized in
float32, as transformers does.

Gemma3Processor's own pan-and-scan defaults (off, 256, 4, 1.2) are passed to the image processor at
every call and so win over the preprocessor_config.json's values: through `Gemma3Processor`, only a
call's `do_pan_and_scan=True` (and its other pan_and_scan_* arguments) turns it on. `from_config`
takes the file's values where they are set (the published files have null: off), as the image
processor alone does; a runtime that turns pan-and-scan on per request sets `do_pan_and_scan` on a
copy (`dataclasses.replace`).
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

BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, the processor's default
# Gemma3Processor.images_kwargs: the values it passes when preprocessor_config.json has null
MIN_CROP_SIZE = 256
MAX_NUM_CROPS = 4
MIN_RATIO_TO_ACTIVATE = 1.2


class FrameInputs(NamedTuple):
    pixel_values: np.ndarray  # [frames, 3, S, S] float32: each image whole, then its crops
    image_grid_thw: np.ndarray  # [images, 3] int64: frames, patches a side, patches a side


def _frame_side(size, image_size: int) -> int:
    """The frame's side from `size` ({"height": S, "width": S}), which must be the tower's image_size."""
    if size is None:
        return image_size
    if not isinstance(size, dict) or set(size) != {"height", "width"}:
        raise ValueError(f'image processor config: size must be {{"height": pixels, "width": pixels}}, got {size!r}')
    height, width = (positive_int(f"size.{key}", size[key]) for key in ("height", "width"))
    if height != image_size or width != image_size:
        raise ValueError(f"image processor config: size {width}x{height} is not the vision tower's image_size "
                         f"{image_size} square: its frames would not give the model's patch grid")
    return image_size


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    image_size: int  # a frame's side in pixels (size.height = size.width)
    patch_size: int
    pooling: int  # patches a side per soft token (the projector's average pool)
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = MIN_CROP_SIZE
    pan_and_scan_max_num_crops: int = MAX_NUM_CROPS
    pan_and_scan_min_ratio_to_activate: float = MIN_RATIO_TO_ACTIVATE
    resample: int = BILINEAR
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_config(cls, preprocessor: dict, image_size: int, patch_size: int, pooling: int) -> Gemma3ImageProcessor:
        """From a preprocessor_config.json's dict and the tower's geometry (the vision config). A key that
        is absent or null takes transformers' default (the processor's, for the pan-and-scan ones).
        do_convert_rgb is not read: every picture is made RGB (false would hand the tower a grey or RGBA
        picture's 1 or 4 channels, which transformers' own normalize refuses)."""
        for key, value in (("image_size", image_size), ("patch_size", patch_size), ("pooling", pooling)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"vision config: {key} must be a positive integer, got {value!r}")
        if image_size % patch_size or (image_size // patch_size) % pooling:
            raise ValueError(f"vision config: image_size {image_size} is not a whole number of {pooling} x "
                             f"{patch_size}-pixel patches a side")
        config = {key: value for key, value in preprocessor.items() if value is not None}
        if config.get("do_resize", True) is not True:
            raise ValueError(f"image processor config: do_resize must be true (the tower takes {image_size}-pixel "
                             f"frames), got {config['do_resize']!r}")
        fields = {"do_pan_and_scan": flag("do_pan_and_scan", config.get("do_pan_and_scan", False))}
        for key in ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops"):
            if key in config:
                fields[key] = positive_int(key, config[key])
        if "pan_and_scan_min_ratio_to_activate" in config:
            fields["pan_and_scan_min_ratio_to_activate"] = number("pan_and_scan_min_ratio_to_activate",
                                                                   config["pan_and_scan_min_ratio_to_activate"])
        if "resample" in config:
            if config["resample"] not in [r.value for r in Image.Resampling] or isinstance(config["resample"], bool):
                raise ValueError(f"image processor config: resample must be a PIL resampling filter (0-5), "
                                 f"got {config['resample']!r}")
            fields["resample"] = int(config["resample"])
        fields.update({key: per_channel(key, config[key]) for key in ("image_mean", "image_std") if key in config})
        if any(s == 0 for s in fields.get("image_std", ())):
            raise ValueError(f"image processor config: image_std must not be 0, got {config['image_std']!r}")
        fields.update({key: flag(key, config[key]) for key in ("do_rescale", "do_normalize") if key in config})
        if "rescale_factor" in config:
            fields["rescale_factor"] = number("rescale_factor", config["rescale_factor"])
        return cls(_frame_side(config.get("size"), image_size), patch_size, pooling, **fields)

    @property
    def frame_tokens(self) -> int:
        """Soft tokens a frame gives (Gemma 3: (896 / 14 / 4)^2 = 256)."""
        return (self.image_size // self.patch_size) ** 2 // (self.pooling * self.pooling)

    def crop_boxes(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """The pan-and-scan crops of a picture as (left, top, right, bottom) boxes, transformers'
        pan_and_scan line for line; [] where it makes none."""
        if height <= 0 or width <= 0:
            raise ValueError(f"image of {width}x{height} pixels: empty")
        if not self.do_pan_and_scan:
            return []
        min_crop, max_crops = self.pan_and_scan_min_crop_size, self.pan_and_scan_max_num_crops
        if width >= height:  # square or landscape: crops side by side
            if width / height < self.pan_and_scan_min_ratio_to_activate:
                return []
            across = min(int(math.floor(width / min_crop)), int(math.floor(width / height + 0.5)))
            across, down = min(max_crops, max(2, across)), 1
        else:  # portrait: crops one above the other
            if height / width < self.pan_and_scan_min_ratio_to_activate:
                return []
            down = min(int(math.floor(height / min_crop)), int(math.floor(height / width + 0.5)))
            across, down = 1, min(max_crops, max(2, down))
        crop_w, crop_h = int(math.ceil(width / across)), int(math.ceil(height / down))
        if min(crop_w, crop_h) < min_crop:
            return []
        # transformers slices the array: a crop past the edge is cut short there, and where the crop count
        # passes the side (only with a min crop size under the max crop count: 5 crops of a 7x1 picture)
        # the last is empty, which Pillow resizes to a black frame; the PIL class sends that frame (the
        # torchvision class raises), so it is kept, and the prompt's count with it
        return [(min(x, width), min(y, height), min(x + crop_w, width), min(y + crop_h, height))
                for y in range(0, crop_h * down, crop_h) for x in range(0, crop_w * across, crop_w)]

    def crops(self, height: int, width: int) -> int:
        """How many pan-and-scan crops a picture gets (transformers' num_crops; 0: none)."""
        return len(self.crop_boxes(height, width))

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """(frames, patches a side, patches a side) of a picture: frames = 1 + its crops; the picture's
        soft tokens are frames * frame_tokens."""
        side = self.image_size // self.patch_size
        return 1 + self.crops(height, width), side, side

    def frames(self, image: Image.Image) -> list[Image.Image]:
        """The picture's frames, uint8 RGB: the whole picture resized, then each crop resized."""
        image = to_rgb(image)
        pieces = [image] + [image.crop(box) for box in self.crop_boxes(image.height, image.width)]
        size = (self.image_size, self.image_size)
        # Pillow hands back an unchanged copy where the size is already right, as transformers gets
        return [piece.resize(size, resample=self.resample) for piece in pieces]

    def normalized(self, frame: Image.Image) -> np.ndarray:
        return rescaled(self, np.asarray(frame)).transpose(2, 0, 1)  # [3, S, S]

    def preprocess(self, pictures: list) -> FrameInputs:
        """The vision tower's inputs for these pictures (PIL images, made RGB as transformers makes
        them), one image after another in the order given."""
        frames, grids = [], []
        side = self.image_size // self.patch_size
        for index, picture in enumerate(pictures):
            if not isinstance(picture, Image.Image):
                raise ValueError(f"image {index}: expected a decoded picture (PIL image), got {type(picture).__name__}")
            own = self.frames(picture)
            frames += [self.normalized(frame) for frame in own]
            grids.append((len(own), side, side))
        pixel_values = np.stack(frames) if frames else np.zeros((0, 3, self.image_size, self.image_size), np.float32)
        return FrameInputs(np.ascontiguousarray(pixel_values, dtype=np.float32),
                           np.asarray(grids, dtype=np.int64).reshape(-1, 3))
