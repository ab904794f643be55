"""Completing a milestone: one crash-safe step from the final acceptance to main.

`begin_completion` puts the completion and the intent to merge (`merge.state: pending`) on the
record, which the caller writes in the same atomic write as `completed` (and, from the loop, the
final round): a final acceptance is recorded exactly once, and a kill before, during or after
the merge leaves a record that says a merge is owed. `finish_completed` carries it out, and
the next start calls it again for a merge still pending: merging is idempotent (a branch main
already holds is "already merged"), and anything that stops it is recorded as the reason.
Only the tip a final acceptance judged (or a merge round's review after it) is merged,
whatever a record says.

Several milestones may finish at once: they merge one at a time, in the order they were
finally accepted (`MergeQueue`), and every merge into main, the loop's, a human's approval's
or a retry's, holds one lock, so two never race on main or on the human's checkout.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from anima.config import Config
from anima.errors import AnimaError, GitStopped
from anima.events import EventBus, LogLine, MilestoneChanged, Notice
from anima.git import GitRepo
from anima.git.locks import clear_stale_locks
from anima.git.merge import MergeOutcome
from anima.loop.phases import check_transition
from anima.loop.state import reconcile_state
from anima.loop.worktree import memory_as_started, remove_worktree
from anima.paths import ProjectPaths
from anima.phases import Phase
from anima.store.models import (
    MergeInfo,
    MergeState,
    MilestoneRecord,
    MilestoneStatus,
    now,
)
from anima.store.store import Store
from anima.text.redact import redact

#: Held by every merge into main in this process, from the check that it merges cleanly to
#: the merge itself: a merge of another milestone in between would make it conflict after all.
_MERGING = threading.RLock()


@contextmanager
def merging() -> Iterator[None]:
    """Hold main for one milestone's conflict check and merge (re-entrant)."""
    with _MERGING:
        yield


