"""One git worktree per milestone: created when it starts, re-attached after a crash, removed
when it ends. The human's own checkout is never switched, stashed or cleaned by Anima; each
milestone's agents, checks and git commands work in `.anima/worktrees/<id>` instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import git

from anima.errors import GitError
from anima.git.locks import admin_dir
from anima.git.repo import RepoBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Worktree:
    """One entry of `git worktree list`: where it is, and its branch (None: detached)."""

    path: Path
    branch: str | None
    prunable: bool
    #: a `git worktree add` killed before its checkout ended: git's own lock still says
    #: "initializing", and the tree is half checked out (its missing files read as deleted)
    half_made: bool = False


#: Held while a worktree is added or removed: milestones start on threads of their own, and
#: `git worktree add` can read another add's half-made `.git/worktrees/<id>/` and fail.
_CHANGING = threading.Lock()


class Worktrees(RepoBase):
    """The worktrees of the project's repository (call on the human's checkout)."""

    def worktrees(self) -> list[Worktree]:
        """Every linked worktree (not the main checkout), in one call."""
        _, out, _ = self._run(["worktree", "list", "--porcelain", "-z"], check=False)
        found: list[Worktree] = []
        for block in os.fsdecode(out).split("\0\0"):
            fields = dict(line.partition(" ")[::2] for line in block.split("\0") if line)
            if "worktree" not in fields:
                continue
            path = Path(fields["worktree"])
            if path == self.root:
                continue
            branch = fields.get("branch", "").removeprefix("refs/heads/") or None
            found.append(Worktree(path, branch, "prunable" in fields,
                                  fields.get("locked") == "initializing"))
        return found

    def worktree_repo(self, path: Path) -> Self:
        """The linked worktree at `path` as a repository of its own, its git folder found
        from this side (`admin_dir`) and named in every command, so a `.git` file that whatever
        writes the tree rewrote (to a repository of its own) is never read. GitError when git
        does not know it."""
        try:
            admin = admin_dir(self.common_dir, path)
        except FileNotFoundError as exc:
            raise GitError(str(exc)) from None
        return type(self)(git.Git(path), path, admin, self.common_dir)

    def add_worktree(self, path: Path, branch: str, main: str) -> str:
        """Check `branch` out at `path`, creating it from `main`'s tip when it is missing;
        return the milestone's base commit.

        A restart finds what a kill left: the worktree is kept as it is (it may hold the
        Developer's uncommitted work, or be where an agent switched it: the caller puts it
        back on `branch`, `recover_milestone`); a registration whose folder is gone is
        pruned, and one a killed `git worktree add` left half checked out is removed, and
        the worktree added again. Anything else at `path` is not overwritten.
        """
        if self._run(["check-ref-format", f"refs/heads/{branch}"], check=False)[0] != 0:
            raise GitError(f"{branch!r} is not a valid git branch name")
        with _CHANGING:
            self._add_worktree(path, branch, main)
        return self._text(["merge-base", f"refs/heads/{main}", f"refs/heads/{branch}"],
                          what=f"Branch {branch!r} shares no history with {main!r} in "
                               f"{self.root}")

    def _add_worktree(self, path: Path, branch: str, main: str) -> None:
        if not self.branch_exists(branch):
            self._run(["branch", "--no-track", self._rev_arg(branch, "branch name"),
                       f"refs/heads/{self._rev_arg(main, 'branch name')}"],
                      what=f"Cannot create branch {branch!r} from {main!r} in {self.root}")
        here = next((w for w in self.worktrees() if w.path == path), None)
        if here is not None and here.half_made:  # only git wrote there: made again
            log.warning("%s was left half checked out by a `git worktree add` that was "
                        "killed; removed and added again", path)
            self._remove_worktree(path)
            here = None
        if here is not None and (here.prunable or not path.exists()):
            self._run(["worktree", "prune"], check=False)
            here = None
        if here is None:
            if path.exists() and any(path.iterdir()):
                raise GitError(f"{path} exists and is not a worktree of {self.root}; move it "
                               "away, then resume the milestone")
            path.parent.mkdir(parents=True, exist_ok=True)
            # git's parallel checkout (a worker per CPU): 10,000 files soon after another
            # milestone's worktree was removed took ~7 s one by one, ~1 s so (on an ext4
            # without a journal, bench/isolation.py)
            self._run(["-c", "checkout.workers=0", "worktree", "add", "--quiet", str(path),
                       self._rev_arg(branch, "branch name")],
                      what=f"Cannot add a worktree for {branch} at {path}")

    def remove_worktree(self, path: Path) -> bool:
        """Remove a milestone's worktree (its branch stays); True when there was one. Call
        only once what it held is committed or stashed: its files go."""
        with _CHANGING:
            return self._remove_worktree(path)

    def _remove_worktree(self, path: Path) -> bool:
        known = any(w.path == path for w in self.worktrees())
        if known:
            self._run(["worktree", "remove", "--force", "--force", str(path)], check=False)
        if path.exists():  # not registered (a copy, a half-made add): Anima's folder anyway
            shutil.rmtree(path, ignore_errors=True)
        self._run(["worktree", "prune"], check=False)
        return known
