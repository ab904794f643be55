"""The Iteration Monitor: what the milestone is at, both agents live, and how it got here.

Top: `MilestoneHeader` (title, round, consecutive rejections k/max, features k/n, tokens, cost,
elapsed). Middle: the Developer and Acceptor `AgentPane`s side by side, the active one
highlighted. Below: `FeatureChecklist` and `RoundHistory`. Bottom: `PhaseBar` (the scheduler's
phase in words and the time left before the turn times out, or the usage limit the turn waits
for and when it resumes). Everything here runs on the GUI
thread and is fed by `ui.bridge.EngineBridge` signals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    Qt,
    QTimer,
    Slot,
)
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from anima import events as ev
from anima.events import ROLES
from anima.phases import PHASE_TEXT, RUNNING, Phase
from ui.agent_pane import ROLE_TITLES, AgentPane
from ui.formatting import ElapsedClock, enum_text, format_duration, format_tokens
from ui.record_facts import (
    agents_text,
    dropped_rounds,
    ended_text,
    limit_wait_text,
    live_rounds,
)
from ui.round_history import RoundHistory
from ui.widgets import ElidedLabel, set_style_state

if TYPE_CHECKING:
    from anima.engine.facade import Feature, MilestoneRecord

#: GUI-thread time per event-loop turn for turning transcript events into lines while
#: replaying, in chunks of REPLAY_CHUNK events. A fixed 200 events cost 20-30 ms (their
#: markdown), which a loaded machine stretched into stalls of 180 ms.
REPLAY_SLICE_SECONDS = 0.004
REPLAY_CHUNK = 20

# Which pane is highlighted in which phase.
ACTIVE_ROLE = {Phase.DEVELOPER: "developer", Phase.RECOVERING: "developer",
               Phase.ACCEPTOR: "acceptor", Phase.FINAL_ACCEPTANCE: "acceptor"}

FEATURE_COLORS = {"pending": "#6e7781", "in_progress": "#0b5cad", "done": "#1a7f37",
                  "blocked": "#c5221f"}


def record_phase(record: MilestoneRecord) -> Phase:
    """The phase a record is in when the scheduler is not saying: a running milestone's last
    phase, else its status (a pending one: idle)."""
    status = enum_text(record.status)
    if status == "in_progress":
        return Phase(record.phase)
    return Phase(status) if status in set(Phase) else Phase.IDLE


class _Stat(QWidget):
    """A caption over a value, the unit of the header."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.caption = QLabel(caption, self)
        self.caption.setObjectName("statCaption")
        self.value = QLabel("—", self)
        self.value.setObjectName("statValue")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.caption)
        layout.addWidget(self.value)

    def set(self, text: str, level: str = "normal", tooltip: str = "") -> None:
        self.value.setText(text)
        self.setToolTip(tooltip)
        set_style_state(self.value, "level", level)


