"""Creating a project's `.anima/` from the shipped example.

Below both front ends: `anima init` and the app's "Initialise Anima here" call the same code,
and neither has to import the other for it.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from anima.errors import AnimaError, ProjectError
from anima.paths import ProjectPaths


def example_dir() -> Path:
    """The shipped `.anima.example/` (a source checkout and a wheel install both work)."""
    spec = importlib.util.find_spec("anima_example")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location, "config.json").is_file():
            return Path(location)
    raise AnimaError("the example .anima/ is missing from this installation; reinstall anima")


def init_project(root: Path) -> Path:
    """Create `.anima/` from the example. Never overwrites anything."""
    root = Path(root)
    if not root.is_dir():
        raise ProjectError(f"{root} is not a folder")
    paths = ProjectPaths(root)
    if paths.anima.exists():
        raise ProjectError(f"{paths.anima} already exists; nothing was changed")
    source = example_dir()
    shutil.copytree(source, paths.anima, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "README.md", "__init__.py"))
    return paths.anima
