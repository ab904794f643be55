"""One milestone's page, opened from the board in a tab: its decision bar on top, then its
Iteration Monitor (both agents live, features, rounds) and its Changes.

Several pages can be open at once; each shows only its milestone's events. A page opened
while its milestone runs first replays the transcript the engine wrote, then the live output:
events that arrive while the transcript is read are held and the overlap is dropped, so
nothing shows twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QTabWidget, QVBoxLayout, QWidget

from anima import events as ev
from ui.changes_view import ChangesView
from ui.formatting import ElapsedClock
from ui.monitor import IterationMonitor
from ui.review import ReviewPanel

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord


def drop_overlap(replayed: list[ev.AgentEvent], held: list[ev.AgentEvent]
                 ) -> list[ev.AgentEvent]:
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
        self._held: list[ev.AgentEvent] | None = None
        self.monitor.history.round_selected.connect(self._on_round_selected)

    def show_record(self, record: MilestoneRecord) -> None:
        self.record = record
        self.monitor.show_record(record)
        self.review.show_record(record)
        self.changes.show_record(record)
        # The reason is said once: in the decision bar when it shows, else in the phase bar.
        self.monitor.phase_bar.set_reason_shown(not self.review.isVisibleTo(self))

    def on_phase_changed(self, event: ev.PhaseChanged) -> None:
        self.monitor.on_phase_changed(event)

    # --- agent output ------------------------------------------------------------------------
    def begin_replay(self) -> None:
        """The transcript is being read: hold live output until it is on screen."""
        self._held = []

    def replay(self, events: list[ev.AgentEvent]) -> None:
        """Show the transcript read from disk, then what arrived meanwhile."""
        held, self._held = self._held or [], []

        def done() -> None:
            rest = drop_overlap(events, held + (self._held or []))
            self._held = None
            if rest:
                self.monitor.feed_agent_events(rest)

        if events:
            self.monitor.replay(events, then=done)
        else:
            done()

    def feed(self, events: list[ev.AgentEvent]) -> None:
        if self._held is not None:
            self._held.extend(events)
        else:
            self.monitor.feed_agent_events(events)

    @property
    def replaying(self) -> bool:
        return self._held is not None

    def on_verdict(self, event: ev.VerdictReached) -> None:
        self.monitor.on_verdict(event)

    def on_check(self, event: ev.CheckStarted | ev.CheckFinished) -> None:
        self.monitor.on_check(event)

    def _on_round_selected(self, round_no: int) -> None:
        self.changes.show_round(round_no)
        self.tabs.setCurrentWidget(self.changes)

