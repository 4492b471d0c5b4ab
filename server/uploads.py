"""A speech endpoint's form, its file streamed to disk under a size limit: /v1/audio/transcriptions
and /translations (server/transcriptions.py).

The body is parsed as it arrives (python-multipart's parser, which Starlette's own forms use) and
the file part's bytes go to a temporary file a received chunk at a time, so the server never holds
the upload in memory: the preparer later reads the file once (runtime/media/sources.py) to decode
it. OpenAI's limit is the default, 25 MB (`--max-upload-mb`); a file over it is refused with a 413
naming the limit as soon as its bytes pass it, or before anything is read when the Content-Length
already says so. The caller removes the file after the request (`SavedUpload.remove`). A client that
disconnects mid-upload is `UploadAbandoned`: its part removed, one line in the log (`abandoned`).

The text fields are small (MAX_FIELD_BYTES together, MAX_FIELDS of them); a url-encoded form
(no file: parsed only to say which field is missing) is read whole under the same small bound.
app.py's BodyLimit leaves these routes to this module (their bodies are the upload's size, not the
JSON routes' --max-body-bytes).
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from trt_llm.server.app import CLIENT_GONE, HttpError

log = logging.getLogger(__name__)

MB = 1 << 20
DEFAULT_MAX_UPLOAD_MB = 25  # OpenAI's limit on a speech-to-text upload
MAX_FIELD_BYTES = 1 << 20  # the text fields together (Starlette's own max_part_size, per field there)
MAX_FIELDS = 32
# A body may be this much over the file's limit (its text fields and the parts' headers); a larger
# Content-Length is refused before a byte is read.
FORM_ALLOWANCE = 2 * MAX_FIELD_BYTES


@dataclass
class SavedUpload:
    """The file part of a form, on disk."""
    path: Path
    filename: str
    size: int

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class UploadAbandoned(Exception):
    """The client disconnected before its upload was whole (its part on disk already removed)."""

    def __init__(self, received: int):
        super().__init__(f"the client disconnected during its upload ({received} bytes received)")
        self.received = received


def abandoned(route: str, error: UploadAbandoned) -> Response:
    """One line in the log for a client that left mid-upload, not Starlette's traceback; the answer
    (499, as app.client_gone's) nobody reads."""
    log.warning("%s: the client disconnected during its upload (%d bytes received); nothing was decoded", route,
                error.received)
    return Response(status_code=CLIENT_GONE)


def too_large(limit: int) -> HttpError:
    return HttpError(413, f"file: the upload is larger than the server's limit of {limit / MB:g} MB ({limit} bytes; "
                          "--max-upload-mb)", "file", "file_too_large")


class _Form:
    """python-multipart's callbacks: text fields into `fields`, the file part into a temporary file."""

    def __init__(self, limit: int):
        self.limit = limit
        self.fields: list[tuple[str, str]] = []
        self.upload: SavedUpload | None = None
        self._file = None  # the open temporary file while its part arrives
        self._headers: dict[bytes, bytes] = {}
        self._header, self._value, self._data = b"", b"", bytearray()
        self._name = ""
        self._text_bytes = 0  # of every text field so far

    def on_part_begin(self):
        self._headers, self._data, self._name = {}, bytearray(), ""

    def on_header_field(self, data: bytes, start: int, end: int):
        self._header += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int):
        self._value += data[start:end]

    def on_header_end(self):
        self._headers[self._header.lower()] = self._value
        self._header, self._value = b"", b""

    def on_headers_finished(self):
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" not in options:
            if len(self.fields) >= MAX_FIELDS:
                raise HttpError(400, f"the form has more than {MAX_FIELDS} fields")
            return
        if self.upload is not None:
            raise HttpError(400, f"{self._name or 'file'}: only one file may be uploaded", self._name or "file")
        filename = options[b"filename"].decode("utf-8", "replace")
        handle, path = tempfile.mkstemp(prefix="trt-llm-upload-", suffix=Path(filename).suffix[:16])
        self._file = os.fdopen(handle, "wb")
        self.upload = SavedUpload(Path(path), filename, 0)

    def on_part_data(self, data: bytes, start: int, end: int):
        if self._file is None:
            self._data += data[start:end]
            self._text_bytes += end - start
            if self._text_bytes > MAX_FIELD_BYTES:
                raise HttpError(413, f"{self._name}: the form's text fields are larger than {MAX_FIELD_BYTES} bytes",
                                self._name)
            return
        self.upload.size += end - start
        if self.upload.size > self.limit:
            raise too_large(self.limit)
        self.write(data[start:end])

    def write(self, chunk: bytes) -> None:
        """One received piece of the file onto the disk (a page-cache write: no need to leave the loop)."""
        self._file.write(chunk)

    def on_part_end(self):
        if self._file is not None:
            self._file.close()
            self._file = None
            self.fields.append((self._name, self.upload))
        else:
            self.fields.append((self._name, self._data.decode("utf-8", "replace")))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


async def read_form(request: Request, limit: int) -> tuple[list[tuple[str, object]], SavedUpload | None]:
    """The form's fields in order, each (name, text) or (name, SavedUpload) for the file, and that
    file. Raises HttpError: 413 past `limit` bytes of file, 400 for a malformed form. On any error
    nothing stays on disk."""
    content_type = request.headers.get("content-type", "")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit + FORM_ALLOWANCE:
        raise too_large(limit)  # before a byte is read
    if content_type.startswith("application/x-www-form-urlencoded"):
        return await _urlencoded(request), None
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise HttpError(400, "the multipart/form-data body has no boundary in its Content-Type")
    form = _Form(limit)
    parser = MultipartParser(boundary, {name: getattr(form, name) for name in (
        "on_part_begin", "on_header_field", "on_header_value", "on_header_end", "on_headers_finished",
        "on_part_data", "on_part_end")})
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            parser.write(chunk)
        parser.finalize()
    except FormParserError as error:
        _discard(form)
        raise HttpError(400, f"the multipart/form-data body is malformed: {error}") from None
    except ClientDisconnect:  # the client left mid-upload: what it sent goes
        _discard(form)
        raise UploadAbandoned(received) from None
    except BaseException:
        _discard(form)
        raise
    return form.fields, form.upload


def _discard(form: _Form) -> None:
    form.close()
    if form.upload is not None:
        form.upload.remove()


async def _urlencoded(request: Request) -> list[tuple[str, object]]:
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_ALLOWANCE:
                raise HttpError(413, f"the url-encoded form is larger than {FORM_ALLOWANCE} bytes")
    except ClientDisconnect:
        raise UploadAbandoned(len(body)) from None
    return parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
