"""Gemma 3's image preprocessing (trt_llm/families/gemma3/processor.py) against transformers'.

The oracle is `Gemma3ImageProcessorPil`, the class `AutoProcessor` gives where torchvision is not
installed (this project installs none), called as `Gemma3Processor` calls it: with the processor's
own pan-and-scan defaults (`Gemma3Processor.images_kwargs`) and a call's overrides as keyword
arguments, which win over the preprocessor_config.json's values. The frames are compared with
np.array_equal: both resize with Pillow and round alike, so nothing is left to tolerate.

Measured once beside this, not run here (it needs torchvision, which the project does not install):
the torchvision `Gemma3ImageProcessor` differs from these frames by up to 2 uint8 levels (0.0157) on up
to 17% of the values of a resized frame, and by one float32 rounding (6e-8) elsewhere; the same crops.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from PIL import Image

from trt_llm.families.gemma3.processor import Gemma3ImageProcessor

transformers = pytest.importorskip("transformers")
from transformers import Gemma3Processor  # noqa: E402
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402

# google/gemma-3-4b-it's preprocessor_config.json (the pan-and-scan keys are null in the published files)
PUBLISHED = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}
IMAGE_SIZE, PATCH, POOLING = 896, 14, 4  # Gemma 3's SigLIP tower and its 4 x 4 average pool

# a call's pan-and-scan arguments (what a user passes to Gemma3Processor)
SETTINGS = {
    "plain": {},
    "pan_and_scan": {"do_pan_and_scan": True},
    "small_crops": {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 100, "pan_and_scan_max_num_crops": 7},
    "eager": {"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": 1.0, "pan_and_scan_max_num_crops": 2},
}


def _photo(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth gradients with noise on top, uint8 [H, W, 3]: both the soft and hard parts a resize rounds."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([127 + 100 * np.sin(x / 17.0), 127 + 100 * np.cos(y / 23.0), (x * 3 + y) % 256], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _pictures() -> dict[str, Image.Image]:
    rgba = _photo(400, 1100, 3)
    alpha = np.linspace(0, 255, 1100, dtype=np.uint8)[None, :].repeat(400, 0)
    palette = Image.fromarray(_photo(900, 300, 4)).quantize(colors=64)
    palette.info["transparency"] = 5  # one transparent palette entry: transformers composites it on white
    return {
        "square": Image.fromarray(_photo(896, 896, 0)),
        "landscape_4_3": Image.fromarray(_photo(480, 640, 1)),
        "wide_3_1": Image.fromarray(_photo(300, 900, 2)),
        "tall_1_3": Image.fromarray(_photo(1000, 333, 5)),
        "tiny_10x7": Image.fromarray(_photo(7, 10, 6)),
        "thin_2000x40": Image.fromarray(_photo(40, 2000, 7)),  # exaggerated, but too thin for a 256 crop
        "rgba": Image.fromarray(np.dstack([rgba, alpha]), "RGBA"),
        "palette": palette,
        "grayscale": Image.fromarray(_photo(700, 260, 8)[..., 0], "L"),
    }


PICTURES = _pictures()


def _ours(settings: dict) -> Gemma3ImageProcessor:
    return Gemma3ImageProcessor.from_config({**PUBLISHED, **settings}, IMAGE_SIZE, PATCH, POOLING)


def _theirs(pictures: list, settings: dict):
    """transformers' frames and num_crops, the image processor called as Gemma3Processor calls it."""
    processor = Gemma3ImageProcessorPil(**PUBLISHED)
    out = processor(pictures, **{**Gemma3Processor.images_kwargs, **settings}, return_tensors="np")
    return np.asarray(out["pixel_values"]), list(out["num_crops"])


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", list(PICTURES))
def test_frames_equal_transformers(name, setting):
    picture, settings = PICTURES[name], SETTINGS[setting]
    ours = _ours(settings)
    pixel_values, num_crops = _theirs([picture], settings)
    got = ours.preprocess([picture])
    assert got.pixel_values.dtype == np.float32 and got.pixel_values.shape == pixel_values.shape
    assert np.array_equal(got.pixel_values, pixel_values)
    assert ours.crops(picture.height, picture.width) == num_crops[0]
    side = IMAGE_SIZE // PATCH
    assert ours.grid_thw(picture.height, picture.width) == (1 + num_crops[0], side, side)
    assert got.image_grid_thw.tolist() == [[1 + num_crops[0], side, side]]


