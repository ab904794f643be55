"""`depends_on`: which milestones wait for others, and which never can start (a dependency
that names no milestone, a cancelled one or one whose merge failed, or a cycle).

Statuses are compared by value (`==`): the window reads copies of records whose status a
test or a view set as a plain string."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field

from anima.store.models import MergeState, MilestoneRecord, MilestoneStatus


@dataclass
class Dependencies:
    #: milestone id -> the ids it still waits for (not yet completed and merged into main)
    waiting: dict[str, list[str]] = field(default_factory=dict)
    #: milestone id -> why it can never start as it is written (an unknown or cancelled
    #: dependency, a cycle)
    broken: dict[str, str] = field(default_factory=dict)


#: Whether main has a completed milestone Anima did not merge (merge_on_complete off): you
#: merged it yourself. Git answers it; the records alone cannot.
InMain = Callable[[MilestoneRecord], bool]


def done(record: MilestoneRecord, in_main: InMain | None = None) -> bool:
    """Completed and in main: merged by Anima, or by you where Anima merges nothing."""
    if record.status != MilestoneStatus.COMPLETED:
        return False
    if record.merge is not None:
        return record.merge.merged
    return in_main is not None and in_main(record)


def _not_merged(record: MilestoneRecord) -> bool:
    """Completed, and its merge failed for good (no merge round is coming)."""
    return record.status == MilestoneStatus.COMPLETED and record.merge is not None \
        and record.merge.state == MergeState.FAILED


def dependencies(records: list[MilestoneRecord], in_main: InMain | None = None,
                 unreadable: Set[str] = frozenset(),
                 undefined: Set[str] = frozenset()) -> Dependencies:
    """What every milestone's `depends_on` says now. `unreadable`: milestones whose file is
    there but cannot be read as it is written; one waits for them (until they are fixed).
    `undefined`: records whose `.md` is gone; a pending one never starts, so nothing can
    wait for it (one waited for ever, and the run ended "nothing left to do"), and its own
    `depends_on`, the record's, says nothing (the file put back says it anew)."""
    by_id = {r.id: r for r in records}
    found = Dependencies()
    for record in records:
        if record.id in undefined and record.status == MilestoneStatus.PENDING:
            continue
        known = [d for d in record.depends_on if d in by_id]
        gone = [d for d in known if d in undefined
                and by_id[d].status == MilestoneStatus.PENDING]
        if unknown := [d for d in record.depends_on if d not in by_id and d not in unreadable]:
            found.broken[record.id] = (
                f"depends_on names {', '.join(unknown)}, which "
                f"{'is not a milestone' if len(unknown) == 1 else 'are not milestones'} of "
                "this project")
        elif gone:
            found.broken[record.id] = (
                f"depends_on names {', '.join(gone)}, whose .md "
                f"{'file is' if len(gone) == 1 else 'files are'} gone (a milestone never "
                f"starts without it): put {'it' if len(gone) == 1 else 'them'} back, or "
                f"remove {', '.join(gone)} from depends_on")
        elif (cycle := _cycle(record.id, by_id)) is not None:
            found.broken[record.id] = f"depends_on makes a cycle: {' → '.join(cycle)}" + (
                f" ({record.id} names itself)" if len(cycle) == 2 else "")
        elif cancelled := [d for d in known
                           if by_id[d].status == MilestoneStatus.CANCELLED]:
            found.broken[record.id] = (
                f"depends_on names {', '.join(cancelled)}, which "
                f"{'was' if len(cancelled) == 1 else 'were'} cancelled: it can never start "
                "unless you remove it from depends_on")
        elif unmerged := [d for d in known if _not_merged(by_id[d])]:
            found.broken[record.id] = (
                f"depends_on names {', '.join(unmerged)}, completed but never merged into "
                "main (`anima status` says why): it can never start unless you merge "
                f"{'it' if len(unmerged) == 1 else 'them'} yourself and remove "
                f"{'it' if len(unmerged) == 1 else 'them'} from depends_on")
        elif waiting := [d for d in record.depends_on
                         if d not in by_id or not done(by_id[d], in_main)]:
            found.waiting[record.id] = waiting
    return found


def awaited(record: MilestoneRecord, broken: dict[str, str], where: str = "its line") -> str:
    """A dependency, and why it holds things up when that is not just time: a paused one
    waits for the human too, and one that never starts as its file is written (`broken`)
    until you fix that file (`where` says why: `anima status`'s line, the board's card)."""
    if record.id in broken and record.status == MilestoneStatus.PENDING:
        return f"{record.id} (which never starts as its file is written: see {where})"
    if record.status in (MilestoneStatus.PENDING, MilestoneStatus.IN_PROGRESS):
        return record.id
    if record.status == MilestoneStatus.COMPLETED and record.merge is None:
        return f"{record.id} (completed; merge_on_complete is off: merge it into main yourself)"
    if record.status == MilestoneStatus.COMPLETED:
        return f"{record.id} (completed, not merged yet)"
    return f"{record.id} ({record.status})"  # a StrEnum: its value


def _cycle(start: str, by_id: dict[str, MilestoneRecord]) -> list[str] | None:
    """A path of dependencies from `start` back to itself, if there is one."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for dep in by_id[node].depends_on if node in by_id else []:
            if dep == start:
                return [*path, dep]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, [*path, dep]))
    return None


def held_by_pause(records: Iterable[MilestoneRecord], limit: int) -> list[str]:
    """Run one at a time (a parallel `limit` of 1: so configured, or without the sandbox),
    the paused milestones that hold every start until you resume or abort them: milestones
    build on each other, and the next may need what the paused one was to bring."""
    if limit != 1:
        return []
    return [r.id for r in records if r.status == MilestoneStatus.PAUSED]


def held_line(paused: Sequence[str]) -> str:
    """What a milestone held by `paused` waits for, as the run's end and `status` say it."""
    return (f"until {', '.join(paused)} {'is' if len(paused) == 1 else 'are'} resumed or "
            "aborted (milestones run one at a time)")
