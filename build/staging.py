"""Write a directory beside its destination and swap it in only when complete.

A failed build or compile never leaves a half-written folder where a good one was.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Weights are hard-linked from a bundle into its engine directory (no second copy of the largest
# files on a device's small disk); nothing writes these files in place. Everything else is copied.
LINKED_SUFFIXES = (".data", ".safetensors")


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """Yields an empty sibling folder of `out`; on success it replaces `out`, on failure it is removed."""
    out = Path(out)
    staging = out.with_name(out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


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
