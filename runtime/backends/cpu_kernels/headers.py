"""ONNX Runtime's C API header, which our kernels compile against, from Debian's libonnxruntime-dev.

No PyPI package ships ONNX Runtime's headers; Debian's registry does (which CI and a user's machine
reach as they reach PyPI). The .deb is fetched once (85 KB), checked against the digest recorded
here, and only `onnxruntime_c_api.h` is taken from it (a .deb is an `ar` archive holding a tar of
its files: read here without dpkg, so any Linux host can do it). The header is API version 21: its
structs are what ONNX Runtime 1.21 and every later release read (ONNX Runtime keeps the C API's
layout), so the library it builds registers with the runtime pip installed (1.32 when written).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path

HEADER = "onnxruntime_c_api.h"
# (url, sha256): the first that downloads with its digest serves; a Debian pool keeps a version as
# long as a suite names it, so two are listed.
PACKAGES = (
    ("http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb",
     "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"),
    ("http://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-2_amd64.deb",
     "2c2fb80360505458b44a1298333416377fc750b4ea72fb5b81189341f9ec0294"),
)


class HeaderUnavailable(RuntimeError):
    pass


def header(folder: Path, download: bool = True) -> Path:
    """`folder`/onnxruntime_c_api.h, fetched first where it is not there yet (download=False: only
    what is there). Raises HeaderUnavailable with the reason."""
    path = folder / HEADER
    if path.is_file():
        return path
    if not download:
        raise HeaderUnavailable(f"{path} is not there (python -m trt_llm.runtime.backends.cpu_kernels fetches it)")
    errors = []
    for url, digest in PACKAGES:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                package = response.read()
        except OSError as error:
            errors.append(f"{url}: {error}")
            continue
        if hashlib.sha256(package).hexdigest() != digest:
            errors.append(f"{url}: sha256 is not the recorded one")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{HEADER}.{os.getpid()}"
        partial.write_bytes(_member(package, HEADER))
        os.replace(partial, path)
        return path
    raise HeaderUnavailable("cannot fetch ONNX Runtime's C header: " + "; ".join(errors))


def _member(package: bytes, name: str) -> bytes:
    """File `name` (any folder) from a .deb's data archive."""
    if not package.startswith(b"!<arch>\n"):
        raise HeaderUnavailable("not a .deb (ar) archive")
    position = 8
    while position + 60 <= len(package):
        entry = package[position:position + 60]
        member, size = entry[:16].decode().strip().rstrip("/"), int(entry[48:58])
        body = package[position + 60:position + 60 + size]
        position += 60 + size + (size & 1)
        if member.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as archive:  # xz, gz or plain: tarfile tells
                for info in archive.getmembers():
                    if info.isfile() and info.name.endswith("/" + name):
                        return archive.extractfile(info).read()
            raise HeaderUnavailable(f"{name} is not in the package")
    raise HeaderUnavailable("the package has no data archive")
