"""IterationMonitor's bars and ReviewPanel, fed real records and events."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from PySide6.QtCore import Qt, QTimer

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication, QMessageBox

from anima import events as ev
from anima.store.models import (
    CheckRun,
    Feature,
    FeatureStatus,
    Iteration,
    MergeInfo,
    MergeState,
    MilestoneRecord,
    Spend,
)
from ui.monitor import FeatureChecklist, IterationMonitor
from ui.review import ReviewPanel

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def answer_dialog(button: str) -> list[str]:
    """Click `button` of the next modal dialog once it is open; collects its text."""
    asked: list[str] = []

    def answer() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(10, answer)
            return
        asked.append(f"{box.text()} {box.informativeText()}")
        next(b for b in box.buttons() if b.text().replace("&", "") == button).click()

    QTimer.singleShot(0, answer)
    return asked


def make_record(status: str = "in_progress", rejections: int = 2) -> MilestoneRecord:
    its = [Iteration(round=1, kind="feature", feature="F1", commit="a" * 40, verdict="accepted",
                     tokens=1200, cost_usd=0.05, started_at=T0,
                     ended_at=T0 + timedelta(seconds=75),
                     check=CheckRun(command="pytest -q", passed=True, exit_code=0,
                                    duration_seconds=2.34, tail="3 passed"))]
    its += [Iteration(round=i, kind="fix", feature="F2", commit="b" * 40, verdict="rejected",
                      reason=f"reason {i}", started_at=T0, ended_at=T0,
                      check=CheckRun(command="pytest -q", passed=False, exit_code=1,
                                     tail="FAILED test_version") if i == 2 else None)
            for i in (2, 3)]
    return MilestoneRecord(
        id="m1", title="Greeter", status=status, created_at=T0, started_at=T0,
        iteration_count=1, consecutive_rejections=rejections, tokens_used=4321, cost_usd=0.123,
        features=[Feature(id="F1", title="Greet", status="done", rounds=1, commits=["a" * 40]),
                  Feature(id="F2", title="Version", status="in_progress", rounds=2),
                  Feature(id="F3", title="Help")],
        iterations=its, pause_reason="3 consecutive rejections" if status == "paused" else None)


def test_header_checklist_and_history_show_the_record(qtbot) -> None:
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    monitor.show_record(make_record())
    header = monitor.header
    assert header.title.text() == "Greeter"
    assert header.round.value.text() == "3 / 20"  # rounds run: what the limit counts
    assert header.rejections.value.text() == "2 / 3"
    assert header.rejections.value.property("level") == "warn"
    assert header.features.value.text() == "1 / 3"
    assert header.tokens.value.text() == "4.3k" and header.cost.value.text() == "$0.12"
    assert monitor.checklist.lines() == ["[x]  F1  Greet   — 1 round · 1 commit",
                                         "[/]  F2  Version   — 2 rounds", "[ ]  F3  Help"]
    model = monitor.history.history
    assert model.rowCount() == 3
    row = [model.index(0, c).data() for c in range(model.columnCount())]
    assert row == ["1", "feature", "F1", "aaaaaaa", "✓ 2.3 s", "ACCEPTED", "1.2k", "$0.05",
                   "1:15"]
    assert model.index(1, 5).data() == "REJECTED: reason 2"
    # The Checks column: Anima's own run of the project's checks, or none.
    assert [model.index(r, 4).data() for r in range(3)] == ["✓ 2.3 s", "✗ exit 1", "—"]
    tip = model.index(1, 4).data(Qt.ItemDataRole.ToolTipRole)
    assert "Checks: `pytest -q` — ✗ exit 1" in tip and "FAILED test_version" in tip


def test_the_header_counts_what_the_round_in_flight_spent(qtbot) -> None:
    """README: every dollar counts, the round in flight's too (`in_flight`, settled at its
    verdict or, after a kill, at the next start); the header showed only the totals."""
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    rec = make_record()
    rec.in_flight = Spend(cost_usd=0.7)
    monitor.show_record(rec)
    assert monitor.header.cost.value.text() == "$0.82 (incl. $0.70 in flight)"


def test_the_acceptor_pane_shows_the_checks_while_they_run(qtbot) -> None:
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    pane = monitor.panes["acceptor"]
    monitor.show_events([ev.CheckStarted("m1", 2, "pytest -q", time.time() - 65, 600.0)])
    pane.flush()
    assert "▶ Anima runs the checks: pytest -q" in pane.plain_text()
    assert pane.state_label.text() in ("running checks · 1:05", "running checks · 1:06")
    monitor.show_events([ev.CheckFinished("m1", 2, "pytest -q", False, "exited 1 after 65.2 s",
                                          "collected 3 items\nFAILED test_version")])
    pane.flush()
    text = pane.plain_text()
    assert "✗ checks exited 1 after 65.2 s" in text and "FAILED test_version" in text
    assert pane.state_label.text() == "idle · checks exited 1 after 65.2 s"
    assert "checks" not in monitor.panes["developer"].plain_text()


def test_phase_bar_follows_the_scheduler_and_counts_down(qtbot) -> None:
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    expected = {"developer": "Waiting for Developer", "acceptor": "Waiting for Acceptor",
                "final_acceptance": "Final acceptance", "recovering": "Resuming",
                "completed": "Completed", "awaiting_review": "Awaiting your review"}
    for phase, text in expected.items():
        monitor.on_phase_changed(ev.PhaseChanged("m1", phase, "idle"))
        assert monitor.phase_bar.text == text
    monitor.on_phase_changed(ev.PhaseChanged("m1", "paused", "acceptor", "round limit"))
    assert monitor.phase_bar.text == "Paused — round limit"
    monitor.on_phase_changed(ev.PhaseChanged("m1", "developer", "paused",
                                             deadline=time.time() + 125))
    assert monitor.panes["developer"].active and not monitor.panes["acceptor"].active
    assert monitor.phase_bar.countdown.text() in ("turn times out in 2:05",
                                                  "turn times out in 2:04")
    monitor.on_phase_changed(ev.PhaseChanged("m1", "acceptor", "developer"))
    assert monitor.panes["acceptor"].active and not monitor.panes["developer"].active


def test_review_panel_for_a_paused_milestone(qtbot) -> None:
    panel = ReviewPanel()
    qtbot.addWidget(panel)
    panel.show_record(make_record("paused", 3))
    assert panel.isVisibleTo(panel.parentWidget() or panel)
    assert panel.reason.text() == "3 consecutive rejections"
    assert panel.rejections.text() == "✘ Round 2: reason 2\n✘ Round 3: reason 3"
    panel.note.setPlainText("look at F2")
    with qtbot.waitSignal(panel.resume_requested) as blocker:
        panel.resume_button.click()
    assert blocker.args == ["m1", "look at F2"]
    panel.show_record(make_record("paused", 3))  # the same decision, rescanned
    assert not panel.isEnabled()  # the request is still in flight
    panel.setEnabled(True)  # it was refused: the window hands the decision back
    aborted: list[str] = []
    panel.abort_requested.connect(aborted.append)
    asked = answer_dialog("Cancel")
    panel.abort_button.click()
    assert aborted == [] and "cancelled for good" in asked[0]
    answer_dialog("Abort milestone")
    panel.abort_button.click()
    assert aborted == ["m1"]
    done = make_record("completed", 0)
    done.merge = MergeInfo(state=MergeState.FAILED, merged=False,
                           detail="merging milestone/m1 into main conflicts in "
                                   "a.py; the merge was aborted")
    panel.show_record(done)
    assert panel.mode == "completed" and panel.reason.text().startswith("Not merged: merging")
    assert not any(b.isVisible() for b in (panel.resume_button, panel.abort_button,
                                           panel.approve_button, panel.changes_button))


def test_elapsed_stops_while_the_milestone_waits(qtbot) -> None:
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    monitor.show_record(make_record("paused", 3))
    # Started at T0, the last round ended at T0 + 75 s: a pause does not keep counting.
    assert monitor.header.elapsed.value.text() == "1:15"
    monitor.show_record(make_record("in_progress", 0))
    assert monitor.header.elapsed.value.text() != "1:15"  # running: counts up to now


def test_while_several_run_the_monitor_stays_with_the_one_it_follows(qtbot) -> None:
    """Another milestone's phases and agents do not mix into the panes or move the bar;
    once the followed one leaves the loop, the next one's phase is followed."""
    monitor = IterationMonitor()
    qtbot.addWidget(monitor)
    monitor.on_phase_changed(ev.PhaseChanged("m1", "developer", "idle"))
    monitor.on_phase_changed(ev.PhaseChanged("m2", "acceptor", "developer"))
    assert monitor.live_milestone == "m1" and monitor.phase_bar.text == "Waiting for Developer"
    monitor.show_events([
        ev.AssistantText(role="developer", text="from m1", milestone_id="m1"),
        ev.AssistantText(role="developer", text="from m2", milestone_id="m2")])
    pane = monitor.panes["developer"]
    pane.flush()
    assert "from m1" in pane.plain_text() and "from m2" not in pane.plain_text()
    monitor.on_phase_changed(ev.PhaseChanged("m1", "completed", "merging"))
    monitor.on_phase_changed(ev.PhaseChanged("m2", "developer", "acceptor"))
    assert monitor.live_milestone == "m2" and monitor.phase_bar.text == "Waiting for Developer"


