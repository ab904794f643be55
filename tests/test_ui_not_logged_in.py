"""A `claude` that is installed but not logged in, in the window: one message that says what
to do, on the milestone's card and its page (not repeated in the banner), a pause that is not
a rejection, and an Acceptor that never ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import FakeClaude
from tests.helpers import make_project
from tests.test_ui_app import TWO, Window, screenshot

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

WORDS = ("claude is not logged in: run `claude` once and log in, or set ANTHROPIC_API_KEY; "
         "then resume")
DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_not_logged_in_is_an_error_not_rejections(
        qtbot, git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": TWO})
    # What the real CLI prints when it has neither a login nor a key (captured from 2.1.330).
    fake_claude.write_script({"developer_default": {"replay": "nologin-2.1.330"}})
    w = Window(qtbot, tmp_path)
    try:
        w.window.resize(1024, 700)
        w.window.open_project(git_repo)
        w.wait_status("m1", "paused")
        card = w.window.board.cards["m1"]
        qtbot.waitUntil(lambda: card.state.text() == WORDS, timeout=10000)
        qtbot.wait(300)  # the engine's error, if any, has arrived too
        assert WORDS not in w.window.errors.messages  # said once: on the card, not the banner
        page = w.page()
        monitor = page.monitor
        assert w.pane_text("acceptor").strip() == ""  # it never ran: nothing to show
        assert "REJECTED" not in w.pane_text("developer")
        assert monitor.history.model().rowCount() == 0  # no round, no rejection
        assert w.window._records["m1"].consecutive_rejections == 0
        assert page.review.reason.text() == WORDS
        if os.environ.get("ANIMA_SCREENSHOTS"):  # for docs/, in the app's own style
            screenshot(w.window, qtbot, "not_logged_in.png")
    finally:
        w.close()
