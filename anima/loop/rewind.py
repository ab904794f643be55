""""Continue from round N": put a paused milestone's branch back to an accepted round, resume.

When the last rounds went astray, the reviewer picks an accepted round; the milestone branch is
moved back to that round's commit and the milestone resumes from there. Nothing is lost: the
commits dropped from the branch stay reachable under `refs/anima/dropped/<id>/<n>`, the
rounds stay in the record's history (their verdicts `withdrawn`: they no longer decide what
comes next, nor what main receives), and a note on the record says what was done. Features
whose commits were all dropped go back to pending so the Developer does them again, and the
dropped rounds stop counting toward the round limit (their cost stays in the totals).
"""

from __future__ import annotations

from anima import comments
from anima.config import Config
from anima.errors import AnimaError, GitError
from anima.events import EventBus
from anima.git import GitRepo
from anima.git.objects import take_objects
from anima.loop import actions
from anima.store.models import (
    FeatureStatus,
    MilestoneRecord,
    MilestoneStatus,
    Verdict,
    Withdrawn,
)
from anima.store.store import Store

DROPPED_REFS = "refs/anima/dropped"


class RewindError(AnimaError):
    """The milestone cannot continue from that round."""


def accepted_rounds(record: MilestoneRecord) -> list[int]:
    """Rounds a paused milestone can continue from: accepted, with a commit."""
    return [it.round for it in record.standing
            if it.verdict is Verdict.ACCEPTED and it.commit]


def continue_from_round(store: Store, repo: GitRepo, config: Config, milestone_id: str,
                        round_no: int, note: str = "",
                        bus: EventBus | None = None) -> MilestoneRecord:
    """Move the milestone branch back to round `round_no`'s commit, record it, then resume."""
    with comments.LOCK:
        record = store.load_record(milestone_id)
        if record.status is not MilestoneStatus.PAUSED:
            raise RewindError(f"milestone {milestone_id!r} is {record.status.value}, not paused")
        if round_no not in accepted_rounds(record) or not record.branch_name:
            raise RewindError(f"round {round_no} of {milestone_id} is not an accepted round "
                              f"with a commit; choose one of {accepted_rounds(record)}")
        target = next(it.commit for it in record.iterations if it.round == round_no)
        assert target is not None
        record.notes += take_objects(store.paths.agent_objects(milestone_id), repo.common_dir)
        head = repo.branch_head(record.branch_name)
        if not repo.is_ancestor(target, head):
            raise RewindError(f"round {round_no}'s commit {target[:7]} is not on "
                              f"{record.branch_name} any more; nothing was changed")
        kept_under = f"{DROPPED_REFS}/{milestone_id}/{len(record.notes) + 1}"
        if head != target:
            worktree = store.paths.worktree(milestone_id)
            try:
                tree = repo.worktree_repo(worktree)
            except GitError:  # no worktree (the milestone is not running): the branch alone
                tree = repo
            tree.ensure_clean()  # the reset must not take uncommitted edits with it
            repo.keep_ref(kept_under, head)
            tree.reset_branch(record.branch_name, target)
        _drop_rounds(record, repo, round_no, head, kept_under)
        store.save_record(record)
        return actions.resume(store, config, milestone_id, note, bus)


def _drop_rounds(record: MilestoneRecord, repo: GitRepo, round_no: int, head: str,
                 kept_under: str, why: str = "") -> None:
    """The record's side of a rewind to round `round_no` (the branch is there now, `head`
    kept under `kept_under`): the rounds after it withdrawn, their features undone."""
    target = next(it.commit for it in record.iterations if it.round == round_no)
    assert target is not None
    for feature in record.features:
        kept = [c for c in feature.commits if repo.is_ancestor(c, target)]
        if kept != feature.commits:
            feature.commits = kept
            if feature.status is FeatureStatus.DONE or not kept:
                feature.status = FeatureStatus.IN_PROGRESS if kept else FeatureStatus.PENDING
    newly = [it for it in record.standing if it.round > round_no]
    for it in newly:
        it.withdrawn = Withdrawn.DROPPED
    last = max(it.round for it in record.iterations)
    # The rounds after it leave the count and the round limit: the limit is the
    # milestone's progress, and that is undone.
    record.max_iterations += len(newly)
    dropped = f" (rounds {round_no + 1}–{last} dropped)" if last > round_no else ""
    record.notes.append(
        f"continued from round {round_no}{dropped}: {record.branch_name} put back to "
        f"{target[:7]}"
        + (f"; the dropped commits (up to {head[:7]}) are kept under {kept_under}"
           if head != target else "")
        + ("; the dropped rounds no longer count toward the round limit"
           if dropped else "") + why)


def finish_cut_short(store: Store, repo: GitRepo, config: Config,
                     records: list[MilestoneRecord], bus: EventBus | None = None) -> list[str]:
    """At start-up: a "Continue from round" that a kill cut short, told by a ref under
    `DROPPED_REFS` no note names (it is made before the branch moves, the note after). The
    branch moved: the record follows and the milestone resumes, as you asked (else the next
    review took the move for the Developer's rewriting history, and put the dropped rounds
    back). It did not: nothing was done, and the ref goes."""
    lines = []
    dropped: dict[str, list[tuple[str, str]]] = {}  # one git call for every milestone
    for ref, kept in repo.refs_under(DROPPED_REFS):
        dropped.setdefault(ref[len(DROPPED_REFS) + 1:].partition("/")[0], []).append((ref, kept))
    for record in records:
        if not (branch := record.branch_name):
            continue
        for ref, kept in dropped.get(record.id, []):
            if any(ref in note for note in record.notes):
                continue
            head = repo.resolve(f"refs/heads/{branch}")
            if head is None:  # deleted since (yours): nothing to finish, the ref is kept
                continue
            if head == kept:
                repo.delete_ref(ref, kept)
                lines.append(f"{record.id}: a \"Continue from round\" that a kill cut short "
                             "had not moved the branch yet: nothing was done; choose it again")
                continue
            rounds = [n for n in accepted_rounds(record) if next(
                it.commit for it in record.iterations if it.round == n) == head]
            if not rounds or not repo.is_ancestor(head, kept):
                continue
            with comments.LOCK:
                record = store.load_record(record.id)
                _drop_rounds(record, repo, rounds[-1], kept, ref,
                             " (finished at the restart: a kill had cut it short)")
                store.save_record(record)
            lines.append(f"{record.id}: {record.notes[-1]}")
            if record.status is MilestoneStatus.PAUSED:
                record = actions.resume(store, config, record.id, "", bus)
    return lines
