"""One agent's live output as a readable transcript.

Rendering costs about 50 µs a line when appended one by one (bench/pane_throughput.py measures
the pane), and an agent can emit
thousands of lines a second, so `AgentPane` never touches the document per event: events become
formatted runs in a pending list, and a ~16 ms timer flushes them in one edit block. A flood
that would be trimmed by the scrollback cap anyway is dropped before it is laid out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from PySide6.QtCore import QTimer, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from anima import events as ev
from ui.formatting import format_tokens
from ui.search_bar import SearchBar
from ui.transcript import (
    DEFAULT_MAX_LINES,
    Line,
    TranscriptView,
    clip,
    render_markdown,
    summarize_result,
)
from ui.widgets import ElidedLabel, tool_button

FLUSH_INTERVAL_MS = 16
# A flush lays out what fits this budget (measured per line as it goes), so a burst never
# stalls the event loop; a backlog is flushed again on the next loop turn, not a frame later.
MAX_FLUSH_SECONDS = 0.008
MIN_LINES_PER_FLUSH = 200
RESULT_PREVIEW_LINES = 3
ERROR_PREVIEW_LINES = 8
# A rejection reason is shown whole up to this many lines (the record keeps all of it).
REASON_PREVIEW_LINES = 60
THINKING_PREVIEW_LINES = 4

ROLE_TITLES = {"developer": "Developer", "acceptor": "Acceptor"}
# A failed turn's `subtype` in plain words (the CLI's names mean little to a reader).
TURN_ERRORS = {
    "success": "the turn ended with an error",
    "error_during_execution": "the turn broke off while it was running",
    "error_max_turns": "the turn reached its step limit",
    "error_max_budget_usd": "the turn reached its spending limit",
}


class AgentPane(QFrame):
    """The Developer's or the Acceptor's stream: header, transcript, search bar.

    Feed it `anima.events.AgentEvent`s (and verdicts, separators) on the GUI thread; it batches
    them per frame. `active` highlights the pane whose agent the scheduler is waiting for.
    """

    def __init__(self, role: str, *, max_lines: int = DEFAULT_MAX_LINES,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.setObjectName("agentPane")
        self.setProperty("active", False)
        self._pending: deque[Line] = deque()
        self._tool_names: dict[str, str] = {}
        self._turn_started: float | None = None
        self._check_started: float | None = None  # monotonic, while Anima runs the checks
        self._tools_this_turn = 0
        self.lines_rendered = 0
        self.lines_dropped = 0
        self._seconds_per_line = 20e-6
        self._last_kind = ""
        self._session_id = ""
        self._stop_requested = False

        # Elided (whole in its tooltip): "Developer · CLI version · model" must not make two
        # panes side by side wider than a 1024-pixel screen.
        self.title = ElidedLabel(self, keep=ROLE_TITLES.get(role, role.title()))
        self.title.setText(self.title.keep)
        self.title.setObjectName("paneTitle")
        # "idle · last turn 0.2 s · 4 steps · 150 tokens · $0.0100" is elided too.
        self.state_label = ElidedLabel(self)
        self.state_label.setText("idle")
        self.state_label.setObjectName("paneState")
        self.context_label = QLabel("", self)
        self.context_label.setObjectName("paneContext")
        self.follow_button = tool_button(self, "↓ Follow")
        self.follow_button.setObjectName("followButton")
        self.follow_button.setToolTip("Output keeps coming; click to jump to the latest")
        self.follow_button.hide()
        header = QFrame(self)
        header.setObjectName("paneHeader")
        header_layout = QHBoxLayout(header)
        header_layout.setContentsMargins(10, 4, 8, 4)
        header_layout.addWidget(self.title)
        header_layout.addWidget(self.state_label, 1)
        header_layout.addWidget(self.context_label)
        header_layout.addWidget(self.follow_button)

        self.view = TranscriptView(max_lines, self)
        self.view.setObjectName("transcript")
        # Three lines at the least (Qt's own minimum is five): the window fits a 540-px screen.
        self.view.setMinimumHeight(3 * self.view.fontMetrics().lineSpacing() + 8)
        self.search = SearchBar(self.view, self)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(header)
        layout.addWidget(self.search)
        layout.addWidget(self.view, 1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(FLUSH_INTERVAL_MS)
        self._timer.timeout.connect(self._on_flush_due)
        self._clock = QTimer(self)
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self._update_state)
        self.view.following_changed.connect(self._on_following_changed)
        self.follow_button.clicked.connect(self.view.scroll_to_end)

    # --- public API (GUI thread) ----------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.property("active"))

    def set_active(self, active: bool) -> None:
        """Highlight the pane whose agent has the turn (a style sheet property)."""
        if self.active == active:
            return
        self.setProperty("active", active)
        for widget in (self, *self.findChildren(QFrame, "paneHeader"), self.title):
            widget.style().unpolish(widget)
            widget.style().polish(widget)

    @property
    def pending_lines(self) -> int:
        return len(self._pending)

    def feed(self, event: ev.Event) -> None:
        """Queue an event's lines for the next frame."""
        lines = self._lines_for(event)
        if lines:
            self._queue(lines)

    def feed_many(self, events: Sequence[ev.Event]) -> None:
        """Queue many events (a transcript replay) without a frame per event."""
        for event in events:
            lines = self._lines_for(event)
            if lines:
                self._pending.extend(lines)
        self._schedule()

    def append_separator(self, text: str) -> None:
        """A quiet rule between rounds, so a long transcript keeps its structure."""
        self._queue([(("text", ""),), (("separator", f"──── {text} ────"),)])

    def note_stop_requested(self) -> None:
        """The human stopped the agents: a running turn's error result is their stop."""
        self._stop_requested = self._turn_started is not None

    def flush(self) -> None:
        """Render everything pending now (tests, screenshots)."""
        while self._pending:
            self._flush_some(limit_time=False)

    def plain_text(self) -> str:
        return self.view.toPlainText()

    # --- event → lines ---------------------------------------------------------------------
    def _lines_for(self, event: ev.Event) -> list[Line]:
        if isinstance(event, ev.AgentEvent) and event.role != self.role:
            return []
        if isinstance(event, ev.AssistantText):
            self._mark_working()
            lines = render_markdown(event.text)
            if self._last_kind == "tool" and lines and lines[0] != (("text", ""),):
                lines.insert(0, (("text", ""),))  # air between tool calls and prose
            self._last_kind = "text"
            return lines
        if isinstance(event, ev.ToolUse):
            self._mark_working()
            self._tools_this_turn += 1
            if len(self._tool_names) > 512:
                self._tool_names.clear()
            self._tool_names[event.tool_use_id] = event.tool
            self._last_kind = "tool"
            return [(("tool", "▸ " + (event.summary or event.tool)),)]
        if isinstance(event, ev.ToolResult):
            self._tool_names.pop(event.tool_use_id, None)
            limit = ERROR_PREVIEW_LINES if event.is_error else RESULT_PREVIEW_LINES
            key = "result_error" if event.is_error else "result"
            shown = summarize_result(event.content, limit)
            return [((key, ("  └ " if i == 0 else "    ") + line),) for i, line in enumerate(shown)]
        if isinstance(event, ev.Thinking):
            self._mark_working()
            shown = summarize_result(event.text, THINKING_PREVIEW_LINES)
            return [(("thinking", ("✻ " if i == 0 else "  ") + line),)
                    for i, line in enumerate(shown)]
        if isinstance(event, ev.TurnResult):
            return self._turn_finished(event)
        if isinstance(event, ev.ApiRetry):
            return [(("error", f"⟳ {event.describe()}"),)]
        if isinstance(event, ev.RateLimitChanged):
            # The latest usage-limit state; "allowed" with nothing to add is not news.
            if event.status == "allowed" and event.utilization is None:
                return []
            key = "meta" if event.status == "allowed" else "error"
            return [((key, f"◔ {event.describe()}"),)]
        if isinstance(event, ev.RawOutput):
            return [(("raw", clip(line)),) for line in event.text.rstrip("\n").split("\n")]
        if isinstance(event, ev.SessionStarted):
            # stream-json repeats system/init every turn: a turn starts; say so only once
            # per session.
            self._mark_working()
            if event.session_id == self._session_id:
                return []
            self._session_id = event.session_id
            self._show_context(None)
            model = f" · {event.model}" if event.model else ""
            cli = f" · {event.cli}" if event.cli else ""
            self.title.setText(f"{ROLE_TITLES.get(self.role, self.role.title())}{cli}{model}")
            return [(("meta", f"● session {event.session_id[:8]}{model}"),)]
        if isinstance(event, ev.AgentExited):
            return self._exited(event)
        if isinstance(event, ev.ContextUsage):
            self._show_context(event)
            return []
        if isinstance(event, ev.Compacted):
            return [(("meta", f"⟲ the CLI compacted the context ({event.trigger})"
                              f"{event.sizes(format_tokens)}"),)]
        if isinstance(event, ev.CheckStarted | ev.CheckFinished):
            return self._check_lines(event)
        if isinstance(event, ev.VerdictReached):
            word = "ACCEPTED" if event.accepted else "REJECTED"
            reason = summarize_result(event.reason, REASON_PREVIEW_LINES) \
                if event.reason and not event.accepted else []
            first = f": {reason[0]}" if reason else ""
            label = "Final acceptance" if event.kind == "final" else f"Round {event.round}"
            key = "accepted" if event.accepted else "rejected"
            # The whole reason, one displayed line per line of it.
            return [((key, f"{'✔' if event.accepted else '✘'} {label} {word}{first}"),),
                    *(((key, f"    {clip(line)}"),) for line in reason[1:])]
        return []

    def _turn_finished(self, event: ev.TurnResult) -> list[Line]:
        self._turn_started = None
        self._clock.stop()
        parts = [f"{event.duration_ms / 1000:.1f} s"]
        if event.num_turns:
            parts.append(f"{event.num_turns} steps")
        tokens = sum(int(v) for k, v in (event.usage or {}).items()
                     if k.endswith("tokens") and isinstance(v, int | float))
        if tokens:
            parts.append(f"{format_tokens(tokens)} tokens")
        if event.turn_cost_usd is not None:  # what this turn spent, not the process's total
            parts.append(f"${event.turn_cost_usd:.4f}")
        summary = " · ".join(parts)
        stopped, self._stop_requested = self._stop_requested, False
        if event.stopped:  # Anima's own interrupt: not a failure
            self._set_state("stopped")
            return [(("meta", f"■ turn stopped{' by you' if stopped else ''} · {summary}"),)]
        self._set_state(f"idle · last turn {summary}")
        refused = [(("error", f"⛔ refused by the tool rules: {clip(d)}"),)
                   for d in event.permission_denials]
        if event.is_error and stopped:
            return [*refused, (("meta", f"turn stopped by you · {summary}"),)]
        if event.is_error:
            detail = f" — {clip(event.text, 300)}" if event.text else ""
            words = TURN_ERRORS.get(event.subtype, f"the turn failed ({event.subtype})")
            return [*refused, (("error", f"✗ {words}{detail}"),), (("meta", summary),)]
        return [*refused, (("meta", f"✓ turn done · {summary}"),)]

    def _exited(self, event: ev.AgentExited) -> list[Line]:
        self._turn_started = None
        self._clock.stop()
        if event.expected:
            self._set_state("stopped")
            return [(("meta", f"agent stopped (exit code {event.exit_code})"),)]
        self._set_state("crashed")
        lines: list[Line] = [(("error", f"✗ process exited unexpectedly "
                                        f"(exit code {event.exit_code})"),)]
        for line in event.stderr_tail.rstrip().split("\n")[-12:]:
            if line.strip():
                lines.append((("raw", clip(line)),))
        return lines

    def _show_context(self, usage: ev.ContextUsage | None) -> None:
        """The header's "% context": how full the agent's window was after its last turn."""
        if usage is None:
            self.context_label.setText("")
            self.context_label.setToolTip("")
            return
        self.context_label.setText(f"{usage.percent:.0f}% context")
        self.context_label.setToolTip(
            f"{format_tokens(usage.tokens)} of {format_tokens(usage.window)} tokens in use "
            f"after the last turn (Anima starts a fresh session past the rollover threshold)")

    def _check_lines(self, event: ev.CheckStarted | ev.CheckFinished) -> list[Line]:
        """Anima's own run of the project's checks, with a live elapsed time in the header."""
        if isinstance(event, ev.CheckStarted):
            self._check_started = time.monotonic() - max(0.0, time.time() - event.started_at)
            self._clock.start()
            self._update_state()
            return [(("tool", f"▶ Anima runs the checks: {event.command}"),)]
        self._check_started = None
        if self._turn_started is None:
            self._clock.stop()
        self._set_state(f"idle · checks {event.outcome}")
        if event.passed:
            return [(("result", f"  └ ✓ checks {event.outcome}"),)]
        lines: list[Line] = [(("result_error", f"  └ ✗ checks {event.outcome}"),)]
        lines += [(("result_error", "    " + clip(line)),)
                  for line in event.tail.splitlines()[-ERROR_PREVIEW_LINES:]]
        return lines

    def _mark_working(self) -> None:
        if self._turn_started is None:
            self._turn_started = time.monotonic()
            self._tools_this_turn = 0
            self._clock.start()
            self._update_state()

    @Slot()
    def _update_state(self) -> None:
        if self._check_started is not None:
            seconds = int(time.monotonic() - self._check_started)
            self._set_state(f"running checks · {seconds // 60}:{seconds % 60:02d}")
            return
        if self._turn_started is None:
            return
        seconds = int(time.monotonic() - self._turn_started)
        tools = f" · {self._tools_this_turn} tool calls" if self._tools_this_turn else ""
        self._set_state(f"working · {seconds // 60}:{seconds % 60:02d}{tools}")

    def _set_state(self, text: str) -> None:
        self.state_label.setText(text)

    # --- batching ------------------------------------------------------------------------------
    def _queue(self, lines: list[Line]) -> None:
        self._pending.extend(lines)
        self._schedule()

    def _schedule(self) -> None:
        if self._pending and not self._timer.isActive():
            self._timer.start(FLUSH_INTERVAL_MS)

    @Slot()
    def _on_flush_due(self) -> None:
        if not self.isVisible():
            # A page in a background tab lays nothing out: it keeps the newest lines (a
            # scrollback's worth) and shows them when its tab comes to the front.
            self._drop_beyond_cap()
            return
        self._flush_some(limit_time=True)
        if self._pending:
            # Behind: flush again as soon as the event loop has had its turn.
            self._timer.start(0)

    def _drop_beyond_cap(self) -> None:
        """Lines beyond the cap would be laid out only to be trimmed at once: skip them."""
        excess = len(self._pending) - self.view.max_lines
        if excess > 0:
            for _ in range(excess):
                self._pending.popleft()
            self.lines_dropped += excess

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._schedule()  # what arrived while the tab was in the background

    def _flush_some(self, *, limit_time: bool) -> None:
        """Lay out as many pending lines as fit the time budget of one flush."""
        self._drop_beyond_cap()
        count = len(self._pending)
        if limit_time:
            count = min(count, max(MIN_LINES_PER_FLUSH,
                                   int(MAX_FLUSH_SECONDS / self._seconds_per_line)))
        pop = self._pending.popleft
        batch = [pop() for _ in range(count)]
        started = time.perf_counter()
        self.view.append_lines(batch)
        if count >= MIN_LINES_PER_FLUSH:
            spent = (time.perf_counter() - started) / count
            # Rise fast, fall slowly: an underestimate is what causes a stall.
            self._seconds_per_line = max(spent, 0.8 * self._seconds_per_line + 0.2 * spent)
        self.lines_rendered += count

    @Slot(bool)
    def _on_following_changed(self, following: bool) -> None:
        self.follow_button.setVisible(not following)
