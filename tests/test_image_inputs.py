"""Image inputs of the VLMs: runtime/media/sources.py turns a content part's source into an RGB picture and
runtime/media/vision/processor.py into the vision tower's inputs, both equal to transformers.

The oracle is transformers' `Qwen2VLImageProcessorPil` (the processor Qwen2.5-VL and Qwen3-VL use,
without torchvision) given the same file as Pillow opens it: pixel_values within 1e-5 and the grids
identical, with Qwen2.5-VL's and Qwen3-VL's real settings and with token limits, on real photographs
(scikit-image's and matplotlib's sample data, read from the installed wheels) and on generated files
for every decoding path (alpha, grayscale, palette, CMYK, 16-bit, GIF, WebP, EXIF, tiny, long)."""

import base64
import copy
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers import Qwen2VLImageProcessorPil
from transformers.image_utils import load_image as hf_load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

from trt_llm.runtime.media.vision.processor import ImageProcessor, smart_resize
from trt_llm.runtime.media.sources import MediaError, load_image, media_bytes
from vlm_assets import PREPROCESSOR, VLM_FAMILIES

TOLERANCE = 1e-5
PHOTOS = {"astronaut": "astronaut.png", "chelsea": "chelsea.png", "coffee": "coffee.png", "rocket": "rocket.jpg",
          "grace_hopper": "grace_hopper.jpg"}


def _package_file(package: str, *parts: str) -> Path | None:
    """A data file inside an installed package, found without importing it (nothing is downloaded)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    return path if path.is_file() else None


def photo(name: str) -> Path:
    if name == "grace_hopper":
        path = _package_file("matplotlib", "mpl-data", "sample_data", PHOTOS[name])
        reason = "matplotlib's sample data (pip install matplotlib)"
    else:
        path = _package_file("skimage", "data", PHOTOS[name])
        reason = "scikit-image's data files (pip install scikit-image)"
    if path is None:
        pytest.skip(f"{PHOTOS[name]} needs {reason}")
    return path


def _pattern(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise [H, W, 3] uint8: detail for bicubic resampling to get wrong."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width]
    base = np.stack([rows * 255 / max(height - 1, 1), cols * 255 / max(width - 1, 1),
                     127 + 120 * np.sin((rows + cols) / 7)], axis=-1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def _make_files(folder: Path) -> dict[str, Path]:
    rgb = _pattern(120, 160)
    files = {}

    def save(name: str, image: Image.Image, **kwargs) -> None:
        files[name.split(".")[0]] = folder / name
        image.save(folder / name, **kwargs)

    alpha = np.linspace(0, 255, 160, dtype=np.uint8)[None, :].repeat(120, 0)  # transparent to opaque
    save("rgba.png", Image.fromarray(np.dstack([rgb, alpha])))
    save("gray.png", Image.fromarray(rgb[..., 0]))
    save("gray_alpha.png", Image.fromarray(np.dstack([rgb[..., 0], alpha])))
    palette = Image.fromarray(rgb).quantize(32)
    save("palette_transparent.png", palette, transparency=3)
    save("rgb_transparent.png", Image.fromarray(rgb), transparency=tuple(int(v) for v in rgb[0, 0]))
    save("gray16.png", Image.fromarray(rgb[..., 1].astype(np.uint16) * 4))  # I;16, partly over 255
    save("cmyk.jpg", Image.fromarray(rgb).convert("CMYK"), quality=95)
    save("photo.webp", Image.fromarray(rgb), quality=90)
    save("alpha.webp", Image.fromarray(np.dstack([rgb, alpha])), lossless=True)
    frames = [Image.fromarray(_pattern(120, 160, seed)).quantize(64) for seed in (1, 2)]
    save("two_frames.gif", frames[0], save_all=True, append_images=frames[1:], duration=100, loop=0)
    save("tiny.png", Image.fromarray(_pattern(10, 10)))
    save("wide.png", Image.fromarray(_pattern(50, 2000)))
    save("tall.jpg", Image.fromarray(_pattern(2000, 50)), quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the stored picture is to be turned 90 degrees clockwise
    save("exif_rotated.jpg", Image.fromarray(rgb), exif=exif.tobytes(), quality=95)
    return files


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    return _make_files(tmp_path_factory.mktemp("images"))


GENERATED = ("rgba", "gray", "gray_alpha", "palette_transparent", "rgb_transparent", "gray16", "cmyk", "photo",
             "alpha", "two_frames", "tiny", "wide", "tall", "exif_rotated")


def _image_path(name: str, generated: dict[str, Path]) -> Path:
    return generated[name] if name in generated else photo(name)


def _hf_input(path: Path) -> Image.Image:
    """The picture as transformers' processor gets it: Pillow's file for the processor to convert,
    except for the EXIF case, whose upright form is `transformers.image_utils.load_image`'s."""
    return hf_load_image(str(path)) if path.stem == "exif_rotated" else Image.open(path)


