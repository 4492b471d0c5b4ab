"""Media sources of an input file: a content part's `"image": SOURCE` (later `"audio"`) turned into
bytes, and an image's bytes into the RGB picture the model's processor would have seen.

A source is a local path (absolute, or relative to the input file's folder), a `file://` URL or a
`data:` URL. Nothing is ever fetched: http(s) and every other scheme are refused, so running an input
file never reaches the network. Errors are one-line `MediaError`s naming the source as written (and
the path it resolved to); the caller puts the request, message and part in front.

Decoding matches what transformers hands its Qwen-VL image processor: the EXIF orientation applied
(as `transformers.image_utils.load_image` does for a path or URL) and transparency composited onto
white (as the processor's own `convert_to_rgb` does for a picture with alpha). Only common raster
formats are opened; Pillow's exotic plugins (EPS runs Ghostscript) are never reached from a request.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import stat
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, unquote_to_bytes, urlsplit

if TYPE_CHECKING:  # Pillow is imported by the functions that decode pictures: a text run's cold start
    from PIL import Image  # does not pay for it

# Pillow's format ids (a JPEG with several pictures, as phones write, opens as MPO through "JPEG").
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")
SHOWN_CHARACTERS = 64  # a data URL in a message: its start and its length, not megabytes of base64

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_KNOWN_SCHEMES = ("data", "file", "http", "https")


class MediaError(ValueError):
    pass


def _shown(source: str) -> str:
    """The source as written, quoted on one line; a data URL cut to its start."""
    if len(source) <= SHOWN_CHARACTERS or source[:5].lower() != "data:":
        return repr(source)
    return f"{source[:SHOWN_CHARACTERS]!r}... ({len(source):,} characters)"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _scheme(source: str) -> str | None:
    """The URL scheme of `source`, or None for a path. `name:x.png` stays a path unless the scheme is
    one we know or is followed by `//`, so an odd file name is not mistaken for a URL."""
    match = _SCHEME.match(source)
    if match is None:
        return None
    scheme = match.group(1).lower()
    if scheme in _KNOWN_SCHEMES or source[match.end():].startswith("//"):
        return scheme
    return None


def _read_file(path: Path, name: str, kind: str, read: bool = True) -> bytes | Path:
    """The file's bytes (read=False: its path, once checked: a long clip is decoded from the file as a
    stream, never read whole)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise MediaError(f"{kind} {name}: no such file") from None
    except OSError as error:
        raise MediaError(f"{kind} {name}: cannot read it ({error.strerror or _one_line(error)})") from None
    except ValueError:  # a NUL character: no file system takes it
        raise MediaError(f"{kind} {name}: not a valid path") from None
    if stat.S_ISDIR(info.st_mode):
        raise MediaError(f"{kind} {name}: is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block and /dev/zero never ends
        raise MediaError(f"{kind} {name}: not a regular file")
    if not read:
        if info.st_size == 0:
            raise MediaError(f"{kind} {name}: the file is empty")
        return path
    try:
        data = path.read_bytes()
    except OSError as error:
        raise MediaError(f"{kind} {name}: cannot read it ({error.strerror or _one_line(error)})") from None
    if not data:
        raise MediaError(f"{kind} {name}: the file is empty")
    return data


def _path_source(source: str, base_dir: Path | None, kind: str, read: bool = True) -> tuple[bytes | Path, str]:
    path = Path(os.path.expanduser(source))
    if not path.is_absolute():
        path = (Path(base_dir) if base_dir is not None else Path.cwd()) / path
    path = path.absolute()
    name = _shown(source) if str(path) == source else f"{_shown(source)} ({str(path)!r})"
    return _read_file(path, name, kind, read), name


def _file_url_source(source: str, kind: str, read: bool = True) -> tuple[bytes | Path, str]:
    parts = urlsplit(source)
    if parts.netloc not in ("", "localhost"):
        raise MediaError(f"{kind} {_shown(source)}: a file URL on host {parts.netloc!r}; only local files "
                         "(file:///absolute/path) are read")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise MediaError(f"{kind} {_shown(source)}: a file URL needs an absolute path (file:///absolute/path)")
    name = f"{_shown(source)} ({str(path)!r})"
    return _read_file(Path(path), name, kind, read), name


def _data_url_source(source: str, kind: str) -> tuple[bytes, str]:
    name = _shown(source)
    header, comma, payload = source[len("data:"):].partition(",")
    if not comma:
        raise MediaError(f"{kind} {name}: a data URL needs a comma before its payload (data:<mime>;base64,<data>)")
    params = [p.strip().lower() for p in header.split(";")]
    mime = params[0] or "text/plain"  # RFC 2397's default
    if not mime.startswith(f"{kind}/"):
        raise MediaError(f"{kind} {name}: a data URL of type {mime!r}, not {kind}/*")
    # Percent-decoding first, as urllib's data: handler does: some clients escape '+', '/' and '='.
    data = unquote_to_bytes(payload)
    if "base64" in params[1:]:
        try:
            data = base64.b64decode(re.sub(rb"\s+", b"", data), validate=True)
        except (binascii.Error, ValueError) as error:
            raise MediaError(f"{kind} {name}: bad base64 payload ({_one_line(error)})") from None
    if not data:
        raise MediaError(f"{kind} {name}: the data URL holds no data")
    return data, name


def media_bytes(source: str, base_dir: Path | None = None, kind: str = "image") -> tuple[bytes, str]:
    """The bytes of a media source and the name that messages about it use (the source as written,
    with the path it resolved to). `base_dir` is the input file's folder (None: the working
    directory); `kind` ("image", "audio") is the type a data URL must declare and the word messages
    begin with."""
    return _media(source, base_dir, kind, True)


def media_file(source: str, base_dir: Path | None = None, kind: str = "audio") -> tuple[bytes | Path, str]:
    """media_bytes, but a file (a path, a file:// URL) is checked and given as its path, not read: a
    long clip is decoded from its file a block at a time. A data URL's bytes are in the request already."""
    return _media(source, base_dir, kind, False)


def _media(source: str, base_dir: Path | None, kind: str, read: bool) -> tuple[bytes | Path, str]:
    if not isinstance(source, str):
        raise MediaError(f"{kind} source: expected a path or URL string, got {type(source).__name__}")
    if not source.strip():
        raise MediaError(f"{kind} source: empty")
    scheme = _scheme(source)
    if scheme is None:
        return _path_source(source, base_dir, kind, read)
    if scheme == "file":
        return _file_url_source(source, kind, read)
    if scheme == "data":
        return _data_url_source(source, kind)
    remote = "http(s) URLs are" if scheme in ("http", "https") else f"the {scheme}: scheme is"
    raise MediaError(f"{kind} {_shown(source)}: {remote} not supported: nothing is fetched over the network; "
                     "give a local path, a file:// URL or a data: URL")


def _check_pixels(image: Image.Image, name: str) -> None:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and image.width * image.height > limit:
        raise MediaError(f"image {name}: {image.width}x{image.height} is {image.width * image.height:,} pixels, over "
                         f"the limit of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS, a guard against decompression bombs)")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' `convert_to_rgb` makes it: anything with an alpha band or a transparent
    colour (RGBA, LA, PA, a palette or RGB image with a tRNS entry) composited onto opaque white,
    everything else through Pillow's own conversion (CMYK, L, P, and 16-bit I;16, which Pillow clips
    at 255 rather than scales)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_image(data: bytes, name: str) -> Image.Image:
    """An image's bytes as an upright RGB picture (the first frame of an animation); `name` is what
    a MediaError calls the source."""
    from PIL import Image, ImageOps

    Image.init()  # registers Pillow's plugins (once), so that AVIF is known where this Pillow has it
    formats = [f for f in IMAGE_FORMATS if f in Image.OPEN]
    try:
        with warnings.catch_warnings():
            # Pillow warns between MAX_IMAGE_PIXELS and twice it and raises above; _check_pixels
            # refuses from the limit on, so the warning would only be noise beside the error.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=formats)
            _check_pixels(image, name)
            image.load()
            return to_rgb(ImageOps.exif_transpose(image))
    except MediaError:
        raise
    except Image.DecompressionBombError as error:
        raise MediaError(f"image {name}: {_one_line(error)}") from None
    except Image.UnidentifiedImageError:
        raise MediaError(f"image {name}: not an image in a supported format ({', '.join(formats)})") from None
    except Exception as error:  # noqa: BLE001 -- Pillow's decoders raise OSError, SyntaxError, ValueError,
        # EOFError, struct.error... on damaged data; each means the same thing to the user
        raise MediaError(f"image {name}: cannot decode it ({type(error).__name__}: {_one_line(error)})") from None


def load_image(source: str, base_dir: Path | None = None) -> Image.Image:
    """The RGB picture of an `"image"` content part's source."""
    data, name = media_bytes(source, base_dir, "image")
    return decode_image(data, name)
