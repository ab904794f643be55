"""What `pip install .` (not editable) puts on a user's machine: every module of the app."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_every_module_and_the_shipped_files(tmp_path: Path) -> None:
    """A package left out of pyproject's list is missing from the wheel, and the installed
    app fails on its first import of it."""
    source = tmp_path / "source"  # a fresh copy: no `build/` left by an earlier build
    source.mkdir()
    for name in ("anima", "ui", "resources", ".anima.example", "pyproject.toml", "README.md"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copyfile
        copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w",
                    str(tmp_path)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("anima-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(REPO).as_posix() for folder in ("anima", "ui")
               for p in (REPO / folder).rglob("*.py")}
    assert sources - names == set()
    assert "anima_resources/prompts/developer_system.md" in names
    assert "anima_example/config.json" in names
