"""The board and the milestone pages: the real window on the real engine (nothing auto-starts),
with records and agent output published on the engine's own bus, as its loop publishes them."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPointF, Qt, QTimer
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication, QWidget

from anima import events as ev
from anima.paths import ProjectPaths
from anima.phases import Phase
from anima.store.models import (
    AgentRun,
    FeatureStatus,
    LimitWait,
    MergeInfo,
    MergeState,
    MilestoneStatus,
)
from anima.store.store import Store
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import Window
from ui.board import MilestoneCard
from ui.milestone_page import drop_overlap

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

NOW = datetime.now(UTC)


@pytest.fixture
def board(qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> Iterator[Window]:
    """A window on a project with milestones a, b, c, all pending (nothing starts)."""
    make_project(git_repo, {m: milestone_md(f"Milestone {m.upper()}", ["One", "Two"])
                            for m in ("a", "b", "c")})
    w = Window(qtbot, tmp_path, auto_start=False)
    try:
        w.window.open_project(git_repo)
        qtbot.waitUntil(lambda: len(w.window.board.cards) == 3, timeout=10000)
        yield w
    finally:
        w.close()


def publish(w: Window, *events: ev.Event) -> None:
    """As the engine's loop does: on its bus, from its thread or ours (the bridge queues)."""
    assert w.window.engine is not None
    for event in events:
        w.window.engine.bus.publish(event)
    assert w.window.bridge is not None
    w.window.bridge.flush()


def changed(w: Window, milestone_id: str, **update: Any) -> Any:
    record = w.window._records[milestone_id].model_copy(update=update)
    publish(w, ev.MilestoneChanged(record))
    return record


@contextmanager
def scans_held(w: Window) -> Iterator[None]:
    """The records these tests publish are not the store's: the engine's next scan (once a
    second) would publish the store's back, under a test that looks at the board."""
    assert w.window.engine is not None
    with w.window.engine.milestones._registering:
        yield


def card(w: Window, milestone_id: str) -> MilestoneCard:
    return w.window.board.cards[milestone_id]


def click(widget: MilestoneCard) -> None:
    for kind in (QMouseEvent.Type.MouseButtonPress, QMouseEvent.Type.MouseButtonRelease):
        widget.event(QMouseEvent(kind, QPointF(5, 5), QPointF(5, 5), Qt.MouseButton.LeftButton,
                                 Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))


def test_a_pending_card_on_a_depends_on_cycle_says_it_never_starts(board: Window) -> None:
    """One depending on itself said "Waiting for c", as if c would come; a cycle of two,
    "Waiting for b" and "Waiting for a". Each says why it never starts, as `anima status`
    does, and offers no Start."""
    with scans_held(board):
        changed(board, "c", depends_on=["c"])
        changed(board, "a", depends_on=["b"])
        changed(board, "b", depends_on=["a"])
        for milestone_id, cycle in (("c", "c → c (c names itself)"), ("a", "a → b → a"),
                                    ("b", "b → a → b")):
            shown = card(board, milestone_id)
            assert shown.state.text() == f"Never starts: depends_on makes a cycle: {cycle}"
            assert not shown.button.isVisibleTo(shown)


def test_a_pending_page_says_what_its_card_says_it_waits_for(qtbot, board: Window) -> None:
    """A milestone on a depends_on cycle: its card said "Never starts", its page "It starts by
    itself when a slot is free (config `auto_start`), or when you click Start" over a Start
    that did nothing. The page says what the card says, offers no Start while it waits, and
    offers it again once what it waited for is merged."""
    window = board.window
    with scans_held(board):
        changed(board, "c", depends_on=["c"])
        changed(board, "a", depends_on=["b"])
        pages = {m: window.open_page(m) for m in ("a", "c")}
        for m, page in pages.items():
            assert page is not None
            review = page.review
            assert review.isVisibleTo(page) and review.reason.text() == \
                card(board, m).state.text(), m
            assert not review.start_button.isVisibleTo(page)
            assert review.abort_button.isVisibleTo(page)
        assert pages["c"].review.reason.text() == \
            "Never starts: depends_on makes a cycle: c → c (c names itself)"
        assert pages["a"].review.reason.text() == "Waiting for b"
        changed(board, "b", status=MilestoneStatus.COMPLETED, started_at=NOW, completed_at=NOW,
                merge=MergeInfo(state=MergeState.MERGED, merged=True, detail="merged"))
        review = pages["a"].review
        assert review.reason.text().startswith("2 features, 1 acceptance criteria. It starts")
        assert review.start_button.isVisibleTo(pages["a"])


