"""The vision component at run time: images -> the rows the decoder reads at their image tokens.

One encoder call takes every image of a request not seen before (one graph run: each image is its own
attention segment), and keeps each image's rows under a hash of its file's bytes
(runtime/media/encoder_cache.py). The component's config (build/vision_stage.py) says how to feed the
graph; the image processor is the checkpoint's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from trt_llm.families.adapters import adapter
from trt_llm.runtime.media.encoder_cache import EncoderCache, content_key
from trt_llm.runtime.media.encoder_session import encoder_session
from trt_llm.runtime.media.vision.processor import ImageProcessor
from trt_llm.runtime.media.sources import MediaError, decode_image

CACHE_IMAGES = 64  # encoded images kept (their rows are small beside the decoder's KV cache)


@dataclass(frozen=True)
class EncodedImage:
    grid: tuple[int, int, int]  # (t, h, w) in patches
    embeds: np.ndarray  # [tokens, H] rows for the decoder's image tokens
    deepstack: np.ndarray | None  # [k, tokens, H] Qwen3-VL's early-layer features

    @property
    def tokens(self) -> int:
        return self.embeds.shape[0]


@dataclass
class PendingImage:
    """A decoded image before encoding: its content key and the grid it will be cut into."""
    key: str
    picture: object  # PIL.Image
    grid: tuple[int, int, int]


class VisionEncoder:
    def __init__(self, engine_dir, threads: int = 0):
        self.settings = json.loads(engine_dir.component_path("vision", "config").read_text())
        preprocessor = json.loads(engine_dir.component_path("vision", "preprocessor").read_text())
        s = self.settings
        # The tower's host inputs for the images' grids (trt_llm/families/adapters.py, named by the manifest)
        self.adapter = adapter(engine_dir.adapter_name("vision"), s)
        # Qwen's patches, unless the family's adapter brings its own image processor (SmolVLM's tiles)
        own_processor = getattr(self.adapter, "image_processor", None)
        self.processor = own_processor(preprocessor) if own_processor else token_limited(
            ImageProcessor.from_config(preprocessor), s["min_image_tokens"], s["max_image_tokens_per_image"])
        self.merge = s["merge_size"]
        self.image_token_id = s["image_token_id"]
        self.max_request_tokens = s["max_image_tokens"]
        self.session = encoder_session(engine_dir, "vision", threads)
        self.engine_dir = engine_dir  # a video's settings read from it when the first one comes
        self.cache = EncoderCache(CACHE_IMAGES)
        self.encoded_images = 0  # graph work done: images and their tokens, and the time it took
        self.encoded_tokens = 0
        self.encode_seconds = 0.0
        self.profiler = None  # a runtime.profiler.Profiler: images, their tokens, the encoder's time

    def pending(self, data: bytes, name: str) -> PendingImage:
        """An image's file bytes, decoded and sized (a MediaError names it when it cannot be)."""
        picture = decode_image(data, name)
        try:
            grid = self.processor.grid_thw(picture.height, picture.width)
        except ValueError as error:
            raise MediaError(f"image {name}: {error}") from None
        key = content_key(data)
        return PendingImage(key, picture, grid)

    def tokens_of(self, image: PendingImage) -> int:
        t, h, w = image.grid
        return t * h * w // (self.merge * self.merge)

    def encode(self, images: list[PendingImage]) -> list[EncodedImage]:
        """The rows of each image, from the cache or from one graph run over those not in it."""
        started = time.perf_counter()
        encoded, missing = self.cache.encode(images, self._run)
        if missing:
            elapsed = time.perf_counter() - started
            tokens = sum(self.tokens_of(image) for image in missing)
            self.encoded_images += len(missing)
            self.encoded_tokens += tokens
            self.encode_seconds += elapsed
            if self.profiler:
                self.profiler.stages["vision_encode"].append(elapsed * 1000)
                self.profiler.count("vision_encoded_tokens", tokens)
        if self.profiler:
            self.profiler.count("images", len(images))
            self.profiler.count("image_tokens", sum(self.tokens_of(image) for image in images))
        return encoded

    def _run(self, images: list[PendingImage]) -> list[EncodedImage]:
        inputs = self.processor.preprocess([image.picture for image in images])
        return self.run_patches(inputs.pixel_values, inputs.image_grid_thw)

    def run_patches(self, pixel_values: np.ndarray, grid_thw) -> list[EncodedImage]:
        """One graph run over patches already cut (images', or a video's: runtime/media/video), each
        grid (t, h, w) its own item; the rows of each."""
        grids = [tuple(int(v) for v in row) for row in grid_thw]
        feeds = {"pixel_values": pixel_values.astype(self.session.input_dtype("pixel_values")),
                 **self.adapter.feeds(grids)}
        outputs = self.session.run(feeds)
        embeds, deepstack = outputs[0], outputs[1] if len(outputs) > 1 else None
        encoded, start = [], 0
        for grid in grids:
            count = grid[0] * grid[1] * grid[2] // (self.merge * self.merge)
            rows = slice(start, start + count)
            encoded.append(EncodedImage(grid, embeds[rows], None if deepstack is None else deepstack[:, rows]))
            start += count
        return encoded


def token_limited(processor: ImageProcessor, min_tokens: int, max_tokens: int) -> ImageProcessor:
    """The checkpoint's own size bounds narrowed to the build's token limits (vision: in the build
    config): Qwen3-VL's processor brings every image to 64 tokens at least, and keeps doing so
    when the build allows fewer; a build limit the checkpoint's range cannot meet wins."""
    block = processor.factor * processor.factor
    low = max(min_tokens, -(-processor.min_pixels // block))
    high = min(max_tokens, processor.max_pixels // block)
    return processor.with_token_limits(min(low, high), high)