def test_crops_where_expected():
    """The cases above do make crops (a test of crops that never happen would prove nothing): counted
    by hand from the rule (aspect rounded half up, 2 to max crops, each at least min crop size)."""
    ours = _ours(SETTINGS["pan_and_scan"])
    assert ours.crops(300, 900) == 3  # 3:1 -> 3 crops of 300x300
    assert ours.crops(1000, 333) == 3  # portrait 3.003:1 -> 3 crops of 333x334
    assert ours.crops(480, 640) == 2  # 1.33 passes 1.2: rounds to 1, raised to the minimum 2 crops of 320 wide
    assert ours.crops(896, 896) == 0 and ours.crops(500, 590) == 0  # under the 1.2 ratio
    assert ours.crops(40, 2000) == 0  # 4 crops of 500x40: 40 < 256
    assert ours.crops(300, 3000) == 4  # 10:1 capped at 4 crops
    assert _ours(SETTINGS["small_crops"]).crops(300, 3000) == 7
    assert _ours(SETTINGS["plain"]).crops(300, 3000) == 0


def test_several_images_in_order():
    """Several pictures in one call: each whole image then its crops, one image after another, as
    transformers batches them (grouped by shape there, reordered back)."""
    names = ["wide_3_1", "square", "tall_1_3", "tiny_10x7", "wide_3_1"]
    pictures = [PICTURES[n] for n in names]
    settings = SETTINGS["pan_and_scan"]
    pixel_values, num_crops = _theirs(pictures, settings)
    got = _ours(settings).preprocess(pictures)
    assert np.array_equal(got.pixel_values, pixel_values)
    assert got.image_grid_thw[:, 0].tolist() == [1 + n for n in num_crops] == [4, 1, 4, 1, 4]
    # the runtime's token count: 256 soft tokens a frame
    assert [t * h * w // POOLING**2 for t, h, w in got.image_grid_thw.tolist()] == [1024, 256, 1024, 256, 1024]


def _coded(height: int, width: int) -> np.ndarray:
    """A [2, H, W] array whose values are their own row and column: a crop's first value says where it
    was cut, its shape how big."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([rows, cols]).astype(np.int32)


def _their_boxes(height: int, width: int, min_crop: int, max_crops: int, ratio: float) -> list[tuple]:
    crops = Gemma3ImageProcessorPil().pan_and_scan(_coded(height, width), min_crop, max_crops, ratio)
    boxes = []
    for crop in crops:
        h, w = crop.shape[1:]
        if crop.size:
            top, left = int(crop[0, 0, 0]), int(crop[1, 0, 0])
        else:  # a slice past the edge: the crops are one row or one column, so it starts at the far edge
            top, left = (height, 0) if h == 0 else (0, width)
        boxes.append((left, top, left + w, top + h))
    return boxes


def test_crop_boxes_equal_transformers_pan_and_scan():
    """Where each crop is cut, against transformers' pan_and_scan itself, over a sweep of sizes (both
    orientations, thresholds, rounding of the aspect at .5) and settings."""
    sizes = [(h, w) for h, w in itertools.product([1, 7, 255, 256, 300, 511, 512, 767, 1000, 1023], repeat=2)]
    sizes += [(200, 500), (200, 300), (1000, 2500), (2500, 1000), (256, 1281), (13, 1500)]
    settings = [(256, 4, 1.2), (100, 7, 1.2), (1, 5, 1.2), (300, 3, 2.0), (256, 4, 0.5), (64, 1, 1.2)]
    checked = with_crops = 0
    for (height, width), (min_crop, max_crops, ratio) in itertools.product(sizes, settings):
        ours = dataclasses.replace(_ours(SETTINGS["pan_and_scan"]), pan_and_scan_min_crop_size=min_crop,
                                   pan_and_scan_max_num_crops=max_crops, pan_and_scan_min_ratio_to_activate=ratio)
        theirs = _their_boxes(height, width, min_crop, max_crops, ratio)
        assert ours.crop_boxes(height, width) == theirs, (height, width, min_crop, max_crops, ratio)
        checked += 1
        with_crops += bool(theirs)
    assert with_crops > checked // 4  # the sweep is not all "no crops"


def test_empty_last_crop_is_a_black_frame_as_in_transformers():
    """A min crop size under the crop count can cut a crop past the edge (5 crops of 2 pixels from a
    7-pixel side): transformers' PIL class resizes the empty slice to a black frame and counts it."""
    settings = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 1, "pan_and_scan_max_num_crops": 5}
    picture = Image.fromarray(np.full((1, 7, 3), 200, np.uint8))
    pixel_values, num_crops = _theirs([picture], settings)
    got = _ours(settings).preprocess([picture])
    assert num_crops == [5] and got.image_grid_thw.tolist() == [[6, 64, 64]]
    assert np.array_equal(got.pixel_values, pixel_values)
    assert (got.pixel_values[-1] == -1.0).all()


