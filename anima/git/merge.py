"""Merging a finished milestone into main without touching the human's work: computed in
git's object store, main moved last, and a kill at any point leaves either the old main or the
merge, never half of one."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from anima.errors import GitError
from anima.git.branches import BranchOps
from anima.git.history import History
from anima.git.locks import admin_dir
from anima.git.repo import (
    DIFF_SUBMODULES,
    IN_PROGRESS,
    StatusEntry,
    listing,
    short_hash,
)
from anima.git.worktrees import Worktree, Worktrees
from anima.paths import is_under_anima


@dataclass(frozen=True)
class MergeOutcome:
    """Result of merging a milestone branch; `detail` is a sentence for the record and log."""

    merged: bool
    detail: str
    #: the human's files that keep the merge waiting (changed in their checkout on main)
    waiting: list[str] = field(default_factory=list)
    #: not merged yet, but it will be when tried again (the human's files, main moving)
    retry: bool = False
    #: the files where the branch and main conflict (the branch must take main in first)
    conflicts: list[str] = field(default_factory=list)



class Merging(BranchOps, History, Worktrees):
    """Merging a milestone into main (call on the human's checkout)."""

    def _humans_worktrees(self) -> list[Worktree]:
        """The worktrees of the human's elsewhere (a milestone's under `.anima/` is not)."""
        return [tree for tree in self.worktrees()
                if not tree.prunable and tree.path.is_dir() and not (
                    tree.path.is_relative_to(self.root)
                    and is_under_anima(tree.path.relative_to(self.root).as_posix()))]

    def _checkout_on(self, branch: str, humans: list[Worktree]) -> Self | None:
        """The human's checkout that has `branch` checked out (git lets one have it): this
        one, or one of their worktrees `humans`; None when none has."""
        if self.current_branch() == branch:
            return self
        tree = next((t for t in humans if t.branch == branch), None)
        return None if tree is None else self.worktree_repo(tree.path)

    def _rebasing(self, branch: str, humans: list[Worktree]) -> Path | None:
        """A checkout of the human's (this one, or one of their worktrees `humans`) in the
        middle of a rebase of `branch` (its HEAD is detached meanwhile): moving the branch
        under it would fail the rebase at its end."""
        git_dirs = [(self.root, self.git_dir)]
        for tree in humans:
            with contextlib.suppress(OSError):
                git_dirs.append((tree.path, admin_dir(self.common_dir, tree.path)))
        for where, git_dir in git_dirs:
            for state in ("rebase-merge", "rebase-apply"):
                with contextlib.suppress(OSError):
                    head = (git_dir / state / "head-name").read_text(encoding="utf-8")
                    if head.strip() == f"refs/heads/{branch}":
                        return where
        return None

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

    def _merge_tree(self, ours: str, theirs: str) -> tuple[int, str, list[str], str]:
        """git's merge of two commits, in the object store only: (exit code, the merged
        tree, the conflicting files, stderr).

        Run on an empty work tree: git 2.39 reads a merge's attributes (`merge=union`) from the
        work tree's `.gitattributes`, which in your checkout may be a file you have not
        committed or a branch nobody reviewed; with none, a conflict is one."""
        with tempfile.TemporaryDirectory(prefix="anima-merge-") as empty:
            code, out, err = self._run(["merge-tree", "--write-tree", "-z", "--name-only",
                                        "--no-messages", ours, theirs], check=False,
                                       work_tree=Path(empty))
        tree, *names = [os.fsdecode(p) for p in out.split(b"\0") if p] or [""]
        return code, tree, sorted(set(names)), err

    def merge_conflicts(self, commit: str, main: str) -> list[str]:
        """The files where merging `commit` into `main` conflicts (none: it merges)."""
        code, _, names, _ = self._merge_tree(f"refs/heads/{self._rev_arg(main, 'branch')}",
                                             self._rev_arg(commit))
        return names if code == 1 else []

    def merge_branch(self, branch: str, main: str, message: str,
                     replaceable: dict[str, bytes] | None = None,
                     tip: str | None = None) -> MergeOutcome:
        """Merge a finished milestone branch into main with a merge commit, without checking
        anything out: whatever branch the human's checkout is on, main gets the merge.

        The merge is computed in git's object store (`merge-tree`): a conflict leaves every
        branch and file as it was and names the files. When the human's checkout (or a
        worktree of theirs elsewhere) is on main, its files follow main (`read-tree -m -u`,
        which refuses, all or nothing, to touch a file the human changed or an untracked one
        in the way): then the merge waits, naming them (`MergeOutcome.waiting`). main moves
        last, only from where it was read.
        `replaceable`: untracked files of the human's that the merge may replace while they
        hold exactly these bytes (memory notes the Developer started from).
        `tip`: the commit to merge (the one a final acceptance judged; None: the branch's
        tip). The branch is the Developer's to write: read again here, it could have moved
        since the caller checked it, and main would get a commit nobody judged.
        """
        replaceable = replaceable or {}
        for name in (branch, main):
            if not self.branch_exists(name):
                raise GitError(f"Cannot merge {branch} into {main}: there is no branch {name!r}")
        before = self.branch_head(main)
        tip = self.branch_head(branch) if tip is None else self.resolve(tip)
        if tip is None:
            raise GitError(f"Cannot merge {branch} into {main}: its commit is missing")
        if self.is_ancestor(tip, before):
            return MergeOutcome(True, f"{main} already contains {branch}; nothing to merge")
        humans = self._humans_worktrees()
        if (rebasing := self._rebasing(main, humans)) is not None:
            return MergeOutcome(False, f"the merge of {branch} into {main} waits: {rebasing} "
                                       f"is in the middle of a rebase of {main}; finish it "
                                       "(`git rebase --continue`) or abort it and the merge "
                                       "goes on", retry=True)
        code, tree, conflicts, err = self._merge_tree(before, tip)
        if code != 0:
            if code == 1 and conflicts:
                return MergeOutcome(False, f"merging {branch} into {main} conflicts in "
                                           f"{listing(conflicts)}; {main} is unchanged "
                                           f"and {branch} is kept", conflicts=conflicts)
            reason = (err.strip() or "no detail").splitlines()
            return MergeOutcome(False, f"merging {branch} into {main} failed "
                                       f"({' '.join(reason[-3:])}); {main} is unchanged and "
                                       f"{branch} is kept")
        merge = self._text([*self._identity_args(), "commit-tree", tree, "-p", before,
                            "-p", tip, "-m", message],
                           what=f"Cannot write the merge of {branch} into {main}")
        checkout = self._checkout_on(main, humans)
        aside: dict[Path, Path] = {}
        if checkout is not None:
            where = "your checkout" + ("" if checkout is self else f" at {checkout.root}")
            waits, aside = checkout._checkout_merge(before, merge, replaceable, where)
            if waits is not None:
                files, why = waits
                return MergeOutcome(False, f"the merge of {branch} into {main} waits: {why}",
                                    waiting=files, retry=True)
        code, _, err = self._run(["update-ref", "-m", f"anima: {message}", f"refs/heads/{main}",
                                  merge, before], check=False)
        if code != 0:  # put the checkout back, try again later
            now = self.resolve(f"refs/heads/{main}") or before
            if checkout is not None:  # to where main is now: a commit of the human's
                # meanwhile holds the merge's files, which going back to `before` would
                # stage for deletion
                checkout._run(["read-tree", "-m", "-u", merge, now], check=False)
            # Where main's file took a place (main moved), the one aside waits for the next try.
            _put_back({path: held for path, held in aside.items() if not os.path.lexists(path)})
            _raise_if_full(err, self.root, f"{main} could not be moved to the merge of {branch}")
            if now == before:  # a lock, most likely
                return MergeOutcome(False, f"{main} could not be moved to the merge of "
                                           f"{branch} ({err.strip()}); the merge is tried "
                                           "again", retry=True)
            return MergeOutcome(False, f"{main} moved while {branch} was merged into it "
                                       f"({err.strip()}); the merge is tried again",
                                retry=True)
        for held in aside.values():
            held.unlink(missing_ok=True)
        return MergeOutcome(True, f"merged {branch} into {main} as {short_hash(merge)}")

    def _checkout_merge(self, before: str, merge: str, replaceable: dict[str, bytes],
                        where: str) -> tuple[tuple[list[str], str] | None, dict[Path, Path]]:
        """Make this checkout (`where`, on main at `before`) show `merge`'s files, all or
        nothing: the files in the way and why not, or None; and the replaceable files set
        aside for it (each under a name of its own, until main has the merge)."""
        entries = self._status().entries
        if unresolved := sorted(e.path for e in entries if e.kind == "u"):
            return (unresolved, self._unresolved(where, unresolved)), {}
        touched = {change.path for change in self.raw_changes(before, merge)}
        left = self._left_aside(replaceable)
        if waiting := self._in_the_way(entries, touched, before, merge, replaceable):
            return (waiting, f"{where} has changes to {listing(waiting)} (or files of its own "
                             "there), which the merge changes too; commit, stash or move them "
                             "away and it goes on"), {}
        present = {rel for rel in touched if os.path.lexists(self.root / rel)}
        folders = {str(d) for rel in touched for d in Path(rel).parents
                   if _is_dir(self.root / d)}
        fresh = self._step_aside(touched, replaceable, merge)
        code, _, err = self._run(["read-tree", "-m", "-u", before, merge], check=False)
        if code != 0 and (written := self._written_as_merged(touched, before, merge)):
            # A checkout of the merge that a kill cut short: the files it wrote already
            # read as the merge has them; staged, the same all-or-nothing checkout ends.
            self._run(["update-index", "--add", "--remove", "--", *written], check=False)
            code, _, err = self._run(["read-tree", "-m", "-u", before, merge], check=False)
        if code == 0:
            return None, left | fresh
        if _full(err, self.root):  # it wrote part of the merge's files before it failed
            self._undo_checkout(touched - present, present, folders, before)
        _put_back(fresh)  # what an earlier try set aside stays so until the next
        _raise_if_full(err, self.root, f"{where} could not take the merge's files")
        files = [line.split("'")[1] for line in err.splitlines() if line.count("'") >= 2]
        return (files, f"in {where}, {err.strip().splitlines()[0]}"), {}

    def _unresolved(self, where: str, files: list[str]) -> str:
        """Why a checkout whose index holds conflicts keeps the merge waiting (git takes no
        other tree into it, whatever files the merge changes), naming the operation of the
        human's that left them, if any (a `git stash pop` leaves none)."""
        label = next((label for marker, _, label in IN_PROGRESS
                      if os.path.lexists(self.git_dir / marker)), None)
        return (f"{where} has unresolved conflicts in {listing(files)}"
                + (f" ({label} of yours)" if label else "")
                + "; resolve them" + (" and finish or abort it" if label else "")
                + ", and it goes on")

    def _undo_checkout(self, created: set[str], present: set[str], folders: set[str],
                       before: str) -> None:
        """What a checkout that failed half way (a full disk) wrote: the files it made go
        (and the folders it made for them), the tracked ones it began to rewrite read as
        main has them again. Left, they would read as the human's changes, and the merge
        would wait for them for ever."""
        for rel in sorted(created):
            path = self.root / rel
            if path.is_symlink() or path.is_file():
                path.unlink()
            for folder in Path(rel).parents:
                if str(folder) in folders or not _is_dir(self.root / folder):
                    break
                with contextlib.suppress(OSError):  # not empty: something else is there
                    (self.root / folder).rmdir()
        if tracked := [rel for rel in sorted(present) if self.blob(before, rel) is not None]:
            self._run(["checkout", "-q", before, "--", *tracked], check=False)

    def _reads_as(self, rel: str, content: bytes | None) -> bool:
        """Whether the human's `rel` is a regular file holding exactly `content`. A path
        longer than PATH_MAX from the checkout's root (git names it from the tree's top)
        reads as no file."""
        file = self.root / rel
        try:
            return content is not None and file.is_file() and not file.is_symlink() \
                and file.read_bytes() == content
        except OSError:
            return False

    def blob(self, commit: str, rel: str) -> bytes | None:
        """A file's bytes in a commit (`rel` from the root), None if it has none."""
        code, blob, _ = self._run(["cat-file", "blob", f"{commit}:{rel}"], check=False)
        return blob if code == 0 else None

    def _written_as_merged(self, touched: set[str], before: str, merge: str) -> list[str]:
        """Paths the merge changes whose file already reads as the merge has it (or is gone
        where the merge deletes it) while the index still holds main's entry."""
        written = []
        for path in sorted(touched):
            blob = self.blob(merge, path)
            staged = self._run(["diff", DIFF_SUBMODULES, "--cached", "--quiet", before, "--",
                                path], check=False)[0] == 0
            gone = blob is None and not os.path.lexists(self.root / path)
            if staged and (gone or self._reads_as(path, blob)):
                written.append(path)
        return written

    def _left_aside(self, replaceable: dict[str, bytes]) -> dict[Path, Path]:
        """What an earlier try that a kill cut short set aside: back in place where nothing
        took its place; else (its checkout wrote the merge's file there) still aside, to go
        once main has the merge, like a file set aside now."""
        left = {}
        for rel in replaceable:
            path = self.root / rel
            held = _aside(path)
            if not held.is_file() or held.is_symlink():
                continue
            if os.path.lexists(path):
                left[path] = held
            else:
                os.replace(held, path)
        return left

    def _step_aside(self, touched: set[str], replaceable: dict[str, bytes],
                    merge: str) -> dict[Path, Path]:
        """Rename the replaceable untracked files the merge brings out of its way (a rename
        needs no free space, a rewrite would); returns where each went. One whose index
        entry is already the merge's (an earlier try's checkout) stays: the checkout would
        not write it back."""
        aside = {}
        for rel, content in replaceable.items():
            if rel in touched and self._reads_as(rel, content) and self._run(
                    ["diff", DIFF_SUBMODULES, "--cached", "--quiet", merge, "--", rel],
                    check=False)[0] != 0:
                path = self.root / rel
                aside[path] = _aside(path)
                os.replace(path, aside[path])
        return aside

    def _in_the_way(self, entries: tuple[StatusEntry, ...], touched: set[str], before: str,
                    merge: str, replaceable: dict[str, bytes]) -> list[str]:
        """The human's changed or untracked files (`entries`, their checkout's status) that
        the merge would change, ignored ones too (a local config the branch adds, which the
        checkout would overwrite), unless the file already reads as the merge has it (a kill
        right after the checkout followed) or is a replaceable one as it was."""
        listed = {e.path for e in entries if e.path in touched}
        _, out, _ = self._run(["diff", DIFF_SUBMODULES, "--name-only", "--no-renames",
                               "--diff-filter=A", "-z", before, merge, "--"])
        added = {os.fsdecode(p) for p in out.split(b"\0") if p}
        listed |= {p for p in added if os.path.lexists(self.root / p)}  # untracked, ignored
        return [path for path in sorted(listed)
                if not self._reads_as(path, replaceable.get(path))
                and not self._reads_as(path, self.blob(merge, path))]


def _is_dir(path: Path) -> bool:
    """`Path.is_dir`, False for a path it cannot ask about (longer than PATH_MAX: git names
    files from the tree's top, so a commit may hold one)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _aside(path: Path) -> Path:
    """Where `_step_aside` puts `path`."""
    return path.with_name(f".{path.name}.anima-aside")


def _put_back(aside: dict[Path, Path]) -> None:
    """The files `_step_aside` moved, back where they were."""
    for path, held in aside.items():
        with contextlib.suppress(FileNotFoundError):
            os.replace(held, path)


#: Free bytes below which a git that failed to write is taken to have met a full disk (its
#: message may only say "unable to write file").
_FULL_BELOW = 1 << 20


def _full(err: str, root: Path) -> bool:
    if "No space left on device" in err or "Disk quota exceeded" in err:
        return True
    try:
        return shutil.disk_usage(root).free < _FULL_BELOW
    except OSError:
        return False


def _raise_if_full(err: str, root: Path, what: str) -> None:
    """A git that could not write for want of space: the disk is full, which Anima stops
    for and names (not a merge that waits for the human's files, nor main that moved)."""
    if _full(err, root):
        raise OSError(errno.ENOSPC, f"{what}: {err.strip().splitlines()[-1]}")
