"""The window is fed by what changed: an idle project moves nothing on screen, and what the
user is in the middle of (an open Abort dialog, a request in flight, a dismissed banner)
survives the engine's rescans. The real MainWindow and the real engine in a temp git repo."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from anima.engine.facade import Engine
from anima.events import AgentEvent, EventBus, ToolUse
from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import TWO, Window
from ui.banner import ErrorBanner

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

# Long enough for the engine's once-a-second rescan to come round at least twice.
RESCANS_MS = 2500


def banner_texts(banner: ErrorBanner) -> list[str]:
    """What the error banner's rows say, as shown."""
    return [label.text() for label in banner.findChildren(QLabel, "errorText")]


def paused_project(repo: Path, config: dict[str, object] | None = None) -> Path:
    """A project whose milestone m1 paused after three rejections (as the loop leaves it)."""
    make_project(repo, {"m1": TWO}, config=config)
    store = Store(ProjectPaths(repo))
    store.scan(max_iterations=30, requires_human_review=False, register=True)
    rec = store.load_record("m1")
    rec.status = MilestoneStatus.PAUSED
    rec.pause_reason = "3 consecutive rejections"
    rec.consecutive_rejections = 3
    rec.started_at = datetime.now(UTC)
    store.save_record(rec)
    return repo


def test_an_idle_window_in_watch_mode_moves_nothing(qtbot, git_repo: Path, fake: FakeClaude,
                                                    tmp_path: Path) -> None:
    paused_project(git_repo)
    (git_repo / ".anima" / "milestones" / "broken.md").write_text("no title\n", "utf-8")
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        page = w.page()
        qtbot.waitUntil(page.review.isVisible, timeout=10000)
        qtbot.waitUntil(lambda: bool(w.window.errors.messages), timeout=5000)
        qtbot.wait(1500)  # the first rescans after the start
        moved: list[str] = []
        rounds = page.monitor.history.history
        rounds.modelReset.connect(lambda: moved.append("rounds reset"))
        rounds.dataChanged.connect(lambda *_a: moved.append("rounds redrawn"))
        w.window.board.counts_changed.connect(lambda *_a: moved.append("board recounted"))
        assert w.window.bridge is not None
        w.window.bridge.event_received.connect(
            lambda event: moved.append(f"published {type(event).__name__}"))
        qtbot.wait(3000)
        assert moved == []
        assert banner_texts(w.window.errors) == [m for m in w.window.errors.messages]
    finally:
        w.close()


