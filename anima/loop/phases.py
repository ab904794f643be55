"""Which phase may follow which, and the milestone status that goes with each: every status
change, the loop's and the human's, goes through `check_transition`."""

from __future__ import annotations

from anima.errors import AnimaError
from anima.phases import Phase
from anima.store.models import MilestoneStatus

STOPS = frozenset({Phase.PAUSED, Phase.FAILED})

#: Which phase may follow which. Anything else is a bug and raises IllegalTransition.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # IDLE is also a pending milestone's phase, and a run's before its first step: you may
    # stop it there (while the CLI's version is read), and it pauses.
    Phase.IDLE: frozenset({Phase.STARTING, Phase.RECOVERING, Phase.PAUSED, Phase.FAILED,
                           Phase.CANCELLED}),
    Phase.STARTING: frozenset({Phase.DEVELOPER}) | STOPS,
    Phase.RECOVERING: frozenset({Phase.DEVELOPER, Phase.MERGING}) | STOPS,
    Phase.DEVELOPER: frozenset({Phase.DEVELOPER, Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE})
    | STOPS,
    Phase.ACCEPTOR: frozenset({Phase.DEVELOPER, Phase.MERGING}) | STOPS,
    Phase.FINAL_ACCEPTANCE: frozenset({Phase.DEVELOPER, Phase.MERGING,
                                       Phase.AWAITING_REVIEW}) | STOPS,
    # The merge queue: main took the branch (completed), or a merge round resolves a conflict.
    Phase.MERGING: frozenset({Phase.COMPLETED, Phase.DEVELOPER}) | STOPS,
    Phase.PAUSED: frozenset({Phase.RECOVERING, Phase.CANCELLED}),
    Phase.AWAITING_REVIEW: frozenset({Phase.COMPLETED, Phase.RECOVERING, Phase.CANCELLED}),
    # Completed with its merge still owed, and main moved so that it no longer merges
    # cleanly: back for a merge round (`completion._back_for_a_merge_round`).
    Phase.COMPLETED: frozenset({Phase.RECOVERING}),
    Phase.FAILED: frozenset({Phase.RECOVERING, Phase.CANCELLED}),
    Phase.CANCELLED: frozenset(),
}



#: The milestone status that goes with a phase (None: the status does not change).
STATUS_OF: dict[Phase, MilestoneStatus] = {
    Phase.STARTING: MilestoneStatus.IN_PROGRESS,
    Phase.RECOVERING: MilestoneStatus.IN_PROGRESS,
    Phase.PAUSED: MilestoneStatus.PAUSED,
    Phase.AWAITING_REVIEW: MilestoneStatus.AWAITING_REVIEW,
    Phase.COMPLETED: MilestoneStatus.COMPLETED,
    Phase.FAILED: MilestoneStatus.FAILED,
    Phase.CANCELLED: MilestoneStatus.CANCELLED,
}

#: The phase a milestone rests in while no loop drives it, by status (a human acts on these).
#: One in progress that no run drives (its Anima stopped, or it waits for a free slot) is
#: where a run of it begins.
RESTING_PHASE: dict[MilestoneStatus, Phase] = {
    MilestoneStatus.PENDING: Phase.IDLE,
    MilestoneStatus.IN_PROGRESS: Phase.IDLE,
    MilestoneStatus.PAUSED: Phase.PAUSED,
    MilestoneStatus.AWAITING_REVIEW: Phase.AWAITING_REVIEW,
    MilestoneStatus.FAILED: Phase.FAILED,
    MilestoneStatus.COMPLETED: Phase.COMPLETED,
    MilestoneStatus.CANCELLED: Phase.CANCELLED,
}


class IllegalTransition(AnimaError):
    pass


def check_transition(current: Phase, target: Phase) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal scheduler transition {current} → {target}")
