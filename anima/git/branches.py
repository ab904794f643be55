"""Branch moves in a milestone's worktree, committing what the Developer left behind, and
putting a branch back where Anima last accepted it."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from anima.atomic import no_link_above
from anima.errors import GitError
from anima.git.locks import Mended, mend_worktree_state, set_index_aside
from anima.git.repo import RepoBase, StatusEntry, listing, short_hash
from anima.git_options import AGENT_REFLOG_MARK
from anima.paths import is_memory_path, is_under_anima


@dataclass(frozen=True)
class Tips:
    """Where the milestone branch and main are, and whether the branch is checked out in this
    working tree: what the loop reads before and after each agent's turn."""

    branch: str | None  # the branch's commit; None: it does not exist
    main: str | None
    on_branch: bool
    #: the ref the branch names when an agent made it a symbolic ref (None: a branch)
    symbolic: str | None = None


@dataclass(frozen=True)
class Leftovers:
    """What `commit_leftovers` did."""

    commit: str | None  # Anima's commit; None when there was nothing to commit
    #: Untracked repositories nested in the tree, never committed: git would take one as a
    #: submodule with no `.gitmodules` (a commit that only this disk holds), and one with no
    #: commit yet stops `git add` altogether.
    nested: tuple[str, ...] = ()


def _path_git_writes(path: bytes) -> bool:
    """Whether an index entry's path is one git itself writes: relative, inside the tree,
    never into a `.git`."""
    return not path.startswith(b"/") and all(
        part not in (b"", b".", b"..") and part.lower() != b".git" for part in path.split(b"/"))


