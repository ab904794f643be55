"""The Acceptor reviews, it does not change: a snapshot of the tree before its turn and a
restore that undoes whatever it did (commits, edits, half-done git operations)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

from anima.atomic import read_regular
from anima.errors import GitError
from anima.git.repo import IN_PROGRESS, RepoBase, StatusEntry, TreeStatus, listing, short_hash
from anima.paths import is_under_anima


@dataclass(frozen=True)
class TreeSnapshot:
    """Where the repository stood before an Acceptor review, so `restore` can undo the review.

    `fingerprint` holds one `(path, status, content digest)` triple per dirty or untracked
    path outside `.anima/` (porcelain v2 status fields, sorted by path); two snapshots of an
    unchanged tree compare equal.
    """

    head: str
    branch: str | None
    fingerprint: tuple[tuple[str, str, str], ...]



class ReviewGuard(RepoBase):
    """Undoing an Acceptor's changes."""

    def snapshot(self) -> TreeSnapshot:
        """Record HEAD, branch and the tree outside `.anima/` (one git call)."""
        status = self._status()
        if status.head is None:
            raise GitError(f"{self.root} is on a branch with no commits; cannot snapshot it")
        return TreeSnapshot(status.head, status.branch, self._fingerprint(status.entries))

    def restore(self, snap: TreeSnapshot) -> list[str]:
        """Undo whatever happened since `snap` (an Acceptor review); describe what was undone.

        One git call when nothing changed. Otherwise: unfinished merges/rebases are
        forgotten, HEAD and the branch are moved back (a reviewer's commits are dropped from
        the branch but stay in the reflog), the index is reset, new or changed tracked files
        are restored, and untracked files created since the snapshot are deleted. Nothing
        under `.anima/` is touched, untracked files from before the snapshot are kept, and
        paths that were already dirty at snapshot time are never overwritten (a change to
        them is only reported).
        """
        undone = self.end_operations("quit")
        status = self._status()
        fingerprint = self._fingerprint(status.entries)
        moved = status.head != snap.head or status.branch != snap.branch
        if not moved and not undone and fingerprint == snap.fingerprint:
            return []
        if moved:
            undone += self._move_head(snap, status)
            self._run(["reset", "-q"], what=f"Cannot reset the index of {self.root}")
            status = self._status()
            fingerprint = self._fingerprint(status.entries)
        before = {path: (code, digest) for path, code, digest in snap.fingerprint}
        restaged = [  # untracked before, staged by the reviewer: unstage, keep the file
            e.path for e in status.entries if before.get(e.path, ("",))[0] == "?" and e.kind != "?"
        ]
        if restaged:
            self._on_paths(["reset", "-q"], restaged,
                           f"Cannot unstage {listing(restaged)} in {self.root}")
            undone += [f"{path} unstaged" for path in restaged]
            status = self._status()
            fingerprint = self._fingerprint(status.entries)
        now = {path: (code, digest) for path, code, digest in fingerprint}
        entries = {e.path: e for e in status.entries}
        tracked: list[StatusEntry] = []
        untracked: list[str] = []
        for path, state in now.items():
            if path in before:
                if before[path] != state:
                    undone.append(
                        f"{path} had uncommitted changes before the review and was changed "
                        "again; left as is"
                    )
            elif entries[path].kind == "?":
                untracked.append(path)
            else:
                tracked.append(entries[path])
        for path, (code, _) in before.items():
            if path not in now:
                undone.append(
                    f"untracked {path} was deleted during the review and cannot be restored"
                    if code == "?"
                    else f"uncommitted changes to {path} were undone during the review"
                )
        if tracked:
            self._on_paths(["restore", f"--source={snap.head}", "--staged", "--worktree"],
                           [e.path for e in tracked],
                           f"Cannot restore {listing([e.path for e in tracked])} in {self.root}")
            undone += [self._describe_reverted(e) for e in tracked]
        for path in untracked:
            if self._remove_untracked(path):
                undone.append(f"untracked {path} removed")
            else:
                undone.append(f"untracked folder {path} (a nested repository) left in place")
        return undone

    def end_operations(self, how: Literal["quit", "abort"], branch: str = "") -> list[str]:
        """End a merge/rebase/cherry-pick/revert/am left half done: `quit` forgets it (index
        and files stay for the caller), `abort` also puts HEAD, index and files back as they
        were before it began; quit when an abort cannot, or would move a branch but `branch`.

        An abort moves the branch the operation's state names (a rebase's `head-name`) or
        HEAD's to a commit that state names, and that state is in the worktree's own git
        folder, which the Developer writes by hand as easily as through git: an abort
        Anima ran for it would move main, with Anima's unconfined git."""
        done: list[str] = []
        for marker, verb, label in IN_PROGRESS:
            if not os.path.lexists(self.git_dir / marker):
                continue
            if how == "abort" and not self._moves_only(marker, branch):
                how = "quit"
            for command in dict.fromkeys([(verb, f"--{how}"), (verb, "--quit")]):
                code, _, err = self._run(list(command), check=False)
                if code != 0 and marker == "rebase-apply":
                    code, _, err = self._run(["am", command[1]], check=False)
                if code == 0:
                    break
            if code != 0:
                raise GitError(f"Cannot abandon {label} in {self.root}: {err.strip()}")
            aborted = how == "abort" and command[1] == "--abort"
            done.append(f"{label} was {'aborted' if aborted else 'abandoned'}")
        return done

    def _moves_only(self, marker: str, branch: str) -> bool:
        """Whether aborting the operation at `marker` leaves every branch but `branch` where
        it is: HEAD is on it or detached, and so is the rebase, if it is one."""
        allowed = {f"ref: refs/heads/{branch}", "ref: detached HEAD"}
        named = ["HEAD"]
        if marker.startswith("rebase") and not os.path.lexists(self.git_dir / marker / "applying"):
            named.append(f"{marker}/head-name")  # `am` (applying) resets HEAD's branch
        for name in named:
            try:
                text = read_regular(self.git_dir / name, 4096).decode().strip()
            except (OSError, UnicodeDecodeError):
                return False
            if name != "HEAD" and not text.startswith("ref: "):
                text = f"ref: {text}"  # `head-name` holds the ref's name alone
            if text.startswith("ref: ") and text not in allowed:
                return False
        return True

    def _move_head(self, snap: TreeSnapshot, status: TreeStatus) -> list[str]:
        """Point HEAD (and the snapshot's branch) back at the snapshot without touching files."""
        done: list[str] = []
        now_at = short_hash(status.head or "nothing")
        if snap.branch is None:
            self._run(["update-ref", "--no-deref", "HEAD", snap.head])
            done.append(f"HEAD moved to {now_at}; reset to {short_hash(snap.head)}")
            return done
        ref = f"refs/heads/{snap.branch}"
        tip = self.resolve(ref)
        if status.branch != snap.branch:
            self._run(["symbolic-ref", "HEAD", ref], what=f"Cannot check out {snap.branch}")
            where = f"branch {status.branch}" if status.branch else "a detached HEAD"
            done.append(f"switched to {where} at {now_at}; switched back to {snap.branch}")
        if tip != snap.head:
            self._run(["update-ref", ref, snap.head], what=f"Cannot reset branch {snap.branch}")
            if status.branch == snap.branch:
                done.append(f"HEAD moved to {now_at}; reset to {short_hash(snap.head)}")
            elif tip is None:
                done.append(f"branch {snap.branch} was deleted; "
                            f"recreated at {short_hash(snap.head)}")
            else:
                done.append(
                    f"branch {snap.branch} moved to {short_hash(tip or 'nothing')}; "
                    f"reset to {short_hash(snap.head)}"
                )
        return done

    @staticmethod
    def _describe_reverted(entry: StatusEntry) -> str:
        if entry.kind == "u":
            return f"conflicted {entry.path} restored"
        if entry.xy[0] == "A":
            return f"new file {entry.path} removed"
        if "D" in entry.xy:
            return f"deleted {entry.path} restored"
        return f"modified {entry.path} reverted"

    def _remove_untracked(self, path: str) -> bool:
        """Delete an untracked file, then the folders it leaves empty (never `.anima/`).

        Returns False for a folder git reports whole (a nested repository): not ours to delete.
        """
        full = self.root / path
        if full.is_dir() and not full.is_symlink():
            return False
        try:
            full.unlink(missing_ok=True)
        except OSError as exc:
            raise GitError(f"Cannot remove {path} from {self.root}: {exc}") from None
        parent = full.parent
        while parent != self.root and not is_under_anima(parent.relative_to(self.root).as_posix()):
            with contextlib.suppress(OSError):
                parent.rmdir()
            if parent.exists():
                break
            parent = parent.parent
        return True
