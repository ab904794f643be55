"""EngineBridge and AgentPane: real events published from a worker thread, real widgets."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, QPointF, Qt, QThread
from PySide6.QtGui import QTextCursor, QWheelEvent
from PySide6.QtWidgets import QApplication

from anima import events as ev
from anima.agents.tools import describe_tool
from ui.agent_pane import AgentPane
from ui.bridge import EngineBridge
from ui.transcript import render_markdown

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


@pytest.fixture
def bus() -> ev.EventBus:
    return ev.EventBus()


@pytest.fixture
def bridge(qtbot, bus: ev.EventBus):
    b = EngineBridge(bus)
    yield b
    b.close()


@pytest.fixture
def pane(qtbot, bridge: EngineBridge) -> AgentPane:
    p = AgentPane("developer")
    p.resize(700, 500)
    qtbot.addWidget(p)
    p.show()
    bridge.agent_events_received.connect(p.feed_many)
    return p


_DELIVERED = "delivered"


@pytest.fixture
def deliver(qtbot, bus: ev.EventBus, bridge: EngineBridge):
    """Publish like the engine does (from a worker thread), wait until the GUI has it all."""
    def publish(events: list[ev.Event]) -> None:
        marker = ev.LogLine(None, f"{_DELIVERED} {id(events)}")
        # Stamped as the engine stamps what its agents say (milestone id, tool summaries).
        stamp = ev.MilestonePublisher(
            bus, "m1", lambda e: describe_tool(e.tool, e.input, Path("/work/project")))
        thread = threading.Thread(target=lambda: [stamp.publish(e)
                                                  for e in [*events, marker]])
        with qtbot.waitSignal(bridge.log_line_received, timeout=5000,
                              check_params_cb=lambda e: e is marker):
            thread.start()
        thread.join()
    return publish


def shown(qtbot, pane: AgentPane) -> str:
    qtbot.waitUntil(lambda: pane.pending_lines == 0 and not pane._timer.isActive(),
                    timeout=3000)
    return pane.plain_text()


def line_color(pane: AgentPane, needle: str) -> str:
    """Foreground colour of the first line containing `needle`."""
    block = pane.view.document().begin()
    while block.isValid():
        if needle in block.text():
            it = block.begin()
            return it.fragment().charFormat().foreground().color().name()
        block = block.next()
    raise AssertionError(f"{needle!r} not shown")


# --- the bridge ------------------------------------------------------------------------------


def test_bridge_delivers_every_event_in_order_on_the_gui_thread(qtbot, bus, bridge) -> None:
    received: list[tuple[ev.Event, bool]] = []
    gui = QApplication.instance().thread()
    bridge.event_received.connect(lambda e: received.append((e, QThread.currentThread() is gui
                                                             or QThread.currentThread() == gui)))
    phases: list[ev.PhaseChanged] = []
    bridge.phase_changed.connect(phases.append)
    events: list[ev.Event] = [ev.AssistantText("developer", f"line {i}") for i in range(2000)]
    events.insert(1000, ev.PhaseChanged("m1", "acceptor", "developer"))
    thread = threading.Thread(target=lambda: [bus.publish(e) for e in events])
    thread.start()
    thread.join()
    qtbot.waitUntil(lambda: len(received) == len(events), timeout=5000)
    assert [e for e, _ in received] == events
    assert all(on_gui for _, on_gui in received)
    assert phases == [events[1000]]


def test_bridge_call_runs_off_the_gui_thread_and_reports_back_on_it(qtbot, bridge) -> None:
    ran_on: list[str] = []
    done: list[object] = []
    errors: list[ev.EngineError] = []
    bridge.error_raised.connect(errors.append)

    def work() -> str:
        ran_on.append(threading.current_thread().name)
        return "ok"

    bridge.call("work", work, on_done=done.append)
    qtbot.waitUntil(lambda: done == ["ok"], timeout=3000)
    assert ran_on and ran_on[0] != threading.main_thread().name

    def fail() -> None:
        raise RuntimeError("not a git repository")

    bridge.call("Opening", fail)
    qtbot.waitUntil(lambda: bool(errors), timeout=3000)
    assert "Opening failed: not a git repository" in errors[0].message
    assert not bridge.busy


def test_an_engine_calls_error_is_shown_redacted(qtbot, bridge) -> None:
    """An approval's merge that fails quotes git, and git quotes the remote with its token."""
    token = "ghp_" + "a1B2c3D4e5" * 4
    errors: list[ev.EngineError] = []
    handled: list[BaseException] = []
    bridge.error_raised.connect(errors.append)

    def fail() -> None:
        raise RuntimeError(f"git push failed: https://me:{token}@github.com/me/repo.git")

    bridge.call("Approving", fail)
    bridge.call("Reading the changes", fail, on_error=handled.append)
    qtbot.waitUntil(lambda: bool(errors) and bool(handled), timeout=3000)
    for shown in (errors[0].message, str(handled[0])):
        assert token not in shown and "<REDACTED>" in shown