def test_defaults_are_transformers():
    """An empty config (or the published one, all null) takes transformers' values: the image
    processor class's resample / mean / std / rescale, Gemma3Processor's pan-and-scan defaults."""
    for config in ({}, PUBLISHED):
        ours = Gemma3ImageProcessor.from_config(config, IMAGE_SIZE, PATCH, POOLING)
        defaults = Gemma3Processor.images_kwargs
        assert ours.do_pan_and_scan is defaults["do_pan_and_scan"] is False
        assert ours.pan_and_scan_min_crop_size == defaults["pan_and_scan_min_crop_size"]
        assert ours.pan_and_scan_max_num_crops == defaults["pan_and_scan_max_num_crops"]
        assert ours.pan_and_scan_min_ratio_to_activate == defaults["pan_and_scan_min_ratio_to_activate"]
        assert ours.resample == Gemma3ImageProcessorPil.resample
        assert ours.image_mean == tuple(Gemma3ImageProcessorPil.image_mean)
        assert ours.image_std == tuple(Gemma3ImageProcessorPil.image_std)
        assert ours.rescale_factor == Gemma3ImageProcessorPil.rescale_factor
        assert ours.frame_tokens == 256 and ours.grid_thw(10, 7) == (1, 64, 64)
    # the empty config's frames are the published config's (size from the tower, bilinear, 0.5 / 0.5)
    picture = PICTURES["landscape_4_3"]
    empty = Gemma3ImageProcessor.from_config({}, IMAGE_SIZE, PATCH, POOLING).preprocess([picture])
    assert np.array_equal(empty.pixel_values, _theirs([picture], {})[0])


def test_config_values_are_read():
    """A config's own values reach the frames (here: bicubic, other mean / std, the file's pan-and-scan on)."""
    # the image processor alone needs every pan-and-scan key once it is on (null ones fail in its arithmetic)
    config = {**PUBLISHED, "resample": 3, "image_mean": 0.25, "image_std": [0.2, 0.3, 0.4], "do_pan_and_scan": True,
              "pan_and_scan_max_num_crops": 2, "pan_and_scan_min_crop_size": 256,
              "pan_and_scan_min_ratio_to_activate": 1.2}
    ours = Gemma3ImageProcessor.from_config(config, IMAGE_SIZE, PATCH, POOLING)
    picture = PICTURES["wide_3_1"]
    theirs = Gemma3ImageProcessorPil(**config)(picture, return_tensors="np")  # the image processor alone
    assert ours.crops(picture.height, picture.width) == list(theirs["num_crops"])[0] == 2
    assert np.array_equal(ours.preprocess([picture]).pixel_values, np.asarray(theirs["pixel_values"]))


@pytest.mark.parametrize(("change", "key"), [
    ({"size": {"height": 448, "width": 448}}, "size"),
    ({"size": {"shortest_edge": 896}}, "size"),
    ({"size": {"height": 896, "width": 0}}, "size.width"),
    ({"resample": 9}, "resample"),
    ({"resample": "bilinear"}, "resample"),
    ({"do_resize": False}, "do_resize"),
    ({"do_pan_and_scan": "yes"}, "do_pan_and_scan"),
    ({"pan_and_scan_min_crop_size": 0}, "pan_and_scan_min_crop_size"),
    ({"pan_and_scan_max_num_crops": 2.5}, "pan_and_scan_max_num_crops"),
    ({"pan_and_scan_min_ratio_to_activate": "1.2"}, "pan_and_scan_min_ratio_to_activate"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
    ({"image_std": [0.5, 0, 0.5]}, "image_std"),
    ({"rescale_factor": float("nan")}, "rescale_factor"),
    ({"do_normalize": 1}, "do_normalize"),
])
def test_bad_config_names_its_key(change, key):
    with pytest.raises(ValueError, match=rf"^image processor config: {key} "):
        Gemma3ImageProcessor.from_config({**PUBLISHED, **change}, IMAGE_SIZE, PATCH, POOLING)


def test_bad_geometry():
    with pytest.raises(ValueError, match="vision config: image_size 896 is not a whole number of 5 x 14"):
        Gemma3ImageProcessor.from_config({}, IMAGE_SIZE, PATCH, 5)
    with pytest.raises(ValueError, match="vision config: pooling must be a positive integer"):
        Gemma3ImageProcessor.from_config({}, IMAGE_SIZE, PATCH, 0)


def test_bad_pictures():
    ours = _ours(SETTINGS["pan_and_scan"])
    with pytest.raises(ValueError, match="image of 0x5 pixels: empty"):
        ours.preprocess([Image.new("RGB", (0, 5))])
    with pytest.raises(ValueError, match="image 1: expected a decoded picture"):
        ours.preprocess([PICTURES["square"], np.zeros((5, 5, 3), np.uint8)])
    empty = ours.preprocess([])
    assert empty.pixel_values.shape == (0, 3, 896, 896) and empty.image_grid_thw.shape == (0, 3)