_HF = {}


def hf_processor(family: str, **overrides) -> Qwen2VLImageProcessorPil:
    key = (family, tuple(sorted(overrides.items())))
    if key not in _HF:
        # A deep copy: given min_pixels, transformers writes it into the `size` dict it was passed.
        _HF[key] = Qwen2VLImageProcessorPil(**copy.deepcopy({**PREPROCESSOR[family], **overrides}))
    return _HF[key]


def assert_same(ours, theirs) -> None:
    np.testing.assert_array_equal(ours.image_grid_thw, theirs["image_grid_thw"])
    assert ours.image_grid_thw.dtype == np.int64 and ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == theirs["pixel_values"].shape
    assert np.abs(ours.pixel_values - theirs["pixel_values"]).max() <= TOLERANCE


# ------------------------------------------------------------------------------------------------
# The processor against transformers


@pytest.mark.parametrize("name", [*PHOTOS, *GENERATED])
@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_pixels_equal_transformers(family, name, generated):
    path = _image_path(name, generated)
    ours = ImageProcessor.from_config(PREPROCESSOR[family]).preprocess([load_image(str(path))])
    assert_same(ours, hf_processor(family)([_hf_input(path)], return_tensors="np"))


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_token_limits_equal_transformers_pixel_bounds(family, generated):
    """max 64 tokens per image: transformers given the same bounds as pixels, on every image."""
    processor = ImageProcessor.from_config(PREPROCESSOR[family]).with_token_limits(4, 64)
    block = processor.factor ** 2
    assert (processor.min_pixels, processor.max_pixels) == (4 * block, 64 * block)
    hf = hf_processor(family, min_pixels=4 * block, max_pixels=64 * block)
    for name in [*PHOTOS, "rgba", "tiny", "wide", "tall"]:
        path = _image_path(name, generated)
        image = load_image(str(path))
        ours = processor.preprocess([image])
        assert_same(ours, hf([_hf_input(path)], return_tensors="np"))
        tokens = processor.num_image_tokens(image.height, image.width)
        assert tokens == len(ours.pixel_values) // 4 == hf.get_number_of_image_patches(image.height, image.width) // 4
        assert 4 <= tokens <= 64, name


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_several_images_in_one_call(family, generated):
    """The patches of each image one after another, as transformers concatenates them."""
    paths = [photo("astronaut"), generated["rgba"], generated["wide"], generated["tiny"]]
    processor = ImageProcessor.from_config(PREPROCESSOR[family])
    ours = processor.preprocess([load_image(str(p)) for p in paths])
    assert_same(ours, hf_processor(family)([_hf_input(p) for p in paths], return_tensors="np"))
    assert ours.image_grid_thw.shape == (4, 3)


