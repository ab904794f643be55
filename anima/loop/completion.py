"""Completing a milestone: one crash-safe step from the final acceptance to main.

`begin_completion` puts the completion and the intent to merge (`merge.state: pending`) on the
record, which the caller writes in the same atomic write as `completed` (and, from the loop, the
final round): a final acceptance is recorded exactly once, and a kill before, during or after
`git merge` leaves a record that says a merge is owed. `finish_completed` carries it out, and
the next start calls it again for a merge still pending: merging is idempotent (a branch main
already holds is "already merged"), and anything that stops it is recorded as the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from anima.config import Config
from anima.errors import AnimaError
from anima.events import EventBus, LogLine, MilestoneChanged, Notice
from anima.git import GitRepo
from anima.loop.recovery import stash_changes
from anima.loop.state import reconcile_state
from anima.store.models import MergeInfo, MergeState, MilestoneRecord, MilestoneStatus, now
from anima.store.store import Store


def begin_completion(record: MilestoneRecord, config: Config) -> None:
    """Mark the record completed with its merge pending (not written: the caller does)."""
    record.status = MilestoneStatus.COMPLETED
    record.completed_at = now()
    record.interrupted = False
    record.merge = None
    if config.merge_on_complete and record.branch_name and record.main_branch:
        record.merge = MergeInfo(state=MergeState.PENDING, at=record.completed_at,
                                 detail=f"merging {record.branch_name} into {record.main_branch}")


def merge_pending(record: MilestoneRecord) -> bool:
    return record.status is MilestoneStatus.COMPLETED and record.merge is not None \
        and record.merge.state is MergeState.PENDING


def finish_completed(record: MilestoneRecord, store: Store, repo: GitRepo, config: Config,
                     bus: EventBus) -> None:
    """Do the pending merge (or just return to main), record the outcome, tell everyone."""
    def log(text: str) -> None:
        bus.publish(LogLine(record.id, text))

    if merge_pending(record):
        record.merge = _merge(record, repo, config, log)
        log(("merged: " if record.merge.merged else "not merged: ") + record.merge.detail)
    elif record.main_branch:
        try:
            repo.switch(record.main_branch)
        except AnimaError as e:
            log(f"could not return to {record.main_branch}: {e}")
    store.save_record(record)
    reconcile_state(store, store.load_records())
    bus.publish(MilestoneChanged(record.model_copy(deep=True)))
    merged = record.merge is None or record.merge.merged
    bus.publish(Notice(record.id, "completed", f"{record.title} is completed"
                       + ("" if merged else f"; not merged: {record.merge.detail}"
                          if record.merge else "")))


def _merge(record: MilestoneRecord, repo: GitRepo, config: Config,
           log: Callable[[str], None]) -> MergeInfo:
    branch, main = record.branch_name or "", record.main_branch or ""
    if not config.merge_on_complete:
        return MergeInfo(state=MergeState.FAILED, at=now(),
                         detail=f"merge_on_complete is off: {main} is unchanged and {branch} "
                                "is kept")
    try:
        if repo.dirty_paths():  # never reviewed, so never merged; kept in a named stash
            stash_changes(record, repo, log, "uncommitted changes found before merging "
                                             f"{branch} into {main}")
        outcome = repo.merge_branch(branch, main, f"Merge {branch}: {record.title}")
    except AnimaError as e:
        with_main = _back_on(repo, main)
        return MergeInfo(state=MergeState.FAILED, at=now(),
                         detail=f"merging {branch} into {main} failed: {e}; {with_main}")
    return MergeInfo(state=MergeState.MERGED if outcome.merged else MergeState.FAILED,
                     merged=outcome.merged, detail=outcome.detail, at=now())


def _back_on(repo: GitRepo, main: str) -> str:
    try:
        repo.switch(main)
    except AnimaError as e:
        return f"could not return to {main} either ({e})"
    return f"the tree is back on {main}; the branch is kept"
