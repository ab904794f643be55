"""Help → About, saving a pane's transcript, Stop now asks first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog

from anima import events as ev
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import Window
from ui.desktop import AboutBox
from ui.main_window import MainWindow

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def window(qtbot, tmp_path: Path) -> MainWindow:
    w = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.show()
    return w


def menu_action(window: MainWindow, menu: str, text: str):
    bar = window.menuBar()
    top = next(a.menu() for a in bar.actions() if a.text().replace("&", "") == menu)
    return next(a for a in top.actions() if a.text().replace("&", "") == text)


def test_about_names_anima_and_the_claude_version(qtbot, window: MainWindow,
                                                  fake_claude: FakeClaude,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    menu_action(window, "Help", "About Anima").trigger()
    box = window.findChild(AboutBox)
    assert box is not None and "Anima 0.1.0" in box.text()
    qtbot.waitUntil(lambda: "9.9.9 (Fake Claude)" in box.text(), timeout=10000)
    box.close()
    assert menu_action(window, "Help", "Read the README").isEnabled()


def test_save_transcript_writes_the_pane_text_and_never_proposes_the_project(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])})
    w = Window(qtbot, tmp_path, auto_start=False)
    try:
        window = w.window
        window.open_project(git_repo)
        pane = w.page().monitor.panes["acceptor"]
        pane.feed(ev.AssistantText("acceptor", "The change does what it says.\n\nACCEPTED"))
        pane.flush()
        pane.view.setFocus()
        proposed = save_through_the_dialog(window, tmp_path / "review.txt")
        # Not in the project, where a Developer's `git add -A` would commit it.
        assert not Path(proposed).resolve().is_relative_to(git_repo.resolve())
        assert "ACCEPTED" in (tmp_path / "review.txt").read_text(encoding="utf-8")
        assert "acceptor" in window.statusBar().currentMessage()
    finally:
        w.close()


def save_through_the_dialog(window: MainWindow, target: Path) -> str:
    """File ▸ Save transcript, answered with `target`; the folder the dialog proposed."""
    proposed: list[str] = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            QTimer.singleShot(10, answer)
            return
        proposed.append(dialog.directory().absolutePath())
        dialog.selectFile(str(target))
        dialog.accept()

    QTimer.singleShot(0, answer)
    window.save_transcript_action.trigger()
    return proposed[0]


def test_about_names_each_roles_agent_cli(qtbot, fake_claude: FakeClaude,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A cross-vendor pair: the box says which CLI each role runs, and its version."""
    from anima.config import Config

    fake_claude.use_env(monkeypatch)
    config = Config.model_validate({"developer": {"agent": "codex",
                                                  "command": "/nowhere/codex"}})
    box = AboutBox(None, config)
    qtbot.addWidget(box)
    assert "developer: codex --version" in box.text()
    assert "acceptor: claude --version" in box.text()
    qtbot.waitUntil(lambda: "9.9.9 (Fake Claude)" in box.text()
                    and "checking" not in box.text(), timeout=10000)
    assert "codex --version: not found" in box.text()
