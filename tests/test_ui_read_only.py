"""A second window on a project another Anima drives: read-only, saying who holds it, following
the files, and opening the project for real once the other one stops."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.conftest import FakeClaude
from tests.helpers import make_project
from tests.test_ui_app import TWO, Window, screenshot
from ui import read_only

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

HOLD = """
import sys
from anima.lock import ProjectLock
lock = ProjectLock(sys.argv[1], command="anima run /elsewhere --headless")
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


@pytest.fixture
def held(git_repo: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the project's lock until its stdin is closed."""
    make_project(git_repo, {"m1": TWO})
    paths = ProjectPaths(git_repo)
    Store(paths).register(paths.milestone_md("m1"), datetime.now(UTC), max_iterations=20,
                          requires_human_review=False)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(paths.lock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield holder
    holder.kill()
    holder.wait(10)


def test_a_project_run_elsewhere_opens_read_only_then_for_real_when_freed(
        qtbot, git_repo: Path, held: subprocess.Popen[str], fake_claude: FakeClaude,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_claude.use_env(monkeypatch)
    w = Window(qtbot, tmp_path)
    try:
        window = w.window
        window.open_project(git_repo)
        notice = next(m for m in window.errors.messages if m.startswith("Opened read-only"))
        assert f"pid {held.pid}" in notice and "anima run /elsewhere --headless" in notice
        assert window.engine is None and "(read-only)" in window.windowTitle()
        assert window.pages.currentWidget() is window.tabs  # not "initialise it"
        assert w.status_of("m1") == "pending"
        page = w.page()
        assert not page.review.isEnabled() and not window.add_action.isEnabled()
        # Idle files are not read again (validating many long records would stall the window).
        shown = window._records["m1"]
        qtbot.wait(2 * read_only.REFRESH_MS + 300)
        assert window._records["m1"] is shown
        # The other Anima changes the record: the window follows the file.
        store = Store(ProjectPaths(git_repo))
        rec = store.load_record("m1")
        rec.status = MilestoneStatus.PAUSED
        rec.pause_reason = "3 consecutive rejections"
        store.save_record(rec)
        qtbot.waitUntil(lambda: w.status_of("m1") == "paused", timeout=10000)
        assert not page.review.isEnabled()
        if os.environ.get("ANIMA_SCREENSHOTS"):  # for docs/, in the app's own style
            screenshot(window, qtbot, "read_only.png")
        # It stops: this window takes the project over and runs it.
        assert held.stdin is not None
        held.stdin.close()
        held.wait(10)
        qtbot.waitUntil(lambda: window.engine is not None, timeout=10000)
        assert window.read_only_holder is None and "(read-only)" not in window.windowTitle()
    finally:
        w.close()


def test_a_closed_read_only_window_takes_nothing_over(
        qtbot, git_repo: Path, held: subprocess.Popen[str], fake_claude: FakeClaude,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The other Anima stops just after this window was closed: the window, gone for the
    user, must not open the project and start its agents."""
    fake_claude.use_env(monkeypatch)
    w = Window(qtbot, tmp_path)
    w.window.open_project(git_repo)
    assert w.window.read_only_holder is not None
    w.window.close_without_asking()
    qtbot.waitUntil(lambda: not w.window.isVisible(), timeout=5000)
    assert held.stdin is not None
    held.stdin.close()
    held.wait(10)
    qtbot.wait(2 * read_only.REFRESH_MS + 300)
    assert w.window.engine is None
    assert not [t for t in threading.enumerate() if t.name == "anima-engine"]
    w.window.deleteLater()


HOLDER_WINDOW = """
import os, sys
from pathlib import Path
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication
from anima.engine.facade import Engine
from ui.main_window import MainWindow

app = QApplication([])
window = MainWindow(QSettings(sys.argv[2], QSettings.Format.IniFormat),
                    engine_factory=lambda root: Engine(root, config_overrides={
                        "summarizer": {"enabled": False}}))
front = window._bring_to_front
def brought() -> None:  # what the user sees, said on stdout for the test
    front()
    print("brought to the front", flush=True)
window._bring_to_front = brought
window.show()
window.open_project(Path(sys.argv[1]))
def listening() -> None:
    if window._raise_server is None:
        QTimer.singleShot(50, listening)
    else:
        print("listening", flush=True)
QTimer.singleShot(50, listening)
app.exec()
"""


def line_within(process: subprocess.Popen[str], seconds: float) -> str:
    """The process's next stdout line, or "" if none comes in time (never hangs the test)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().strip() if ready else ""


def test_a_second_window_brings_the_window_that_runs_the_project_forward(
        qtbot, git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {})
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER_WINDOW, str(git_repo), str(tmp_path / "first.ini")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    try:
        assert line_within(first, 20) == "listening"
        w = Window(qtbot, tmp_path)
        try:
            w.window.open_project(git_repo)
            assert w.window.engine is None and w.window.read_only_holder is not None
            assert w.window.read_only_holder.pid == first.pid
            assert line_within(first, 10) == "brought to the front"
            assert any("Its window has been brought to the front." in m
                       for m in w.window.errors.messages)
        finally:
            first.terminate()
            first.wait(15)
            w.close()
    finally:
        first.kill()
