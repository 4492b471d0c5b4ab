"""Which frames of a video are kept and the size they are resized to, as transformers' video
processors choose them (Qwen2VLVideoProcessor for Qwen2.5-VL, Qwen3VLVideoProcessor for Qwen3-VL),
in plain Python and numpy: the runtime imports neither torch nor transformers.

Qwen2.5-VL samples `fps` frames a second rounded down to whole temporal patches (torch.arange's
float steps, truncated); its temporal mRoPE positions advance by tokens_per_second x seconds per
temporal patch. Qwen3-VL samples `fps` frames a second evenly (np.linspace, rounded) and writes each
temporal patch's time in the prompt (`<1.5 seconds>`); its sizes come from the whole clip's pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.media.vision.processor import MAX_ASPECT_RATIO, smart_resize

DEFAULT_FPS = 2.0  # transformers' Qwen3VLVideoProcessor.fps and qwen-vl-utils' FPS
MIN_FRAMES = 4  # both processors' min_frames
MAX_FRAMES = 768  # both processors' max_frames: the most a video part may ask for


@dataclass(frozen=True)
class Layout:
    """How a family samples and places a video (its vision adapter's `video_timestamps`): `timestamps`
    (Qwen3-VL: every temporal patch its own run of tokens after its time as text) or one run with scaled
    temporal positions (Qwen2.5-VL)."""
    timestamps: bool


def qwen2_indices(total: int, source_fps: float, fps: float, max_frames: int, temporal: int) -> np.ndarray:
    """Qwen2VLVideoProcessor.sample_frames with `fps`: the frame count fps x duration, within
    [min_frames, max_frames] and the clip, floored to whole temporal patches; the frames
    torch.arange(0, total, total / count).int() picks (a float32 arange, its length counted in
    double as torch counts it)."""
    most = math.floor(min(max_frames, total) / temporal) * temporal
    count = total / source_fps * fps
    count = min(max(count, MIN_FRAMES), most, total)
    count = math.floor(count / temporal) * temporal
    if count <= 0:
        raise ValueError(f"{total} frame(s) make no temporal patch of {temporal}")
    step = total / count
    length = math.ceil(total / step)
    return (np.arange(length, dtype=np.float64) * step).astype(np.float32).astype(np.int64)


def qwen3_indices(total: int, source_fps: float, fps: float, max_frames: int) -> np.ndarray:
    """Qwen3VLVideoProcessor.sample_frames with `fps`: int(duration x fps) frames within
    [min_frames, max_frames] and the clip, spread evenly from the first to the last."""
    count = int(total / source_fps * fps)
    count = min(max(count, MIN_FRAMES), max_frames, total)
    return np.linspace(0, total - 1, count).round().astype(int)


def smart_resize_video(frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int,
                       max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's video smart_resize: as the image one, the bounds over the whole clip's pixels
    (frames rounded to whole temporal patches); a side under one block first scaled up to it."""
    if frames < temporal:
        raise ValueError(f"{frames} frame(s), fewer than one temporal patch ({temporal})")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(f"frames of {width}x{height} pixels: aspect ratio {ratio:.1f}:1 is over "
                         f"{MAX_ASPECT_RATIO}:1, which the Qwen-VL video processor refuses")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_size(layout: Layout, frames: int, height: int, width: int, temporal: int, factor: int,
               min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) every frame is resized to; min_pixels / max_pixels are per frame.
    Qwen2.5-VL sizes each frame as an image; Qwen3-VL bounds the clip's pixels, its frames times the
    per-frame bounds (transformers' cap_pixels_per_frame)."""
    if layout.timestamps:
        return smart_resize_video(frames, height, width, temporal, factor, min_pixels * frames, max_pixels * frames)
    if frames < temporal:
        raise ValueError(f"{frames} frame(s), fewer than one temporal patch ({temporal})")
    return smart_resize(height, width, factor, min_pixels, max_pixels)


def timestamps(indices, source_fps: float, temporal: int) -> list[float]:
    """Qwen3VLProcessor._calculate_timestamps: each temporal patch's time, the mean of its first and
    last frame's (the last frame repeated to fill the last patch)."""
    indices = [int(i) for i in indices]
    if len(indices) % temporal:
        indices += [indices[-1]] * (temporal - len(indices) % temporal)
    seconds = [index / source_fps for index in indices]
    return [(seconds[i] + seconds[i + temporal - 1]) / 2 for i in range(0, len(seconds), temporal)]


def time_interval(tokens_per_second: float, frames: int, total: int, source_fps: float, temporal: int) -> np.float32:
    """Qwen2.5-VL's temporal position step per temporal patch: tokens_per_second x second_per_grid_t,
    second_per_grid_t = temporal / the sampled frame rate (frames / total x source fps), in float32
    as the processor's tensor and get_rope_index compute it."""
    sampled_fps = frames / total * source_fps
    second_per_grid = np.float32(temporal / sampled_fps)
    return np.float32(np.float32(tokens_per_second) * second_per_grid)
