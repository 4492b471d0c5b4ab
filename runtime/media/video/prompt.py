"""A request's images and videos in its prompt: each placeholder the chat template wrote widened to
the item's tokens, the rows from the vision tower, and the prompt's mRoPE positions over both.

The template writes `<|vision_start|><|video_pad|><|vision_end|>` per video part; transformers'
processors widen the `<|video_pad|>`: Qwen2.5-VL to the video's tokens (one run, t > 1), Qwen3-VL to
one `<t seconds><|vision_start|>` + frame tokens + `<|vision_end|>` per temporal patch. This module does
the same, so the prompt is token for token transformers'. Every limit is checked and every video
decoded before the tower runs; a video's rows are cached under its content and sampling (the context
cache's block keys cover the same key, one per Qwen3-VL frame run).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from trt_llm.runtime.media.sequence_media import SequenceMedia, media_parts, read_parts
from trt_llm.runtime.media.sources import MediaError
from trt_llm.runtime.media.video.reader import PendingVideo, VideoReader
from trt_llm.runtime.media.vision.encoder import EncodedImage, VisionEncoder
from trt_llm.runtime.media.vision.mrope import span_positions
from trt_llm.runtime.media.vision.prompt import refuse_pan_and_scan
from trt_llm.runtime.text.prompt import PromptError


def video_reader(vision: VisionEncoder) -> VideoReader:
    """The engine's VideoReader, made once (Qwen2.5-VL's tokens_per_second from the checkpoint's
    config, transformers' default 4 where it has none)."""
    reader = getattr(vision, "video_reader", None)
    if reader is None:
        config = json.loads(vision.engine_dir.component_path("llm", "config").read_text())
        tokens_per_second = (config.get("vision_config") or {}).get("tokens_per_second", 4)
        reader = vision.video_reader = VideoReader(vision, tokens_per_second)
    return reader


def attach_vision(vision: VisionEncoder, tokenizer, messages, token_ids: list[int], media_dir: Path | None,
                  where: str, max_input_len: int) -> tuple[list[int], SequenceMedia]:
    """As runtime/media/vision/prompt.attach_images, for a prompt with video parts (and images)."""
    image_parts, video_parts = media_parts(messages, "image"), media_parts(messages, "video")
    refuse_pan_and_scan(vision, image_parts, where)
    images = read_parts(image_parts, "image", media_dir, where, vision.pending)
    image_counts = [vision.tokens_of(image) for image in images]
    left = vision.max_request_tokens - sum(image_counts)
    try:
        reader = video_reader(vision)
    except MediaError as error:
        raise ValueError(f"{where}.messages: {error}") from None
    videos = []
    for m, c, part in video_parts:
        budget = max(left, 0) // len(video_parts)
        try:
            videos.append(reader.read(part, media_dir, budget))
        except (MediaError, ValueError) as error:
            raise ValueError(f"{where}.messages[{m}].content[{c}]: {error}") from None
    video_counts = [reader.tokens_of(video) for video in videos]
    total = sum(image_counts) + sum(video_counts)
    if total > vision.max_request_tokens:
        raise ValueError(f"{where}.messages: its {len(images)} image(s) and {len(videos)} video(s) take {total} image "
                         f"tokens ({', '.join(map(str, image_counts + video_counts))}), more than the engine's "
                         f"max_image_tokens {vision.max_request_tokens}")
    image_token, video_token = vision.image_token_id, vision.settings["video_token_id"]
    for token, parts, kind in ((image_token, image_parts, "image"), (video_token, video_parts, "video")):
        placed = sum(1 for t in token_ids if t == token)
        if placed != len(parts):
            raise PromptError(f"{where}.messages: the chat template placed {placed} {kind} token(s) for "
                              f"{len(parts)} {kind} part(s)")
    widened, spans = _widen(token_ids, image_token, video_token, images, videos, reader, vision, tokenizer)
    if len(widened) > max_input_len:
        raise ValueError(f"{where}: prompt is {len(widened)} tokens with its images' and videos' {total}, longer "
                         f"than the engine's max_input_len {max_input_len}")
    encoded_images = vision.encode(images) if images else []
    encoded_videos = encode_videos(vision, videos) if videos else []
    rows, keys, runs = [], [], []
    for kind, index, offset, frame in spans:
        if kind == "image":
            part, key, step = encoded_images[index], images[index].key, 1.0
        else:
            part, key, step = encoded_videos[index], videos[index].key, videos[index].interval
            if frame is not None:  # one temporal patch of a Qwen3-VL video
                part, key = _frame(part, frame, vision.merge), f"{key}:{frame}"
        rows.append((offset, part))
        keys.append(key)
        runs.append((offset, part.grid, step))
    rope = span_positions(len(widened), runs, vision.merge)
    return widened, SequenceMedia(rows, rope, keys=tuple(keys))


def _widen(token_ids, image_token, video_token, images, videos: list[PendingVideo], reader: VideoReader,
           vision: VisionEncoder, tokenizer):
    """The widened prompt, and its vision runs in order: (kind, item index, first token, frame or None)."""
    start, end = vision.settings["vision_start_token_id"], tokenizer.token_to_id("<|vision_end|>")
    widened, spans, next_image, next_video = [], [], 0, 0
    for token in token_ids:
        if token == image_token:
            spans.append(("image", next_image, len(widened), None))
            widened += [token] * vision.tokens_of(images[next_image])
            next_image += 1
        elif token == video_token:
            video = videos[next_video]
            if video.timestamps is None:
                spans.append(("video", next_video, len(widened), None))
                widened += [token] * reader.tokens_of(video)
            else:
                t, h, w = video.grid
                per_frame = h * w // (vision.merge * vision.merge)
                for frame, seconds in enumerate(video.timestamps):
                    widened += tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False) + [start]
                    spans.append(("video", next_video, len(widened), frame))
                    widened += [token] * per_frame + [end]
            next_video += 1
        else:
            widened.append(token)
    return widened, spans


def _frame(video: EncodedImage, frame: int, merge: int) -> EncodedImage:
    """Temporal patch `frame` of an encoded video, as its own run of rows."""
    t, h, w = video.grid
    count = h * w // (merge * merge)
    rows = slice(frame * count, (frame + 1) * count)
    return EncodedImage((1, h, w), video.embeds[rows], None if video.deepstack is None else video.deepstack[:, rows])


def encode_videos(vision: VisionEncoder, videos: list[PendingVideo]) -> list[EncodedImage]:
    """Each video's rows, from the vision encoder's cache or one graph run over those not in it."""
    def run(missing: list[PendingVideo]) -> list[EncodedImage]:
        return vision.run_patches(np.concatenate([video.pixel_values for video in missing]),
                                  [video.grid for video in missing])

    started = time.perf_counter()
    encoded, missing = vision.cache.encode(videos, run)
    vision.encoded_videos = getattr(vision, "encoded_videos", 0) + len(missing)
    if missing and vision.profiler:
        vision.profiler.stages["vision_encode"].append((time.perf_counter() - started) * 1000)
    return encoded