class MilestoneHeader(QFrame):
    """Title, round, consecutive rejections (coloured as they near the limit), progress, cost."""

    def __init__(self, parent: QWidget | None = None, clock: ElapsedClock | None = None
                 ) -> None:
        super().__init__(parent)
        self.setObjectName("milestoneHeader")
        self.max_rejections = 3
        self.roles: dict[str, Any] = {}  # each role's config, once the engine says
        self.clock = clock or ElapsedClock()
        self._record: MilestoneRecord | None = None
        # Elided (whole in its tooltip): a long title must not set the window's minimum width.
        self.title = ElidedLabel(self)
        self.title.setText("No milestone")
        self.title.setObjectName("milestoneTitle")
        self.status = QLabel("", self)
        self.status.setObjectName("statusPill")
        self.status.hide()  # an empty pill is a grey blob: shown with a milestone only
        # Which agent CLI plays each role (pairs may mix them); elided, whole in its tooltip.
        self.agents = ElidedLabel(self)
        self.agents.setObjectName("headerAgents")
        self.round = _Stat("Round", self)
        self.rejections = _Stat("Rejections in a row", self)
        self.features = _Stat("Features", self)
        self.tokens = _Stat("Tokens", self)
        self.cost = _Stat("Cost", self)
        self.elapsed = _Stat("Elapsed", self)
        top = QHBoxLayout()
        top.addWidget(self.title)
        top.addWidget(self.status)
        top.addStretch(1)
        top.addWidget(self.agents)
        stats = QHBoxLayout()
        stats.setSpacing(28)
        for stat in (self.round, self.rejections, self.features, self.tokens, self.cost,
                     self.elapsed):
            stats.addWidget(stat)
        stats.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 6, 14, 6)
        layout.setSpacing(4)
        layout.addLayout(top)
        layout.addLayout(stats)

    def show_record(self, record: MilestoneRecord | None) -> None:
        self._record = record
        if record is None:
            self.title.setText("No milestone")
            self.status.hide()
            self.agents.setText("")
            for stat in (self.round, self.rejections, self.features, self.tokens, self.cost,
                         self.elapsed):
                stat.set("—")
            return
        self.title.setText(record.title)
        self.title.setToolTip(f"{record.title}\n{record.id} · branch "
                              f"{record.branch_name or '(not yet)'}")
        status = enum_text(record.status)
        self.status.setText(status.replace("_", " "))
        self.status.show()
        set_style_state(self.status, "status", status)
        self.agents.setText(agents_text(record, self.roles, ROLE_TITLES))
        # Rounds a rewind dropped are history, not progress: they leave the count.
        dropped = len(dropped_rounds(record))
        rounds = len(live_rounds(record))
        self.round.set(f"{rounds} / {record.max_iterations}" + (f" · {dropped} dropped"
                                                                if dropped else ""),
                       tooltip=f"{rounds} rounds count, {record.iteration_count} of them "
                               f"accepted; the milestone pauses after {record.max_iterations}"
                               + (f"; {dropped} rounds were dropped by “Continue from round”"
                                  if dropped else ""))
        k, limit = record.consecutive_rejections, self.max_rejections
        level = "bad" if k >= limit else "warn" if k and k >= limit - 1 else \
            "note" if k else "normal"
        self.rejections.set(f"{k} / {limit}", level,
                            f"The loop pauses after {limit} rejections in a row")
        done, total = record.features_done, len(record.features)
        self.features.set(f"{done} / {total}", "good" if total and done == total else "normal")
        self.tokens.set(format_tokens(record.tokens_used))
        self.cost.set(record.spent_text)
        self.tick()

    def set_limits(self, max_rejections: int, roles: dict[str, Any]) -> None:
        self.max_rejections, self.roles = max_rejections, roles
        self.show_record(self._record)

    def tick(self) -> None:
        """Refresh the elapsed time (called every second by the monitor)."""
        if self._record is not None:
            self.elapsed.set(self.clock.text(self._record))


