"""What a milestone record means for the window, in one place: which board column it sits in,
why it needs you, what it waits for, which rounds a rewind dropped, what is true now.

Pure functions of the records the engine publishes (no Qt), so the board, the milestone page
and the decision bar say the same thing, and the tests read them directly.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from anima.events import ROLES
from anima.store.dependencies import awaited, dependencies, held_line
from ui.formatting import enum_text, local_time

#: The board's columns, left to right: (key, title).
COLUMNS = (("pending", "Pending"), ("running", "Running"), ("needs_you", "Needs you"),
           ("done", "Done"))
_COLUMN_OF_STATUS = {"pending": "pending", "in_progress": "running", "paused": "needs_you",
                     "awaiting_review": "needs_you", "failed": "needs_you",
                     "completed": "done", "cancelled": "done"}
#: The one decision a card that needs you offers in place: (action, button text).
MAIN_ACTION = {"paused": ("resume", "Resume"), "awaiting_review": ("review", "Review"),
               "failed": ("retry", "Retry"), "pending": ("start", "Start")}


#: The agent CLIs, by a role's `agent`.
AGENT_NAMES = {"claude": "Claude Code", "codex": "Codex"}
#: The statuses in which a milestone's record says what plays each role: it runs on it, or ran.
_RAN_STATUSES = frozenset({"in_progress", "completed", "cancelled"})


def column_of(record: Any) -> str:
    status = enum_text(record.status)
    if status == "completed" and record.merge is not None and (
            enum_text(record.merge.state) == "failed" or record.merge.waits_for_you):
        return "needs_you"  # completed but not merged: the human has to merge it, or clear
        # the way for the merge
    return _COLUMN_OF_STATUS.get(status, "pending")


def depends_on_facts(record: Any, records: Iterable[Any]) -> tuple[list[str], str | None]:
    """What a pending one's `depends_on` holds it for, as `anima status` says it: the
    milestones it still waits for, and why it never starts as the files are written (None
    when it can), from one reading of every record's dependencies.

    Each awaited one comes with why when that is not just time: "rate-limit (paused)" waits
    for you, "cart-api (completed, not merged yet)" for main to have it. Only completed and
    merged counts as done (a completed one whose merge waited for your files was, and the
    card offered a Start that did nothing); one Anima merges nothing of counts as merged,
    which only git could tell. An id with no record at all is waited for too. Never starting
    (a cycle, one on itself, one naming no milestone or a cancelled one): waiting for itself,
    its card said "Waiting for <its own id>"."""
    records = list(records)
    found = dependencies(records, in_main=lambda _record: True)
    by_id = {r.id: r for r in records}
    return ([awaited(by_id[d], found.broken, "its card") if d in by_id else d
             for d in found.waiting.get(record.id, [])], found.broken.get(record.id))


def pending_hold(record: Any, records: Iterable[Any], held: Sequence[str]) -> str:
    """Why a pending milestone neither starts when a slot is free nor with Start, as its card
    and its page say it: it never starts, or waits for others (its `depends_on`), or, run
    one at a time, for the paused ones every start waits for (`held`); "" when it starts."""
    waits, broken = depends_on_facts(record, records)
    return (f"Never starts: {broken}" if broken else
            f"Waiting for {', '.join(waits)}" if waits else
            f"Waiting {held_line(held)}" if held else "")


def limit_wait_text(record: Any) -> str:
    """"Waiting for the usage limit to reset at 04:18" while the milestone's agents wait out
    a usage limit (its phase still names the agent whose turn it is, which is not under way);
    "" when they do not, or its reset is past."""
    wait = record.limit_wait
    if wait is None or wait.until.timestamp() <= time.time():
        return ""
    words = wait.reason.split(" (")[0]  # the limit's name and message: the tooltip's
    return words[:1].upper() + words[1:]


def agents_text(record: Any, configured: Mapping[str, Any], titles: Mapping[str, str],
                models: bool = True) -> str:
    """"Developer: Codex gpt-5-codex · Acceptor: Claude Code": the agent CLI playing each role
    (`titles`: what each role is called), with its model when one is set (else the CLI's
    default) and `models` asks for it. While it runs and once it ended, what its record says
    it runs (ran) on; before it starts and while it waits for you, what its next start runs
    on: the config the engine announced (`configured`: role → its `agent` and `model`; a
    paused one resumes on an edited config's). A role neither says is left out."""
    ran = enum_text(record.status) in _RAN_STATUSES
    said = []
    for role in ROLES:
        run = (record.agents.get(role) if ran else None) or configured.get(role) or \
            record.agents.get(role)
        if run is not None:
            name = AGENT_NAMES.get(run.agent, run.agent)
            said.append(f"{titles[role]}: {name} {run.model}" if run.model and models else
                        f"{titles[role]}: {name}")
    return " · ".join(said)


def needs_you_reason(record: Any) -> str:
    """Why a milestone in the "needs you" column waits for you, in one line."""
    status = enum_text(record.status)
    if status == "paused":
        return record.pause_reason or "Paused"
    if status == "failed":
        return f"Failed: {record.error or 'an unexpected error'}"
    if status == "awaiting_review":
        return no_new_commit(record) or (
            f"Done — ready for your review ({record.features_done}/{len(record.features)} "
            "features)")
    if record.merge is not None and record.merge.waits_for_you:
        return merge_waits_text(record.merge)
    if record.merge is not None:
        return f"Not merged: {record.merge.detail}"
    return ""


def merge_waits_text(merge: Any) -> str:
    """A merge held up by the human's files, as a sentence: which files, and what to do."""
    return f"Not merged yet: {merge.detail}"


def ended_text(record: Any) -> str:
    """A finished milestone in words: merged or why not; cancelled by whom and when."""
    status = enum_text(record.status)
    if status == "cancelled":
        when = f" at {local_time(record.completed_at)}" if record.completed_at else ""
        return f"Cancelled by you{when}"
    if record.merge is None:
        return "Completed · not merged (merge_on_complete is off)"
    state = enum_text(record.merge.state)
    return {"merged": "Completed · merged", "pending": "Completed · merging…"}.get(
        state, f"Completed · not merged: {record.merge.detail}")


def dropped_rounds(record: Any) -> set[int]:
    """Rounds a "Continue from round N" took off the branch: history, not progress."""
    return {it.round for it in record.iterations if enum_text(it.withdrawn) == "dropped"}


def live_rounds(record: Any) -> list[Any]:
    """The rounds that still count: every round but the dropped ones."""
    dropped = dropped_rounds(record)
    return [it for it in record.iterations if it.round not in dropped]


def current_rejections(record: Any, limit: int = 3) -> list[tuple[int, str]]:
    """The rejections that still stand (newest last): those after the last accepted round,
    so a rejection a later round fixed, or a dropped round's, is not listed."""
    standing: list[tuple[int, str]] = []
    for it in live_rounds(record):
        if enum_text(it.verdict) == "accepted":
            standing = []
        else:
            standing.append((it.round, it.reason or "(no reason given)"))
    return standing[-limit:]


def no_new_commit(record: Any) -> str:
    """When your last request (a note or comments) came back for review without a commit
    after it, say so; else "". A review that changed nothing should not look like progress."""
    if enum_text(record.status) != "awaiting_review" or not record.human_notes:
        return ""
    asked = record.human_notes[-1].at
    before = [it.commit for it in record.iterations if it.commit and it.started_at < asked]
    after = [it.commit for it in record.iterations if it.commit and it.started_at >= asked]
    if any(c not in before for c in after):
        return ""
    return ("Back for review with no new commit: nothing changed since your request of "
            f"{local_time(asked)}")
