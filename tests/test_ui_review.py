"""Deciding from one place: the paused view at a laptop's size, Abort, the merge result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, QRect

from anima.paths import ProjectPaths
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md
from tests.test_ui_app import TWO, Window, laid_out_minimum
from tests.test_ui_monitor import answer_dialog

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

LONG_REASON = ("make_greeting(None) returns 'Hello, None!' instead of raising ValueError, and "
               "the CLI prints a traceback for an empty --name; add tests for both edge cases")


@pytest.fixture
def fake(fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    fake_claude.use_env(monkeypatch)
    return fake_claude


def test_a_long_rejection_reason_fits_1024_by_700_and_abort_asks_first(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    assert len(LONG_REASON) > 150
    make_project(git_repo, {"m1": TWO})
    no = {"text": f"REJECTED: {LONG_REASON}"}
    fake.write_script({"acceptor": [no, no, no]})
    w = Window(qtbot, tmp_path)
    window = w.window
    try:
        window.open_project(git_repo)
        w.wait_status("m1", "paused")
        page = w.page()
        review = page.review
        qtbot.waitUntil(review.isVisible, timeout=5000)
        # Asked again until applied: the offscreen platform may apply a first shrink late.
        qtbot.waitUntil(lambda: (window.resize(1024, 700), window.width() == 1024)[1],
                        timeout=3000)
        assert laid_out_minimum(window).width() <= 1024
        # Said once: in the decision bar (one line, whole in its tooltip), not the phase bar.
        assert LONG_REASON in review.reason.toolTip()
        assert LONG_REASON not in page.monitor.phase_bar.text
        resume = review.resume_button
        corner = resume.mapTo(window, QPoint(resume.width(), resume.height()))
        assert resume.isVisible() and QRect(0, 0, 1024, 700).contains(corner)

        # Abort asks in a real dialog; Cancel keeps the milestone, the button then aborts.
        asked = answer_dialog("Cancel")
        review.abort_button.click()
        assert "cancelled for good" in asked[0] and w.status_of("m1") == "paused"
        answer_dialog("Abort milestone")
        review.abort_button.click()
        w.wait_status("m1", "cancelled")
        assert run_git(git_repo, "branch", "--show-current").strip() == "main"
    finally:
        w.close()


def test_continue_from_an_accepted_round_in_the_window(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    make_project(git_repo, {"m1": milestone_md("Three", ["One", "Two", "Three"])})
    no = {"text": "REJECTED: F3 is wrong"}
    fake.write_script({"acceptor": [{"auto": True}, {"auto": True}, no, no, no]})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("m1", "paused", timeout=30000)
        page = w.page()
        review = page.review
        qtbot.waitUntil(review.continue_button.isVisible, timeout=5000)
        labels = [a.text() for a in review.continue_menu.actions()]
        assert [label.split(" · ")[0] for label in labels] == ["Round 1", "Round 2"]
        round1 = w.window._records["m1"].iterations[0].commit
        asked = answer_dialog("Continue from round 1")
        review.continue_menu.actions()[0].trigger()
        assert "Put the branch back to round 1" in asked[0]
        w.wait_status("m1", "completed", timeout=30000)
        assert "continued from round 1" in w.window._records["m1"].notes[0]
        # Rounds 2-5 left the branch: marked dropped, out of the round count.
        history = page.monitor.history.history
        assert history.dropped == {2, 3, 4, 5}
        assert page.monitor.header.round.value.text().endswith(" · 4 dropped")
        assert run_git(git_repo, "for-each-ref", "--format=%(refname)", "refs/anima/dropped/")
        qtbot.waitUntil(lambda: getattr(w.window._records["m1"].merge, "merged", False),
                        timeout=10000)
        assert run_git(git_repo, "merge-base", "--is-ancestor", round1, "main") == ""
    finally:
        w.close()


LONG_TITLE = ("A very long milestone title that says everything the milestone is about, "
              "down to its smallest feature and the reason it was written at all " * 3).strip()


def test_the_window_shrinks_to_800_by_500_with_a_long_title_and_busy_panes(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """Neither a long milestone title nor a pane's "idle · last turn … · $…" sets a minimum
    width: both are elided, whole in their tooltips."""
    make_project(git_repo, {"long": "---\nrequires_human_review: true\n---\n"
                            + milestone_md(LONG_TITLE, ["Alpha"]),
                            "m1": TWO})
    fake.write_script({"milestones": {"m1": {"feature_dir": "features/m1"},
                                      "long": {"feature_dir": "features/long"}}})
    w = Window(qtbot, tmp_path, max_parallel_milestones=2)
    window = w.window
    try:
        window.open_project(git_repo)
        w.wait_status("long", "awaiting_review", timeout=30000)
        for milestone_id in ("m1", "long"):
            page = w.page(milestone_id)
            for pane in page.monitor.panes.values():
                pane.flush()
        page = w.page("long")
        header = page.monitor.header
        state = page.monitor.panes["developer"].state_label
        # What a pane says between two turns, and longer.
        state.setText("idle · last turn 0.2 s · 4 steps · 150 tokens · $0.0100 · " * 3)
        assert laid_out_minimum(window).width() <= 800, window.minimumSizeHint()
        assert header.title.text() == LONG_TITLE and LONG_TITLE in header.title.toolTip()
        assert "$0.0100" in state.toolTip()
        qtbot.waitUntil(lambda: (window.resize(800, 500), window.width() == 800)[1],
                        timeout=3000)
        qtbot.wait(100)
        assert header.title.shown_text().endswith("…")
        assert header.title.geometry().right() < 800
        # The long title's tab is elided too: the Board tab never scrolls out of reach.
        bar = window.tabs.tabBar()
        assert all(bar.tabRect(i).right() <= bar.width() for i in range(bar.count())), \
            [bar.tabRect(i) for i in range(bar.count())]
    finally:
        w.close()


def test_a_milestone_redefined_while_it_waits_for_review_says_approve_sends_it_back(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    """Its `.md` edited while it waits for your review: the page listed the features as the
    record holds them and offered "Approve to complete it (and merge)", though approving now
    sends it back to the Developer to build the added feature. The decision bar says so."""
    review = "---\nrequires_human_review: true\n---\n"
    make_project(git_repo, {"m1": review + milestone_md("Greeter", ["Alpha"])})
    w = Window(qtbot, tmp_path)
    try:
        w.window.open_project(git_repo)
        w.wait_status("m1", "awaiting_review")
        panel = w.page().review
        assert "Approve to complete it" in panel.reason.toolTip()
        ProjectPaths(git_repo).milestone_md("m1").write_text(
            review + milestone_md("Greeter", ["Alpha", "Bravo"]), encoding="utf-8")
        said = ("Its features changed in m1.md since its final acceptance: Approve sends it "
                "back to the Developer")
        qtbot.waitUntil(lambda: said in panel.reason.toolTip(), timeout=10000)
        assert "Approve to complete it" not in panel.reason.toolTip()
        assert said in panel.approve_button.toolTip()
        assert panel.approve_button.text() == "Approve and go on"
        panel.approve_button.click()
        qtbot.waitUntil(lambda: (w.status_of("m1"), len(w.window._records["m1"].features))
                        == ("awaiting_review", 2), timeout=30000)  # Bravo built, judged again
        qtbot.waitUntil(lambda: "Approve to complete it" in panel.reason.toolTip(),
                        timeout=10000)
        assert panel.approve_button.text() == "Approve"
    finally:
        w.close()