class PhaseBar(QFrame):
    """The scheduler's phase in words, and the time left before the current turn times out;
    while a usage limit holds the turn, that wait and when it resumes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("phaseBar")
        self.phase = Phase.IDLE
        self.reason = ""
        self.deadline: float | None = None
        #: The usage-limit wait the turn is held for: (until, what the card says, why).
        self.wait: tuple[float, str, str] | None = None
        self._turn_seconds: float | None = None
        self._reason_shown = True
        self.dot = QLabel("●", self)
        self.dot.setObjectName("phaseDot")
        self.label = QLabel(PHASE_TEXT[Phase.IDLE], self)
        self.label.setObjectName("phaseLabel")
        self.label.setWordWrap(True)  # a long pause reason wraps; it never widens the window
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.countdown = QLabel("", self)
        self.countdown.setObjectName("countdown")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 4, 12, 4)
        layout.addWidget(self.dot)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.countdown)
        set_style_state(self, "phase", "idle")

    @property
    def text(self) -> str:
        return self.label.text()

    def show_phase(self, phase: Phase, reason: str = "", deadline: float | None = None) -> None:
        self.phase, self.reason, self.deadline = phase, reason, deadline
        self._turn_seconds = None if deadline is None else deadline - time.time()
        self._draw()

    def show_wait(self, wait: tuple[float, str, str] | None) -> None:
        """The usage-limit wait the milestone's next turn is held for, as its card says it
        ((until, words, why)), or None: while it lasts, the bar says it instead of the turn
        it holds, whose time runs from the prompt sent again at its end."""
        if wait is None and self.wait is not None and self._turn_seconds is not None:
            self.deadline = time.time() + self._turn_seconds
        self.wait = wait
        self._draw()

    def _waiting(self) -> bool:
        return self.wait is not None and self.phase in RUNNING

    def _draw(self) -> None:
        phase, reason = self.phase, self.reason
        words = PHASE_TEXT[phase]
        if self._waiting() and self.wait is not None:
            words, reason = self.wait[1], self.wait[2]
        elif phase == Phase.CANCELLED and reason:
            words = reason  # "Cancelled by you at 14:05"
        elif reason and self._reason_shown and phase in (Phase.PAUSED, Phase.FAILED,
                                                       Phase.RECOVERING, Phase.MERGING):
            words = f"{words} — {reason}"
        self.label.setText(words)
        self.label.setToolTip(reason)
        set_style_state(self, "phase", phase)
        self.tick()

    def set_reason_shown(self, shown: bool) -> None:
        """Whether the bar says why (paused, failed): not when the decision bar says it."""
        if shown != self._reason_shown:
            self._reason_shown = shown
            self._draw()

    def tick(self) -> None:
        if self._waiting() and self.wait is not None:
            left = self.wait[0] - time.time()
            if left <= 0:  # its reset passed: the engine sends the prompt again
                self.show_wait(None)
                return
            self.countdown.setText(f"resumes in {format_duration(left)}")
            set_style_state(self.countdown, "level", "normal")
            return
        if self.deadline is None or self.phase not in RUNNING:
            self.countdown.setText("")
            return
        left = self.deadline - time.time()
        if left <= 0:
            self.countdown.setText("turn timing out…")
            set_style_state(self.countdown, "level", "bad")
            return
        self.countdown.setText(f"turn times out in {format_duration(left)}")
        set_style_state(self.countdown, "level", "warn" if left < 60 else "normal")


class FeatureChecklist(QListWidget):
    """`[x] F1 Title — 2 rounds · 1 commit`, one line per feature, coloured by status."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("featureChecklist")
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setWordWrap(True)
        self._shown: list[tuple[Any, ...]] = []

    def show_features(self, features: list[Feature]) -> None:
        """Items are updated in place, never cleared and made again: a round changes one
        line, and the list keeps its scroll position (and its items) meanwhile."""
        key = [(f.id, f.title, enum_text(f.status), f.rounds, len(f.commits),
                tuple(f.criteria)) for f in features]
        if key == self._shown:
            return  # nothing changed: keep the scroll position and avoid flicker
        shown, self._shown = self._shown, key
        while self.count() > max(len(features), 1):
            self.takeItem(self.count() - 1)
        while self.count() < max(len(features), 1):
            self.addItem(QListWidgetItem())
        if not features:
            self._fill(self.item(0), "No features parsed from this milestone", "", "", None)
        for row, feature in enumerate(features):
            if row < len(shown) and shown[row] == key[row]:
                continue  # a round changes one line: the others are not laid out again
            status = enum_text(feature.status)
            box = feature.status.box if hasattr(feature.status, "box") else "[ ]"
            details = []
            if feature.rounds:
                details.append(f"{feature.rounds} round{'s' * (feature.rounds != 1)}")
            if feature.commits:
                n = len(feature.commits)
                details.append(f"{n} commit{'s' * (n != 1)}")
            suffix = f"   — {' · '.join(details)}" if details else ""
            criteria = "\n".join(f"• {c}" for c in feature.criteria)
            self._fill(self.item(row), f"{box}  {feature.id}  {feature.title}{suffix}", status,
                       f"{feature.id} {feature.title} ({status.replace('_', ' ')})"
                       + (f"\n\nAcceptance:\n{criteria}" if criteria else ""), feature.id)

    def _fill(self, item: QListWidgetItem, text: str, status: str, tooltip: str,
              feature_id: str | None) -> None:
        item.setText(text)
        item.setForeground(QBrush(QColor(FEATURE_COLORS.get(status, "#1f2328"))))
        font = QFont(self.font())
        font.setBold(status == "in_progress")
        item.setFont(font)
        item.setToolTip(tooltip)
        item.setData(Qt.ItemDataRole.UserRole, feature_id)

    def lines(self) -> list[str]:
        return [self.item(i).text() for i in range(self.count())]