# --- rendering -------------------------------------------------------------------------------


def test_markdown_headings_bold_code_and_bullets_render_cleanly() -> None:
    lines = render_markdown("# Report\n**Feature**: F1 and `x()`\n- item\n```py\n## not a head\n"
                            "```\nREJECTED: no tests\n**ACCEPTED**")
    flat = ["".join(text for _, text in line) for line in lines]
    assert flat == ["Report", "Feature: F1 and x()", "  • item", "  ## not a head",
                    "REJECTED: no tests", "ACCEPTED"]
    assert lines[0][0][0] == "h"
    assert ("bold", "Feature") in lines[1] and ("code", "x()") in lines[1]
    assert lines[3][0][0] == "code"
    assert lines[4][0][0] == "rejected" and lines[5][0][0] == "accepted"


def test_tool_calls_are_one_compact_line_with_their_key_argument() -> None:
    root = Path("/work/project")
    assert describe_tool("Bash", {"command": "git commit -m 'feat: F1'\n\nbody"}) == \
        "Bash: git commit -m 'feat: F1' …"
    assert describe_tool("Read", {"file_path": "/work/project/src/x.py"}, root) == \
        "Read: src/x.py"
    assert describe_tool("Grep", {"pattern": "TODO", "path": "src"}) == "Grep: TODO  in src"
    assert describe_tool("TodoWrite", {"todos": [1, 2]}) == "TodoWrite: 2 todos"
    assert describe_tool("Mystery", {}) == "Mystery"


def test_pane_shows_the_stream_readably(qtbot, deliver, pane: AgentPane) -> None:
    result = "\n".join(f"row {i}" for i in range(40))
    deliver([
        ev.SessionStarted("developer", "5e55-10n-1d", "claude-x"),
        ev.AssistantText("developer", "## Plan\nI will **commit** with `git`."),
        ev.ToolUse("developer", "Bash", "t1", {"command": "git commit -m 'feat: F1'"}),
        ev.ToolResult("developer", "t1", result),
        ev.ToolUse("developer", "Read", "t2", {"file_path": "/work/project/src/x.py"}),
        ev.ToolResult("developer", "t2", "boom", is_error=True),
        ev.RawOutput("developer", "Warning: something not JSON"),
        ev.TurnResult("developer", "done", False, "s", cost_usd=0.5, turn_cost_usd=0.0123,
                      usage={"input_tokens": 1000, "output_tokens": 234}, duration_ms=4200,
                      num_turns=3),
        ev.AgentExited("developer", 137, "Killed\n", expected=False),
        ev.AssistantText("acceptor", "not mine"),
    ])
    text = shown(qtbot, pane)
    assert "● session 5e55-10n" in text
    assert "Plan\nI will commit with git." in text
    assert "▸ Bash: git commit -m 'feat: F1'" in text
    assert "row 0\n    row 1\n    row 2\n    … (37 more lines)" in text
    assert "▸ Read: src/x.py" in text
    assert "Warning: something not JSON" in text
    assert "✓ turn done · 4.2 s · 3 steps · 1.2k tokens · $0.0123" in text
    assert "process exited unexpectedly (exit code 137)" in text
    assert "not mine" not in text
    assert line_color(pane, "boom") == "#c5221f"
    assert line_color(pane, "Warning: something") == "#9a6700"
    assert line_color(pane, "process exited") == "#c5221f"
    assert "crashed" in pane.state_label.text()


