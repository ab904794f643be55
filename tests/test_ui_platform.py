"""A first start on a fresh machine: one line saying what is missing, never a core dump."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from ui.main_window import MainWindow
from ui.platform_check import platform_problem


def test_without_a_display_the_app_says_so_and_exits(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    settings = tmp_path / "settings.ini"
    result = subprocess.run([sys.executable, "-m", "anima", "--settings", str(settings)],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "anima: there is no display to open a window on (DISPLAY is not set): run "
        "`anima run PROJECT --headless`, or set QT_QPA_PLATFORM=offscreen"]
    assert not settings.exists()


def test_missing_xcb_libraries_are_named_with_their_packages() -> None:
    present = {"xcb-cursor"}
    problem = platform_problem({"DISPLAY": ":0"}, lambda name: name if name in present else None,
                               "linux")
    assert problem == ("Qt's xcb platform plugin needs libxcb-icccm4, libxcb-keysyms1; install "
                       "them: sudo apt install libxcb-icccm4 libxcb-keysyms1")
    assert platform_problem({"DISPLAY": ":0"}, lambda name: name, "linux") is None
    assert platform_problem({"QT_QPA_PLATFORM": "offscreen"}, lambda name: None, "linux") is None


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_a_placeholder_path_is_not_remembered_as_the_last_project(qtbot, tmp_path: Path) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings)
    qtbot.addWidget(window)
    window.open_project(Path("/path/to/your/project"))
    assert any("does not exist" in m for m in window.errors.messages)
    assert window.last_project() is None and window.recent_projects() == []


@pytest.mark.qt_log_ignore("propagateSizeHints")
def test_a_folder_that_is_not_a_git_repository_is_refused_before_writing(
        qtbot, tmp_path: Path) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    folder = tmp_path / "plain"
    folder.mkdir()
    window = MainWindow(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.open_project(folder)
    assert window.pages.currentWidget() is window.no_anima
    assert "is not a git repository" in window.no_anima.text.text()
    assert not window.init_button.isEnabled()
    window._on_init_clicked()  # even if asked (a stale page): refused
    assert not (folder / ".anima").exists()
    assert any("Cannot initialise Anima" in m for m in window.errors.messages)
