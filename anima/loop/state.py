"""The one writer of state.json: what the project is doing (awake on a milestone, waiting for
a usage limit, paused, sleeping). Everything that changes it comes through here, so the rules
of what it says live in one place."""

from __future__ import annotations

from datetime import datetime

from anima.store.models import MilestoneRecord, MilestoneStatus, State, StateStatus
from anima.store.store import Store


def write_state(store: Store, status: StateStatus, milestone_id: str | None, *,
                waiting_until: datetime | None = None, waiting_reason: str | None = None) -> None:
    """Say what the project is doing now (a loop drives it, or it stopped)."""
    store.save_state(State(status=status, current_milestone=milestone_id,
                           waiting_until=waiting_until, waiting_reason=waiting_reason))


def expected_state(records: list[MilestoneRecord]) -> State:
    """What state.json says while no loop drives the project: paused (naming the milestone)
    while one waits for a human after a pause, else sleeping, naming the milestone that an
    interruption left in progress (the next start resumes it), if any."""
    paused = next((r for r in records if r.status is MilestoneStatus.PAUSED), None)
    if paused is not None:
        return State(status=StateStatus.PAUSED, current_milestone=paused.id)
    active = next((r for r in records if r.status is MilestoneStatus.IN_PROGRESS), None)
    return State(status=StateStatus.SLEEPING, current_milestone=active.id if active else None)


def reconcile_state(store: Store, records: list[MilestoneRecord]) -> bool:
    """Make state.json agree with the records (a kill may fall between the two writes, a
    run may end while nothing is driven). Returns True if it was rewritten."""
    want = expected_state(records)
    state = store.load_state()
    if (state.status, state.current_milestone) == (want.status, want.current_milestone):
        return False
    store.save_state(want)
    return True