def test_verdicts_are_green_and_red(qtbot, deliver, bridge) -> None:
    acceptor = AgentPane("acceptor")
    qtbot.addWidget(acceptor)
    acceptor.show()
    bridge.agent_events_received.connect(acceptor.feed_many)
    bridge.verdict_reached.connect(acceptor.feed)
    deliver([
        ev.AssistantText("acceptor", "Looked at it.\n\nREJECTED: no test covers the greeting"),
        ev.VerdictReached("m1", 2, "feature", False, "no test covers the greeting"),
        ev.AssistantText("acceptor", "**ACCEPTED**"),
        ev.VerdictReached("m1", 3, "fix", True),
    ])
    text = shown(qtbot, acceptor)
    assert "REJECTED: no test covers the greeting" in text
    assert "✘ Round 2 REJECTED: no test covers the greeting" in text
    assert "✔ Round 3 ACCEPTED" in text
    assert line_color(acceptor, "REJECTED: no test") == "#c5221f"
    assert line_color(acceptor, "✔ Round 3") == "#1a7f37"


def test_a_rejection_with_bullets_is_shown_whole(qtbot, deliver, bridge) -> None:
    developer = AgentPane("developer")
    qtbot.addWidget(developer)
    developer.show()
    bridge.agent_events_received.connect(developer.feed_many)
    bridge.verdict_reached.connect(developer.feed)
    reason = "two problems\n- AC 3: no --version\n- AC 5: lint fails"
    deliver([ev.AssistantText("acceptor", f"**REJECTED** — {reason}"),
             ev.VerdictReached("m1", 2, "feature", False, reason)])
    text = shown(qtbot, developer)
    assert "✘ Round 2 REJECTED: two problems" in text
    assert "- AC 3: no --version" in text and "- AC 5: lint fails" in text
    assert line_color(developer, "AC 5: lint fails") == "#c5221f"
    # The pane highlights exactly what the engine reads as a verdict.
    assert [r[0][0] for r in render_markdown("**REJECTED** — x\nVerdict: accepted")] == \
        ["rejected", "accepted"]


def test_refused_tool_calls_are_shown(qtbot, deliver, pane: AgentPane) -> None:
    deliver([ev.TurnResult("developer", "done", False, "s", turn_cost_usd=0.01,
                           permission_denials=("Bash: git push origin main",))])
    text = shown(qtbot, pane)
    assert "⛔ refused by the tool rules: Bash: git push origin main" in text
    assert line_color(pane, "refused by the tool rules") == "#c5221f"


# --- batching, cap, scrolling, search --------------------------------------------------------


def test_text_is_batched_per_frame_not_per_event(qtbot, deliver, pane: AgentPane) -> None:
    inserts: list[int] = []
    original = pane.view.append_lines
    pane.view.append_lines = lambda lines: (inserts.append(len(lines)), original(lines))
    deliver([ev.AssistantText("developer", f"line {i}") for i in range(500)])
    text = shown(qtbot, pane)
    assert text.count("line ") == 500 and text.endswith("line 499")
    assert sum(inserts) == 500
    assert len(inserts) <= 5  # one flush per frame, not one per event


def test_scrollback_is_capped(qtbot, bus) -> None:
    pane = AgentPane("developer", max_lines=100)
    qtbot.addWidget(pane)
    pane.show()
    for i in range(1000):
        pane.feed(ev.AssistantText("developer", f"line {i}"))
        if i % 150 == 0:
            pane.flush()  # several flushes: the cap holds across trims
    text = shown(qtbot, pane)
    assert pane.view.line_count <= 100 and pane.view.document().blockCount() <= 100
    assert text.endswith("line 999") and "line 0\n" not in text


def test_a_full_pane_keeps_nearly_its_whole_scrollback_and_the_readers_place(qtbot) -> None:
    """Past the cap the oldest lines go a twentieth of the cap at a time: the pane still holds
    nearly the cap (not half of it), and a reader scrolled up keeps the line they read."""
    pane = AgentPane("developer", max_lines=200)
    qtbot.addWidget(pane)
    pane.resize(500, 300)
    pane.show()
    view = pane.view

    def top_line() -> str:
        return view.cursorForPosition(view.viewport().rect().topLeft()).block().text()

    wraps = " and a long line of agent prose that wraps in the pane" * 3  # every third line
    pane.feed_many([ev.AssistantText("developer", f"line {i}{wraps * (i % 3 == 0)}")
                    for i in range(200)])
    shown(qtbot, pane)
    view.verticalScrollBar().setSliderPosition(150)  # the user drags the scroll bar up
    reading = top_line()
    for batch in range(4):
        pane.feed_many([ev.AssistantText("developer", f"more {batch}.{i}{wraps * (i % 3 == 0)}")
                        for i in range(30)])
        text = shown(qtbot, pane)
        assert 190 <= view.line_count <= 200 and text.endswith(f"more {batch}.29")
        assert top_line() == reading and not view.following


