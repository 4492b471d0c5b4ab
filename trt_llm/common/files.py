"""Files the tools write for the user: whole or not at all, with the user's permissions."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def user_mode(directory: bool = False) -> int:
    """The mode a plain open() or mkdir() would give under the process's umask (tempfile's
    mkstemp and mkdtemp make private 0600 / 0700 files, which surprises users who share them)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), user_mode())
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the option."""


def _probe(folder: Path) -> None:
    """Create and remove a file in `folder`: raises OSError where nothing can be written."""
    handle, probe = tempfile.mkstemp(prefix=".probe.", dir=folder)
    os.close(handle)
    os.unlink(probe)


def prepare_output_file(path: str | Path, option: str) -> Path:
    """Check, before any work, that `path` can be written as a file: its folder is made if missing
    (as users expect of -o), and a directory or an unwritable place is refused."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        raise OutputPathError(f"{option} {str(path)!r}: is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _probe(path.parent)
    except OSError as error:
        raise OutputPathError(f"{option} {str(path)!r}: cannot write there: {error.strerror or error}") from None
    return path


def prepare_output_dir(path: str | Path, option: str) -> Path:
    """Make the folder `path` (and its parents) now, or refuse it in one line."""
    path = Path(os.path.abspath(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
        _probe(path)
    except FileExistsError:
        raise OutputPathError(f"{option} {str(path)!r}: is a file, not a folder") from None
    except OSError as error:
        raise OutputPathError(f"{option} {str(path)!r}: cannot make or write this folder: "
                              f"{error.strerror or error}") from None
    return path