def test_the_checklist_updates_a_line_in_place_and_keeps_its_scroll(qtbot) -> None:
    """A round changes one feature's line; the rest of the list (and where the human scrolled
    to) stays as it was, and only the feature in progress is bold."""
    checklist = FeatureChecklist()
    qtbot.addWidget(checklist)
    checklist.resize(300, 120)
    checklist.show()
    features = [Feature(id=f"F{i}", title=f"Feature {i}") for i in range(1, 31)]
    checklist.show_features(features)
    checklist.scrollToBottom()
    scrolled = checklist.verticalScrollBar().value()
    assert scrolled > 0
    first = checklist.item(0)
    features[29] = features[29].model_copy(update={"status": FeatureStatus.IN_PROGRESS,
                                                   "rounds": 1})
    checklist.show_features(features)
    assert checklist.verticalScrollBar().value() == scrolled
    assert checklist.item(0) is first and checklist.count() == 30
    assert checklist.lines()[29].endswith("Feature 30   — 1 round")
    assert checklist.item(29).font().bold() and not checklist.item(0).font().bold()
    features[29] = features[29].model_copy(update={"status": FeatureStatus.DONE})
    checklist.show_features(features)
    assert not checklist.item(29).font().bold()
    checklist.show_features([])
    assert checklist.lines() == ["No features parsed from this milestone"]