def test_auto_scroll_pauses_while_the_user_reads_and_resumes_at_the_bottom(qtbot,
                                                                            pane) -> None:
    bar = pane.view.verticalScrollBar()
    pane.feed_many([ev.AssistantText("developer", f"line {i}") for i in range(300)])
    shown(qtbot, pane)
    assert bar.maximum() > 0 and bar.value() == bar.maximum()
    bar.setSliderPosition(10)  # the user drags the scroll bar up
    assert not pane.view.following
    assert pane.follow_button.isVisibleTo(pane)
    pane.feed_many([ev.AssistantText("developer", f"more {i}") for i in range(50)])
    shown(qtbot, pane)
    assert bar.value() == 10
    pane.follow_button.click()  # back to the bottom: following again
    assert pane.view.following and not pane.follow_button.isVisibleTo(pane)
    pane.feed_many([ev.AssistantText("developer", f"again {i}") for i in range(50)])
    shown(qtbot, pane)
    assert bar.value() == bar.maximum()


def test_only_the_users_scroll_stops_following(qtbot, pane) -> None:
    """A narrower pane re-wraps its lines (the value moves before the range grows) and keeps
    following; the wheel and the keyboard scroll away and stop it."""
    bar = pane.view.verticalScrollBar()
    long_line = "a rather long line of agent prose that wraps in the pane " * 3
    pane.feed_many([ev.AssistantText("developer", f"{i} {long_line}") for i in range(200)])
    shown(qtbot, pane)
    qtbot.waitExposed(pane)
    for width in (600, 420, 650, 380):
        pane.resize(width, 500)
        qtbot.wait(50)
        assert pane.view.following and bar.value() == bar.maximum() > 0, width
    pane.feed(ev.AssistantText("developer", "the newest line"))
    shown(qtbot, pane)
    assert bar.value() == bar.maximum() and not pane.follow_button.isVisibleTo(pane)

    wheel = QWheelEvent(QPointF(50, 50), QPointF(50, 50), QPoint(0, 0), QPoint(0, 360),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                        Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(pane.view.viewport(), wheel)
    assert not pane.view.following and bar.value() < bar.maximum()
    assert pane.follow_button.isVisibleTo(pane)
    pane.follow_button.click()
    assert pane.view.following
    qtbot.keyClick(pane.view, Qt.Key.Key_PageUp)
    assert not pane.view.following and bar.value() < bar.maximum()


def test_following_survives_long_wrapped_output_laid_out_later(qtbot, pane) -> None:
    """Qt lays wrapped text out after the append returns (the scroll range grows later):
    a pane that follows must still end at the bottom, and keep following."""
    bar = pane.view.verticalScrollBar()
    long_line = "a rather long line of agent prose that wraps in the pane " * 6
    for batch in range(5):
        pane.feed_many([ev.AssistantText("developer", f"{batch}.{i} {long_line}")
                        for i in range(40)])
        shown(qtbot, pane)
        qtbot.wait(20)
    assert pane.view.following
    assert bar.value() == bar.maximum() > 0


def test_find_selects_matches_and_says_when_there_is_none(qtbot, pane: AgentPane) -> None:
    """The bar itself; Ctrl+F is the window's (tests/test_ui_find_and_close.py)."""
    pane.feed_many([ev.AssistantText("developer", f"line {i}") for i in range(50)]
                   + [ev.AssistantText("developer", "the needle is here")])
    shown(qtbot, pane)
    pane.view.setFocus()
    pane.search.open_bar()
    assert pane.search.isVisible()
    qtbot.keyClicks(pane.search.edit, "needle")
    assert pane.view.textCursor().selectedText() == "needle"
    pane.search.edit.clear()
    qtbot.keyClicks(pane.search.edit, "haystack")
    assert pane.search.status.text() == "No match"
    qtbot.keyClick(pane.search.edit, Qt.Key.Key_Escape)
    assert not pane.search.isVisible()


def test_text_is_selectable_and_copyable(qtbot, pane: AgentPane) -> None:
    pane.feed(ev.AssistantText("developer", "copy me please"))
    shown(qtbot, pane)
    cursor = pane.view.textCursor()
    cursor.movePosition(QTextCursor.MoveOperation.Start)
    cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    pane.view.setTextCursor(cursor)
    pane.view.copy()
    assert "copy me please" in QApplication.clipboard().text()
    assert pane.view.isReadOnly()


def test_active_pane_is_highlighted(qtbot, pane: AgentPane) -> None:
    assert pane.property("active") is False
    pane.set_active(True)
    assert pane.property("active") is True and pane.active


def test_the_header_shows_the_context_in_use_and_a_compaction_is_shown(
        qtbot, deliver, pane: AgentPane) -> None:
    deliver([ev.SessionStarted("developer", "s-one", "claude-x"),
             ev.ContextUsage("developer", "s-one", tokens=46_000, window=200_000),
             ev.ContextUsage("acceptor", "s-two", tokens=190_000, window=200_000)])
    shown(qtbot, pane)
    assert pane.context_label.text() == "23% context"
    assert "46.0k of 200.0k tokens" in pane.context_label.toolTip()
    deliver([ev.Compacted("developer", "auto", pre_tokens=160_000, post_tokens=9_000)])
    assert "⟲ the CLI compacted the context (auto): 160.0k → 9.0k tokens" in shown(qtbot, pane)
    # A fresh session starts from nothing: the old figure would be a lie.
    deliver([ev.SessionStarted("developer", "s-three", "claude-x")])
    shown(qtbot, pane)
    assert pane.context_label.text() == ""


def test_a_stopped_turn_is_not_a_failure_and_cli_retries_show(qtbot, pane: AgentPane,
                                                              deliver) -> None:
    deliver([ev.ApiRetry("developer", 3, 10, 4000.0, 529, "overloaded"),
             ev.TurnResult("developer", "", True, "s", subtype="error_during_execution",
                           duration_ms=1200, terminal_reason="aborted_streaming")])
    text = shown(qtbot, pane)
    assert "⟳ API retry 3/10: 529 overloaded, next in 4 s" in text
    assert "■ turn stopped" in text and "turn failed" not in text
    assert pane.state_label.text() == "stopped"


def test_a_stop_and_failed_turns_are_said_in_plain_words(qtbot, pane, deliver) -> None:
    def turn(subtype: str) -> list[ev.Event]:
        return [ev.AssistantText("developer", "working"),
                ev.TurnResult("developer", "", True, "s", subtype=subtype)]

    deliver(turn("success"))  # an error result the CLI labels "success"
    pane.note_stop_requested()  # between turns: nothing to stop in this pane
    deliver(turn("error_during_execution")[:1])
    pane.note_stop_requested()  # the human's Stop now, mid-turn
    deliver(turn("error_during_execution")[1:])
    deliver([*turn("error_during_execution"),
             ev.AgentExited("developer", -15, "", expected=True)])
    text = shown(qtbot, pane)
    assert "✗ the turn ended with an error" in text
    assert "turn stopped by you" in text
    assert line_color(pane, "turn stopped by you") != "#c5221f"
    assert "✗ the turn broke off while it was running" in text  # not a stop: still red
    assert "agent stopped (exit code -15)" in text
    assert "turn failed (" not in text


def test_a_narrow_pane_shortens_its_title_but_never_the_role(qtbot, deliver,
                                                              pane: AgentPane) -> None:
    """"Developer · CLI version · model" gives way to a narrow window (two panes side by side
    on a 1024-pixel screen), whole in its tooltip; the role name stays."""
    deliver([ev.SessionStarted("developer", "s-narrow", "claude-opus-4-5-20251101",
                               cli="2.1.332 (Claude Code)")])
    qtbot.waitUntil(lambda: "2.1.332" in pane.title.text())
    pane.resize(pane.minimumSizeHint().width(), 400)
    qtbot.waitUntil(lambda: pane.width() < 500)
    qtbot.wait(100)  # the header's layout follows on the next pass
    shown = pane.title.shown_text()
    assert shown.startswith("Developer") and shown.endswith("…"), shown
    assert "claude-opus-4-5-20251101" in pane.title.toolTip()
