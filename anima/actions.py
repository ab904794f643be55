"""What a human does to a milestone: resume, approve, request changes, abort.

Shared by the CLI (`anima resume`, `anima approve`) and the app's review panel, so both
follow exactly the same rules. Each action validates the status, updates the record and
state.json atomically, and says what it did.
"""

from __future__ import annotations

from anima.config import Config
from anima.errors import ActionError
from anima.events import EventBus, LogLine, MilestoneChanged
from anima.git_ops import GitRepo
from anima.redact import redact
from anima.scheduler import finish_completed
from anima.store import HumanNote, MilestoneRecord, MilestoneStatus, State, Store, now


def _require(record: MilestoneRecord, *allowed: MilestoneStatus) -> None:
    if record.status not in allowed:
        wanted = " or ".join(s.value for s in allowed)
        raise ActionError(f"milestone {record.id!r} is {record.status.value}, not {wanted}")


def _clean_note(note: str) -> str:
    """A human pastes logs and configs too: the note is redacted before it is stored, logged
    or sent to the Developer."""
    return redact(note.strip())


def _add_note(record: MilestoneRecord, note: str) -> None:
    if note:
        record.human_notes.append(HumanNote(at=now(), text=note))


def _publish(bus: EventBus | None, record: MilestoneRecord, text: str) -> None:
    if bus is not None:
        bus.publish(LogLine(record.id, text))
        bus.publish(MilestoneChanged(record.model_copy(deep=True)))


def resume(store: Store, config: Config, milestone_id: str, note: str = "",
           bus: EventBus | None = None) -> MilestoneRecord:
    """paused → in_progress: rejections reset, the note goes to the next Developer prompt.

    A milestone paused at its round limit gets another `max_iterations_per_milestone` rounds.
    """
    note = _clean_note(note)
    record = store.load_record(milestone_id)
    _require(record, MilestoneStatus.PAUSED)
    if record.rounds >= record.max_iterations:
        record.max_iterations = record.rounds + config.max_iterations_per_milestone
    record.status = MilestoneStatus.IN_PROGRESS
    record.consecutive_rejections = 0
    record.pause_reason = None
    _add_note(record, note)
    store.save_record(record)
    store.save_state(State())
    _publish(bus, record, "resumed by you" + (f" with a note: {note}" if note else ""))
    return record


def request_changes(store: Store, milestone_id: str, note: str,
                    bus: EventBus | None = None) -> MilestoneRecord:
    """awaiting_review → in_progress with the human's note as the next round's feedback."""
    note = _clean_note(note)
    if not note:
        raise ActionError("say which changes you want: the note goes to the Developer")
    record = store.load_record(milestone_id)
    _require(record, MilestoneStatus.AWAITING_REVIEW)
    record.status = MilestoneStatus.IN_PROGRESS
    _add_note(record, note)
    store.save_record(record)
    _publish(bus, record, f"changes requested: {note}")
    return record


def approve(store: Store, repo: GitRepo, config: Config, milestone_id: str,
            bus: EventBus | None = None) -> MilestoneRecord:
    """awaiting_review → completed, then merged into main like any completed milestone."""
    record = store.load_record(milestone_id)
    _require(record, MilestoneStatus.AWAITING_REVIEW)
    record.status = MilestoneStatus.COMPLETED
    record.phase = "completed"
    store.save_record(record)
    finish_completed(record, store, repo, config, bus or EventBus())
    return record


def abort(store: Store, milestone_id: str, bus: EventBus | None = None) -> MilestoneRecord:
    """paused / awaiting_review / pending → cancelled. The branch is kept for the human."""
    record = store.load_record(milestone_id)
    _require(record, MilestoneStatus.PAUSED, MilestoneStatus.AWAITING_REVIEW,
             MilestoneStatus.PENDING, MilestoneStatus.FAILED)
    record.status = MilestoneStatus.CANCELLED
    record.phase = "cancelled"
    store.save_record(record)
    state = store.load_state()
    if state.current_milestone == milestone_id:
        store.save_state(State())
    _publish(bus, record, "cancelled by you")
    return record