def test_a_pending_card_says_what_its_dependency_waits_for(board: Window) -> None:
    """c waits for b: while b was paused, c's card said "Waiting for b" as if b would come
    by itself; once b completed with its merge waiting for your files, c's card said
    "Pending" and offered a Start that did nothing (the engine waits for main to have b).
    It says why, as `anima status` does, and offers no Start."""
    with scans_held(board):
        changed(board, "c", depends_on=["b"])
        changed(board, "b", status=MilestoneStatus.PAUSED, started_at=NOW,
                pause_reason="git commit failed")
        assert card(board, "c").state.text() == "Waiting for b (paused)"
        changed(board, "b", status=MilestoneStatus.COMPLETED, completed_at=NOW, merge=MergeInfo(
            state=MergeState.PENDING, detail="the merge of milestone/b into main waits: your "
            "checkout has changes to src/b.py"))
        assert card(board, "c").state.text() == "Waiting for b (completed, not merged yet)"
        assert not card(board, "c").button.isVisibleTo(card(board, "c"))
        changed(board, "b", merge=MergeInfo(state=MergeState.MERGED, merged=True,
                                            detail="merged"))
        assert card(board, "c").state.text() == "Pending · 2 features"
        assert card(board, "c").button.isVisibleTo(card(board, "c"))


def test_a_milestone_waiting_its_turn_in_the_merge_queue_says_so(board: Window) -> None:
    """Finally accepted, a waits for the milestones accepted before it to merge: its card
    said "Merging into main · round 3" over two agent lines "—" (no round runs, no agent),
    and its page "Merging into main" without the engine's why."""
    reason = "its turn to merge into main comes after those accepted earlier"
    with scans_held(board):
        changed(board, "a", status="in_progress", started_at=NOW)
        publish(board, ev.PhaseChanged("a", Phase.MERGING, Phase.ACCEPTOR, reason))
        shown = card(board, "a")
        assert shown.state.text() == \
            "Finally accepted · merges into main after those accepted earlier"
        assert not any(line.isVisibleTo(shown) for line in shown.lines.values())
        page = board.window.open_page("a")
        assert page is not None

        def says_why() -> bool:
            # (a page opens on the store's record, which the engine sends a moment later:
            # not this test's, so the phase is published until the page shows it)
            publish(board, ev.PhaseChanged("a", Phase.MERGING, Phase.ACCEPTOR, reason))
            return page.monitor.phase_bar.text == f"Merging into main — {reason}"

        board.qtbot.waitUntil(says_why, timeout=5000)


def test_running_cards_whose_agents_wait_for_usage_limits_say_until_when(board: Window) -> None:
    """A Claude pair and a Codex pair each meet their own usage limit overnight: both cards
    said "Waiting for Developer · round 1" for hours, as if the Developer worked; only the
    status bar said that they waited, and at 1024 px it cut the second reset off. Each card
    says which reset it waits for, and the phase again once the wait is over."""
    resets = {"a": NOW + timedelta(hours=2), "b": NOW + timedelta(hours=5)}
    with scans_held(board):
        for milestone_id, until in resets.items():
            clock = f"{until.astimezone():%H:%M}"
            changed(board, milestone_id, status="in_progress", started_at=NOW,
                    limit_wait=LimitWait(role="developer", until=until, reason=(
                        f"waiting for the usage limit to reset at {clock} (5-hour limit: "
                        "You've hit your limit)")))
            publish(board, ev.PhaseChanged(milestone_id, Phase.DEVELOPER, Phase.STARTING))
        for milestone_id, until in resets.items():
            assert card(board, milestone_id).state.text() == (
                f"Waiting for the usage limit to reset at {until.astimezone():%H:%M} · round 1")
        changed(board, "a", limit_wait=None)  # its reset came: the Developer's turn goes on
        assert card(board, "a").state.text() == "Waiting for Developer · round 1"


