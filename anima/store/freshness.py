"""When a milestone's definition arrived or changed, from the files' times alone.

Apart from the records' models so that `anima status --json`, which scripts poll, asks it the
same way the full scan does without loading pydantic.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from anima.paths import ProjectPaths


def changed_after(path: Path, when: float) -> bool:
    """Whether `path` changed after `when` (a `mv` keeps an older mtime: ctime counts). One
    that cannot be looked at counts as changed: reading it says why."""
    try:
        st = path.stat()
    except OSError:
        return True
    return max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > when


def defined_after_record(paths: ProjectPaths, milestone_id: str) -> bool:
    """Whether a pending milestone may read otherwise than its record says: its `.md` or the
    config (its review and round limit) changed after the record was written. A record
    without its `.md` is listed as it is."""
    if not paths.milestone_md(milestone_id).exists():
        return False
    try:
        written = paths.milestone_record(milestone_id).stat().st_mtime_ns / 1e9
    except OSError:
        return True
    return changed_after(paths.milestone_md(milestone_id), written) or \
        changed_after(paths.config, written)


def arrival(path: Path) -> datetime:
    """When a file arrived where it is, as the watcher would have stamped it: its ctime, which
    a `mv` or a copy sets (an edit since moves it on too). Now, for one gone meanwhile."""
    try:
        return datetime.fromtimestamp(path.stat().st_ctime_ns / 1e9, UTC)
    except OSError:
        return datetime.now(UTC)
