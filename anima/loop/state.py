"""The one writer of state.json: what the project is doing (awake on milestones, waiting for
a usage limit, paused, sleeping). Everything that changes it comes through here, so the rules
of what it says live in one place.

Several milestones may run at once, each on its own thread; the board of a store (one per
store, see `board`) holds every running one and writes the whole picture each time one of
them changes, so no run overwrites another's line.
"""

from __future__ import annotations

import threading
import weakref
from datetime import datetime

from anima.phases import Phase
from anima.store.models import (
    MilestoneRecord,
    MilestoneStatus,
    RunningMilestone,
    State,
    StateStatus,
    now,
)
from anima.store.store import Store


def expected_state(records: list[MilestoneRecord],
                   running: list[RunningMilestone] | None = None) -> State:
    """What state.json says: awake while loops drive milestones (the first of them is the
    `current_milestone` older readers know); else paused (naming the milestone) while one
    waits for a human after a pause, else sleeping, naming the milestone that an
    interruption left in progress (the next start resumes it), if any."""
    if running:
        return State(status=StateStatus.AWAKE, current_milestone=running[0].id,
                     running=list(running))
    paused = next((r for r in records if r.status is MilestoneStatus.PAUSED), None)
    if paused is not None:
        return State(status=StateStatus.PAUSED, current_milestone=paused.id)
    active = next((r for r in records if r.status is MilestoneStatus.IN_PROGRESS), None)
    return State(status=StateStatus.SLEEPING, current_milestone=active.id if active else None)


class StateBoard:
    """The running milestones of one project, each with its usage-limit wait."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._running: dict[str, RunningMilestone] = {}

    def awake(self, record: MilestoneRecord, worktree: str | None = None,
              activity: str | None = None) -> None:
        """`record` is driven: its phase and round as they are now."""
        with self._lock:
            line = self._running.get(record.id) or RunningMilestone(id=record.id)
            line.phase, line.round = record.phase, record.rounds + (
                record.phase in (Phase.DEVELOPER, Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE))
            if worktree is not None:
                line.worktree = worktree
            if activity is not None:
                line.activity = activity
            self._running[record.id] = line
            self._write(None)

    def leave(self, milestone_id: str) -> None:
        """`milestone_id` is no longer driven (paused, awaiting review, ended, stopped)."""
        with self._lock:
            if self._running.pop(milestone_id, None) is not None:  # once, not per caller
                self._write(self.store.load_records() if not self._running else None)

    def waiting(self, milestone_id: str, until: datetime | None, reason: str = "") -> None:
        """`milestone_id`'s next turn waits for a usage limit to reset (None: it no longer
        does). Each its own: pairs on different agent CLIs wait for different accounts."""
        with self._lock:
            line = self._running.get(milestone_id)
            if line is None:  # left already: its wait is no longer the project's
                return
            line.waiting_until, line.waiting_reason = \
                (until, reason) if until is not None else (None, None)
            self._write(None)

    def reconcile(self, records: list[MilestoneRecord]) -> bool:
        """Make state.json agree with the records and the running milestones (a kill may
        fall between two writes, a run may end while nothing is driven). True if rewritten."""
        with self._lock:
            want = self._state(records)
            state = self.store.load_state()
            if (state.status, state.current_milestone, state.running) == \
                    (want.status, want.current_milestone, want.running):
                return False
            self.store.save_state(want)
            return True

    def _state(self, records: list[MilestoneRecord] | None) -> State:
        state = expected_state(records or [], [_unexpired(line)
                                               for line in self._running.values()])
        waits = [line for line in state.running if line.waiting_until is not None]
        if waits:  # the earliest: when the first of them sends again
            first = min(waits, key=lambda line: line.waiting_until or now())
            state.waiting_until, state.waiting_reason = first.waiting_until, first.waiting_reason
        return state

    def _write(self, records: list[MilestoneRecord] | None) -> None:
        self.store.save_state(self._state(records))


def _unexpired(line: RunningMilestone) -> RunningMilestone:
    """`line` without a wait long over (its milestone has not said so yet)."""
    if line.waiting_until is None or line.waiting_until > now():
        return line
    return line.model_copy(update={"waiting_until": None, "waiting_reason": None})


_BOARDS: weakref.WeakKeyDictionary[Store, StateBoard] = weakref.WeakKeyDictionary()
_BOARDS_LOCK = threading.Lock()


def board(store: Store) -> StateBoard:
    """The board of `store`: the engine's runs and the human's actions share it, so an
    action's rewrite keeps the milestones that still run."""
    with _BOARDS_LOCK:
        found = _BOARDS.get(store)
        if found is None:
            found = _BOARDS[store] = StateBoard(store)
        return found


def reconcile_state(store: Store, records: list[MilestoneRecord]) -> bool:
    """See `StateBoard.reconcile`."""
    return board(store).reconcile(records)