def test_live_lines_that_come_while_a_page_replays_land_after_the_history(qtbot) -> None:
    """A page opened on a running milestone (as `MainWindow.open_page` does): its phase, a
    verdict and agent output come while the transcript is read; all of them show below the
    replayed history, in the order they came."""
    from anima.phases import Phase
    from ui.milestone_page import MilestonePage

    page = MilestonePage("m")
    qtbot.addWidget(page)
    page.show()
    page.begin_replay()
    page.on_phase_changed(ev.PhaseChanged("m", Phase.ACCEPTOR, Phase.DEVELOPER))
    page.feed([ev.AssistantText("acceptor", "live review line", milestone_id="m")])
    page.feed([ev.VerdictReached("m", 7, "feature", True)])
    page.feed([ev.AssistantText("acceptor", "after the verdict", milestone_id="m")])
    page.replay([ev.AssistantText("acceptor", f"old review {i}\nACCEPTED", milestone_id="m")
                 for i in range(3)])
    qtbot.waitUntil(lambda: not page.replaying)
    pane = page.monitor.panes["acceptor"]
    pane.flush()
    text = pane.plain_text()
    order = [text.index(s) for s in ("old review 2", "──── Acceptor · ", "live review line",
                                     "Round 7 ACCEPTED", "after the verdict")]
    assert order == sorted(order), text
    assert page.monitor.phase_bar.text == "Waiting for Acceptor"


def test_a_verdict_both_replayed_and_held_live_is_shown_once(qtbot) -> None:
    """The transcript keeps the verdicts too: one that came while it was read is in both."""
    from ui.milestone_page import MilestonePage

    page = MilestonePage("m")
    qtbot.addWidget(page)
    page.show()
    page.begin_replay()
    said = ev.AssistantText("acceptor", "REJECTED: no test", milestone_id="m")
    verdict = ev.VerdictReached("m", 2, "feature", False, "no test")
    after = ev.AssistantText("developer", "adding the test", milestone_id="m")
    page.feed([said, verdict, after])
    page.replay([ev.AssistantText("acceptor", "earlier", milestone_id="m"), said, verdict])
    qtbot.waitUntil(lambda: not page.replaying)
    texts = {}
    for role, pane in page.monitor.panes.items():
        pane.flush()
        texts[role] = pane.plain_text()
    assert texts["acceptor"].count("✘ Round 2 REJECTED: no test") == 1, texts["acceptor"]
    assert texts["developer"].count("✘ Round 2 REJECTED: no test") == 1, texts["developer"]
    developer = texts["developer"]
    assert developer.index("REJECTED: no test") < developer.index("adding the test")


