"""A project seen without driving it: who drives it now, and its records and transcript read
from the files. A second window on a project another Anima runs shows it this way, writing
nothing, until the lock is free."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from anima.config import load_config
from anima.engine.merged import merged_by_you
from anima.errors import AnimaError
from anima.events import TranscriptEvent
from anima.journal import read_transcript_tail
from anima.lock import LockInfo, ProjectLock
from anima.paths import ProjectPaths
from anima.store.store import Scan, Store

log = logging.getLogger(__name__)

#: How much of a transcript a window replays: more lines than its panes keep.
REPLAY_BYTES = 4 * 2**20


def driven_elsewhere(root: Path) -> LockInfo | None:
    """The live process that holds the project's lock, unless it is this one."""
    holder = ProjectLock(ProjectPaths(root).lock).holder()
    return None if holder is None or holder.pid == os.getpid() else holder


def files_stamp(root: Path) -> tuple[tuple[str, int, int], ...]:
    """What the records depend on, as (name, mtime_ns, size): a window reads them again only
    when this changed (a hundred long records take tens of ms to validate)."""
    paths = ProjectPaths(root)
    stamps = []
    for path in (paths.config, paths.state, *sorted(paths.milestones.glob("*"))):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        stamps.append((path.name, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


def read_records(root: Path) -> Scan:
    """Every readable record and what is wrong with the others; registers nothing."""
    paths = ProjectPaths(root)
    config = load_config(paths.config)
    return Store(paths).scan(max_iterations=config.max_iterations_per_milestone,
                             requires_human_review=config.requires_human_review, register=False,
                             in_main=merged_by_you(root))


def last_transcript(root: Path) -> tuple[str | None, list[TranscriptEvent]]:
    """The current milestone (state.json) and the newest events of its transcript."""
    paths = ProjectPaths(root)
    try:
        milestone_id = Store(paths).load_state().current_milestone
    except AnimaError as e:  # a corrupt state.json is reported when the engine starts
        log.info("no transcript replay: %s", e)
        return None, []
    if not milestone_id:
        return None, []
    return milestone_id, read_transcript_tail(paths.transcripts(milestone_id), REPLAY_BYTES)


def transcript(root: Path, milestone_id: str) -> list[TranscriptEvent]:
    """The newest events of one milestone's transcript (a read-only window's page)."""
    return read_transcript_tail(ProjectPaths(root).transcripts(milestone_id), REPLAY_BYTES)