def test_a_running_card_waiting_for_a_usage_limit_goes_back_by_itself_once_it_resets(
        qtbot, board: Window) -> None:
    """The card said "Waiting for the usage limit to reset at 04:18" past 04:18 until the
    engine's next record (none came from an Anima killed waiting), over "Dev: —" and
    "Acc: —" as if an agent were about to say something. While it waits it says only the
    wait; once the reset passes, the phase and the agents' lines again, on the board's one
    clock (no timer per card)."""
    clocks = len(board.window.board.findChildren(QTimer))
    until = datetime.now(UTC) + timedelta(seconds=1.5)
    with scans_held(board):
        changed(board, "a", status="in_progress", started_at=NOW, limit_wait=LimitWait(
            role="developer", until=until, reason=f"waiting for the usage limit to reset at "
            f"{until.astimezone():%H:%M} (5-hour limit: You've hit your limit)"))
        publish(board, ev.PhaseChanged("a", Phase.DEVELOPER, Phase.STARTING))
        board.window.board.refresh_now()
        shown = card(board, "a")
        assert shown.state.text() == \
            f"Waiting for the usage limit to reset at {until.astimezone():%H:%M} · round 1"
        assert not any(line.isVisibleTo(shown) for line in shown.lines.values())
        assert shown.agents.text() == "Dev: Claude Code · Acc: Claude Code"
        assert len(board.window.board.findChildren(QTimer)) == clocks
        qtbot.waitUntil(lambda: shown.state.text() == "Waiting for Developer · round 1",
                        timeout=4000)
        qtbot.waitUntil(lambda: [line.text() for line in shown.lines.values()
                                 if line.isVisibleTo(shown)] == ["Dev: —", "Acc: —"],
                        timeout=2000)
        assert shown.accessibleName() == "a: Waiting for Developer · round 1"


def test_a_page_whose_agents_wait_for_a_usage_limit_says_until_when(
        qtbot, board: Window) -> None:
    """The card said the usage limit and its reset; the page's phase bar said "Waiting for
    Developer · turn times out in 8:57", then "turn timing out…" in red for the hours of the
    wait. It says what the card says and when the turn resumes; once the wait is over (the
    engine says so, or its reset passes), the phase again, with the turn's time counted from
    the prompt sent again."""
    until = datetime.now(UTC) + timedelta(minutes=23)
    clock = f"{until.astimezone():%H:%M}"
    reason = (f"waiting for the usage limit to reset at {clock} (5-hour limit: You've hit "
              "your limit)")
    with scans_held(board):
        changed(board, "a", status="in_progress", started_at=NOW, limit_wait=LimitWait(
            role="developer", until=until, reason=reason))
        page = board.window.open_page("a")
        assert page is not None
        publish(board, ev.PhaseChanged("a", Phase.DEVELOPER, Phase.STARTING,
                                       deadline=time.time() + 540))
        qtbot.waitUntil(lambda: not page.replaying, timeout=5000)
        bar = page.monitor.phase_bar
        words = f"Waiting for the usage limit to reset at {clock}"
        assert card(board, "a").state.text() == f"{words} · round 1"
        assert bar.text == words
        assert bar.label.toolTip() == reason
        assert bar.countdown.text().startswith(("resumes in 22:", "resumes in 23:00"))
        changed(board, "a", limit_wait=None)  # over: the Developer's turn goes on
        assert bar.text == "Waiting for Developer"
        assert bar.countdown.text().startswith("turn times out in 8:")

        # A reset that passes while the engine says nothing yet: the bar goes back by itself.
        changed(board, "a", limit_wait=LimitWait(
            role="developer", until=datetime.now(UTC) + timedelta(seconds=1.5), reason=reason))
        assert bar.text.startswith("Waiting for the usage limit to reset at ")
        qtbot.waitUntil(lambda: bar.text == "Waiting for Developer", timeout=4000)
        assert bar.countdown.text().startswith("turn times out in 8:")


