"""Write a directory beside its destination and swap it in only when complete.

A failed build or compile never leaves a half-written folder where a good one was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from trt_llm.build.engine_dir import BUNDLE, ENGINE, MANIFEST
from trt_llm.common.files import user_mode

# Weights are hard-linked from a bundle into its engine directory (no second copy of the largest
# files on a device's small disk); nothing writes these files in place. Everything else is copied.
LINKED_SUFFIXES = (".data", ".safetensors")


class OutputDirError(ValueError):
    """The output folder cannot be written, or holds something this tool did not write."""


def _is_ours(folder: Path) -> bool:
    """Whether `folder` is an engine directory or a bundle that trt-llm wrote (its manifest says so)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("kind") in (ENGINE, BUNDLE) \
        and "format_version" in manifest and isinstance(manifest.get("components"), dict)


def check_output_dir(out: Path, key: str = "output_dir") -> Path:
    """Refuse, before any work, an output folder that cannot be written or whose contents are not
    ours to replace: a build replaces only an empty folder, or an engine or bundle it wrote."""
    out = Path(os.path.abspath(out))
    for parent in reversed(out.parents):
        if parent.exists() and not parent.is_dir():
            raise OutputDirError(f"{key}: {str(out)!r} cannot be made: {str(parent)!r} is a file")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutputDirError(f"{key}: {str(out)!r} is a file, not a folder; choose a new folder")
        if any(out.iterdir()) and not _is_ours(out):
            raise OutputDirError(
                f"{key}: {str(out)!r} holds files that are not an engine or bundle written by trt-llm "
                f"(no trt-llm {MANIFEST}); nothing was touched. Choose a new or empty folder")
    return out


@contextmanager
def staged(out: Path, key: str = "output_dir") -> Iterator[Path]:
    """Yields a new, empty sibling folder of `out`; on success it replaces `out`, on failure it is
    removed. `out` is checked first (check_output_dir): only our own engines are ever replaced."""
    out = check_output_dir(out, key)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # A fresh name of our own: nothing the user had beside `out` is touched.
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
        staging.chmod(user_mode(directory=True))  # mkdtemp's 0700 would become the engine's mode
    except OSError as error:
        raise OutputDirError(f"{key}: cannot write in {str(out.parent)!r}: {error.strerror or error}") from None
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # Swap: the old engine moves aside first, so a failure here never leaves neither of them.
    old = out.with_name(f".{out.name}.old-{staging.name.rsplit('-', 1)[-1]}") if out.exists() else None
    if old is not None:
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _link_or_copy(source: str, destination: str) -> None:
    if source.endswith(LINKED_SUFFIXES):
        try:
            os.link(source, destination)
            return
        except OSError:  # another filesystem, or links not allowed: copy
            pass
    shutil.copy2(source, destination)


def copy_tree(source: Path, destination: Path) -> None:
    """Copy `source` into the existing folder `destination`, weights hard-linked where possible."""
    shutil.copytree(source, destination, copy_function=_link_or_copy, dirs_exist_ok=True)
