"""Pause and Stop act on the milestone whose page is in front, and say so; on the board, on
every running milestone, and say that. Decisions are offered for every state that takes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import Window
from tests.test_ui_monitor import answer_dialog

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def three_at_once(qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> Window:
    """`p` paused by rejections while `h1` and `h2` each have a Developer turn that does not
    end by itself."""
    make_project(git_repo, {"p": milestone_md("Paused one", ["Alpha"]),
                            "h1": milestone_md("First busy one", ["Alpha"]),
                            "h2": milestone_md("Second busy one", ["Alpha"])},
                 config={"max_parallel_milestones": 3})
    no = {"text": "REJECTED: still wrong"}
    fake.write_script({"milestones": {
        "p": {"feature_dir": "features/p", "acceptor": [no, no, no]},
        "h1": {"feature_dir": "features/h1", "developer_default": {"hang": True}},
        "h2": {"feature_dir": "features/h2", "developer_default": {"hang": True}}}})
    w = Window(qtbot, tmp_path)
    w.window.open_project(git_repo)
    try:
        w.wait_status("p", "paused", timeout=30000)
        for milestone_id in ("h1", "h2"):
            pane = w.page(milestone_id).monitor.panes["developer"]
            qtbot.waitUntil(lambda p=pane: "working" in p.state_label.text(), timeout=10000)
    except BaseException:
        w.close()
        raise
    return w


def test_pause_and_stop_act_on_the_milestone_in_front_and_say_so(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    w = three_at_once(qtbot, git_repo, fake, tmp_path)
    window = w.window
    controls = window.run_controls
    pause, stop = controls.pause_action, controls.stop_action
    try:
        # The paused milestone's page: nothing to pause or stop there, whatever else runs.
        w.page("p")
        assert not pause.isEnabled() and not stop.isEnabled()

        w.page("h1")
        assert pause.isEnabled() and stop.isEnabled()
        pause.trigger()
        assert pause.text() == "Pausing after this round…" and not pause.isEnabled()
        assert "h1" in window.statusBar().currentMessage() or \
            "First busy one" in window.statusBar().currentMessage()
        # Another running milestone's page says nothing about h1's pause.
        w.page("h2")
        assert pause.text() == "Pause after this round" and pause.isEnabled()
        w.page("p")
        assert pause.text() == "Pause after this round" and not pause.isEnabled()
        w.page("h1")
        assert pause.text() == "Pausing after this round…"

        # The board: Stop says what it does — every running milestone.
        window.tabs.setCurrentIndex(0)
        assert stop.isEnabled()
        asked = answer_dialog("Cancel")
        stop.trigger()
        assert asked and "Stop all 2 running milestones now?" in asked[0], asked
        answer_dialog("Stop now")
        stop.trigger()
        w.wait_status("h1", "paused")
        w.wait_status("h2", "paused")
        assert not stop.isEnabled() and not pause.isEnabled()
        assert window._records["p"].pause_reason != window._records["h1"].pause_reason
        assert not [m for m in window.errors.messages if "not running" in m], \
            window.errors.messages
    finally:
        w.close()


def test_abort_is_offered_while_awaiting_review_and_before_the_start(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """`anima abort` takes an awaiting_review and a pending milestone: so does the window,
    asking first."""
    make_project(git_repo, {
        "r": "---\nrequires_human_review: true\n---\n" + milestone_md("Needs review", ["A"]),
        "q": "---\ndepends_on: [r]\n---\n" + milestone_md("Comes after", ["B"])})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("r", "awaiting_review", timeout=30000)
        for milestone_id, title in (("q", "Comes after"), ("r", "Needs review")):
            review = w.page(milestone_id).review
            assert review.abort_button.isVisible(), milestone_id
            asked = answer_dialog("Cancel")
            review.abort_button.click()
            assert asked and f"Abort “{title}”?" in asked[0]
            assert review.isEnabled() and w.status_of(milestone_id) != "cancelled"
            answer_dialog("Abort milestone")
            review.abort_button.click()
            w.wait_status(milestone_id, "cancelled")
        assert not [m for m in w.window.errors.messages if "Aborting" in m]
    finally:
        w.close()