def test_the_error_banner_neither_counts_rescans_nor_comes_back_once_dismissed(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    make_project(git_repo, {}, config={"auto_start": False})
    bad = git_repo / ".anima" / "milestones" / "broken.md"
    bad.write_text("just some words, no title\n", encoding="utf-8")
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        errors = w.window.errors
        qtbot.waitUntil(lambda: any("broken.md" in m for m in errors.messages), timeout=10000)
        qtbot.wait(RESCANS_MS)
        assert banner_texts(errors) == errors.messages  # no "(×3)" climbing per rescan
        errors.dismiss(next(m for m in errors.messages if "broken.md" in m))
        qtbot.wait(RESCANS_MS)
        assert not any("broken.md" in m for m in errors.messages)
        assert not errors.isVisible()
    finally:
        w.close()


def test_the_banner_goes_when_the_bad_file_is_fixed(qtbot, git_repo: Path, fake: FakeClaude,
                                                    tmp_path: Path) -> None:
    make_project(git_repo, {}, config={"auto_start": False})
    bad = git_repo / ".anima" / "milestones" / "broken.md"
    bad.write_text("just some words, no title\n", encoding="utf-8")
    gone = git_repo / ".anima" / "milestones" / "gone.md"
    gone.write_text("no title either\n", encoding="utf-8")
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        errors = w.window.errors
        qtbot.waitUntil(lambda: len(errors.messages) == 2, timeout=10000)
        bad.write_text(milestone_md("Fixed", ["One thing"]), encoding="utf-8")
        gone.unlink()
        qtbot.waitUntil(lambda: not errors.messages, timeout=10000)
        assert not errors.isVisible()
        w.wait_status("broken", "pending")
    finally:
        w.close()


def test_an_open_abort_dialog_survives_the_rescans(qtbot, git_repo: Path, fake: FakeClaude,
                                                   tmp_path: Path) -> None:
    paused_project(git_repo)
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        review = w.page().review
        qtbot.waitUntil(review.isVisible, timeout=10000)
        qtbot.keyClicks(review.note, "half-written note")
        seen: list[tuple[str, str]] = []

        def after_rescans() -> None:  # a rescan or two while the user reads the question
            box = QApplication.activeModalWidget()
            assert isinstance(box, QMessageBox)
            seen.append((box.text(), review.note.toPlainText()))
            next(b for b in box.buttons() if b.text().replace("&", "") == "Abort milestone"
                 ).click()

        QTimer.singleShot(RESCANS_MS, after_rescans)
        review.abort_button.click()  # the dialog's own event loop runs until the click
        assert seen and "Abort" in seen[0][0] and seen[0][1] == "half-written note"
        w.wait_status("m1", "cancelled")
    finally:
        w.close()


class SlowApproveEngine(Engine):
    """The real engine, whose approve takes as long as the test says (a slow merge)."""

    release = threading.Event()

    def approve(self, milestone_id: str) -> None:
        self.release.wait(20)
        super().approve(milestone_id)


def test_the_review_panel_stays_disabled_while_approve_runs_and_the_footer_follows(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    make_project(git_repo, {"m1": "---\nrequires_human_review: true\n---\n" + TWO})
    w = Window(qtbot, tmp_path)
    SlowApproveEngine.release = threading.Event()
    w.window.engine_factory = lambda root: SlowApproveEngine(
        root, config_overrides={"summarizer": {"enabled": False}})
    try:
        w.window.open_project(git_repo)
        w.wait_status("m1", "awaiting_review", timeout=30000)
        page = w.page()
        review, footer = page.review, page.monitor.phase_bar
        qtbot.waitUntil(review.isVisible, timeout=5000)
        assert footer.text == "Awaiting your review"
        review.approve_button.click()
        qtbot.wait(RESCANS_MS)
        assert not review.isEnabled()  # the request is still running
        SlowApproveEngine.release.set()
        w.wait_status("m1", "completed")
        qtbot.waitUntil(lambda: footer.text == "Completed", timeout=5000)
    finally:
        SlowApproveEngine.release.set()
        w.close()


def test_the_header_shows_the_rejection_limit_the_project_configures(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    paused_project(git_repo, config={"max_consecutive_rejections": 5})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        value = w.page().monitor.header.rejections.value
        qtbot.waitUntil(lambda: value.text() == "3 / 5", timeout=10000)
        assert value.property("level") == "note"  # 3 of 5: not yet the limit
    finally:
        w.close()


def test_switching_projects_leaves_nothing_of_the_old_one(qtbot, git_repo: Path,
                                                          fake: FakeClaude,
                                                          tmp_path: Path) -> None:
    make_project(git_repo, {"m1": TWO})
    fake.write_script({"acceptor": [{"text": "REJECTED: still wrong"}] * 3})
    other = tmp_path / "other"
    other.mkdir()
    run_git(other, "init", "-q", "-b", "main")
    run_git(other, "commit", "-q", "--allow-empty", "-m", "chore: start")
    make_project(other, {"b1": TWO}, config={"auto_start": False})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("m1", "paused", timeout=30000)
        page = w.page()
        qtbot.waitUntil(lambda: page.monitor.phase_bar.text.startswith("Paused"), timeout=5000)
        assert w.window.windowTitle() == "Anima — repo — 1 needs you"
        w.window.open_project(other)
        w.wait_status("b1", "pending")
        qtbot.wait(300)
        # The old project's pages are closed, its cards gone, its counts out of the title.
        assert w.window.milestone_pages == {} and w.window.tabs.count() == 1
        assert list(w.window.board.cards) == ["b1"]
        assert w.window.windowTitle() == "Anima — other"
    finally:
        w.close()


def test_agent_events_say_which_milestone_and_what_a_tool_call_does(
        git_repo: Path, fake: FakeClaude) -> None:
    """A view needs neither the scheduler's state nor the agent dialect to place and show
    what an agent said: the engine stamps each agent event on its way out."""
    make_project(git_repo, {"m1": TWO})
    bus = EventBus()
    said: list[AgentEvent] = []
    bus.subscribe(lambda e: said.append(e) if isinstance(e, AgentEvent) else None)
    engine = Engine(git_repo, bus=bus, config_overrides={"summarizer": {"enabled": False}})
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    assert said and {e.milestone_id for e in said} == {"m1"}
    tools = [e for e in said if isinstance(e, ToolUse)]
    assert tools and all(e.summary.startswith(e.tool) for e in tools)
    assert any(e.summary.startswith("Bash: git ") for e in tools)
