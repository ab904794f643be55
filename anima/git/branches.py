"""Moving between main and a milestone branch without losing the human's files, committing
what the Developer left behind, and putting a branch back where Anima last accepted it."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from anima.errors import GitError
from anima.git.repo import (
    ANIMA_DIR,
    KEPT_DIR,
    RepoBase,
    is_definition_path,
    is_memory_path,
    is_under_anima,
    listing,
    short_hash,
)
from anima.git_options import AGENT_REFLOG_MARK


class BranchOps(RepoBase):
    """Branch moves and the commits Anima makes on its own behalf."""

    def switch(self, branch: str) -> None:
        """Check out an existing branch (local changes are carried over when git allows).

        The human's files under `.anima/` survive the switch (see `_keeping_human_files`).
        """
        with self._keeping_human_files(f"refs/heads/{branch}"):
            code, _, err = self._run(
                ["switch", "-q", "--no-guess", self._rev_arg(branch, "branch name")],
                check=False,
            )
        if code != 0:
            if not self.branch_exists(branch):
                raise GitError(f"Cannot switch {self.root} to branch {branch!r}: it does not exist")
            raise GitError(f"Cannot switch {self.root} to branch {branch!r}: {err.strip()}")


    @contextlib.contextmanager
    def _keeping_human_files(self, target: str) -> Iterator[None]:
        """Keep the human's `.anima/` definitions and memory on disk, as they are, across a
        checkout or merge of `target`.

        A milestone branch may track them (the Developer's `git add -A`) while main does not:
        git would delete them on the way back to main — `.anima/.gitignore` among them, whose
        loss lets Anima's runtime files into the next commit — and refuses to check out or
        merge over them while they are untracked. So the untracked ones that `target` tracks
        step aside, and afterwards every one of them is back with the human's bytes.
        """
        kept = self._human_anima_files()
        _, listed, _ = self._run(["ls-tree", "-r", "-z", "--name-only", target, "--",
                                  ANIMA_DIR], check=False)
        in_target = {os.fsdecode(p) for p in listed.split(b"\0") if p}
        entries = self._status().entries
        untracked = {e.path for e in entries if e.kind == "?"}
        aside = [p for p in kept if (r := p.relative_to(self.root).as_posix()) in in_target
                 and r in untracked]
        # An edited tracked definition would block the checkout: HEAD's version goes back
        # for the moment.
        edited = [e.path for e in entries if e.kind != "?" and self.root / e.path in kept]
        # A copy on disk first, so a kill in between loses nothing (`restore_kept_files`).
        for path in [*aside, *(self.root / e for e in edited)]:
            copy = self.root / KEPT_DIR / path.relative_to(self.root / ANIMA_DIR)
            copy.parent.mkdir(parents=True, exist_ok=True)
            with copy.open("wb") as fh:
                fh.write(kept[path])
                fh.flush()
                os.fsync(fh.fileno())
        for path in aside:
            path.unlink()
        if edited:
            self._run(["restore", "--source=HEAD", "--staged", "--worktree", "--", *edited],
                      check=False)
        try:
            yield
        finally:
            for path, content in kept.items():
                if not path.exists() or path.read_bytes() != content:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content)
            shutil.rmtree(self.root / KEPT_DIR, ignore_errors=True)


    def restore_kept_files(self) -> list[str]:
        """After a kill in the middle of a switch: the human's files kept aside come back."""
        backup = self.root / KEPT_DIR
        if not backup.is_dir():
            return []
        restored = []
        for copy in sorted(p for p in backup.rglob("*") if p.is_file()):
            target = self.root / ANIMA_DIR / copy.relative_to(backup)
            content = copy.read_bytes()
            if not target.exists() or target.read_bytes() != content:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
                restored.append(target.relative_to(self.root).as_posix())
        shutil.rmtree(backup)
        return restored


    def _human_anima_files(self) -> dict[Path, bytes]:
        """Definitions and memory under `.anima/` (small files), by absolute path."""
        base = self.root / ANIMA_DIR
        kept: dict[Path, bytes] = {}
        for path in base.rglob("*"):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and (is_definition_path(rel) or is_memory_path(rel)):
                kept[path] = path.read_bytes()
        return kept


    def start_milestone_branch(self, branch: str, main: str) -> str:
        """Create `branch` from `main` and check it out; return the base commit.

        On a restart the branch already exists: it is checked out as it is, and the base
        returned is its merge base with `main` (the record's `base_commit` remains the truth).
        """
        if self.branch_exists(branch):
            self.switch(branch)
            return self._text(
                ["merge-base", f"refs/heads/{main}", f"refs/heads/{branch}"],
                what=f"Branch {branch!r} shares no history with {main!r} in {self.root}",
            )
        if self._run(["check-ref-format", f"refs/heads/{branch}"], check=False)[0] != 0:
            raise GitError(f"{branch!r} is not a valid git branch name")
        self.switch(main)
        base = self.head()
        self._run(
            ["switch", "-q", "-c", self._rev_arg(branch, "branch name")],
            what=f"Cannot create branch {branch!r} from {main!r} in {self.root}",
        )
        return base


    def commit_leftovers(self, message: str) -> str | None:
        """Commit what the Developer left uncommitted, on its behalf; return the new hash.

        Runs only when something outside `.anima/` is uncommitted: files under `.anima/`
        (an untracked memory/project.md from `anima init`, the human's definitions) are not
        the Developer's leftovers. The commit takes those paths plus `.anima/memory/`;
        runtime files and definitions are never added by Anima. Hooks are skipped: this is
        Anima's bookkeeping, and a failing hook must not stall the round.
        """
        entries = self._status().entries
        if all(is_under_anima(e.path) for e in entries):
            return None
        paths = [e.path for e in entries if not is_under_anima(e.path) or is_memory_path(e.path)]
        spec = b"\0".join(os.fsencode(p) for p in paths) + b"\0"
        what = f"Cannot commit the leftover changes in {self.root} ({listing(paths)})"
        self._run(
            ["--literal-pathspecs", "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"],
            stdin=spec,
            what=what,
        )
        self._run(
            [
                *self._identity_args(),
                "--literal-pathspecs",
                "commit",
                "-q",
                "--no-verify",
                "-m",
                message,
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
            ],
            stdin=spec,
            what=what,
        )
        return self.head()


    def stash_all(self, name: str) -> str | None:
        """Stash every change outside `.anima/`, untracked files included, as `name`.

        Returns the stash commit's full hash (stable, unlike `stash@{n}`; `git stash apply
        <hash>` restores it and `git stash list` shows `name`), or None when nothing was dirty.
        The paths are named one by one: a pathspec that mentions `.anima` (even to exclude
        it) is refused when the project's own .gitignore ignores `.anima/`.
        """
        paths = self.dirty_paths()
        if not paths:
            return None
        self._run(
            [
                *self._identity_args(),
                "--literal-pathspecs",
                "stash",
                "push",
                "--include-untracked",
                "-q",
                "-m",
                name,
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
            ],
            stdin=b"\0".join(os.fsencode(p) for p in paths) + b"\0",
            what=f"Cannot stash the changes in {self.root} ({listing(paths)})",
        )
        return self._text(["rev-parse", "--verify", "refs/stash"])


    def agent_visits_since(self, since: float, branch: str) -> set[str]:
        """Commits an agent reached since `since` (Unix time): what this working tree's HEAD
        pointed at (checked out, committed), and where an agent's git moved `branch` from any
        worktree (its reflog entries carry the agents' mark)."""
        visits = {commit for commit, _ in self._reflog_since("HEAD", since)}
        return visits | {commit for commit, subject in self._reflog_since(
            f"refs/heads/{branch}", since) if subject.startswith(AGENT_REFLOG_MARK)}


    def _reflog_since(self, ref: str, since: float) -> list[tuple[str, str]]:
        code, out, _ = self._run(
            ["reflog", "show", "--date=unix", "--format=%H %gd %gs", ref, "--"], check=False
        )
        entries = []
        for line in os.fsdecode(out).splitlines() if code == 0 else []:
            commit, _, rest = line.partition(" ")
            selector, _, subject = rest.partition(" ")
            stamp = selector[selector.find("{") + 1 : -1]
            if stamp.isdigit() and int(stamp) >= int(since):
                entries.append((commit, subject))
        return entries


    def keep_ref(self, ref: str, commit: str) -> None:
        """Point `ref` at `commit`: a ref of Anima's under refs/anima/ (it stays reachable),
        or a branch an agent deleted, put back."""
        self._run(["update-ref", ref, commit], what=f"Cannot create {ref} in {self.root}")


    def commit_anima_revert(self, base: str, paths: Sequence[str], message: str) -> str:
        """Commit `paths` back to how `base` has them (absent if it lacks them), leaving the
        working tree alone; return the new HEAD. Hooks are skipped (Anima's bookkeeping)."""
        spec = b"\0".join(os.fsencode(p) for p in paths) + b"\0"
        what = f"Cannot put back {listing(list(paths))} in a commit in {self.root}"
        self._run(
            ["--literal-pathspecs", "reset", "-q", self._rev_arg(base), "--pathspec-from-file=-",
             "--pathspec-file-nul"],
            stdin=spec,
            what=what,
        )
        self._run([*self._identity_args(), "commit", "-q", "--no-verify", "-m", message],
                  what=what)
        return self.head()


    def reset_branch(self, branch: str, commit: str) -> None:
        """Put `branch` back at `commit`; when it is checked out, its files follow (the
        human's `.anima/` files are kept as they are)."""
        if self.current_branch() != branch:
            self.keep_ref(f"refs/heads/{branch}", commit)
            return
        with self._keeping_human_files(commit):
            self._run(["reset", "-q", "--hard", self._rev_arg(commit)],
                      what=f"Cannot reset {branch} to {short_hash(commit)} in {self.root}")