class MergeQueue:
    """Finally accepted milestones wait here for their turn to merge, oldest acceptance
    first; shared by the runs of one engine."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: list[tuple[datetime, str]] = []
        self._holder: tuple[datetime, str] | None = None

    def enlist(self, milestone_id: str, accepted_at: datetime) -> None:
        """Take the milestone's place as its acceptance is recorded: its run still has steps
        to go before it asks for its `turn`, and one accepted after it that gets there first
        must wait for it all the same."""
        with self._changed:
            self._drop(milestone_id)
            bisect.insort(self._waiting, (accepted_at, milestone_id))
            self._changed.notify_all()

    def withdraw(self, milestone_id: str) -> None:
        """The milestone will not ask for its turn (its run ended, or its acceptance no longer
        stands): the ones after it stop waiting for it."""
        with self._changed:
            self._drop(milestone_id)
            self._changed.notify_all()

    def _drop(self, milestone_id: str) -> None:
        self._waiting = [e for e in self._waiting if e[1] != milestone_id]

    @contextmanager
    def turn(self, milestone_id: str, accepted_at: datetime,
             stop: threading.Event) -> Iterator[bool]:
        """Wait until every milestone accepted before this one has had its turn, and the one
        whose turn it is has finished (one accepted earlier that arrives meanwhile, after a
        restart, comes next: it does not cut in); yields False when a stop came first
        (nothing may be merged then)."""
        entry = (accepted_at, milestone_id)
        self.enlist(milestone_id, accepted_at)
        try:
            with self._changed:
                while (self._holder is not None or self._waiting[0] != entry) \
                        and not stop.is_set():
                    self._changed.wait(0.5)
                if not stop.is_set():
                    self._holder = entry
            yield not stop.is_set()
        finally:
            with self._changed:
                self._waiting.remove(entry)
                if self._holder == entry:
                    self._holder = None
                self._changed.notify_all()


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
    """Do the pending merge into main (`repo` is the human's checkout), record the outcome,
    tell everyone; once nothing is owed, the milestone's worktree goes. A merge that waits for
    the human's files stays pending, and is tried again (the engine retries it every few
    seconds)."""
    def log(text: str) -> None:
        bus.publish(LogLine(record.id, text))

    if merge_pending(record):
        assert record.merge is not None
        before = record.merge.detail
        outcome = _merge(record, repo, config, store.paths, bus)
        if outcome.retry:
            record.merge.detail = outcome.detail
            if outcome.detail != before:
                log(outcome.detail)
                store.save_record(record)
                bus.publish(MilestoneChanged(record.model_copy(deep=True)))
                bus.publish(Notice(record.id, "merge_waiting", f"{record.title}: "
                                   f"{outcome.detail}"))
            return
        if outcome.conflicts:
            _back_for_a_merge_round(record, store, bus, outcome.conflicts)
            return
        record.merge = MergeInfo(state=MergeState.MERGED if outcome.merged else MergeState.FAILED,
                                 merged=outcome.merged, detail=outcome.detail, at=now())
        log(("merged: " if outcome.merged else "not merged: ") + outcome.detail)
    store.save_record(record)
    remove_worktree(repo, store.paths, record, log, "the milestone is completed")
    store.save_record(record)  # a stash of what was left uncommitted is noted in it
    reconcile_state(store, store.load_records())
    bus.publish(MilestoneChanged(record.model_copy(deep=True)))
    merged = record.merge is None or record.merge.merged
    bus.publish(Notice(record.id, "completed", f"{record.title} is completed"
                       + ("" if merged else f"; not merged: {record.merge.detail}"
                          if record.merge else "")))


def _back_for_a_merge_round(record: MilestoneRecord, store: Store, bus: EventBus,
                            conflicts: list[str]) -> None:
    """main moved after the conflict check (while the merge waited for your files, while
    Anima was down, or by your own commit) and the branch no longer merges cleanly: as for
    any finally accepted milestone, its Developer merges main in a merge round, its
    Acceptor reviews that, then the merge queue tries again. Nothing is merged meanwhile."""
    check_transition(Phase.COMPLETED, Phase.RECOVERING)
    record.status, record.phase = MilestoneStatus.IN_PROGRESS, Phase.RECOVERING
    record.merge = None
    record.completed_at = None
    text = redact(f"{record.main_branch} moved before {record.branch_name} was merged into "
                  f"it, and they now conflict in {', '.join(conflicts)}: a merge round "
                  "resolves it first, reviewed like any other, then the merge is tried again")
    record.notes.append(text)
    store.save_record(record)
    reconcile_state(store, store.load_records())
    bus.publish(LogLine(record.id, text))
    bus.publish(MilestoneChanged(record.model_copy(deep=True)))


def _merge(record: MilestoneRecord, repo: GitRepo, config: Config,
           paths: ProjectPaths, bus: EventBus) -> MergeOutcome:
    """Merge the finally accepted branch into main (or say why not), one merge at a time."""
    branch, main = record.branch_name or "", record.main_branch or ""
    if not config.merge_on_complete:
        return MergeOutcome(False, f"merge_on_complete is off: {main} is unchanged and "
                                   f"{branch} is kept")
    if (unaccepted := _not_finally_accepted(record, repo)) is not None:
        return MergeOutcome(False, f"{unaccepted}; {main} is unchanged and {branch} is kept")
    try:
        with _MERGING:
            # A lock a killed git left in the project's git folder (yours, or one of the
            # run's) would keep main from moving until the next start.
            for lock in clear_stale_locks(repo.root, repo.common_dir):
                bus.publish(LogLine(record.id, f".git/{lock} was left by a git command that "
                                               "no longer runs; removed"))
            return repo.merge_branch(branch, main, f"Merge {branch}: {record.title}",
                                     replaceable=memory_as_started(paths, record),
                                     tip=record.accepted_tip)
    except GitStopped:
        raise  # not the merge's failure: it is owed, and tried again on resume
    except AnimaError as e:
        return MergeOutcome(False, f"merging {branch} into {main} failed: {e}; {main} is "
                                   f"unchanged and {branch} is kept")


def _not_finally_accepted(record: MilestoneRecord, repo: GitRepo) -> str | None:
    """main receives only what a final acceptance (and the review of a merge round after
    it) judged: the branch's tip must be that commit. Why not, or None. A branch deleted by
    hand since (yours to delete, so not merged) is put back at that commit: with no ref
    left, the work would go at git's next gc, and its worktree could not be put away."""
    accepted = record.accepted_tip
    tip = repo.resolve(f"refs/heads/{record.branch_name}") if record.branch_name else None
    if accepted is None:
        return "no final acceptance is on record"
    if tip is None and record.branch_name and repo.resolve(accepted) == accepted:
        repo.keep_ref(f"refs/heads/{record.branch_name}", accepted)
        return (f"{record.branch_name} was deleted before it was merged; it is back at "
                f"{accepted[:7]}, the commit its final acceptance judged")
    if tip != accepted:
        return (f"{record.branch_name} is at {(tip or 'nothing')[:7]}, not at "
                f"{accepted[:7]}, the commit its final acceptance judged")
    return None
