"""Whether you merged a milestone yourself: with `merge_on_complete` off Anima merges nothing,
and a milestone that depends on one waits until main has what its final acceptance judged."""

from __future__ import annotations

from pathlib import Path

from anima.errors import GitError
from anima.store.dependencies import InMain
from anima.store.models import MilestoneRecord


def merged_by_you(root: Path) -> InMain:
    """For the project at `root`. Git runs (and loads) only when asked: `anima status` asks
    only about a completed milestone Anima did not merge."""
    def merged(record: MilestoneRecord) -> bool:
        from anima.git import GitRepo

        tip = record.accepted_tip
        if tip is None or not record.main_branch:
            return False
        try:
            return GitRepo.open(root).is_ancestor(tip, record.main_branch)
        except GitError:
            return False
    return merged
