"""What a human does to a milestone: resume, approve, request changes, abort.

Shared by the CLI (`anima resume`, `anima approve`, `anima abort`) and the app's review
panel, so both follow exactly the same rules. Each action validates the status against the
loop's transition table (anima.loop.phases), updates the record and state.json atomically,
and says what it did.
"""

from __future__ import annotations

from anima import comments
from anima.config import Config
from anima.errors import ActionError
from anima.events import EventBus, LogLine, MilestoneChanged
from anima.git import GitRepo
from anima.guard.restore import drop_interrupted
from anima.loop.completion import begin_completion, finish_completed, merging
from anima.loop.limits import LIMITS
from anima.loop.phases import RESTING_PHASE, check_transition
from anima.loop.state import reconcile_state
from anima.loop.worktree import remove_worktree
from anima.phases import Phase
from anima.store.models import (
    HumanNote,
    MilestoneRecord,
    MilestoneStatus,
    RoundKind,
    Verdict,
    Withdrawn,
    now,
)
from anima.store.names import MILESTONE_ID_RE
from anima.store.store import Store
from anima.text.redact import redact


def load(store: Store, milestone_id: str, config: Config | None = None) -> MilestoneRecord:
    """The milestone's record. A definition that no Anima has registered yet (none ran since
    it was added, or `auto_start` is off) is registered first when `config` is known: the
    human may cancel a milestone before it ever starts."""
    record_file = store.paths.milestone_record(milestone_id)
    md = store.paths.milestone_md(milestone_id)
    named = MILESTONE_ID_RE.fullmatch(milestone_id) is not None  # not a path elsewhere
    if named and config is not None and not record_file.exists() and md.is_file():
        store.register(md, now(), max_iterations=config.max_iterations_per_milestone,
                       requires_human_review=config.requires_human_review)
    if not named or not record_file.exists():
        raise ActionError(f"there is no milestone {milestone_id!r} in {store.paths.root} "
                          f"(no {md.relative_to(store.paths.root)} or record of it)")
    return store.load_record(milestone_id)


def _require(record: MilestoneRecord, target: Phase, *allowed: MilestoneStatus) -> None:
    """The action applies to these statuses, and the transition table agrees."""
    if record.status not in allowed:
        wanted = " or ".join(s.value for s in allowed)
        raise ActionError(f"milestone {record.id!r} is {record.status.value}, not {wanted}")
    check_transition(RESTING_PHASE[record.status], target)


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
    """paused (or failed) → in_progress: rejections reset, the note goes to the next
    Developer prompt; the next run recovers it and goes on.

    A milestone paused at its round limit gets another `max_iterations_per_milestone` rounds.
    """
    with comments.LOCK:
        record = load(store, milestone_id, config)
        _require(record, Phase.RECOVERING, MilestoneStatus.PAUSED, MilestoneStatus.FAILED)
        note = _clean_note(comments.take_comments(record, note))
        return _resume(store, config, record, note, bus)


def _resume(store: Store, config: Config, record: MilestoneRecord, note: str,
            bus: EventBus | None) -> MilestoneRecord:
    for limit in LIMITS:
        limit.lift(record, config)
    record.status = MilestoneStatus.IN_PROGRESS
    record.pause_reason = None
    record.error = None
    _add_note(record, note)
    store.save_record(record)
    reconcile_state(store, store.load_records())
    _publish(bus, record, "resumed by you" + (f" with a note: {note}" if note else ""))
    return record


def stop_waiting(store: Store, milestone_id: str,
                 bus: EventBus | None = None) -> MilestoneRecord:
    """in_progress, but no run drives it (it waits for a free slot) → paused, as stopped by
    you, as a stop pauses a running one: a resume or an abort may follow. Only the engine
    that would start it may call this, on its worker (nothing starts it meanwhile)."""
    with comments.LOCK:
        record = load(store, milestone_id)
        _require(record, Phase.PAUSED, MilestoneStatus.IN_PROGRESS)
        record.status = MilestoneStatus.PAUSED
        record.phase = Phase.PAUSED
        record.pause_reason = "stopped by you"
        record.interrupted = False
        store.save_record(record)
        reconcile_state(store, store.load_records())
        _publish(bus, record, "stopped by you before it started again: paused")
        return record


def request_changes(store: Store, milestone_id: str, note: str,
                    bus: EventBus | None = None) -> MilestoneRecord:
    """awaiting_review → in_progress with the human's note (and line comments) as feedback."""
    with comments.LOCK:
        record = load(store, milestone_id)
        _require(record, Phase.RECOVERING, MilestoneStatus.AWAITING_REVIEW)
        note = _clean_note(comments.take_comments(record, note))
        if not note:
            raise ActionError("say which changes you want (a note or a comment on a line): "
                              "it goes to the Developer")
        record.status = MilestoneStatus.IN_PROGRESS
        for it in record.standing:  # main now waits for another final acceptance
            if it.kind is RoundKind.FINAL and it.verdict is Verdict.ACCEPTED:
                it.withdrawn = Withdrawn.CHANGES_REQUESTED
        _add_note(record, note)
        store.save_record(record)
    _publish(bus, record, f"changes requested: {note}")
    return record


