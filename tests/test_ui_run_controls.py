"""Pause and Stop act on the milestone whose page is in front, and say so; on the board, on
every running milestone, and say that. Decisions are offered for every state that takes them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from anima.store.models import MilestoneRecord
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import Window
from tests.test_ui_monitor import answer_dialog
from ui.formatting import ElapsedClock
from ui.monitor import IterationMonitor

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
    def ready(w: Window) -> None:
        w.wait_status("p", "paused", timeout=30000)
        for milestone_id in ("h1", "h2"):
            pane = w.page(milestone_id).monitor.panes["developer"]
            qtbot.waitUntil(lambda p=pane: "working" in p.state_label.text(), timeout=10000)

    return opened(qtbot, git_repo, tmp_path, ready)


def opened(qtbot, git_repo: Path, tmp_path: Path, ready: Callable[[Window], None]) -> Window:
    """The window on the project, once `ready` says it is as the test needs it."""
    w = Window(qtbot, tmp_path)
    w.window.open_project(git_repo)
    try:
        ready(w)
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
        # (the records can arrive before the run's end, which the buttons follow)
        qtbot.waitUntil(lambda: not stop.isEnabled() and not pause.isEnabled(), timeout=5000)
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


def two_paused(qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> Window:
    """`p1` and `p2` paused by three rejections each (then accepted once resumed)."""
    make_project(git_repo, {"p1": milestone_md("First", ["Alpha"]),
                            "p2": milestone_md("Second", ["Alpha"])},
                 config={"max_parallel_milestones": 2})
    no = {"text": "REJECTED: still wrong"}
    fake.write_script({"milestones": {
        "p1": {"feature_dir": "features/p1", "acceptor": [no, no, no]},
        "p2": {"feature_dir": "features/p2", "acceptor": [no, no, no]}}})
    return opened(qtbot, git_repo, tmp_path, lambda w: [
        w.wait_status(m, "paused", timeout=30000) for m in ("p1", "p2")])


def test_a_double_click_on_a_cards_resume_sends_one_request(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    w = two_paused(qtbot, git_repo, fake, tmp_path)
    window = w.window
    try:
        window.board.refresh_now()
        card = window.board.cards["p1"]
        assert card.button.text() == "Resume" and card.button.isEnabled()
        card.button.click()
        pressable = card.button.isEnabled()
        card.button.click()
        w.wait_status("p1", "completed", timeout=30000)
        qtbot.wait(300)
        assert not [m for m in window.errors.messages if "not paused" in m], \
            window.errors.messages
        assert not pressable  # until the request took effect (or failed)
        assert w.status_of("p2") == "paused"
        assert window.board.cards["p2"].button.isEnabled()
    finally:
        w.close()


def test_a_refused_request_reenables_its_own_decision_only(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """p1 is resumed twice (its page and its card, both sent before either took effect): the
    second is refused; p2's Resume, sent after, is still in flight when the refusal comes."""
    w = two_paused(qtbot, git_repo, fake, tmp_path)
    window = w.window
    try:
        page1, page2 = w.page("p1"), w.page("p2")
        card1 = window.board.cards["p1"]
        seen: list[tuple[str, bool, bool, bool]] = []
        bridge = window.bridge
        assert bridge is not None
        bridge.error_raised.connect(lambda e: seen.append(
            (e.message, page1.review.isEnabled(), card1.button.isEnabled(),
             page2.review.isEnabled())))
        release = threading.Event()
        bridge.call("a test's hold on the bridge's worker", lambda: release.wait(10))
        page1.review.resume_button.click()
        card1.button.click()
        page2.review.resume_button.click()
        in_flight = (page1.review.isEnabled(), card1.button.isEnabled(),
                     page2.review.isEnabled())
        release.set()
        qtbot.waitUntil(lambda: bool(seen), timeout=10000)
        message, page1_enabled, card1_enabled, page2_enabled = seen[0]
        assert "'p1' is in_progress" in message
        assert not page2_enabled  # p2's request is not answered yet: its bar waits for it
        assert page1_enabled and card1_enabled  # p1's are
        assert in_flight == (False, False, False)
        w.wait_status("p2", "in_progress", timeout=10000)
    finally:
        w.close()