class BranchOps(RepoBase):
    """Branch moves and the commits Anima makes on its own behalf."""

    def tips(self, branch: str, main: str | None) -> Tips:
        """Both branches' commits and where HEAD is, in one `git for-each-ref` (instead of a
        `symbolic-ref` and a `rev-parse` for each); a ref that does not point at a commit is
        peeled as `resolve` would."""
        names = [f"refs/heads/{name}" for name in (branch, main) if name]
        if not all(self._checked_rev(n) for n in names):
            raise GitError(f"{names!r} are not valid branch names in {self.root}")
        _, out, _ = self._run(
            ["for-each-ref", "--format=%(HEAD)%00%(objecttype)%00%(objectname)%00%(symref)"
             "%00%(refname)", *names],
            what=f"Cannot read the branches {listing(names)} in {self.root}",
        )
        found: dict[str, str | None] = {}
        head = symbolic = None
        for line in os.fsdecode(out).splitlines():
            star, kind, oid, target, ref = [*line.split("\0", 4), "", "", "", ""][:5]
            if ref not in names:  # a pattern also matches refs below it (main/x)
                continue
            found[ref] = oid if kind == "commit" else self.resolve(ref)
            if star == "*":
                head = ref
            if ref == names[0] and target:
                symbolic = target
        return Tips(branch=found.get(names[0]),
                    main=found.get(f"refs/heads/{main}") if main else None,
                    on_branch=head == names[0], symbolic=symbolic)

    def switch(self, branch: str) -> None:
        """Check out an existing branch (local changes are carried over when git allows).
        Quiet: the report of local changes runs git inside each submodule, with its config."""
        code, _, err = self._run(
            ["switch", "-q", "--no-guess", self._rev_arg(branch, "branch name")], check=False)
        if code != 0:
            if not self.branch_exists(branch):
                raise GitError(f"Cannot switch {self.root} to branch {branch!r}: it does not exist")
            raise GitError(f"Cannot switch {self.root} to branch {branch!r}: {err.strip()}")

    def commit_leftovers(self, message: str, keep_out: Collection[str] = ()) -> Leftovers:
        """Commit what the Developer left uncommitted, on its behalf.

        Runs only when something outside `.anima/` is uncommitted: files under `.anima/`
        (an untracked memory/project.md from `anima init`, the human's definitions) are not
        the Developer's leftovers. The commit takes those paths plus `.anima/memory/`;
        runtime files, definitions, the paths in `keep_out` (secrets) and untracked nested
        repositories are never added by Anima. Hooks are skipped: this is Anima's
        bookkeeping, and a failing hook must not stall the round.
        """
        entries, nested = _without_nested(self._status().entries)
        entries = [e for e in entries if e.path not in keep_out]
        if all(is_under_anima(e.path) for e in entries):
            return Leftovers(None, nested)
        paths = [e.path for e in entries if not is_under_anima(e.path) or is_memory_path(e.path)]
        what = f"Cannot commit the leftover changes in {self.root} ({listing(paths)})"
        self._on_paths(["add", "-A"], paths, what)
        self._on_paths([*self._identity_args(), "commit", "-q", "--no-verify", "-m", message],
                       paths, what)
        return Leftovers(self.head(), nested)

    def stashes(self) -> list[tuple[str, str]]:
        """Every stash, newest first: (its commit, the name it was stashed under)."""
        code, out, _ = self._run(["stash", "list", "--format=%H%x00%gs"], check=False)
        found = []
        for line in os.fsdecode(out).splitlines() if code == 0 else []:
            commit, _, subject = line.partition("\0")
            found.append((commit, subject.partition(": ")[2]))  # "On <branch>: <name>"
        return found

    def stash_all(self, name: str) -> str | None:
        """Stash every change outside `.anima/`, untracked files included, as `name`.

        Returns the stash commit's full hash (stable, unlike `stash@{n}`; `git stash apply
        <hash>` restores it and `git stash list` shows `name`), or None when nothing was dirty.
        An untracked nested repository stays where it is (git cannot stash one).
        The paths are named one by one: a pathspec that mentions `.anima` (even to exclude
        it) is refused when the project's own .gitignore ignores `.anima/`.
        """
        entries = [e for e in _without_nested(self._status().entries)[0]
                   if not is_under_anima(e.path)]
        if not entries:
            return None
        paths = [e.path for e in entries]
        what = f"Cannot stash the changes in {self.root} ({listing(paths)})"
        if gone := [e.path for e in entries if e.xy[0] == "D"]:
            # `git stash push <path>` refuses a path whose deletion is staged ("did not
            # match any file(s) known to git"); unstaged, the deletion is stashed all the same.
            self._on_paths(["reset", "-q"], gone, what)
        self._on_paths([*self._identity_args(), "stash", "push", "--include-untracked", "-q",
                        "-m", name], paths, what)
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

    def delete_ref(self, ref: str, expected: str) -> None:
        """Delete `ref`, only while it still points at `expected`."""
        self._run(["update-ref", "-d", ref, expected], what=f"Cannot delete {ref} in {self.root}")

    def rebuild_index(self) -> None:
        """Make the index again from HEAD; the files in the tree are left as they are."""
        self._run(["reset", "-q"], what=f"Cannot make the index of {self.root} again")

    def mend_git_folder(self, branch: str) -> Mended:
        """`mend_worktree_state`, then the index the Developer writes (it must, to commit):
        entries git never writes (a path out of the tree, which Anima's `git add` of the
        leftovers dies on) set it aside, to be made again; flags that hide a file's changes
        from `git status` (`--skip-worktree`, `--assume-unchanged`: the checks would pass on
        a file other than the one committed) are cleared, so its changes are committed
        like any left uncommitted, and judged. A skip-worktree file that is absent is left
        flagged: that is how a sparse checkout leaves the files outside its patterns."""
        mended = mend_worktree_state(self.git_dir, branch,
                                     lambda oid: self.resolve(oid) == oid)
        if mended.reindex:
            return mended
        _, out, _ = self._run(["ls-files", "-s", "-t", "-v", "-z"],
                              what=f"Cannot read the index of {self.root}")
        seen: set[tuple[bytes, bytes]] = set()
        forged: list[str] = []
        hidden: dict[str, list[bytes]] = {"--no-skip-worktree": [], "--no-assume-unchanged": []}
        for item in filter(None, out.split(b"\0")):
            meta, _, path = item.partition(b"\t")
            tag, _mode, _oid, stage = meta.split(b" ")
            if not _path_git_writes(path) or (stage, path) in seen:
                forged.append(os.fsdecode(path))
            # (absent, it is a sparse checkout's: your patterns, which a new worktree takes)
            if tag == b"S" and os.path.lexists(self.root / os.fsdecode(path)):
                hidden["--no-skip-worktree"].append(path)
            if tag.islower():
                hidden["--no-assume-unchanged"].append(path)
            seen.add((stage, path))
        if forged:
            aside = set_index_aside(self.git_dir)
            mended.forged.append(f"the worktree's index held entries git never writes "
                                 f"({listing(forged)}; kept as {aside}); Anima made it again "
                                 "from HEAD, the files are as they were")
            mended.reindex = True
            return mended
        for flag, paths in hidden.items():
            if paths:
                self._run(["update-index", flag, "-z", "--stdin"],
                          stdin=b"".join(p + b"\0" for p in paths),
                          what=f"Cannot clear {flag.removeprefix('--no-')} in {self.root}")
        if names := sorted({os.fsdecode(p) for paths in hidden.values() for p in paths}):
            mended.notes.append(f"{listing(names)} hidden from `git status` (`git update-index "
                                "--skip-worktree` or `--assume-unchanged`); Anima cleared "
                                "that, so what the tree holds there is committed and judged")
        return mended

    def refs_under(self, folder: str) -> list[tuple[str, str]]:
        """(ref, object) of every ref inside `folder` (`refs/heads/x/`)."""
        _, out, _ = self._run(["for-each-ref", "--format=%(refname)%00%(objectname)",
                               folder.rstrip("/") + "/"], check=False)
        return [(ref, oid) for ref, _, oid in
                (line.partition("\0") for line in os.fsdecode(out).splitlines()) if oid]

    def keep_ref(self, ref: str, commit: str) -> None:
        """Point `ref` at `commit`: a ref of Anima's under refs/anima/ (it stays reachable),
        a branch an agent deleted, put back, or one it made a symbolic ref, made a branch
        again (`--no-deref`: the ref itself, never the one it names)."""
        self._run(["update-ref", "--no-deref", ref, commit],
                  what=f"Cannot create {ref} in {self.root}")

    def commit_anima_revert(self, base: str, paths: Sequence[str], message: str) -> str:
        """Commit `paths` back to how `base` has them (absent if it lacks them), and make the
        worktree's files match (else the next `git add -A` commits them again); return the
        new HEAD. Hooks are skipped (Anima's bookkeeping)."""
        what = f"Cannot put back {listing(list(paths))} in a commit in {self.root}"
        self._on_paths(["reset", "-q", self._rev_arg(base)], paths, what)
        self._run([*self._identity_args(), "commit", "-q", "--no-verify", "-m", message],
                  what=what)
        kept = [p for p in paths if self._run(["cat-file", "-e", f"HEAD:{p}"], check=False)[0] == 0]
        if kept:
            self._on_paths(["checkout", "-q", "HEAD"], kept, what)
        for path in set(paths) - set(kept):
            target = self.root / path
            if no_link_above(self.root, path) and (target.is_symlink() or target.is_file()):
                target.unlink()
        return self.head()

    def reset_branch(self, branch: str, commit: str, *, keep_files: bool = False) -> None:
        """Put `branch` back at `commit`; when it is checked out here, its files follow (or,
        `keep_files`, stay as they are, their differences uncommitted)."""
        if self.current_branch() != branch:
            self.keep_ref(f"refs/heads/{branch}", commit)
            return
        self._run(["reset", "-q", "--soft" if keep_files else "--hard", self._rev_arg(commit)],
                  what=f"Cannot reset {branch} to {short_hash(commit)} in {self.root}")


def _without_nested(entries: Sequence[StatusEntry]) -> tuple[list[StatusEntry], tuple[str, ...]]:
    """The entries but untracked nested repositories, and those: with every untracked file
    listed (`--untracked-files=all`), git names a folder only when it holds a repository."""
    nested = tuple(e.path for e in entries if e.kind == "?" and e.path.endswith("/"))
    return [e for e in entries if e.path not in nested], nested
