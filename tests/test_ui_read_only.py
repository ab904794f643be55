"""A second window on a project another Anima drives: read-only, saying who holds it, following
the files, and opening the project for real once the other one stops."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.conftest import FakeClaude
from tests.helpers import make_project
from tests.test_ui_app import TWO, Window

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
        assert window.pages.currentWidget() is window.monitor_page  # not "initialise it"
        assert w.status_of("m1") == "pending"
        assert not window.review.isEnabled() and not window.add_button.isEnabled()
        # The other Anima changes the record: the window follows the file.
        store = Store(ProjectPaths(git_repo))
        rec = store.load_record("m1")
        rec.status = MilestoneStatus.PAUSED
        rec.pause_reason = "3 consecutive rejections"
        store.save_record(rec)
        qtbot.waitUntil(lambda: w.status_of("m1") == "paused", timeout=10000)
        assert not window.review.isEnabled()
        if os.environ.get("ANIMA_SCREENSHOTS"):
            window.grab().save(str(Path(__file__).resolve().parent.parent / "docs"
                                   / "read_only.png"))
        # It stops: this window takes the project over and runs it.
        assert held.stdin is not None
        held.stdin.close()
        held.wait(10)
        qtbot.waitUntil(lambda: window.engine is not None, timeout=10000)
        assert window.read_only_holder is None and "(read-only)" not in window.windowTitle()
    finally:
        w.close()
