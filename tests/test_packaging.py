"""The wheel holds every package: pyproject.toml lists its packages one by one (the source folders map
onto trt_llm.*), so a new folder of modules that is not listed would be missing from an installed
trt-llm while the editable install used here still finds it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, folders = set(setuptools["packages"]), setuptools["package-dir"]
    found = set()
    for package, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            if not any(part.startswith(".") or part == "__pycache__" for part in relative):
                found.add(".".join((package, *relative)))
    assert found - listed == set(), "package folders pyproject.toml does not list"
    assert listed - found == set(), "listed packages without an __init__.py"