def test_cards_and_pages_say_which_agent_cli_plays_each_role(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """A Codex Developer reviewed by a Claude Code Acceptor: nothing on the board or the page
    said so before an agent's first turn (only the pane headers, once a session started).
    A pending card and its page say what the config runs; a milestone that ran, what its
    record says it runs on."""
    make_project(git_repo, {m: milestone_md(f"Milestone {m.upper()}", ["One", "Two"])
                            for m in ("a", "b")},
                 config={"developer": {"agent": "codex", "model": "gpt-5-codex"},
                         "acceptor": {"agent": "claude"}})
    w = Window(qtbot, tmp_path, auto_start=False)
    try:
        w.window.resize(1024, 700)
        w.window.open_project(git_repo)
        qtbot.waitUntil(lambda: len(w.window.board.cards) == 2, timeout=10000)
        a = card(w, "a")
        qtbot.waitUntil(lambda: a.agents.text() == "Dev: Codex · Acc: Claude Code",
                        timeout=5000)
        assert a.agents.toolTip() == "Developer: Codex gpt-5-codex · Acceptor: Claude Code"
        assert a.agents.isVisibleTo(w.window)
        qtbot.wait(50)  # laid out
        assert a.agents.shown_text() == a.agents.text()  # whole in a 1024-px column
        page = w.window.open_page("a")
        assert page is not None
        agents = page.monitor.header.agents
        assert agents.text() == "Developer: Codex gpt-5-codex · Acceptor: Claude Code"
        assert agents.isVisibleTo(w.window)
        qtbot.wait(50)  # laid out
        assert agents.shown_text() == agents.text()  # whole at 1024 px
        with scans_held(w):
            changed(w, "a", status="in_progress", started_at=NOW, agents={
                "developer": AgentRun(agent="claude", model="claude-sonnet-4-5",
                                      version="2.1.197 (Claude Code)"),
                "acceptor": AgentRun(agent="codex", version="codex-cli 0.169.0")})
            assert a.agents.text() == "Dev: Claude Code · Acc: Codex"
            assert a.agents.toolTip() == \
                "Developer: Claude Code claude-sonnet-4-5 · Acceptor: Codex"
            assert agents.text() == \
                "Developer: Claude Code claude-sonnet-4-5 · Acceptor: Codex"
    finally:
        w.close()


def test_cards_move_between_columns_as_records_change_and_the_title_counts_them(
        board: Window) -> None:
    with scans_held(board):
        window = board.window
        assert window.board.column_ids("pending") == ["a", "b", "c"]
        assert window.windowTitle() == "Anima — repo"
        changed(board, "c", depends_on=["a"])
        assert card(board, "c").state.text() == "Waiting for a"
        assert not card(board, "c").button.isVisibleTo(card(board, "c"))  # nothing to start yet
        assert card(board, "b").button.text() == "Start"

        changed(board, "a", status="in_progress", started_at=NOW)
        changed(board, "b", status="paused", started_at=NOW,
                pause_reason="3 consecutive rejections")
        assert window.board.column_ids("running") == ["a"]
        assert window.board.column_ids("needs_you") == ["b"]
        assert window.windowTitle() == "Anima — repo — 1 running · 1 needs you"
        assert card(board, "b").state.text() == "3 consecutive rejections"
        assert card(board, "b").button.text() == "Resume"

        changed(board, "b", status="failed", error="git broke")
        assert card(board, "b").button.text() == "Retry"
        assert card(board, "b").state.text() == "Failed: git broke"
        changed(board, "a", status="completed", completed_at=NOW,
                merge=MergeInfo(state=MergeState.MERGED, merged=True, detail="merged"))
        assert window.board.column_ids("done") == ["a"]
        assert card(board, "a").state.text() == "Completed · merged"
        # a is done: c no longer waits, and offers its Start in place.
        assert card(board, "c").state.text() == "Pending · 2 features"
        assert card(board, "c").button.isVisibleTo(card(board, "c"))
        assert window.windowTitle() == "Anima — repo — 1 needs you"
        changed(board, "b", status="cancelled", completed_at=NOW)
        assert card(board, "b").state.text().startswith("Cancelled by you at ")
        assert window.windowTitle() == "Anima — repo"


def one_at_a_time_board(qtbot, git_repo: Path, tmp_path: Path) -> Window:
    """The window on milestones a and b (two features each), run one at a time, nothing
    started: both cards shown."""
    make_project(git_repo, {m: milestone_md(f"Milestone {m.upper()}", ["One", "Two"])
                            for m in ("a", "b")}, config={"max_parallel_milestones": 1})
    w = Window(qtbot, tmp_path, auto_start=False)
    w.window.open_project(git_repo)
    qtbot.waitUntil(lambda: len(w.window.board.cards) == 2, timeout=10000)
    return w


def test_one_at_a_time_the_pending_cards_say_a_pause_holds_them(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """Run one at a time, nothing starts while a milestone is paused: the pending cards said
    "Pending" and offered a Start that did nothing."""
    w = one_at_a_time_board(qtbot, git_repo, tmp_path)
    try:
        with scans_held(w):
            changed(w, "a", status="paused", started_at=NOW, pause_reason="3 consecutive "
                    "rejections")
            b = card(w, "b")
            assert b.state.text() == ("Waiting until a is resumed or aborted (milestones run "
                                      "one at a time)")
            assert not b.button.isVisibleTo(b)
            changed(w, "a", status="in_progress")
            assert b.state.text() == "Pending · 2 features"
    finally:
        w.close()


def test_one_at_a_time_the_pending_cards_let_go_when_the_paused_milestone_is_removed(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """The paused a's files deleted (its `.md`, then its record): its card went, and b's
    still said "Waiting until a is resumed or aborted", with no Start, for good."""
    w = one_at_a_time_board(qtbot, git_repo, tmp_path)
    try:
        paths = ProjectPaths(git_repo)
        store = Store(paths)
        store.save_record(store.load_record("a").model_copy(update={
            "status": MilestoneStatus.PAUSED, "started_at": NOW,
            "pause_reason": "3 consecutive rejections"}))
        held = "Waiting until a is resumed or aborted (milestones run one at a time)"
        qtbot.waitUntil(lambda: card(w, "b").state.text() == held, timeout=10000)
        paths.milestone_md("a").unlink()
        paths.milestone_record("a").unlink()
        qtbot.waitUntil(lambda: "a" not in w.window.board.cards, timeout=10000)
        b = card(w, "b")
        assert b.state.text() == "Pending · 2 features"
        assert b.button.isVisibleTo(b) and b.button.text() == "Start"
    finally:
        w.close()


def test_at_1000_by_620_a_card_that_needs_you_shows_its_cost_and_time_whole(
        qtbot, board: Window) -> None:
    """Its button sat on the stats' line: "1/2 features · $0.88 …" lost cost and time."""
    board.window.resize(1000, 620)
    with scans_held(board):
        for m, status in (("a", "paused"), ("b", "failed"), ("c", "awaiting_review")):
            features = board.window._records[m].features
            one_done = [features[0].model_copy(update={"status": FeatureStatus.DONE}),
                        *features[1:]]
            changed(board, m, status=status, started_at=NOW - timedelta(minutes=31),
                    completed_at=NOW, features=one_done, cost_usd=12.88,
                    pause_reason="3 consecutive rejections", error="git broke")
        qtbot.wait(100)
        for m in ("a", "b", "c"):
            stats = card(board, m).stats
            assert stats.text() == "1/2 features · $12.88 · 31:00"
            assert stats.shown_text() == stats.text(), (m, stats.shown_text())


#: What a pause may say: git's own words, a paragraph or two.
GIT_REASON = (
    "git commit failed in the milestone's worktree: error: cannot lock ref "
    "'refs/heads/milestone/a': Unable to create '/home/dev/shop/.git/refs/heads/milestone/"
    "a.lock': File exists.\n\nAnother git process seems to be running in this repository, "
    "e.g. an editor opened by 'git commit'. Please make sure all processes are terminated "
    "then try again. If it still fails, a git process may have crashed in this repository "
    "earlier: remove the file manually to continue.")


def test_at_1024_by_700_paused_cards_with_long_reasons_keep_their_resume_in_view(
        qtbot, board: Window) -> None:
    """Each paused card showed its whole reason, wrapped: git's two paragraphs made a card
    taller than half the column, and the third paused card's Resume was below the window.
    A card says the start of its reason in three lines at most, the whole in its tooltip."""
    board.window.resize(1024, 700)
    with scans_held(board):
        for m in ("a", "b", "c"):
            changed(board, m, status="paused", started_at=NOW, pause_reason=GIT_REASON)
        qtbot.wait(100)  # laid out
        column = board.window.board.columns["needs_you"]
        assert column.card_ids() == ["a", "b", "c"]
        view = column.scroll_area.viewport()
        seen = view.rect()
        for m in ("a", "b", "c"):
            button = card(board, m).button
            assert button.isVisibleTo(board.window) and button.text() == "Resume"
            corner = button.mapTo(view, button.rect().bottomRight())
            assert seen.contains(button.mapTo(view, button.rect().topLeft())), m
            assert seen.contains(corner), (m, corner, seen)
        for m in ("a", "b", "c"):
            shown = card(board, m)
            assert shown.state.toolTip() == GIT_REASON
            lines = shown.state.shown_lines()
            assert len(lines) == 3 and lines[0].startswith("git commit failed")
            assert lines[-1].endswith("…")
            assert shown.state.height() <= 3 * shown.state.fontMetrics().lineSpacing() + 2


@pytest.mark.parametrize("status", ["completed", "paused"])
def test_at_1024_by_700_a_pages_rounds_table_shows_two_whole_rows(
        qtbot, board: Window, status: str) -> None:
    """A milestone of four rounds, one rejected: at 1024×700 its Rounds table showed one row
    (completed: under a sideways scroll bar, with Duration cut to "3:0"; paused, under its
    decision bar: one and a half). Its columns fit the table's width, and two rows its
    height."""
    from anima.store.models import Iteration

    board.window.resize(1024, 700)
    rounds = [Iteration(round=r, kind="feature", feature=f"F{min(r, 2)}", commit=f"{r}" * 40,
                        verdict="rejected" if r == 2 else "accepted",
                        reason="the empty input is not handled" if r == 2 else "",
                        tokens=41_000 + 900 * r, cost_usd=0.21 + 0.03 * r,
                        started_at=NOW + timedelta(minutes=4 * r),
                        ended_at=NOW + timedelta(minutes=4 * r + 3)) for r in range(1, 5)]
    with scans_held(board):
        changed(board, "a", status=status, started_at=NOW, completed_at=NOW,
                iterations=rounds, pause_reason="3 consecutive rejections",
                merge=MergeInfo(state=MergeState.MERGED, merged=True,
                                detail="merged milestone/a into main"))
        page = board.window.open_page("a")
        assert page is not None
        qtbot.wait(100)  # laid out
        table = page.monitor.history
        header = table.horizontalHeader()
        assert not table.horizontalScrollBar().isVisible()
        assert sum(header.sectionSize(i) for i in range(header.count())) <= \
            table.viewport().width()
        assert table.viewport().height() >= 2 * table.rowHeight(0)


def test_several_running_cards_each_show_their_agents_live(board: Window) -> None:
    with scans_held(board):
        started = datetime.now(UTC) - timedelta(seconds=65)
        for m in ("a", "b", "c"):
            changed(board, m, status="in_progress", started_at=started)
        publish(board,
                ev.PhaseChanged("a", "developer", "starting"),
                ev.PhaseChanged("b", "acceptor", "developer"),
                ev.AssistantText("developer", "Reading the code.\nWriting greet.py",
                                 milestone_id="a"),
                ev.ToolUse("acceptor", "Bash", "t1", {}, summary="Bash: pytest -q",
                           milestone_id="b"),
                ev.ContextUsage("acceptor", "s1", 50_000, 200_000, milestone_id="b"),
                ev.AssistantText("developer", "Another milestone's words", milestone_id="c"))
        board.window.board.refresh_now()
        a, b = card(board, "a"), card(board, "b")
        assert board.window.board.column_ids("running") == ["a", "b", "c"]
        assert a.state.text() == "Waiting for Developer · round 1"
        assert a.lines["developer"].toolTip() == "Dev: Writing greet.py"
        assert b.state.text() == "Waiting for Acceptor · round 1"
        assert b.lines["acceptor"].toolTip() == "Acc (25 %): Bash: pytest -q"
        assert "Another" not in a.lines["developer"].toolTip()
        assert a.stats.text() in ("0/2 features · $0.00 · 1:05", "0/2 features · $0.00 · 1:06")
        assert board.window.windowTitle() == "Anima — repo — 3 running"


def test_a_click_opens_the_page_and_open_pages_update_live_each_their_own(
        qtbot, board: Window) -> None:
    window = board.window
    for m in ("a", "b"):
        changed(board, m, status="in_progress", started_at=NOW)
    click(card(board, "a"))
    click(card(board, "b"))
    pages = window.milestone_pages
    assert set(pages) == {"a", "b"} and window.current_page() is pages["b"]
    assert window.tabs.count() == 3  # the board and two pages
    qtbot.waitUntil(lambda: not pages["a"].replaying and not pages["b"].replaying,
                    timeout=5000)
    publish(board, ev.AssistantText("developer", "only for a", milestone_id="a"),
            ev.AssistantText("developer", "only for b", milestone_id="b"))
    text = {}
    for m, page in pages.items():
        pane = page.monitor.panes["developer"]
        pane.flush()
        text[m] = pane.plain_text()
    assert "only for a" in text["a"] and "only for b" not in text["a"]
    assert "only for b" in text["b"] and "only for a" not in text["b"]
    changed(board, "a", status="paused", pause_reason="round limit reached")
    assert pages["a"].review.isVisibleTo(pages["a"]) and pages["a"].review.mode == "paused"
    click(card(board, "a"))  # already open: shown, not opened twice
    assert window.current_page() is pages["a"] and window.tabs.count() == 3
    window.tabs.tabCloseRequested.emit(window.tabs.indexOf(pages["b"]))
    assert set(window.milestone_pages) == {"a"}


def test_a_pages_title_is_shown_whole_when_there_is_room(qtbot, board: Window) -> None:
    """At 1280 px, "Greeter CLI" read "Greeter C…" beside an empty header: a title whose
    width in pixels is not a whole number was cut by the fraction."""
    window = board.window
    page = window.open_page("a")
    assert page is not None
    title = page.monitor.header.title
    with scans_held(board):
        for text in ("Greeter CLI", "Rate limiting", "Search index", "Billing export"):
            changed(board, "a", title=text)
            qtbot.waitUntil(lambda text=text: title.text() == text, timeout=5000)
            qtbot.wait(50)  # laid out
            assert title.shown_text() == text


def test_review_and_resume_in_place(qtbot, board: Window, git_repo: Path) -> None:
    window = board.window
    changed(board, "a", status="awaiting_review", started_at=NOW)
    card(board, "a").button.click()  # Review: the page opens on its changes
    page = window.milestone_pages["a"]
    assert window.current_page() is page and page.tabs.currentWidget() is page.changes
    # A paused record on disk, as the loop leaves it; Resume on its card resumes it.
    store = Store(ProjectPaths(git_repo))
    paused = store.load_record("b").model_copy(update={
        "status": MilestoneStatus.PAUSED, "started_at": NOW,
        "pause_reason": "round limit reached"})
    store.save_record(paused)
    publish(board, ev.MilestoneChanged(paused))
    assert card(board, "b").button.text() == "Resume"
    card(board, "b").button.click()
    qtbot.waitUntil(lambda: "b" in window.board.column_ids("running"), timeout=10000)
    assert store.load_record("b").status.value == "in_progress"


def test_live_output_held_during_the_replay_is_not_shown_twice() -> None:
    said = [ev.AssistantText("developer", f"line {i}", milestone_id="a") for i in range(4)]
    # The transcript read from disk ends with what the bridge delivered meanwhile.
    assert drop_overlap(said[:3], said[1:]) == said[3:]
    assert drop_overlap(said[:2], said[2:]) == said[2:]
    assert drop_overlap([], said) == said


def test_log_lines_stay_in_the_log_not_in_the_status_bar(board: Window) -> None:
    """Each message once, where it belongs: Anima's own log lines ("phase … → …") are the
    milestone's log, not the window's status bar."""
    window = board.window
    window.statusBar().showMessage("Ready")
    publish(board, ev.LogLine("a", "phase recovering → developer: round 6 (feature)"))
    assert window.statusBar().currentMessage() == "Ready"


def test_a_page_in_a_background_tab_lays_nothing_out_until_shown(qtbot, board: Window) -> None:
    """Output streams to every open page, but only the page on screen pays for drawing it:
    a background one shows what it missed as soon as its tab comes to the front."""
    window = board.window
    changed(board, "a", status="in_progress", started_at=NOW)
    page = window.open_page("a")
    assert page is not None
    qtbot.waitUntil(lambda: not page.replaying, timeout=5000)
    window.tabs.setCurrentIndex(0)  # back to the board
    pane = page.monitor.panes["developer"]
    publish(board, ev.AssistantText("developer", "written while nobody looked",
                                    milestone_id="a"))
    qtbot.wait(100)
    assert pane.lines_rendered == 0 and "nobody looked" not in pane.plain_text()
    window.tabs.setCurrentWidget(page)
    qtbot.waitUntil(lambda: "written while nobody looked" in pane.plain_text(), timeout=2000)


def test_a_page_whose_transcript_cannot_be_read_still_shows_the_live_output(
        qtbot, board: Window, git_repo: Path) -> None:
    from anima.paths import TRANSCRIPT

    # Something in the transcript's place that cannot be read (a folder).
    (ProjectPaths(git_repo).transcripts("a") / TRANSCRIPT).mkdir(parents=True)
    changed(board, "a", status="in_progress", started_at=NOW)
    page = board.window.open_page("a")
    assert page is not None
    qtbot.waitUntil(lambda: not page.replaying, timeout=5000)
    publish(board, ev.AssistantText("developer", "still live", milestone_id="a"))
    pane = page.monitor.panes["developer"]
    pane.flush()
    assert "still live" in pane.plain_text()


def test_the_board_works_from_the_keyboard(qtbot, board: Window, git_repo: Path) -> None:
    """Tab reaches each card and its button in the order drawn, the arrows move between cards,
    Enter or Space opens a page as a click does, and the focused card shows it."""
    window = board.window
    store = Store(ProjectPaths(git_repo))  # on record, as the loop leaves it: pages read it
    review = store.load_record("b").model_copy(update={
        "status": MilestoneStatus.AWAITING_REVIEW, "started_at": NOW})
    store.save_record(review)
    publish(board, ev.MilestoneChanged(review))
    qtbot.waitUntil(card(board, "b").isVisible)  # a moved card shows in the next event loop
    assert window.board.column_ids("pending") == ["a", "c"]
    assert window.board.column_ids("needs_you") == ["b"]
    assert card(board, "b").accessibleName() == f"b: {card(board, 'b').state.text()}"
    assert card(board, "b").button.accessibleName() == "Review b"
    assert card(board, "a").accessibleName() == "a: Pending · 2 features"
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5000)

    def press(key: Qt.Key, modifier: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier,
              ) -> QWidget | None:
        focused = QApplication.focusWidget()
        assert focused is not None
        qtbot.keyClick(focused, key, modifier)
        return QApplication.focusWidget()

    window.tabs.tabBar().setFocus()
    for _ in range(10):  # out of the tab bar, on into the board
        if isinstance(press(Qt.Key.Key_Tab), MilestoneCard):
            break
    assert QApplication.focusWidget() is card(board, "a")
    # Seen: the card's frame turns the accent colour (it was grey).
    focused = card(board, "a").grab().toImage()
    middle = focused.width() // 2
    assert focused.pixelColor(middle, 0).name() == "#2f6feb"
    assert press(Qt.Key.Key_Tab) is card(board, "a").button  # its Start
    assert card(board, "a").grab().toImage().pixelColor(middle, 0).name() != "#2f6feb"
    assert press(Qt.Key.Key_Tab) is card(board, "c")
    assert press(Qt.Key.Key_Tab) is card(board, "c").button
    assert press(Qt.Key.Key_Tab) is card(board, "b")  # the empty Running column is skipped
    assert press(Qt.Key.Key_Tab) is card(board, "b").button
    assert press(Qt.Key.Key_Tab, Qt.KeyboardModifier.ShiftModifier) is card(board, "b")
    # Arrows: across to the nearest column with cards, up and down within one.
    assert press(Qt.Key.Key_Left) is card(board, "a")
    assert press(Qt.Key.Key_Down) is card(board, "c")
    assert press(Qt.Key.Key_Down) is card(board, "c")  # the column's end
    assert press(Qt.Key.Key_Up) is card(board, "a")
    assert press(Qt.Key.Key_Left) is card(board, "a")  # the board's edge
    assert press(Qt.Key.Key_Down) is card(board, "c")
    assert press(Qt.Key.Key_Right) is card(board, "b")  # at its height, or the last card

    press(Qt.Key.Key_Return)  # on a card: its page, as a click
    assert window.current_page() is window.milestone_pages["b"]
    window.tabs.setCurrentIndex(0)
    window.board.focus_card("a")
    press(Qt.Key.Key_Space)
    assert window.current_page() is window.milestone_pages["a"]
    # Enter on a card's button presses the button: Review opens the page on its changes.
    window.tabs.setCurrentIndex(0)
    card(board, "b").button.setFocus(Qt.FocusReason.TabFocusReason)
    page_b = window.milestone_pages["b"]
    page_b.tabs.setCurrentIndex(0)
    press(Qt.Key.Key_Enter)
    qtbot.waitUntil(lambda: page_b.tabs.currentWidget() is page_b.changes, timeout=2000)
    assert window.current_page() is page_b
    # A card that moves to another column keeps the keyboard.
    window.tabs.setCurrentIndex(0)
    window.board.focus_card("c")
    changed(board, "c", status="in_progress", started_at=NOW)
    qtbot.waitUntil(card(board, "c").isVisible)
    assert window.board.column_ids("running") == ["c"]
    assert QApplication.focusWidget() is card(board, "c")