def shown_in(event: ev.TranscriptEvent) -> tuple[str, ...]:
    """The roles whose panes show an event."""
    if isinstance(event, ev.AgentEvent):
        return (event.role,)
    if isinstance(event, ev.VerdictReached) and not event.accepted:
        return (ev.ACCEPTOR, ev.DEVELOPER)
    return (ev.ACCEPTOR,)


class IterationMonitor(QWidget):
    """The monitor page: header, the two agent panes, checklist, history, phase bar.

    It shows one milestone's record (`show_record`) and the live agents (`show_events`);
    the scheduler's phase decides which pane is highlighted.
    """

    def __init__(self, parent: QWidget | None = None, clock: ElapsedClock | None = None
                 ) -> None:
        super().__init__(parent)
        self.setObjectName("iterationMonitor")
        self.milestone_id: str | None = None
        self.live_milestone: str | None = None
        self._live_phase = Phase.IDLE  # the followed milestone's phase
        self.header = MilestoneHeader(self, clock)
        self.panes = {role: AgentPane(role, parent=self) for role in ROLES}
        self.checklist = FeatureChecklist(self)
        self.history = RoundHistory(self)
        # A row or two (the rounds table says how tall its two are): the panes come first.
        self.checklist.setMinimumHeight(2 * self.checklist.fontMetrics().lineSpacing() + 12)
        self.phase_bar = PhaseBar(self)

        self.pane_splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.pane_splitter.setChildrenCollapsible(False)
        for pane in self.panes.values():
            self.pane_splitter.addWidget(pane)

        checklist_box = self._titled("Features", self.checklist)
        history_box = self._titled("Rounds", self.history)
        self.detail_splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.detail_splitter.addWidget(checklist_box)
        self.detail_splitter.addWidget(history_box)
        # The rounds' nine columns want about 600 px: at 2:3 of a 1024-px window they scrolled
        # sideways, and the scroll bar took one of the table's two rows.
        self.detail_splitter.setStretchFactor(0, 1)
        self.detail_splitter.setStretchFactor(1, 2)

        self.body = QSplitter(Qt.Orientation.Vertical, self)
        self.body.setChildrenCollapsible(False)
        self.body.addWidget(self.pane_splitter)
        self.body.addWidget(self.detail_splitter)
        self.body.setStretchFactor(0, 3)
        self.body.setStretchFactor(1, 1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.header)
        layout.addWidget(self.body, 1)
        layout.addWidget(self.phase_bar)

        self._clock = QTimer(self)
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self._on_clock)
        self._clock.start()
        self._last_focused: AgentPane | None = None
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.focusChanged.connect(self._on_focus_changed)

    @staticmethod
    def _titled(title: str, widget: QWidget) -> QWidget:
        box = QFrame()
        box.setObjectName("section")
        label = QLabel(title, box)
        label.setObjectName("sectionTitle")
        layout = QVBoxLayout(box)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.setSpacing(4)
        layout.addWidget(label)
        layout.addWidget(widget, 1)
        return box

    def _pane_of(self, widget: QWidget | None) -> AgentPane | None:
        return next((p for p in self.panes.values()
                     if widget is not None and (p is widget or p.isAncestorOf(widget))), None)

    @Slot(QWidget, QWidget)
    def _on_focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        self._last_focused = self._pane_of(new) or self._last_focused

    def pane_in_use(self) -> AgentPane:
        """The pane Find and Save act on: the one holding the focus, else the one last
        focused, else the one whose agent is working, else the Developer's."""
        return (self._pane_of(QApplication.focusWidget()) or self._last_focused
                or next((p for p in self.panes.values() if p.active), self.panes["developer"]))

    def set_limits(self, max_consecutive_rejections: int, roles: dict[str, Any]) -> None:
        """The limits and the roles' config (agent CLI, model) the engine runs with (its
        `EngineReady`), shown from then on."""
        self.header.set_limits(max_consecutive_rejections, roles)

    # --- engine events (GUI thread) ------------------------------------------------------
    def show_record(self, record: MilestoneRecord | None) -> None:
        """Show one milestone's header, checklist and rounds."""
        self.milestone_id = None if record is None else record.id
        self.header.show_record(record)
        self.checklist.show_features([] if record is None else record.features)
        self.history.show_iterations([] if record is None else record.iterations,
                                     set() if record is None else dropped_rounds(record))
        status = "" if record is None else enum_text(record.status)
        if record is not None and (self.live_milestone is None or (
                record.id == self.live_milestone and status != "in_progress")):
            # Before the scheduler says anything (just opened), the record tells the phase;
            # so it does once the live milestone left the loop (approved, aborted).
            phase = record_phase(record)
            reason = ended_text(record) if phase == Phase.CANCELLED else \
                record.pause_reason or ""
            self.phase_bar.show_phase(phase, reason)
        words = "" if record is None else limit_wait_text(record)
        wait = None if record is None else record.limit_wait
        self.phase_bar.show_wait((wait.until.timestamp(), words, wait.reason)
                                 if wait is not None and words else None)

    def follows(self, milestone_id: str | None) -> bool:
        """Whether events of `milestone_id` are the live ones shown: while several
        milestones run, the monitor stays with the one it follows until that one stops."""
        return None in (milestone_id, self.live_milestone) or milestone_id == self.live_milestone

    @Slot(object)
    def on_phase_changed(self, event: ev.PhaseChanged) -> None:
        # The bar and the highlight follow the scheduler, whichever milestone is shown above
        # (one milestone at a time: another's phases wait until this one leaves the loop).
        if not self.follows(event.milestone_id) and self._live_phase in RUNNING:
            return
        self.live_milestone, self._live_phase = event.milestone_id, event.phase
        self.phase_bar.show_phase(event.phase, event.reason, event.deadline)
        active = ACTIVE_ROLE.get(event.phase)
        for role, pane in self.panes.items():
            pane.set_active(role == active)
        if active is not None:
            title = PHASE_TEXT[event.phase].replace("Waiting for ", "")
            pane = self.panes[active]
            pane.append_separator(f"{title} · {datetime.now().strftime('%H:%M:%S')}")

    def show_events(self, events: Sequence[ev.TranscriptEvent]) -> None:
        """Route a run of events, live or replayed, to the panes that show them (batched
        per pane): an agent's to its own; a verdict to the Acceptor's, and a rejection to the
        Developer's too; Anima's run of the checks, between the two, to the Acceptor's."""
        mine: dict[str, list[ev.TranscriptEvent]] = {role: [] for role in self.panes}
        for event in events:
            if self.follows(event.milestone_id):
                for role in shown_in(event):
                    mine[role].append(event)
        for role, pane in self.panes.items():
            if mine[role]:
                pane.feed_many(mine[role])

    def replay(self, events: list[ev.TranscriptEvent],
               then: Callable[[], None] | None = None) -> None:
        """Show a transcript recorded before a restart, marked as such: a slice of events per
        event-loop turn, so a long one never freezes the window; `then` runs after the last."""
        # Only the panes that show something of it are marked.
        roles = {role for event in events for role in shown_in(event)}
        panes = [p for role, p in self.panes.items() if role in roles]
        for pane in panes:
            pane.append_separator("replayed from the transcript")

        def step(start: int) -> None:
            deadline = time.perf_counter() + REPLAY_SLICE_SECONDS
            while start < len(events) and time.perf_counter() < deadline:
                self.show_events(events[start:start + REPLAY_CHUNK])
                start += REPLAY_CHUNK
            if start < len(events):
                QTimer.singleShot(0, self, lambda: step(start))
                return
            for pane in panes:
                pane.append_separator("live")
            if then is not None:
                then()

        step(0)

    @Slot()
    def _on_clock(self) -> None:
        self.header.tick()
        self.phase_bar.tick()
