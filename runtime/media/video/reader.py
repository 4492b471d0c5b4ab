"""A `video` content part -> its frames sampled, resized and cut into patches, ready for the tower
(a PendingVideo), with what its prompt and positions need (grid, Qwen3-VL's timestamps, Qwen2.5-VL's
temporal step).

Per-frame pixel bounds: the part's min_pixels / max_pixels within the engine's image bounds (the
checkpoint's, narrowed to the build's image token limits), and the frames' share of what the request's
max_image_tokens leaves (qwen-vl-utils' total_pixels: a long clip gets smaller frames, not more
tokens than the engine takes). Every bound is checked against the stream's header before a frame is
decoded. A list of frame images is a clip already sampled: all its frames, at the part's fps.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_llm.runtime.media.encoder_cache import content_key
from trt_llm.runtime.media.sources import MediaError, decode_image, media_bytes
from trt_llm.runtime.media.video import sampling
from trt_llm.runtime.media.video.decode import StreamInfo, read_frames, resize
from trt_llm.runtime.media.video.frames import video_patches


@dataclass
class PendingVideo:
    """A decoded video before encoding: its key (content and sampling), patches and grid."""
    key: str
    pixel_values: np.ndarray
    grid: tuple[int, int, int]
    timestamps: list[float] | None  # per temporal patch (Qwen3-VL)
    interval: float  # the temporal position step per temporal patch (Qwen2.5-VL; 1 otherwise)
    frames: int  # sampled, before padding to whole temporal patches


class VideoReader:
    def __init__(self, vision, tokens_per_second: float):
        """vision: the engine's VisionEncoder; tokens_per_second: Qwen2.5-VL's temporal scale."""
        # The tower's adapter says how its family samples and places a video (trt_llm/families/adapters.py)
        timestamps = getattr(vision.adapter, "video_timestamps", None)
        if timestamps is None:
            raise MediaError(f"video input is not supported for the {vision.settings.get('family')} vision tower")
        self.layout = sampling.Layout(timestamps)
        self.processor = vision.processor
        self.tokens_per_second = tokens_per_second

    @property
    def block(self) -> int:
        return self.processor.factor * self.processor.factor

    def read(self, part, media_dir: Path | None, budget: int) -> PendingVideo:
        """The part's video; budget: the image tokens the request leaves it. Raises MediaError
        (the caller names the part) or ValueError naming the option."""
        fps = part.fps if part.fps is not None else sampling.DEFAULT_FPS
        most = part.max_frames if part.max_frames is not None else sampling.MAX_FRAMES
        temporal = self.processor.temporal_patch_size
        if isinstance(part.video, list):
            if len(part.video) > most:
                raise MediaError(f"video: {len(part.video)} frames, more than max_frames {most}")
            hashes, frames, first = [], [], None
            for i, source in enumerate(part.video):  # each resized as it is decoded: one full frame at a time
                try:
                    data, name = media_bytes(source, media_dir, "image")
                    picture = decode_image(data, name)
                except MediaError as error:
                    raise MediaError(f"video frame [{i}]: {error}") from None
                hashes.append(content_key(data))
                if first is None:
                    first = picture.size
                    info = StreamInfo(len(part.video), fps, picture.height, picture.width)
                    height, width = self._size(info, len(part.video), part, budget)
                elif picture.size != first:
                    raise MediaError(f"video frame [{i}]: {picture.width}x{picture.height}, not the first frame's "
                                     f"{first[0]}x{first[1]}; a video's frames share a size")
                frames.append(np.asarray(resize(picture, height, width)))
            indices, frames = np.arange(len(frames)), np.stack(frames)
            content = "frames:" + ",".join(hashes)
        else:
            data, name = media_bytes(part.video, media_dir, "video")

            def choose(info: StreamInfo):
                indices = self._indices(info, fps, most, temporal)
                return indices, self._size(info, len(indices), part, budget)

            info, indices, frames = read_frames(data, name, choose)
            content = content_key(data)
        pixel_values, grid = video_patches(frames, self.processor)
        key = hashlib.sha256(json.dumps([content, [int(i) for i in indices], list(frames.shape[1:3]),
                                         info.fps]).encode()).hexdigest()
        stamps = sampling.timestamps(indices, info.fps, temporal) if self.layout.timestamps else None
        interval = 1.0 if self.layout.timestamps else float(
            sampling.time_interval(self.tokens_per_second, len(indices), info.frames, info.fps, temporal))
        return PendingVideo(key, pixel_values, grid, stamps, interval, len(indices))

    def _indices(self, info: StreamInfo, fps: float, most: int, temporal: int) -> np.ndarray:
        if self.layout.timestamps:
            return sampling.qwen3_indices(info.frames, info.fps, fps, most)
        return sampling.qwen2_indices(info.frames, info.fps, fps, most, temporal)

    def _size(self, info: StreamInfo, frames: int, part, budget: int) -> tuple[int, int]:
        """The frames' (height, width): the per-frame bounds, then the budget's share per frame."""
        low = part.min_pixels if part.min_pixels is not None else self.processor.min_pixels
        high = min(part.max_pixels, self.processor.max_pixels) if part.max_pixels is not None \
            else self.processor.max_pixels
        temporal = self.processor.temporal_patch_size
        patches = math.ceil(frames / temporal)
        share = budget * self.block // max(patches, 1)
        if share < self.block:
            raise ValueError(f"{frames} frames ({patches} temporal patches) need {patches} image tokens at "
                             f"least, more than the {budget} the request's max_image_tokens leaves; lower "
                             "fps or max_frames")
        high = min(high, share)
        low = min(low, high)
        return sampling.frame_size(self.layout, frames, info.height, info.width, temporal, self.processor.factor,
                                   low, high)

    def tokens_of(self, video: PendingVideo) -> int:
        t, h, w = video.grid
        m = self.processor.merge_size
        return t * h * w // (m * m)