def test_build_default_token_limits_on_the_small_and_the_long():
    """The build defaults (4 and 512 tokens): a 10x10 picture is scaled up to 2x2 merged tokens, a
    2000x50 one keeps its shape; both counts straight from the size, as the prompt needs them."""
    for family, tiny_side, wide in (("qwen2_5_vl", 56, (56, 1988)), ("qwen3_vl", 64, (64, 1984))):
        processor = ImageProcessor.from_config(PREPROCESSOR[family]).with_token_limits(4, 512)
        assert processor.resized_size(10, 10) == (tiny_side, tiny_side)
        assert processor.num_image_tokens(10, 10) == 4
        assert processor.resized_size(50, 2000) == wide
        assert processor.grid_thw(50, 2000) == (1, wide[0] // processor.patch_size, wide[1] // processor.patch_size)


def test_smart_resize_equals_transformers():
    rng = np.random.default_rng(0)
    sizes = [(10, 10), (50, 2000), (2000, 50), (1, 200), (200, 1), (28, 28), (42, 42), (14, 70), (4000, 3000)]
    sizes += [tuple(int(v) for v in np.exp(rng.uniform(0, np.log(6000), 2))) for _ in range(400)]
    bounds = [(3136, 12845056), (65536, 16777216), (4 * 784, 64 * 784), (4 * 1024, 512 * 1024), (784, 784)]
    for height, width in sizes:
        for factor in (28, 32):
            for low, high in bounds:
                try:
                    expected = hf_smart_resize(height, width, factor, low, high)
                except ValueError:
                    with pytest.raises(ValueError, match="aspect ratio"):
                        smart_resize(height, width, factor, low, high)
                    continue
                assert smart_resize(height, width, factor, low, high) == expected, (height, width, factor, low, high)


def test_aspect_ratio_over_200_is_a_clear_error():
    processor = ImageProcessor.from_config(PREPROCESSOR["qwen2_5_vl"])
    assert processor.num_image_tokens(1, 200) > 0  # 200:1 is still accepted
    with pytest.raises(ValueError, match=r"image of 201x1 pixels: aspect ratio 201\.0:1 is over 200:1"):
        processor.num_image_tokens(1, 201)
    with pytest.raises(ValueError, match="aspect ratio"):
        processor.preprocess([Image.new("RGB", (3, 1000))])
    with pytest.raises(ValueError, match="empty"):
        smart_resize(0, 10, 28, 3136, 12845056)


def test_config_forms_and_defaults(generated):
    """Both ways of giving the pixel bounds; min_pixels/max_pixels winning over size as in
    transformers; a config without keys equal to transformers' class defaults."""
    legacy = ImageProcessor.from_config({"min_pixels": 1000, "max_pixels": 200000})
    sized = ImageProcessor.from_config({"size": {"shortest_edge": 1000, "longest_edge": 200000}})
    assert legacy == sized and (legacy.min_pixels, legacy.max_pixels) == (1000, 200000)
    both = {"size": {"shortest_edge": 1000, "longest_edge": 200000}, "max_pixels": 50000}
    assert ImageProcessor.from_config(both).max_pixels == 50000
    qwen3 = ImageProcessor.from_config(PREPROCESSOR["qwen3_vl"])
    assert (qwen3.patch_size, qwen3.min_pixels, qwen3.max_pixels, qwen3.image_mean) == (16, 65536, 16777216,
                                                                                         (0.5, 0.5, 0.5))
    image = Image.open(photo("chelsea"))
    for config in ({}, both):
        ours = ImageProcessor.from_config(config).preprocess([load_image(str(photo("chelsea")))])
        assert_same(ours, Qwen2VLImageProcessorPil(**copy.deepcopy(config))([image], return_tensors="np"))
    assert ImageProcessor.from_config({}) == ImageProcessor()


@pytest.mark.parametrize("config, message", [
    ({"do_resize": False}, "do_resize"),
    ({"size": {"height": 224, "width": 224}}, "shortest_edge"),
    ({"min_pixels": 5000, "max_pixels": 4000}, "min_pixels 5000 is over max_pixels 4000"),
    ({"patch_size": 0}, "patch_size must be a positive integer"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
    ({"resample": 99}, "resample"),
])
def test_bad_configs_are_clear_errors(config, message):
    with pytest.raises(ValueError, match=message):
        ImageProcessor.from_config(config)


def test_bad_token_limits_are_clear_errors():
    processor = ImageProcessor()
    with pytest.raises(ValueError, match="min_tokens 8 is over max_tokens 4"):
        processor.with_token_limits(8, 4)
    with pytest.raises(ValueError, match="min_tokens must be a positive integer"):
        processor.with_token_limits(0, 4)


def test_no_images():
    out = ImageProcessor.from_config(PREPROCESSOR["qwen3_vl"]).preprocess([])
    assert out.pixel_values.shape == (0, 3 * 2 * 16 * 16) and out.image_grid_thw.shape == (0, 3)


# ------------------------------------------------------------------------------------------------
# Sources and decoding


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def test_every_form_of_a_source_gives_the_same_pixels(generated, tmp_path, monkeypatch):
    source = tmp_path / "sub dir" / "my photo.png"
    source.parent.mkdir()
    source.write_bytes(generated["rgba"].read_bytes())
    expected = np.asarray(load_image(str(source)))
    assert expected.shape == (120, 160, 3)
    url_path = str(source).replace(" ", "%20")
    forms = [("sub dir/my photo.png", tmp_path), (str(source), None), (f"file://{url_path}", None),
             (f"file://localhost{url_path}", None), (_data_url(source, "image/png"), None)]
    b64 = base64.b64encode(source.read_bytes()).decode()
    forms.append(("data:image/png;base64," + "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76)), None))
    forms.append(("data:image/png;base64," + b64.replace("+", "%2B").replace("/", "%2F"), None))
    for form, base_dir in forms:
        image = load_image(form, base_dir)
        assert image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), expected, err_msg=form[:60])
    monkeypatch.chdir(tmp_path)  # a relative path without a folder is the working directory's
    np.testing.assert_array_equal(np.asarray(load_image("sub dir/my photo.png")), expected)


def test_alpha_is_composited_onto_white(generated):
    """Fully transparent pixels become white whatever colour they store, as transformers' processor
    converts them (its `load_image(path)` instead drops the alpha and keeps the stored colour)."""
    rgba = np.asarray(Image.open(generated["rgba"]))
    ours = np.asarray(load_image(str(generated["rgba"]))).astype(int)
    assert (ours[:, 0] == 255).all() and (ours[:, -1] == rgba[:, -1, :3]).all()
    assert not (np.asarray(hf_load_image(str(generated["rgba"])))[:, 0] == 255).all()


def test_gif_first_frame_and_exif_orientation(generated):
    gif = Image.open(generated["two_frames"])
    first = np.asarray(gif.convert("RGB"))
    gif.seek(1)
    second = np.asarray(gif.convert("RGB"))
    ours = np.asarray(load_image(str(generated["two_frames"])))
    np.testing.assert_array_equal(ours, first)
    assert not np.array_equal(ours, second)

    upright = load_image(str(generated["exif_rotated"]))
    assert upright.size == (120, 160)  # stored 160x120, turned
    np.testing.assert_array_equal(np.asarray(upright), np.asarray(hf_load_image(str(generated["exif_rotated"]))))


def test_remote_urls_are_refused():
    for url in ("http://example.com/cat.png", "https://example.com/cat.png", "HTTPS://example.com/x.jpg",
                "ftp://example.com/cat.png", "s3://bucket/cat.png"):
        with pytest.raises(MediaError, match="nothing is fetched") as error:
            load_image(url)
        assert url in str(error.value)


def _error(source: str, base_dir=None, kind="image") -> str:
    with pytest.raises(MediaError) as error:
        if kind == "image":
            load_image(source, base_dir)
        else:
            media_bytes(source, base_dir, kind)
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_unreadable_sources_are_one_line_errors(tmp_path, generated):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "garbage.jpg").write_bytes(np.random.default_rng(0).bytes(3000))
    png = generated["rgba"].read_bytes()
    (tmp_path / "truncated.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "folder.png").mkdir()
    ico = tmp_path / "icon.ico"
    Image.new("RGB", (16, 16)).save(ico)

    message = _error("missing.png", tmp_path)
    assert f"'missing.png' ({str(tmp_path / 'missing.png')!r}): no such file" in message
    assert "no such file" in _error(f"file://{tmp_path}/missing.png")
    assert "is a directory" in _error("folder.png", tmp_path)
    assert f"'{tmp_path / 'empty.png'}': the file is empty" in _error(str(tmp_path / "empty.png"))
    assert "'garbage.jpg'" in (message := _error("garbage.jpg", tmp_path)) and "not an image" in message
    assert "'truncated.png'" in (message := _error("truncated.png", tmp_path)) and "cannot decode" in message
    assert "not an image in a supported format" in _error(str(ico))
    assert "bad base64 payload" in _error("data:image/png;base64,iVBORw0KGgo*not base64*")
    assert "a data URL of type 'text/plain', not image/*" in _error("data:text/plain;base64,aGVsbG8=")
    assert "not image/*" in _error("data:,hello")
    assert "holds no data" in _error("data:image/png;base64,")
    assert "needs a comma" in _error("data:image/png;base64")
    assert "host 'server'" in _error("file://server/share/cat.png")
    assert "empty" in _error("  ")
    assert "not a valid path" in _error("cat\x00.png", tmp_path)
    long_url = _data_url(generated["rgba"], "image/jpeg")[:2000] + "@@"
    assert "(2,002 characters)" in (message := _error(long_url)) and len(message) < 300


def test_media_bytes_is_generic_over_the_kind(tmp_path):
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF....WAVE")
    assert media_bytes("clip.wav", tmp_path, "audio") == (b"RIFF....WAVE", f"'clip.wav' ({str(clip)!r})")
    data, name = media_bytes("data:audio/wav;base64," + base64.b64encode(b"RIFF").decode(), None, "audio")
    assert data == b"RIFF" and name.startswith("'data:audio/wav")
    assert "not audio/*" in _error("data:image/png;base64,aGVsbG8=", kind="audio")


def test_decompression_bombs_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    # 1,600 pixels: over the limit (Pillow only warns); 10,000: over twice it (Pillow raises).
    for side in (40, 100):
        Image.new("L", (side, side)).save(tmp_path / f"bomb{side}.png")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            message = _error(f"bomb{side}.png", tmp_path)
        assert f"'bomb{side}.png'" in message and "decompression bomb" in message
        assert not caught
