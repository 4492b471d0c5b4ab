"""A video's bytes -> the frames a request keeps, decoded with PyAV (its wheel ships ffmpeg).

Only the containers a video part means are opened, by their signature (MP4 / QuickTime, Matroska /
WebM, AVI, MPEG-TS): ffmpeg's other demuxers (playlists that open further files or URLs, image
sequences) are never reached from a request. The stream's header is checked before any frame is
decoded (its frame size against Pillow's pixel limit, its frame count against MAX_SOURCE_FRAMES),
frames are decoded up to the last one kept only, and each kept frame is resized as soon as it is
decoded, so a long or large clip never sits in memory whole. Errors are one-line MediaErrors naming
the source.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trt_llm.runtime.media.sources import MediaError

MAX_SOURCE_FRAMES = 108_000  # an hour at 30 frames a second: a clip's frames are decoded up to the last kept
CONTAINERS = "MP4/MOV, Matroska/WebM, AVI, MPEG-TS"


@dataclass(frozen=True)
class StreamInfo:
    frames: int  # in the stream
    fps: float  # its average frame rate
    height: int
    width: int


def container_format(data: bytes) -> str | None:
    """ffmpeg's demuxer for these bytes by their signature, or None."""
    if data[4:8] == b"ftyp" or data[4:8] in (b"moov", b"mdat", b"free", b"wide"):
        return "mov"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    if len(data) >= 377 and data[0] == data[188] == data[376] == 0x47:
        return "mpegts"
    return None


def _pixel_limit() -> int | None:
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS


def read_frames(data: bytes, name: str, choose: Callable[[StreamInfo], tuple[np.ndarray, tuple[int, int]]]
                ) -> tuple[StreamInfo, np.ndarray, np.ndarray]:
    """(the stream's info, the kept frames' indices, the frames [F, height, width, 3] uint8 RGB resized).
    choose(info) gives the indices to keep and the (height, width) to resize them to; a ValueError it
    raises becomes a MediaError naming the video."""
    import av

    demuxer = container_format(data)
    if demuxer is None:
        raise MediaError(f"video {name}: not a video in a supported container ({CONTAINERS})")
    try:
        with av.open(io.BytesIO(data), format=demuxer) as container:
            if not container.streams.video:
                raise MediaError(f"video {name}: the file has no video stream")
            stream = container.streams.video[0]
            info = _info(container, stream, name)
            try:
                indices, size = choose(info)
            except ValueError as error:
                raise MediaError(f"video {name}: {error}") from None
            frames = _decode(container, stream, indices, size, name)
    except MediaError:
        raise
    except Exception as error:  # noqa: BLE001 -- ffmpeg's errors (InvalidDataError, ...) on damaged data
        raise MediaError(f"video {name}: cannot decode it ({type(error).__name__}: "
                         f"{' '.join(str(error).split())})") from None
    return info, indices, frames


def _info(container, stream, name: str) -> StreamInfo:
    width, height = stream.codec_context.width, stream.codec_context.height
    if not width or not height:
        raise MediaError(f"video {name}: the stream gives no frame size")
    limit = _pixel_limit()
    if limit is not None and width * height > limit:
        raise MediaError(f"video {name}: frames of {width}x{height} are {width * height:,} pixels, over the limit "
                         f"of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS, a guard against decompression bombs)")
    rate = stream.average_rate or stream.guessed_rate
    if not rate or float(rate) <= 0:
        raise MediaError(f"video {name}: the stream gives no frame rate")
    frames = stream.frames
    if not frames:  # a header without a count (Matroska, MPEG-TS): its packets counted, nothing decoded
        frames = 0
        for packet in container.demux(stream):
            frames += packet.size > 0
            if frames > MAX_SOURCE_FRAMES:
                break
        container.seek(0)
    if frames > MAX_SOURCE_FRAMES:
        raise MediaError(f"video {name}: {frames:,} frames, over the limit of {MAX_SOURCE_FRAMES:,} frames a video")
    if frames < 1:
        raise MediaError(f"video {name}: the stream holds no frames")
    return StreamInfo(int(frames), float(rate), int(height), int(width))


def _decode(container, stream, indices: np.ndarray, size: tuple[int, int], name: str) -> np.ndarray:
    from PIL import Image

    wanted = {int(i) for i in indices}
    last = max(wanted)
    height, width = size
    frames, decoded = [], 0
    for frame in container.decode(stream):
        if decoded > last:
            break
        if decoded in wanted:
            picture = Image.fromarray(frame.to_ndarray(format="rgb24"))
            frames.append(np.asarray(resize(picture, height, width)))
        decoded += 1
    if len(frames) < len(wanted):
        raise MediaError(f"video {name}: the stream ended after {decoded} decodable frame(s); frame {last} "
                         "was to be kept (its header counts more frames than it holds)")
    return np.stack(frames)


def resize(picture, height: int, width: int):
    """Pillow's bicubic, as the image path resizes (transformers' video processors resize with
    torchvision, which cannot run beside this torch; runtime/media/vision/processor.py)."""
    from PIL import Image

    if picture.size == (width, height):
        return picture
    return picture.resize((width, height), resample=Image.Resampling.BICUBIC)
