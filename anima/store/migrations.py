"""Older records and state files, brought up to the current schema on read.

Each step adds what one schema version added, with the value that is true of a file written
before it; a file from a newer Anima is refused and left untouched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anima.errors import RecordError


def _record_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 added `claude_version` (unknown for rounds driven before it)."""
    return {**data, "claude_version": None}


def _record_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 added each round's `context` in use and the milestone's session `rollovers`
    (none known for rounds driven before it)."""
    iterations = [{**it, "context": {}} if isinstance(it, dict) else it
                  for it in data.get("iterations") or []]
    return {**data, "iterations": iterations, "rollovers": []}


def _record_v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 added each round's `check` (no check ran in rounds driven before it)."""
    iterations = [{**it, "check": None} if isinstance(it, dict) else it
                  for it in data.get("iterations") or []]
    return {**data, "iterations": iterations}


def _record_v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v5 gave `merge` a state and added `error`. A completed record without a merge
    outcome or `completed_at` is a completion an older Anima died in: its merge is pending."""
    merge = data.get("merge")
    if isinstance(merge, dict):
        merge = {**merge, "state": "merged" if merge.get("merged") else "failed"}
    elif data.get("status") == "completed" and data.get("completed_at") is None:
        merge = {"state": "pending", "merged": False,
                 "detail": "the completion was cut short by a restart"}
    return {**data, "merge": merge, "error": None}


def _record_v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """v6 added the sessions' models (unknown for sessions started before it)."""
    sessions = data.get("sessions")
    if isinstance(sessions, dict):
        data = {**data, "sessions": {"developer_model": None, "acceptor_model": None,
                                     **sessions}}
    return data


def _state_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 added the usage-limit wait (none in a file written before it)."""
    return {**data, "waiting_until": None, "waiting_reason": None}


def _record_v6_to_v7(data: dict[str, Any]) -> dict[str, Any]:
    """v7 added `comments` (line comments awaiting their Resume / Request changes)."""
    return {**data, "comments": []}


def _record_v7_to_v8(data: dict[str, Any]) -> dict[str, Any]:
    """v8 added `depends_on` (front matter before it named no dependencies)."""
    return {**data, "depends_on": []}


def _record_v8_to_v9(data: dict[str, Any]) -> dict[str, Any]:
    """v9 added which agent, model and CLI version each role ran (`agents`; unknown before)."""
    return {**data, "agents": {}}


_REWOUND = re.compile(r"continued from round \d+ \(rounds (\d+)[–-](\d+) dropped\)")


def _record_v9_to_v10(data: dict[str, Any]) -> dict[str, Any]:
    """v10 says which rounds' verdicts were `withdrawn` (before it, only the notes of a
    "Continue from round N" said which rounds it dropped), and keeps what the round in flight
    spent (`in_flight`; an older Anima kept it in memory, and lost it to a kill)."""
    dropped: set[int] = set()
    for note in data.get("notes") or []:
        for match in _REWOUND.finditer(str(note)):
            dropped.update(range(int(match.group(1)), int(match.group(2)) + 1))
    iterations = [{**it, "withdrawn": "dropped" if it.get("round") in dropped else None}
                  if isinstance(it, dict) else it for it in data.get("iterations") or []]
    last = iterations[-1] if iterations and isinstance(iterations[-1], dict) else None
    if last is not None and last.get("kind") == "final" and last.get("verdict") == "accepted" \
            and last.get("withdrawn") is None and data.get("status") == "in_progress" \
            and data.get("phase") == "awaiting_review":
        # What a v9 Request changes left (and the next run merged): in progress, still in
        # the phase of the review you asked changes from. A resume or a rewind starts from
        # `paused`, a run from any phase but this one.
        last["withdrawn"] = "changes_requested"
    return {**data, "iterations": iterations,
            "in_flight": {"usage": {}, "cost_usd": 0.0}}


def _record_v10_to_v11(data: dict[str, Any]) -> dict[str, Any]:
    """v11 keeps the usage-limit wait (`limit_wait`; an older Anima kept it in memory, and a
    kill made the next start meet the limit again)."""
    return {**data, "limit_wait": None}


def _record_v11_to_v12(data: dict[str, Any]) -> dict[str, Any]:
    """v12's `in_flight` holds the turn in flight's spend so far, and says how much of it
    is an estimate (`estimated_usd`; an older Anima wrote it only after a turn's result)."""
    spent = data.get("in_flight")
    if not isinstance(spent, dict):
        return data
    return {**data, "in_flight": {**spent, "estimated_usd": 0.0}}


def _state_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 lists every `running` milestone; v2's `current_milestone` was the one, if awake."""
    current = data.get("current_milestone")
    running = [{"id": current}] if data.get("status") == "awake" and current else []
    return {**data, "running": running}


def _state_v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 says which `running` milestones wait for a usage limit, each until its reset; v3
    kept one wait, the project's (kept as it was), and did not say whose it was."""
    running = [{**line, "waiting_until": None, "waiting_reason": None}
               if isinstance(line, dict) else line for line in data.get("running") or []]
    return {**data, "running": running}


#: (kind of file, version) -> the step to version + 1. Each step is pure and small.
_MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("record", 1): _record_v1_to_v2,
    ("record", 2): _record_v2_to_v3,
    ("record", 3): _record_v3_to_v4,
    ("record", 4): _record_v4_to_v5,
    ("record", 5): _record_v5_to_v6,
    ("record", 6): _record_v6_to_v7,
    ("record", 7): _record_v7_to_v8,
    ("record", 8): _record_v8_to_v9,
    ("record", 9): _record_v9_to_v10,
    ("record", 10): _record_v10_to_v11,
    ("record", 11): _record_v11_to_v12,
    ("state", 1): _state_v1_to_v2,
    ("state", 2): _state_v2_to_v3,
    ("state", 3): _state_v3_to_v4,
}


def migrate(data: dict[str, Any], current: int, path: Path, kind: str) -> dict[str, Any]:
    """Bring an older file up to the current schema; refuse one from a newer Anima."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int):
        raise RecordError(path, f"schema_version must be an integer, got {version!r}")
    if version > current:
        raise RecordError(path, f"schema_version {version} was written by a newer Anima "
                                f"(this one reads up to {current}); left untouched")
    while version < current:
        data = _MIGRATIONS[(kind, version)](data)
        version += 1
    data["schema_version"] = current
    return data