def approve(store: Store, repo: GitRepo, config: Config, milestone_id: str,
            bus: EventBus | None = None) -> MilestoneRecord:
    """awaiting_review → completed, then merged into main like any completed milestone.

    When main moved meanwhile and the branch no longer merges into it cleanly, the approval
    sends it through the merge queue instead (in_progress): its Developer merges main in a
    merge round, its Acceptor reviews that, and then it merges and completes."""
    record = load(store, milestone_id, config)
    with merging():  # no other merge between the conflict check and this one
        _approve(store, repo, config, record, bus)
    return record


def approved(record: MilestoneRecord) -> str:
    """What an approval did, as `anima approve` says it (with an Anima running or not):
    completed and where its merge stands, or why it goes on first (a merge round, an edited
    definition)."""
    if record.status is MilestoneStatus.IN_PROGRESS:
        return f"approved {record.id}: {record.notes[-1]}"
    merge = f"; {record.merge.detail}" if record.merge else ""
    return f"approved {record.id}: {record.status.value}{merge}"


def _approve(store: Store, repo: GitRepo, config: Config, record: MilestoneRecord,
             bus: EventBus | None) -> None:
    if record.status is MilestoneStatus.AWAITING_REVIEW and (changed := store.redefined(
            record, requires_human_review=config.requires_human_review)):
        _require(record, Phase.RECOVERING, MilestoneStatus.AWAITING_REVIEW)
        record.status = MilestoneStatus.IN_PROGRESS
        for it in record.standing:  # it judged what the milestone no longer is
            if it.kind is RoundKind.FINAL and it.verdict is Verdict.ACCEPTED:
                it.withdrawn = Withdrawn.REDEFINED
        record.notes.append(f"approved by you at {now():%Y-%m-%d %H:%M}; its "
                            f"{' and '.join(changed)} changed in {record.id}.md since its final "
                            "acceptance, which judged the milestone as it was defined before: "
                            "the Developer goes on with it as it is now, and a final "
                            "acceptance judges it again")
        store.save_record(record)
        _publish(bus, record, record.notes[-1])
        return
    if config.merge_on_complete and record.branch_name and record.main_branch and \
            record.status is MilestoneStatus.AWAITING_REVIEW and (conflicts := repo.merge_conflicts(
                f"refs/heads/{record.branch_name}", record.main_branch)):
        _require(record, Phase.RECOVERING, MilestoneStatus.AWAITING_REVIEW)
        record.status = MilestoneStatus.IN_PROGRESS
        conflicts = [redact(c) for c in conflicts]  # file names an agent chose
        record.notes.append(f"approved by you at {now():%Y-%m-%d %H:%M}; "
                            f"{record.main_branch} had moved and conflicts in "
                            f"{', '.join(conflicts)}: a merge round resolves it first")
        store.save_record(record)
        _publish(bus, record, f"approved by you; {record.branch_name} no longer merges into "
                              f"{record.main_branch} cleanly (conflicts in "
                              f"{', '.join(conflicts)}): its Developer merges "
                              f"{record.main_branch} in a merge round, its Acceptor reviews "
                              "it, then it merges and completes")
        return
    _require(record, Phase.COMPLETED, MilestoneStatus.AWAITING_REVIEW)
    begin_completion(record, config)  # completed and the merge pending, in one write
    record.phase = Phase.COMPLETED
    store.save_record(record)
    finish_completed(record, store, repo, config, bus or EventBus())


def abort(store: Store, repo: GitRepo, config: Config, milestone_id: str,
          bus: EventBus | None = None) -> MilestoneRecord:
    """paused / awaiting_review / pending / failed → cancelled, and in progress when no run
    drives it (the caller's to know: it holds the project's lock, or is the engine that would
    start it). Its worktree goes (changes left in it to a named stash); the branch is kept
    for the human."""
    drop_interrupted(store.paths, milestone_id)  # (`sandbox: "off"`: else it would revive it)
    record = load(store, milestone_id, config)
    _require(record, Phase.CANCELLED, MilestoneStatus.PAUSED, MilestoneStatus.AWAITING_REVIEW,
             MilestoneStatus.PENDING, MilestoneStatus.FAILED, MilestoneStatus.IN_PROGRESS)
    record.status = MilestoneStatus.CANCELLED
    record.phase = Phase.CANCELLED
    record.completed_at = now()  # when it ended: the window says when it was cancelled
    record.interrupted = False
    record.comments = []  # never sent: nobody will read them
    if record.pause_reason:  # it is not paused any more; why it was stays in its notes
        record.notes.append(f"paused before it was cancelled: {record.pause_reason}")
        record.pause_reason = None
    # Cancelled on record first: a removal cut short (Ctrl+C kills git with it) leaves a
    # half-deleted tree, which a restart removes for a cancelled milestone; for a paused
    # one it would be kept, and its missing files read as the Developer's deletions.
    store.save_record(record)
    lines: list[str] = []
    noted = len(record.notes)
    remove_worktree(repo, store.paths, record, lines.append, "it was cancelled")
    if len(record.notes) != noted:  # what was left in it went to a stash, named there
        store.save_record(record)
    reconcile_state(store, store.load_records())
    _publish(bus, record, "; ".join(["cancelled by you", *lines]))
    return record
