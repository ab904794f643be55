"""The whole window as a desktop user drives it: Edit ▸ Find wherever the focus is, and a
question before closing or stopping while the agents work (none when idle)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from anima import events as ev
from tests.conftest import FakeClaude
from tests.helpers import make_project, record
from tests.test_ui_app import TWO, Window
from tests.test_ui_monitor import answer_dialog

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def ctrl_f(qtbot, widget) -> None:
    qtbot.keyClick(widget, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)


def test_ctrl_f_opens_the_search_of_the_focused_or_last_used_pane(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    make_project(git_repo, {"m1": TWO}, config={"auto_start": False})
    w = Window(qtbot, tmp_path)
    try:
        window = w.window
        window.open_project(git_repo)
        w.wait_status("m1", "pending")
        window.activateWindow()
        qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5000)
        page = w.page()
        developer, acceptor = page.monitor.panes["developer"], page.monitor.panes["acceptor"]
        acceptor.feed(ev.AssistantText("acceptor", "The tests pass.\n\nthe needle is here"))
        acceptor.flush()

        # The focus on the tab bar, no pane used yet: the Developer's search opens.
        tab_bar = window.tabs.tabBar()
        tab_bar.setFocus()
        ctrl_f(qtbot, tab_bar)
        assert developer.search.isVisible() and developer.search.edit.hasFocus()
        qtbot.keyClick(developer.search.edit, Qt.Key.Key_Escape)
        assert not developer.search.isVisible()

        # A click in the Acceptor's transcript gives it the focus; Ctrl+F searches it.
        qtbot.mouseClick(acceptor.view.viewport(), Qt.MouseButton.LeftButton)
        assert acceptor.view.hasFocus()
        ctrl_f(qtbot, acceptor.view)
        assert acceptor.search.isVisible() and not developer.search.isVisible()
        qtbot.keyClicks(acceptor.search.edit, "needle")
        assert acceptor.view.textCursor().selectedText() == "needle"
        qtbot.keyClick(acceptor.search.edit, Qt.Key.Key_Escape)  # Esc works in the window too
        assert not acceptor.search.isVisible() and acceptor.view.hasFocus()

        # Focus back on the tab bar: the pane used last is the one searched.
        tab_bar.setFocus()
        ctrl_f(qtbot, tab_bar)
        assert acceptor.search.isVisible() and not developer.search.isVisible()
        # On the Changes tab, Ctrl+F finds in the diff, not in a transcript.
        qtbot.keyClick(acceptor.search.edit, Qt.Key.Key_Escape)
        page.tabs.setCurrentWidget(page.changes)
        tab_bar.setFocus()
        ctrl_f(qtbot, tab_bar)
        assert page.tabs.currentWidget() is page.changes
        assert page.changes.search.isVisible() and page.changes.search.edit.hasFocus()
        assert [a.text() for a in window.menuBar().actions()][:3] == ["&File", "&Edit", "&Run"]
    finally:
        w.close()


def agents_at_work(qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> Window:
    """A window whose Developer is in the middle of a turn that does not end by itself."""
    make_project(git_repo, {"m1": TWO})
    fake.write_script({"developer": [{"hang": True}]})
    w = Window(qtbot, tmp_path)
    w.window.open_project(git_repo)
    developer = w.page().monitor.panes["developer"]
    qtbot.waitUntil(lambda: "working" in developer.state_label.text(), timeout=10000)
    return w


def test_closing_while_agents_work_asks_and_the_milestone_is_kept(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    w = agents_at_work(qtbot, git_repo, fake, tmp_path)
    window = w.window
    try:
        asked = answer_dialog("Cancel")
        window.close()
        assert asked and "Agents are working on Greeter" in asked[0]
        assert "resumes where it stopped" in asked[0]
        qtbot.wait(300)
        assert window.isVisible() and window.engine is not None
        assert w.page().monitor.panes["developer"].state_label.text().startswith("working")

        asked = answer_dialog("Stop and close")
        started = time.monotonic()
        window.close()
        qtbot.waitUntil(lambda: window.engine is None, timeout=15000)
        assert asked and time.monotonic() - started < 10
        assert not window.isVisible()
        assert record(git_repo, "m1").status.value == "in_progress"  # picked up on next start
    finally:
        w.close()


def test_closing_an_idle_window_asks_nothing(qtbot, git_repo: Path, fake: FakeClaude,
                                             tmp_path: Path) -> None:
    make_project(git_repo, {"m1": TWO}, config={"auto_start": False})
    w = Window(qtbot, tmp_path)
    window = w.window
    window.open_project(git_repo)
    w.wait_status("m1", "pending")
    seen: list[str] = []

    def watch() -> None:  # a dialog would block close(): note it and dismiss it
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox):
            seen.append(box.text())
            box.reject()

    watcher = QTimer()
    watcher.timeout.connect(watch)
    watcher.start(10)
    try:
        window.close()
        qtbot.waitUntil(lambda: window.engine is None, timeout=15000)
        assert seen == [] and not window.isVisible()
    finally:
        watcher.stop()
        w.close()


def test_stop_now_asks_first(qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    w = agents_at_work(qtbot, git_repo, fake, tmp_path)
    window = w.window
    stop = window.run_controls.stop_action
    developer = w.page().monitor.panes["developer"]
    try:
        qtbot.waitUntil(stop.isEnabled, timeout=5000)
        asked = answer_dialog("Cancel")
        stop.trigger()
        assert asked and "Stop both agents of “Greeter” now?" in asked[0]
        qtbot.wait(300)
        assert developer.state_label.text().startswith("working")
        answer_dialog("Stop now")
        stop.trigger()
        qtbot.waitUntil(lambda: not developer.state_label.text().startswith("working"),
                        timeout=10000)
    finally:
        w.close()
