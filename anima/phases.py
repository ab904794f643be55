"""The milestone loop's phases: small, so the records, the events and the UI can name a phase
without importing the loop. Which phase may follow which is `anima.loop.phases`."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    IDLE = "idle"
    STARTING = "starting"
    RECOVERING = "recovering"
    DEVELOPER = "developer"
    ACCEPTOR = "acceptor"
    FINAL_ACCEPTANCE = "final_acceptance"
    #: finally accepted: waiting its turn in the merge queue, or merging into main
    MERGING = "merging"
    PAUSED = "paused"
    AWAITING_REVIEW = "awaiting_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNING = frozenset({Phase.STARTING, Phase.RECOVERING, Phase.DEVELOPER, Phase.ACCEPTOR,
                     Phase.FINAL_ACCEPTANCE, Phase.MERGING})

#: What the bottom bar of the window says in each phase (seed: 等待 Developer / 等待 Acceptor).
PHASE_TEXT: dict[Phase, str] = {
    Phase.IDLE: "Idle",
    Phase.STARTING: "Starting the agents…",
    Phase.RECOVERING: "Resuming",  # after a restart, or a human's Resume: the reason says which
    Phase.DEVELOPER: "Waiting for Developer",
    Phase.ACCEPTOR: "Waiting for Acceptor",
    Phase.FINAL_ACCEPTANCE: "Final acceptance",
    Phase.MERGING: "Merging into main",
    Phase.PAUSED: "Paused",
    Phase.AWAITING_REVIEW: "Awaiting your review",
    Phase.COMPLETED: "Completed",
    Phase.FAILED: "Failed",
    Phase.CANCELLED: "Cancelled",
}
