"""`ruff check`, `mypy` and `lint-imports` are part of the suite: a lint error fails the build
like a failing test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# The one place the engine hands over to the UI: `anima [PROJECT]` opens the window.
APP_LAUNCH = ("anima/launch.py", "from ui.app import main as app_main")


def test_the_engine_never_imports_qt_widgets_or_the_ui() -> None:
    offenders = []
    for path in (ROOT / "anima").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#")[0].strip()
            if not code.startswith(("import ", "from ")) or (rel, code) == APP_LAUNCH:
                continue
            if "QtWidgets" in code or "QtGui" in code or code.startswith(("from ui", "import ui")):
                offenders.append(f"{rel}: {code}")
    assert offenders == []


def test_the_engine_and_the_ui_type_check() -> None:
    """mypy on anima/ and ui/ (pyproject's `files`), the engine boundary included."""
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layers_hold() -> None:
    """The import-linter contract in pyproject.toml: front ends on top as peers (the CLI and
    the UI never import each other), the engine below; no cycle through them."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports) if lint_imports.exists() else "lint-imports",
                             "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
