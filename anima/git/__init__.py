"""The managed project's git repository, shaped for the loop's per-round checks.

`GitRepo` is one handle composed of one part per job: the plumbing (`repo`), branch moves and
Anima's own commits (`branches`), the Developer-commit checks (`check`), the Acceptor's review
guard (`review_guard`), history reading (`history`), merging into main (`merge`) and each
milestone's worktree (`worktrees`).
"""

from __future__ import annotations

from anima.git.check import CommitCheck
from anima.git.merge import MergeOutcome, Merging
from anima.git.review_guard import ReviewGuard, TreeSnapshot
from anima.git.worktrees import Worktree
from anima.paths import is_definition_path, is_memory_path, is_under_anima


class GitRepo(CommitCheck, ReviewGuard, Merging):
    """The managed project's git repository, as the loop needs it (`GitRepo.open(root)`)."""


__all__ = ["GitRepo", "MergeOutcome", "TreeSnapshot", "Worktree", "is_definition_path",
           "is_memory_path", "is_under_anima"]
