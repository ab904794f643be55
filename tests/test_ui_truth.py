"""The window says what is true now, after every decision: rounds a rewind dropped, the
rejections that still stand, an Elapsed that never runs backwards, who cancelled, a review
request that changed nothing. Real widgets fed real records, as the engine writes them."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from anima.store.models import HumanNote, Iteration, MilestoneRecord, Withdrawn
from ui.board import Board
from ui.formatting import ElapsedClock
from ui.monitor import IterationMonitor
from ui.review import ReviewPanel

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def rounds(*verdicts: str, start: datetime | None = None) -> list[Iteration]:
    """One round a minute from `start`, with a commit each, a reason for each rejection."""
    t0 = start or datetime.now(UTC) - timedelta(hours=1)
    return [Iteration(round=n, kind="feature", feature="F1", commit=f"{n:x}" * 40,
                      verdict=v, reason="" if v == "accepted" else f"wrong in round {n}",
                      started_at=t0 + timedelta(minutes=n),
                      ended_at=t0 + timedelta(minutes=n, seconds=50))
            for n, v in enumerate(verdicts, 1)]


def milestone(status: str, iterations: list[Iteration], **fields: object) -> MilestoneRecord:
    return MilestoneRecord(id="m1", title="Greeter", status=status,
                           created_at=iterations[0].started_at if iterations else
                           datetime.now(UTC), started_at=iterations[0].started_at
                           if iterations else datetime.now(UTC), iterations=iterations,
                           iteration_count=sum(it.verdict == "accepted" for it in iterations),
                           **fields)


def test_rounds_a_rewind_dropped_are_marked_and_leave_the_counters(qtbot) -> None:
    its = rounds("accepted", "rejected", "accepted", "rejected", "rejected", "accepted")
    for it in its[1:5]:
        it.withdrawn = Withdrawn.DROPPED
    record = milestone("paused", its, notes=[
        "continued from round 1 (rounds 2–5 dropped): milestone/m1 put back to 1111111"],
        pause_reason="3 consecutive rejections")
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    monitor.show_record(record)
    model = monitor.history.history
    verdicts = [model.index(r, model.COLUMNS.index("Verdict")).data() for r in range(6)]
    assert verdicts[0] == "ACCEPTED" and verdicts[5] == "ACCEPTED"
    assert verdicts[2] == "dropped · ACCEPTED"
    assert all(v.startswith("dropped · ") for v in verdicts[1:5])
    # Two rounds count (not "6 / 20"); the dropped ones are said, not added.
    assert monitor.header.round.value.text() == "2 / 20 · 4 dropped"
    panel = ReviewPanel()
    qtbot.addWidget(panel)
    panel.show_record(record)
    # A dropped round is no place to continue from, and its rejections no longer stand.
    assert [a.text().split(" · ")[0] for a in panel.continue_menu.actions()] == ["Round 1"]
    assert panel.rejections.text() == ""


def test_the_decision_bar_lists_only_the_rejections_that_still_stand(qtbot) -> None:
    panel = ReviewPanel()
    qtbot.addWidget(panel)
    # Rejected twice, then fixed and accepted, then stopped by you mid-round.
    fixed = milestone("paused", rounds("rejected", "rejected", "accepted"),
                      pause_reason="stopped by you")
    panel.show_record(fixed)
    assert panel.reason.text() == "stopped by you"
    assert panel.rejections.text() == "" and not panel.rejections.isVisibleTo(panel)
    standing = milestone("paused", rounds("accepted", "rejected", "rejected"),
                         pause_reason="stopped by you")
    panel.show_record(standing)
    assert panel.rejections.text() == "✘ Round 2: wrong in round 2\n✘ Round 3: wrong in round 3"


def test_elapsed_never_runs_backwards_when_a_round_is_cut_short(qtbot) -> None:
    start = datetime.now(UTC) - timedelta(seconds=354)
    its = [Iteration(round=1, kind="feature", verdict="accepted", started_at=start,
                     ended_at=start + timedelta(seconds=230))]
    running = milestone("in_progress", its)
    running.started_at = start
    monitor = IterationMonitor(clock=ElapsedClock())
    qtbot.addWidget(monitor)
    monitor.show_record(running)
    assert monitor.header.elapsed.value.text() in ("5:54", "5:55")
    # Stop now: round 2 was cut short, the last round on record ended at 3:50.
    monitor.show_record(running.model_copy(update={"status": "paused",
                                                   "pause_reason": "stopped by you"}))
    assert monitor.header.elapsed.value.text() in ("5:54", "5:55")


def test_a_cancelled_milestone_says_who_cancelled_it_and_when(qtbot) -> None:
    at = datetime.now(UTC).replace(hour=14, minute=5)
    record = milestone("cancelled", rounds("rejected"), pause_reason="stopped by you",
                       completed_at=at)
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    monitor.show_record(record)
    when = at.astimezone().strftime("%H:%M")
    assert monitor.phase_bar.text in (f"Cancelled by you at {when}",
                                      f"Cancelled by you at {at.astimezone():%-d %b %H:%M}")
    assert "stopped by you" not in monitor.phase_bar.text


def test_a_review_request_that_brought_no_new_commit_says_so(qtbot) -> None:
    its = rounds("accepted", "accepted")
    asked = its[-1].ended_at + timedelta(minutes=1)
    final = Iteration(round=3, kind="final", verdict="accepted",
                      started_at=asked + timedelta(seconds=5),
                      ended_at=asked + timedelta(seconds=20))
    record = milestone("awaiting_review", [*its, final],
                       human_notes=[HumanNote(at=asked, text="rename greet()", delivered=True)])
    panel = ReviewPanel()
    qtbot.addWidget(panel)
    panel.show_record(record)
    assert panel.reason.text().startswith("Back for review with no new commit")
    board = Board()
    qtbot.addWidget(board)
    board.set_records([record])
    assert board.cards["m1"].state.text().startswith("Back for review with no new commit")
    # With a commit after the request, it is an ordinary review again.
    fixed = Iteration(round=3, kind="fix", commit="c" * 40, verdict="accepted",
                      started_at=asked + timedelta(seconds=5),
                      ended_at=asked + timedelta(seconds=20))
    panel.show_record(record.model_copy(update={"iterations": [*its, fixed, final]}))
    assert "no new commit" not in panel.reason.text()
