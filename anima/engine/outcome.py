"""How a headless run ended: what `anima run` reports and turns into its exit code."""

from __future__ import annotations

from dataclasses import dataclass

from anima.errors import AnimaError, MilestoneError, RecordError
from anima.loop.completion import merge_pending
from anima.store.dependencies import held_by_pause
from anima.store.models import MilestoneRecord, MilestoneStatus


@dataclass(frozen=True)
class RunOutcome:
    """How a headless run ended: which milestones wait for a human."""

    paused: tuple[str, ...]
    awaiting_review: tuple[str, ...]
    problems: tuple[str, ...]
    #: Still in_progress: a stop (signal, window closed) interrupted them; the next start
    #: resumes them.
    in_progress: tuple[str, ...] = ()
    #: Ended by an unexpected error (in the record and the log); `anima resume` retries.
    failed: tuple[str, ...] = ()
    #: Pending, and what each waits for (`depends_on`) that is not completed and merged.
    waiting: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Completed, its merge into main still owed, and why (a file of the human's in the
    #: way): the next run, or one that watches, finishes it.
    unmerged: tuple[tuple[str, str], ...] = ()
    #: Pending, and why it can never start as its file is written (a `depends_on` cycle,
    #: an unknown or cancelled dependency).
    blocked: tuple[tuple[str, str], ...] = ()
    #: A milestone's file the run could not read (a malformed `.md`, a bad name, a record
    #: of a newer Anima), and the problem: it never runs until the file is fixed (README,
    #: exit codes: exit 2's kind, as `blocked`).
    unreadable: tuple[tuple[str, str], ...] = ()
    #: Run one at a time: the pending milestones that wait behind `held_by` (paused).
    held: tuple[str, ...] = ()
    held_by: tuple[str, ...] = ()
    #: In progress, its `.md` gone (taken away, then resumed, or while Anima was down): it
    #: does not go on until the file is back (exit 2's kind, as `blocked`).
    undefined: tuple[str, ...] = ()

    @classmethod
    def of(cls, records: list[MilestoneRecord], problems: list[AnimaError],
           waiting: dict[str, list[str]] | None = None,
           broken: dict[str, str] | None = None,
           orphans: set[str] | None = None, limit: int = 0) -> RunOutcome:
        """What the records say once nothing is driven any more; `orphans` are the records
        whose definition is gone."""
        def having(status: MilestoneStatus) -> tuple[str, ...]:
            return tuple(r.id for r in records if r.status is status)

        # A pending record whose `.md` is gone never starts (the log says so once): it
        # neither waits nor is held, whatever its record says.
        pending = tuple(m for m in having(MilestoneStatus.PENDING) if m not in (orphans or ()))
        in_progress = having(MilestoneStatus.IN_PROGRESS)
        held_by = tuple(held_by_pause(records, limit))
        # An ended milestone's new `.md` is only reported: the milestone is done.
        ended = set(having(MilestoneStatus.COMPLETED) + having(MilestoneStatus.CANCELLED))
        return cls(failed=having(MilestoneStatus.FAILED), paused=having(MilestoneStatus.PAUSED),
                   awaiting_review=having(MilestoneStatus.AWAITING_REVIEW),
                   problems=tuple(map(str, problems)),
                   in_progress=tuple(m for m in in_progress if m not in (orphans or ())),
                   undefined=tuple(m for m in in_progress if m in (orphans or ())),
                   waiting=tuple((m, tuple(deps)) for m, deps in (waiting or {}).items()
                                 if m in pending),
                   unmerged=tuple((r.id, r.merge.detail) for r in records
                                  if merge_pending(r) and r.merge is not None),
                   blocked=tuple((m, why) for m, why in (broken or {}).items()
                                 if m in pending),
                   unreadable=tuple((p.path.stem, str(p)) for p in problems
                                    if isinstance(p, (MilestoneError, RecordError))
                                    and p.path.stem not in ended | set(broken or {})),
                   held=tuple(m for m in pending if held_by and m not in (waiting or {})
                              and m not in (broken or {})),
                   held_by=held_by)
