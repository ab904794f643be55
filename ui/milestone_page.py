"""One milestone's page, opened from the board in a tab: its decision bar on top, then its
Iteration Monitor (both agents live, features, rounds) and its Changes.

Several pages can be open at once; each shows only its milestone's events. A page opened
while its milestone runs first replays the transcript the engine wrote (the agents' events with
the verdict and check lines), then the live output: events that arrive while the transcript is
read (with the phase lines) are held and shown after it in the order they came, the overlap
dropped, so nothing shows twice or above the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from anima import events as ev
from ui.changes_view import ChangesView
from ui.formatting import ElapsedClock
from ui.monitor import IterationMonitor
from ui.review import ReviewPanel

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord


def drop_overlap(replayed: list[ev.TranscriptEvent], held: list[ev.TranscriptEvent]
                 ) -> list[ev.TranscriptEvent]:
    """The held live events that the transcript does not already end with."""
    for n in range(min(len(replayed), len(held)), 0, -1):
        if replayed[-n:] == held[:n]:
            return held[n:]
    return held


class MilestonePage(QWidget):
    """Decision bar, then Monitor and Changes tabs, for one milestone."""

    def __init__(self, milestone_id: str, clock: ElapsedClock | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("milestonePage")
        self.milestone_id = milestone_id
        self.record: MilestoneRecord | None = None
        #: Pending, why it does not start, as its card says it ("" when it does).
        self.hold = ""
        self.review = ReviewPanel(self)
        self.monitor = IterationMonitor(self, clock=clock)
        self.changes = ChangesView(self)
        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("pageTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.monitor, "Monitor")
        self.tabs.addTab(self.changes, "Changes")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.review)
        layout.addWidget(self.tabs, 1)
        self._held: list[ev.TranscriptEvent] | None = None
        # Phase changes held with them: (live events held before it, what to show), so they
        # land after the history, in the order they came.
        self._held_calls: list[tuple[int, Callable[[], None]]] = []
        self.monitor.history.round_selected.connect(self._on_round_selected)

    def show_record(self, record: MilestoneRecord) -> None:
        self.record = record
        self.monitor.show_record(record)
        self.review.show_record(record, self.hold)
        self.changes.show_record(record)
        # The reason is said once: in the decision bar when it shows, else in the phase bar.
        self.monitor.phase_bar.set_reason_shown(not self.review.isVisibleTo(self))

    def show_hold(self, hold: str) -> None:
        """Why its pending milestone does not start (another record changed): the decision
        bar says it and offers no Start, or offers it again."""
        if hold != self.hold:
            self.hold = hold
            if self.record is not None:
                self.review.show_record(self.record, hold)

    def on_phase_changed(self, event: ev.PhaseChanged) -> None:
        self._show_or_hold(lambda: self.monitor.on_phase_changed(event))

    def _show_or_hold(self, show: Callable[[], None]) -> None:
        if self._held is not None:
            self._held_calls.append((len(self._held), show))
        else:
            show()

    # --- agent output ------------------------------------------------------------------------
    def begin_replay(self) -> None:
        """The transcript is being read: hold live output (and phase lines) until it is on
        screen."""
        self._held = []
        self._held_calls = []

    def replay(self, events: list[ev.TranscriptEvent]) -> None:
        """Show the transcript read from disk, then what arrived meanwhile."""
        if self._held is None:
            self._held = []

        def done() -> None:
            held = self._held or []
            rest = drop_overlap(events, held)
            position = len(held) - len(rest)  # the ones before it are in the transcript
            calls, self._held, self._held_calls = self._held_calls, None, []
            for at, show in calls:
                if at > position:
                    self.monitor.show_events(held[position:at])
                    position = at
                show()
            if position < len(held):
                self.monitor.show_events(held[position:])

        if events:
            self.monitor.replay(events, then=done)
        else:
            done()

    def feed(self, events: Sequence[ev.TranscriptEvent]) -> None:
        """Live output: agent events, verdicts and check lines, in the order they came."""
        if self._held is not None:
            self._held.extend(events)
        else:
            self.monitor.show_events(events)

    @property
    def replaying(self) -> bool:
        return self._held is not None

    def _on_round_selected(self, round_no: int) -> None:
        self.changes.show_round(round_no)
        self.tabs.setCurrentWidget(self.changes)

