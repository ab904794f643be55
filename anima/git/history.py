"""Reading a milestone's history: its commits, their changed files and their diffs."""

from __future__ import annotations

import os

from anima.git.repo import (
    RepoBase,
    short_hash,
)


class History(RepoBase):
    """A milestone's commits, files and diffs."""

    def branch_log(self, base_commit: str, branch: str) -> list[tuple[str, str]]:
        """(full hash, subject) of each commit in base..branch, oldest first."""
        out = self._text(
            [
                "log",
                "--reverse",
                "--no-show-signature",
                "--format=%H%x1f%s",
                f"{self._rev_arg(base_commit)}..{self._rev_arg(branch, 'branch name')}",
                "--",
            ],
            what=f"Cannot read the log of {branch} since {short_hash(base_commit)} in {self.root}",
        )
        pairs: list[tuple[str, str]] = []
        for line in out.splitlines():
            commit, _, subject = line.partition("\x1f")
            pairs.append((commit, subject))
        return pairs


    def oneline_log(self, base: str, branch: str) -> str:
        """`git log --oneline base..branch` (newest first), for prompts and the UI."""
        return self._text(
            [
                "log",
                "--oneline",
                "--no-decorate",
                "--no-color",
                "--no-show-signature",
                f"{self._rev_arg(base)}..{self._rev_arg(branch, 'branch name')}",
                "--",
            ],
            what=f"Cannot read the log of {branch} since {short_hash(base)} in {self.root}",
        )


    def changed_files_between(self, old: str, new: str) -> list[str]:
        """Files that differ between two commits (a round's work: its start head to its commit)."""
        _, out, _ = self._run(
            [
                "diff",
                "--name-only",
                "-z",
                "--no-renames",
                "--no-ext-diff",
                f"{self._rev_arg(old)}^{{commit}}",
                f"{self._rev_arg(new)}^{{commit}}",
                "--",
            ],
            what=f"Cannot list the files changed between {old} and {new} in {self.root}",
        )
        return [os.fsdecode(p) for p in out.split(b"\0") if p]


    def diff_bytes(self, old: str, new: str, *options: str) -> bytes:
        """`git diff <options> old new` as raw bytes: the Changes view's numstat and patch.

        Prefixes, colour, external and textconv drivers are pinned so a user's git config
        cannot change the format the parser reads.
        """
        _, out, _ = self._run(
            [
                "-c",
                "core.quotepath=false",
                "diff",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--no-relative",
                "-M",
                "--src-prefix=a/",
                "--dst-prefix=b/",
                *options,
                f"{self._rev_arg(old)}^{{commit}}",
                f"{self._rev_arg(new)}^{{commit}}",
                "--",
            ],
            what=f"Cannot diff {short_hash(old)}..{short_hash(new)} in {self.root}",
        )
        return out