def test_a_new_verdict_redraws_its_row_and_an_edited_criterion_reaches_the_checklist(
        qtbot) -> None:
    """Each record update used to redraw every row of the rounds table on every open page
    (the window lagged with six busy milestones); and a criterion you edited in the `.md`
    of a running milestone did not reach the feature's tooltip."""
    from ui.round_history import RoundHistory

    t0 = datetime.now(UTC)
    its = [Iteration(round=n, kind="feature", feature="F1", commit=f"{n:x}" * 40,
                     verdict="accepted", started_at=t0, ended_at=t0) for n in range(1, 11)]
    table = RoundHistory()
    qtbot.addWidget(table)
    table.show_iterations(its)
    redrawn: list[tuple[int, int]] = []
    table.history.dataChanged.connect(lambda a, b, *_: redrawn.append((a.row(), b.row())))
    changed = its[6].model_copy(update={"summary": "F1 done"})
    table.show_iterations([*its[:6], changed, *its[7:]])
    assert redrawn == [(6, 6)]
    table.show_iterations([*its[:6], changed, *its[7:]])
    assert redrawn == [(6, 6)]  # the same rounds again: nothing drawn

    checklist = FeatureChecklist()
    qtbot.addWidget(checklist)
    checklist.show_features([Feature(id="F1", title="Greet", criteria=["says hello"])])
    checklist.show_features([Feature(id="F1", title="Greet", criteria=["says hello twice"])])
    assert "says hello twice" in checklist.item(0).toolTip()


def test_the_rounds_table_at_1000_px_keeps_each_verdict_word_whole(qtbot) -> None:
    """The Rounds table gets about 575 px of a 1000 px window: with the checks run, long
    rounds and big spends, the Verdict column was cut to "REJ…" (and "dro…" for a dropped
    round), the header to "Verdic". The verdict word stays whole; the reason is elided (and
    whole in the row's tooltip)."""
    from ui.round_history import RoundHistory
    long_round = [Iteration(round=r, kind="feature", feature=f"F{r}", commit="c" * 40,
                            verdict="rejected", reason="make_greeting(None) returns 'Hello, "
                            "None!' instead of raising ValueError", tokens=1_234_567,
                            cost_usd=12.34, started_at=T0,
                            ended_at=T0 + timedelta(seconds=3900),
                            check=CheckRun(command="pytest", passed=True,
                                           duration_seconds=123.4))
                  for r in range(10, 13)]
    table = RoundHistory()
    qtbot.addWidget(table)
    table.resize(575, 200)
    table.show()
    table.show_iterations(long_round, dropped={10})
    qtbot.wait(50)
    header, fm = table.horizontalHeader(), table.fontMetrics()
    column = table.history.COLUMNS.index("Verdict")
    shown = [fm.elidedText(table.history.index(row, column).data(), Qt.TextElideMode.ElideRight,
                           header.sectionSize(column) - 12) for row in range(3)]
    assert shown[0].startswith("dropped · REJECTED") and shown[1].startswith("REJECTED"), shown
    assert header.sectionSize(column) >= header.sectionSizeHint(column)  # "Verdict" whole
    # Roomy, it still takes what the other columns leave.
    table.resize(1200, 200)
    qtbot.wait(50)
    assert sum(header.sectionSize(i) for i in range(header.count())) >= \
        table.viewport().width() - 1


def test_rounds_appended_on_screen_keep_their_kind_whole(qtbot) -> None:
    """Rounds come one by one while the page shows: at 1400×900 the Kind column said
    "feat…" for every feature round."""
    from ui.round_history import RoundHistory
    rounds = [Iteration(round=r, kind=kind, feature="F1", commit="a" * 40, verdict="accepted",
                        started_at=T0, ended_at=T0)
              for r, kind in ((1, "feature"), (2, "feature"), (3, "fix"))]
    table = RoundHistory()
    qtbot.addWidget(table)
    table.resize(800, 150)
    table.show()
    for n in range(1, 4):
        table.show_iterations(rounds[:n])
        qtbot.wait(10)
    column = table.history.COLUMNS.index("Kind")
    # As wide as its widest cell ("feature") asks, as for rows shown all at once.
    assert table.horizontalHeader().sectionSize(column) >= table.sizeHintForColumn(column)
