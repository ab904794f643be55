"""The board: every milestone of the project as a card, in columns by state.

Pending (with "waiting for <id>" where its front matter `depends_on` names milestones not
completed yet), Running, Needs you (paused, awaiting review, failed, not merged) and Done.
A running card is alive — phase, round, the latest line of each agent, context, cost,
elapsed — and a card that needs you says why and offers its main decision in place (Resume,
Review, Retry; Start for a pending one). A click on a card opens the milestone's page.

Agent output arrives at up to thousands of lines a second per milestone, so a card never
redraws per event: the latest line of each agent is kept, and dirty cards are redrawn at most
`REFRESH_MS` apart. Records move cards between columns only when their column changes.

The board works without a mouse: Tab and Shift+Tab go through the cards column by column, each
card then its button; the arrow keys move between cards (Up / Down in a column, Left / Right to
the next column that has cards); Enter, Return or Space on a card opens its page, as a click
does, and Enter on a card's button presses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QKeyEvent, QMouseEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from anima import events as ev
from anima.phases import PHASE_TEXT, Phase
from anima.store.dependencies import held_by_pause
from ui.agent_pane import ROLE_TITLES
from ui.formatting import ElapsedClock, enum_text
from ui.record_facts import (
    COLUMNS,
    MAIN_ACTION,
    agents_text,
    column_of,
    ended_text,
    limit_wait_text,
    live_rounds,
    needs_you_reason,
    pending_hold,
)
from ui.widgets import ClampedLabel, ElidedLabel, set_style_state

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: How often cards with new agent output are redrawn.
REFRESH_MS = 250
#: The longest agent line a card keeps (it shows one elided line).
LINE_CHARS = 160
_ROLE_SHORT = {"developer": "Dev", "acceptor": "Acc"}
#: A running card in the merge queue ("Merging into main · round 3" said a round ran).
MERGE_QUEUE_TEXT = "Finally accepted · merges into main after those accepted earlier"
#: Arrow key → (columns across, cards down).
_STEPS = {Qt.Key.Key_Up: (0, -1), Qt.Key.Key_Down: (0, 1),
          Qt.Key.Key_Left: (-1, 0), Qt.Key.Key_Right: (1, 0)}
_OPEN_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space)
def latest_line(event: ev.AgentEvent) -> str | None:
    """What an agent event says in one line on a card, or None when it says nothing new."""
    if isinstance(event, ev.AssistantText):
        lines = [line for line in event.text.splitlines() if line.strip()]
        return lines[-1].strip()[:LINE_CHARS] if lines else None
    if isinstance(event, ev.ToolUse):
        return (event.summary or event.tool)[:LINE_CHARS]
    if isinstance(event, ev.Thinking):
        return "thinking…"
    if isinstance(event, ev.TurnResult):
        return "turn failed" if event.is_error else "turn finished"
    return None


class MilestoneCard(QFrame):
    """One milestone on the board. Emits requests; the board passes them on."""

    #: milestone id — the card was clicked. GUI thread.
    clicked = Signal(str)
    #: (milestone id, action: "resume" | "review" | "retry" | "start"). GUI thread.
    action_requested = Signal(str, str)
    #: (milestone id, columns across, cards down) — an arrow key on the card. GUI thread.
    step_requested = Signal(str, int, int)

    def __init__(self, milestone_id: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("milestoneCard")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        # The keyboard's, not the mouse's: a click opens the page as it always did.
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.milestone_id = milestone_id
        self.record: Any = None
        self.action = ""
        #: The status its button's request was sent in, while it is in flight (None: none).
        self.asked_in: str | None = None
        #: Pending, why it does not start (`record_facts.pending_hold`): "" when it does.
        self.hold = ""
        #: Running, its agents wait for a usage limit to reset (`limit_wait_text`): the board
        #: shows it again once the reset passes, whether or not the engine says so.
        self.limit_waiting = False
        self.title = QLabel(self)
        self.title.setObjectName("cardTitle")
        self.title.setWordWrap(True)
        # Three lines at most (the whole in its tooltip): a long pause reason pushed the cards
        # below, and their buttons, out of the column's view.
        self.state = ClampedLabel(self, max_lines=3)
        self.state.setObjectName("cardState")
        # One line each, elided to the card's width (a column is narrow at 1024 px).
        self.lines = {role: ElidedLabel(self) for role in _ROLE_SHORT}
        for label in self.lines.values():
            label.setObjectName("cardLine")
        self.stats = ElidedLabel(self)
        self.stats.setObjectName("cardStats")
        # Which agent CLI plays each role: pairs may mix them.
        self.agents = ElidedLabel(self)
        self.agents.setObjectName("cardAgents")
        self.button = QPushButton(self)
        self.button.setObjectName("cardAction")
        self.button.clicked.connect(self._on_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(3)
        # The button beside the title, not the stats: at 1000 px it left the stats no room
        # for the cost and the time.
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(top)
        layout.addWidget(self.state)
        for label in self.lines.values():
            layout.addWidget(label)
        layout.addWidget(self.stats)
        layout.addWidget(self.agents)

    def show_record(self, record: Any, records: Iterable[Any], phase: Phase | None,
                    clock: ElapsedClock, held: Sequence[str] = (),
                    roles: Mapping[str, Any] | None = None) -> None:
        """`held`: run one at a time, the paused milestones every start waits for; `roles`:
        each role's config as the engine announced it (its `agent` and `model`)."""
        self.record = record
        status = enum_text(record.status)
        if self.asked_in is not None and status != self.asked_in:
            self.request_done()  # the request took effect
        column = column_of(record)
        if self.property("column") != column:
            set_style_state(self, "column", column)
            for child in (self.state, self.button):  # styled by the card's column too
                child.style().unpolish(child)
                child.style().polish(child)
        self.title.setText(record.title)
        self.setToolTip(f"{record.id} — click (or Enter) to open its page")
        running = column == "running"
        pending = column == "pending"
        self.hold = pending_hold(record, records, held) if pending else ""
        queued = running and (phase or Phase(record.phase)) == Phase.MERGING
        waiting = limit_wait_text(record) if running and not queued else ""
        self.limit_waiting = bool(waiting)
        if queued:  # finally accepted: no round, no agent runs; it waits for its turn
            self.state.setText(MERGE_QUEUE_TEXT)
        elif running:
            phase = phase or Phase(record.phase)
            words = waiting or ("Queued to run" if phase == Phase.IDLE else PHASE_TEXT[phase])
            # The round under way (the page's header counts the rounds done).
            self.state.setText(f"{words} · round {len(live_rounds(record)) + 1}")
        elif pending:
            self.state.setText(self.hold or f"Pending · {len(record.features)} features")
        elif column == "needs_you":
            self.state.setText(needs_you_reason(record))
        else:
            self.state.setText(ended_text(record))
        for label in self.lines.values():  # no agent works in the queue, nor while it waits
            label.setVisible(running and not queued and not waiting)
        self.action, text = MAIN_ACTION.get(status, ("", ""))
        if self.hold:
            self.action = ""  # Start would do nothing
        self.button.setText(text)
        self.button.setVisible(bool(self.action))
        # The models in its tooltip: a column is narrow at 1024 px.
        self.agents.setText(agents_text(record, roles or {}, _ROLE_SHORT, models=False))
        self.agents.setToolTip(agents_text(record, roles or {}, ROLE_TITLES))
        self.agents.setVisible(bool(self.agents.text()))
        # What a screen reader says: "Resume" alone would not say which milestone.
        self.setAccessibleName(f"{record.id}: {self.state.text()}")
        self.setAccessibleDescription(f"{record.title}. {self.agents.toolTip()}"
                                      if self.agents.text() else record.title)
        self.button.setAccessibleName(f"{text} {record.id}")
        self.tick(clock)

    def set_agent_line(self, role: str, text: str, context: float | None) -> None:
        ctx = f" ({context:.0f} %)" if context is not None else ""
        self.lines[role].setText(f"{_ROLE_SHORT[role]}{ctx}: {text}")

    def tick(self, clock: ElapsedClock) -> None:
        """Elapsed and cost (the clock runs for a running card only)."""
        record = self.record
        if record is None:
            return
        done, total = record.features_done, len(record.features)
        self.stats.setText(f"{done}/{total} features · ${record.spent_usd:.2f} · "
                           f"{clock.text(record)}")

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and self.rect().contains(
                event.position().toPoint()):
            self.clicked.emit(self.milestone_id)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Arrows ask the board for a neighbour; Enter opens the page, or presses the button
        when it has the focus (a push button outside a dialog leaves Enter to its parent)."""
        key = Qt.Key(event.key())
        if key in _STEPS:
            self.step_requested.emit(self.milestone_id, *_STEPS[key])
        elif key in _OPEN_KEYS and self.button.hasFocus():
            self.button.animateClick()
        elif key in _OPEN_KEYS:
            self.clicked.emit(self.milestone_id)
        else:
            super().keyPressEvent(event)

    @Slot()
    def _on_button(self) -> None:
        if not self.action or self.asked_in is not None:
            return
        if self.action != "review":  # a request to the engine: one at a time
            self.asked_in = enum_text(self.record.status) if self.record is not None else ""
            self.button.setEnabled(False)
        self.action_requested.emit(self.milestone_id, self.action)

    def request_done(self) -> None:
        """Its request took effect, or failed: the button can be pressed again."""
        self.asked_in = None
        self.button.setEnabled(True)


class BoardColumn(QFrame):
    """A titled, scrolling column of cards."""

    def __init__(self, key: str, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("boardColumn")
        self.key, self.name = key, title
        self.heading = QLabel(title, self)
        self.heading.setObjectName("columnTitle")
        self.empty = QLabel(self)
        self.empty.setObjectName("columnEmpty")
        self.empty.setWordWrap(True)
        self.inner = QWidget()
        self.inner.setObjectName("columnInner")
        self.cards = QVBoxLayout(self.inner)
        self.cards.setContentsMargins(0, 0, 0, 0)
        self.cards.setSpacing(8)
        self.cards.addWidget(self.empty)
        self.cards.addStretch(1)
        self.scroll_area = QScrollArea(self)
        self.scroll_area.setObjectName("columnScroll")
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # Tab goes from card to card
        self.scroll_area.setWidget(self.inner)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(6)
        layout.addWidget(self.heading)
        layout.addWidget(self.scroll_area, 1)

    def place(self, card: MilestoneCard, position: int) -> None:
        """Put `card` at `position` (order of the project's milestones) in this column."""
        self.cards.insertWidget(min(position, self.cards.count() - 1), card)

    def card_ids(self) -> list[str]:
        items = (self.cards.itemAt(i) for i in range(self.cards.count()))
        widgets = (item.widget() for item in items if item is not None)
        return [w.milestone_id for w in widgets if isinstance(w, MilestoneCard)]

    def set_count(self, n: int, empty_text: str) -> None:
        self.heading.setText(f"{self.name}  {n}" if n else self.name)
        self.empty.setText(empty_text)
        self.empty.setVisible(n == 0)


EMPTY_TEXT = {"pending": "Drop milestone .md files here to add them.",
              "running": "Nothing runs right now.",
              "needs_you": "Nothing waits for you.",
              "done": "Completed and cancelled milestones land here."}


class Board(QWidget):
    """The project's milestones in four columns; fed by the window on the GUI thread."""

    #: milestone id — open its page. GUI thread.
    milestone_opened = Signal(str)
    #: (milestone id, action) — a card's main decision. GUI thread.
    action_requested = Signal(str, str)
    #: (running, needs you) — the counts changed (title bar, tray). GUI thread.
    counts_changed = Signal(int, int)

    def __init__(self, clock: ElapsedClock | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("board")
        self.clock = clock or ElapsedClock()
        self.columns = {key: BoardColumn(key, title, self) for key, title in COLUMNS}
        self.cards: dict[str, MilestoneCard] = {}
        self.records: dict[str, Any] = {}
        #: how many milestones the engine runs at once, and each role's config (its agent
        #: CLI and model), once it says (`EngineReady`)
        self.parallel = 0
        self.roles: dict[str, Any] = {}
        self.phases: dict[str, Phase] = {}
        self._lines: dict[tuple[str, str], str] = {}
        self._context: dict[tuple[str, str], float] = {}
        self._dirty: set[str] = set()
        self._counts = (-1, -1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(8)
        for column in self.columns.values():
            layout.addWidget(column, 1)
        self._refresh = QTimer(self)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._on_refresh)
        self._refresh.start()
        self._clock = QTimer(self)
        self._clock.setInterval(1000)
        self._clock.timeout.connect(self._on_clock)
        self._clock.start()
        self._recount()

    # --- records -----------------------------------------------------------------------------
    def set_records(self, records: Iterable[Any]) -> None:
        """The whole list (a project opened): cards for these, none for any other."""
        records = list(records)
        for gone in set(self.cards) - {r.id for r in records}:
            self.remove(gone)
        self.records = {r.id: r for r in records}
        held = self._held()
        for record in records:
            self._show(record, held)
        self._recount()

    def set_engine_config(self, parallel: int, roles: Mapping[str, Any]) -> None:
        """The engine's parallel limit (at 1, a paused milestone holds the pending ones) and
        the roles' config (what the cards of those yet to start say plays each role)."""
        self.parallel, self.roles = parallel, dict(roles)
        held = self._held()
        for record in self.records.values():
            self._show(record, held)

    def update_record(self, record: Any) -> None:
        before = self.records.get(record.id)
        self.records[record.id] = record
        held = self._held()
        self._show(record, held)
        statuses = {enum_text(record.status), enum_text(before.status) if before else ""}
        if self.parallel == 1 and "paused" in statuses:
            self._show_pending()  # a pause holds them, or lets them go
        else:  # a milestone completing may free the pending ones that wait for it
            for other in self.records.values():
                if other.id != record.id and record.id in (
                        getattr(other, "depends_on", None) or ()):
                    self._show(other, held)
        self._recount()

    def _held(self) -> list[str]:
        return held_by_pause(self.records.values(), self.parallel)

    def _show_pending(self) -> None:
        held = self._held()
        for record in self.records.values():
            if column_of(record) == "pending":
                self._show(record, held)

    def hold_of(self, milestone_id: str) -> str:
        """Why that pending milestone does not start, as its card says it ("" when it does,
        or is not pending)."""
        card = self.cards.get(milestone_id)
        return "" if card is None else card.hold

    def requests_in_flight(self) -> list[str]:
        """The milestones whose card sent a request that has not taken effect yet."""
        return [i for i, card in self.cards.items() if card.asked_in is not None]

    def request_failed(self, milestone_id: str) -> None:
        if (card := self.cards.get(milestone_id)) is not None:
            card.request_done()

    def remove(self, milestone_id: str) -> None:
        gone = self.records.pop(milestone_id, None)
        card = self.cards.pop(milestone_id, None)
        if card is not None:
            card.setParent(None)
            card.deleteLater()
        if gone is not None and enum_text(gone.status) == "paused":
            self._show_pending()  # it may have held them (one at a time): no longer
        self._recount()

    def _show(self, record: Any, held: list[str]) -> None:
        card = self.cards.get(record.id)
        if card is None:
            card = MilestoneCard(record.id)
            card.clicked.connect(self.milestone_opened)
            card.action_requested.connect(self.action_requested)
            card.step_requested.connect(self._on_step)
            self.cards[record.id] = card
        column = self.columns[column_of(record)]
        if card.parent() is not column.inner:
            focused = card.hasFocus()  # moved, it keeps the keyboard (Qt passes it on)
            order = [i for i in self.records if column_of(self.records[i]) == column.key]
            column.place(card, order.index(record.id) + 1 if record.id in order else 1)
            if focused:
                card.setFocus(Qt.FocusReason.OtherFocusReason)
        if column.key != "running":
            self.phases.pop(record.id, None)
        card.show_record(record, self.records.values(), self.phases.get(record.id), self.clock,
                         held, self.roles)
        self._dirty.add(record.id)

    def _recount(self) -> None:
        for column in self.columns.values():
            column.set_count(len(column.card_ids()), EMPTY_TEXT[column.key])
        self._chain_focus()
        counts = self.counts()
        if counts != self._counts:
            self._counts = counts
            self.counts_changed.emit(*counts)

    def counts(self) -> tuple[int, int]:
        """(running, needs you)."""
        return (len(self.columns["running"].card_ids()),
                len(self.columns["needs_you"].card_ids()))

    def column_ids(self, key: str) -> list[str]:
        """The milestone ids in one column, top to bottom (for tests and accessibility)."""
        return self.columns[key].card_ids()

    # --- the keyboard ----------------------------------------------------------------------------
    def _chain_focus(self) -> None:
        """Tab follows the board as it is drawn (cards are made, and move, in any order):
        column by column, top to bottom, each card then its button."""
        chain = [widget for key in self.columns for milestone_id in self.column_ids(key)
                 for widget in (self.cards[milestone_id], self.cards[milestone_id].button)]
        for first, second in pairwise(chain):
            QWidget.setTabOrder(first, second)

    @Slot(str, int, int)
    def _on_step(self, milestone_id: str, across: int, down: int) -> None:
        """Up / Down within the column; Left / Right to the nearest column with cards, at the
        same height or its last card. Nothing at either end."""
        keys = [key for key in self.columns if self.column_ids(key)]
        here = next(key for key in keys if milestone_id in self.column_ids(key))
        row = self.column_ids(here).index(milestone_id) + down
        if across:
            at = keys.index(here) + across
            if not 0 <= at < len(keys):
                return
            here = keys[at]
            row = min(row, len(self.column_ids(here)) - 1)
        if 0 <= row < len(self.column_ids(here)):
            self.focus_card(self.column_ids(here)[row])

    def focus_card(self, milestone_id: str) -> None:
        """Put the keyboard on a card, scrolled into its column's view."""
        card = self.cards[milestone_id]
        card.setFocus(Qt.FocusReason.TabFocusReason)
        self.columns[column_of(card.record)].scroll_area.ensureWidgetVisible(card)

    # --- live ------------------------------------------------------------------------------------
    def on_phase_changed(self, event: ev.PhaseChanged) -> None:
        self.phases[event.milestone_id] = event.phase
        record = self.records.get(event.milestone_id)
        if record is not None and column_of(record) == "running":
            card = self.cards[record.id]
            card.show_record(record, self.records.values(), event.phase, self.clock,
                             roles=self.roles)
            self._dirty.add(record.id)

    def feed(self, events: list[ev.AgentEvent]) -> None:
        """Agent output of any milestone: only the latest line of each agent is kept."""
        for event in events:
            milestone_id = event.milestone_id
            if milestone_id is None:
                continue
            key = (milestone_id, event.role)
            if isinstance(event, ev.ContextUsage):
                self._context[key] = event.percent
                self._dirty.add(milestone_id)
                continue
            line = latest_line(event)
            if line is not None:
                self._lines[key] = line
                self._dirty.add(milestone_id)

    @Slot()
    def _on_refresh(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for milestone_id in dirty:
            card = self.cards.get(milestone_id)
            if card is None or card.record is None or column_of(card.record) != "running":
                continue
            for role in _ROLE_SHORT:
                key = (milestone_id, role)
                card.set_agent_line(role, self._lines.get(key, "—"), self._context.get(key))

    def refresh_now(self) -> None:
        """Redraw the cards with new output at once (tests; the timer does it otherwise)."""
        self._on_refresh()

    @Slot()
    def _on_clock(self) -> None:
        """Each second: the running cards' time, and a usage limit's reset passing, which
        no record the engine publishes may say (it goes on later, or was killed waiting)."""
        for milestone_id in self.columns["running"].card_ids():
            card = self.cards[milestone_id]
            if card.limit_waiting and not limit_wait_text(card.record):
                self._show(card.record, self._held())
            else:
                card.tick(self.clock)
