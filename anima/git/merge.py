"""Merging a finished milestone into main, and settling a merge that died with Anima: the
one place that knows how an unfinished merge is finished or undone."""

from __future__ import annotations

import os
from dataclasses import dataclass

from anima.errors import GitError
from anima.git.branches import BranchOps
from anima.git.repo import (
    listing,
    short_hash,
)


@dataclass(frozen=True)
class MergeOutcome:
    """Result of merging a milestone branch; `detail` is a sentence for the record and log."""

    merged: bool
    detail: str



class Merging(BranchOps):
    """Merging a milestone into main."""

    def merge_of(self, commit: str, into: str) -> str | None:
        """The merge commit on `into` whose second parent is `commit` (the milestone's merge)."""
        full = self.resolve(commit)
        code, out, _ = self._run(
            [
                "rev-list",
                "--merges",
                "--parents",
                "--ancestry-path",
                "--reverse",
                f"{self._rev_arg(commit)}..{self._rev_arg(into, 'branch name')}",
                "--",
            ],
            check=False,
        )
        for line in os.fsdecode(out).splitlines() if code == 0 else []:
            merge, *parents = line.split()
            if full in parents[1:]:
                return merge
        return None


    def merge_branch(self, branch: str, main: str, message: str) -> MergeOutcome:
        """Merge a finished milestone branch into main with `--no-ff`; end on a clean main.

        A conflict aborts the merge and leaves both branches as they were; the outcome names
        the conflicting files. Hooks are skipped, as for `commit_leftovers`.
        """
        for name in (branch, main):
            if not self.branch_exists(name):
                raise GitError(f"Cannot merge {branch} into {main}: there is no branch {name!r}")
        self.ensure_clean()
        self.switch(main)
        with self._keeping_human_files(f"refs/heads/{branch}"):
            code, out, err = self._merge(branch, message)
            if code != 0:  # aborted before the human's files come back in its way
                return self._merge_failed(branch, main, out, err)
        if b"Already up to date" in out:
            return MergeOutcome(True, f"{main} already contains {branch}; nothing to merge")
        return MergeOutcome(True, f"merged {branch} into {main} as {short_hash(self.head())}")


    def _merge(self, branch: str, message: str) -> tuple[int, bytes, str]:
        return self._run(
            [
                *self._identity_args(),
                "merge",
                "--no-ff",
                "--no-edit",
                "--no-verify",
                "-m",
                message,
                f"refs/heads/{branch}",
            ],
            check=False,
        )


    def settle_interrupted_merge(self, main_branches: set[str]) -> str | None:
        """A `git merge` that died with Anima (its stdout pipe closes: SIGPIPE) leaves MERGE_HEAD.

        If the merge commit was made, only the bookkeeping is left: `merge --quit` forgets it.
        A merge into a main branch that was not committed is Anima's own (`merge_on_complete`;
        the Developer never works on main): `merge --abort`, and the completion redoes it. A
        merge on a milestone branch is the Developer's unfinished work: left to its clean-up.
        """
        if not os.path.lexists(self.git_dir / "MERGE_HEAD"):
            return None
        if self._run(["merge-base", "--is-ancestor", "MERGE_HEAD", "HEAD"], check=False)[0] == 0:
            self._run(["merge", "--quit"], check=False)
            return "a merge committed by the previous run had left its state behind: cleared it"
        if (branch := self.current_branch()) in main_branches:
            self._run(["merge", "--abort"], check=False)
            return f"an unfinished merge into {branch} was aborted (the completion redoes it)"
        return None


    def _merge_failed(self, branch: str, main: str, out: bytes, err: str) -> MergeOutcome:
        _, names, _ = self._run(["diff", "--name-only", "-z", "--diff-filter=U"], check=False)
        conflicts = [os.fsdecode(p) for p in names.split(b"\0") if p]
        if os.path.lexists(self.git_dir / "MERGE_HEAD"):
            self._run(
                ["merge", "--abort"],
                what=f"Merging {branch} into {main} failed and could not be aborted in {self.root}",
            )
        if conflicts:
            detail = (
                f"merging {branch} into {main} conflicts in {listing(conflicts)}; the merge "
                f"was aborted, {main} is unchanged and {branch} is kept"
            )
        else:
            reason = (err.strip() or out.decode(errors="replace").strip()).splitlines()
            detail = (
                f"merging {branch} into {main} failed ({' '.join(reason[-3:]) or 'no detail'}); "
                f"{main} is unchanged and {branch} is kept"
            )
        return MergeOutcome(False, detail)
