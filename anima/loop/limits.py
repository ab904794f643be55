"""The limits that pause a milestone before another round. Each is one object that says
whether it is reached (and why, in the pause reason's words) and what a human's resume lifts,
so the loop and `anima resume` read the same rules (OpenHands' control flags)."""

from __future__ import annotations

from typing import Protocol

from anima.config import Config
from anima.store.models import MilestoneRecord, RoundKind


class Limit(Protocol):
    """A reason to pause between rounds."""

    def reached(self, record: MilestoneRecord, config: Config) -> str | None:
        """The pause reason if the limit is reached, else None."""
        ...

    def lift(self, record: MilestoneRecord, config: Config) -> None:
        """What a human's resume does about it (a budget is raised in the config instead)."""
        ...

# The pause line quotes this much of the last reason; the whole of it is on the round.
_REASON_SHOWN = 400
#: What a round whose turn timed out gives as its reason after the role (`Seats.failure`).
TIMED_OUT = "timed out"
#: What a pause may say the human can add when resuming.
_NOTE = "with a note for the Developer if it helps"


class Rejections:
    """`max_consecutive_rejections` rejections in a row; a resume starts the count again."""

    def reached(self, record: MilestoneRecord, config: Config) -> str | None:
        count = record.consecutive_rejections
        if count < config.max_consecutive_rejections:
            return None
        last = " ".join(record.iterations[-1].reason.split())  # one line, however it came
        if len(last) > _REASON_SHOWN:
            last = last[:_REASON_SHOWN - 1] + "…"
        counted = [it for it in record.standing if it.kind is not RoundKind.FINAL][-count:]
        if all(_timed_out(it.reason) for it in counted):
            todo = ("every one a timeout: raise agent_timeout_seconds (or "
                    "agent_idle_timeout_seconds) in .anima/config.json if the work needs "
                    "longer turns, then resume")
        else:
            todo = (f"resume, {_NOTE}, to give it {config.max_consecutive_rejections} "
                    "more tries")
        return f"{count} consecutive rejections, {todo}; last: {last}"

    def lift(self, record: MilestoneRecord, config: Config) -> None:
        record.consecutive_rejections = 0


class Rounds:
    """The milestone's round limit; a resume grants another `max_iterations_per_milestone`."""

    def reached(self, record: MilestoneRecord, config: Config) -> str | None:
        if record.rounds < record.max_iterations:
            return None
        return (f"round limit reached: {record.rounds} of {record.max_iterations} rounds used; "
                f"resume, {_NOTE}, for {config.max_iterations_per_milestone} more "
                "(max_iterations_per_milestone)")

    def lift(self, record: MilestoneRecord, config: Config) -> None:
        if record.rounds >= record.max_iterations:
            record.max_iterations = record.rounds + config.max_iterations_per_milestone


class Budget:
    """`max_budget_usd` spent on the milestone; the human raises it in .anima/config.json."""

    def reached(self, record: MilestoneRecord, config: Config) -> str | None:
        budget = config.max_budget_usd
        if budget is None or record.cost_usd < budget:
            return None
        return (f"budget reached: ${record.cost_usd:.2f} of ${budget:.2f} spent; raise "
                "max_budget_usd in .anima/config.json, then resume")

    def lift(self, record: MilestoneRecord, config: Config) -> None:
        """Nothing to lift on the record: the budget is the config's."""


def _timed_out(reason: str) -> bool:
    role, _, rest = reason.partition(" ")
    return role in ("Developer", "Acceptor") and rest.startswith(f"{TIMED_OUT}:")


REJECTIONS = Rejections()
#: In the order the loop checks them (the seed's three stops).
LIMITS: tuple[Limit, ...] = (REJECTIONS, Rounds(), Budget())