def test_elapsed_stops_with_a_milestone_stopped_in_its_first_round(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """Stopped before any round ended, a milestone has no round end to count to: its Elapsed
    (page and card) stays what it was, and never counts on to now."""
    make_project(git_repo, {"m1": milestone_md("Hangs", ["Alpha"])})
    fake.write_script({"developer": [{"hang": True}]})
    w = Window(qtbot, tmp_path)
    window = w.window
    try:
        window.open_project(git_repo)
        page = w.page("m1")
        developer = page.monitor.panes["developer"]
        qtbot.waitUntil(lambda: "working" in developer.state_label.text(), timeout=10000)
        qtbot.wait(1100)  # a tick of the clock while it runs
        answer_dialog("Stop now")
        window.run_controls.stop_action.trigger()
        w.wait_status("m1", "paused")
        assert not window._records["m1"].iterations
        elapsed = page.monitor.header.elapsed.value
        card = window.board.cards["m1"]
        before = (elapsed.text(), card.stats.text())
        qtbot.wait(2300)  # two ticks of the clock
        window.board.refresh_now()
        assert (elapsed.text(), card.stats.text()) == before
        assert elapsed.text() != "—"  # what it showed while it ran
    finally:
        w.close()


def test_a_window_opened_on_a_milestone_stopped_in_its_first_round_shows_no_elapsed(
        qtbot) -> None:
    started = datetime.now(UTC) - timedelta(minutes=5)
    record = MilestoneRecord(id="m1", title="Hangs", status="paused", created_at=started,
                             started_at=started, pause_reason="stopped by you")
    monitor = IterationMonitor(clock=ElapsedClock())
    qtbot.addWidget(monitor)
    monitor.show_record(record)
    assert monitor.header.elapsed.value.text() == "—"


def test_start_in_flight_on_a_pending_page_leaves_abort_usable(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """Start on a pending milestone that cannot start yet (the only slot is busy): the whole
    decision bar was disabled, Abort with it, for as long as the other one ran."""
    make_project(git_repo, {"a": milestone_md("Busy one", ["Alpha"]),
                            "b": milestone_md("Waiting one", ["Alpha"])},
                 config={"auto_start": False, "max_parallel_milestones": 1})
    fake.write_script({"milestones": {
        "a": {"feature_dir": "features/a", "developer_default": {"hang": True}},
        "b": {"feature_dir": "features/b"}}})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("a", "pending")
        w.page("a").review.start_button.click()
        w.wait_status("a", "in_progress")
        review = w.page("b").review
        qtbot.waitUntil(review.isVisible, timeout=5000)
        review.start_button.click()  # queued behind "a": b stays pending
        qtbot.wait(1500)
        assert w.status_of("b") == "pending"
        # The user changes their mind: Abort should still be there.
        assert review.abort_button.isVisible()
        assert review.abort_button.isEnabled() and review.isEnabled(), \
            "Abort of a pending milestone is unusable while its Start waits for a slot"
        assert not review.start_button.isEnabled()  # asked once is enough
    finally:
        w.close()


def test_closing_a_page_during_its_replay_then_reopening_it(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path, caplog) -> None:
    """The transcript came for a page already closed: its replay raised (a deleted timer),
    and the bridge dropped the rest of that batch of engine events."""
    make_project(git_repo, {"m1": milestone_md("Busy", ["Alpha"])})
    fake.write_script({"developer": [{"text": "line " * 50 + "\n", "hang": True}]})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("m1", "in_progress")
        pane_ready = w.page("m1").monitor.panes["developer"]
        qtbot.waitUntil(lambda: "working" in pane_ready.state_label.text(), timeout=10000)
        w.window.close_page("m1")
        for _ in range(5):  # close during replay, five times, fast
            page = w.window.open_page("m1")
            assert page is not None and page.replaying
            w.window.close_page("m1")
        qtbot.wait(1500)
        page = w.page("m1")
        qtbot.wait(500)
        failed = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
        assert not failed, [r.getMessage() + str(r.exc_info) for r in failed]
        assert not page.replaying
    finally:
        w.close()


def test_stop_all_on_the_board_does_what_its_dialog_says_of_waiting_milestones(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """"Stop all 2 now" said "the milestones that wait for a slot do not start", and the
    freed slots started the waiting one: the dialog says what happens."""
    make_project(git_repo, {"h1": milestone_md("First busy one", ["Alpha"]),
                            "h2": milestone_md("Second busy one", ["Alpha"]),
                            "w3": milestone_md("Waiting one", ["Alpha"])},
                 config={"max_parallel_milestones": 2})
    hang = {"developer_default": {"hang": True}}
    fake.write_script({"milestones": {
        "h1": {"feature_dir": "features/h1", **hang},
        "h2": {"feature_dir": "features/h2", **hang},
        "w3": {"feature_dir": "features/w3", **hang}}})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("h1", "in_progress")
        w.wait_status("h2", "in_progress")
        qtbot.waitUntil(lambda: len(w.window.run_controls.targets()) == 2, timeout=10000)
        assert w.status_of("w3") == "pending"
        w.window.tabs.setCurrentIndex(0)  # the Board
        asked = answer_dialog("Stop now")
        w.window.run_controls.stop_action.trigger()
        assert asked and "pending milestones start in the slots this frees" in asked[0]
        w.wait_status("h1", "paused")
        w.wait_status("h2", "paused")
        w.wait_status("w3", "in_progress")
    finally:
        w.close()
