"""The milestone loop's phases and which may follow which: small, so the UI and the events
can name a phase without importing the scheduler. Every status change goes through
`check_transition`."""

from __future__ import annotations

from enum import StrEnum

from anima.errors import AnimaError


class Phase(StrEnum):
    IDLE = "idle"
    STARTING = "starting"
    RECOVERING = "recovering"
    DEVELOPER = "developer"
    ACCEPTOR = "acceptor"
    FINAL_ACCEPTANCE = "final_acceptance"
    PAUSED = "paused"
    AWAITING_REVIEW = "awaiting_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNING = frozenset({Phase.STARTING, Phase.RECOVERING, Phase.DEVELOPER, Phase.ACCEPTOR,
                     Phase.FINAL_ACCEPTANCE})
STOPS = frozenset({Phase.PAUSED, Phase.FAILED})

#: Which phase may follow which. Anything else is a bug and raises IllegalTransition.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.STARTING, Phase.RECOVERING, Phase.FAILED,
                           Phase.CANCELLED}),  # IDLE is also a pending milestone's phase
    Phase.STARTING: frozenset({Phase.DEVELOPER}) | STOPS,
    Phase.RECOVERING: frozenset({Phase.DEVELOPER}) | STOPS,
    Phase.DEVELOPER: frozenset({Phase.DEVELOPER, Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE})
    | STOPS,
    Phase.ACCEPTOR: frozenset({Phase.DEVELOPER}) | STOPS,
    Phase.FINAL_ACCEPTANCE: frozenset({Phase.DEVELOPER, Phase.COMPLETED,
                                       Phase.AWAITING_REVIEW}) | STOPS,
    Phase.PAUSED: frozenset({Phase.RECOVERING, Phase.CANCELLED}),
    Phase.AWAITING_REVIEW: frozenset({Phase.COMPLETED, Phase.RECOVERING, Phase.CANCELLED}),
    Phase.COMPLETED: frozenset(),
    Phase.FAILED: frozenset({Phase.RECOVERING, Phase.CANCELLED}),
    Phase.CANCELLED: frozenset(),
}


#: What the bottom bar of the window says in each phase (seed: 等待 Developer / 等待 Acceptor).
PHASE_TEXT: dict[Phase, str] = {
    Phase.IDLE: "Idle",
    Phase.STARTING: "Starting the agents…",
    Phase.RECOVERING: "Recovering after a restart",
    Phase.DEVELOPER: "Waiting for Developer",
    Phase.ACCEPTOR: "Waiting for Acceptor",
    Phase.FINAL_ACCEPTANCE: "Final acceptance",
    Phase.PAUSED: "Paused",
    Phase.AWAITING_REVIEW: "Awaiting your review",
    Phase.COMPLETED: "Completed",
    Phase.FAILED: "Failed",
    Phase.CANCELLED: "Cancelled",
}


class IllegalTransition(AnimaError):
    pass


def check_transition(current: Phase, target: Phase) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal scheduler transition {current} → {target}")
