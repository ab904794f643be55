"""The one way Anima runs git in the managed project, and what every other part reads.

Each call shells out through GitPython's `Git.execute` (one short-lived `git` process per
call; no persistent `cat-file` helpers are started, so nothing is left running), and uses as
few calls as it can: the loop checks, commits and snapshots every round. Every failure is a
`GitError` naming the folder, branch, commit or files involved (a command a stop ended is a
`GitStopped`: anima.git.watch).

Anima's own files live under `.anima/`: runtime files (records, state, logs, transcripts, the
lock) are never reported dirty, committed, stashed, reverted or deleted; definitions
(milestone `.md` files, `soul.md`, `config.json`) and `memory/` may be tracked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, Self

import git

from anima.errors import GitError
from anima.git.watch import watched
from anima.git_options import ANIMA_GIT_ENV, NO_AGENT_CODE, HumanConfig, human_config
from anima.paths import is_under_anima

_MAX_LISTED = 10
_FALLBACK_NAME = "Anima"
_FALLBACK_EMAIL = "anima@localhost"
# Git's own states for an operation left half done (a reviewer may start one and walk away),
# and the command that ends it (`--quit` forgets it, `--abort` also puts back the start).
IN_PROGRESS = (
    ("MERGE_HEAD", "merge", "an unfinished merge"),
    ("CHERRY_PICK_HEAD", "cherry-pick", "an unfinished cherry-pick"),
    ("REVERT_HEAD", "revert", "an unfinished revert"),
    ("rebase-merge", "rebase", "an unfinished rebase"),
    ("rebase-apply", "rebase", "an unfinished rebase or am"),
)


def short_hash(commit: str) -> str:
    return commit[:7] if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) else commit



def listing(paths: Sequence[str], limit: int = _MAX_LISTED) -> str:
    """Name up to `limit` paths, then say how many more there are."""
    shown = ", ".join(paths[:limit])
    rest = len(paths) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown



#: For every diff and patch Anima reads: no submodule's settings are read (the worktree's
#: `.gitmodules` is the Developer's, and one git refuses, `update = !cmd`, fails every diff
#: that does) and no submodule's files are compared (that runs git inside it). A commit that
#: changes a submodule still shows as changing it.
DIFF_SUBMODULES = "--ignore-submodules=dirty"


#: Files up to this size are fingerprinted by content (rewritten as they were, they compare
#: equal); a bigger one (a test's sparse 100 GB image) by its inode's times, or reading it
#: would take minutes and more memory than the machine has.
_HASHED_BYTES = 64 << 20


def _digest(path: Path) -> str:
    """A content fingerprint of a working-tree entry ("-" when it is gone)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "-"
    if stat.S_ISLNK(st.st_mode):
        return "l:" + hashlib.blake2b(os.fsencode(os.readlink(path)), digest_size=16).hexdigest()
    if stat.S_ISDIR(st.st_mode):
        return "d"
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read
        return f"s:{stat.S_IFMT(st.st_mode):o}"
    if st.st_size > _HASHED_BYTES:  # ctime: no program can set it back
        return f"{st.st_mode & 0o111:o}:{st.st_size}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"!{exc.errno}"
    return f"{st.st_mode & 0o111:o}:" + hashlib.blake2b(data, digest_size=16).hexdigest()



def blob_id(data: bytes, object_id_length: int) -> str:
    """Git's blob id of some content, without running git."""
    algo = hashlib.sha256 if object_id_length == 64 else hashlib.sha1
    return algo(b"blob %d\0" % len(data) + data).hexdigest()



@dataclass(frozen=True)
class StatusEntry:
    """One path of `git status --porcelain=v2`: kind is "1" (tracked), "u" or "?"."""

    path: str
    kind: str
    xy: str
    header: str

    @property
    def code(self) -> str:
        return "?" if self.kind == "?" else f"{self.kind} {self.header}"



@dataclass(frozen=True)
class TreeStatus:
    head: str | None
    branch: str | None
    entries: tuple[StatusEntry, ...]



@contextlib.contextmanager
def _stdin(data: bytes | None) -> Iterator[BinaryIO | None]:
    """`data` as the real file GitPython wants for a command's stdin (None: no stdin)."""
    if data is None:
        yield None
        return
    with tempfile.TemporaryFile() as stream:
        stream.write(data)
        stream.seek(0)
        yield stream


class RepoBase:
    """The repository handle and the plumbing every part of it shares."""

    def __init__(self, runner: git.Git, root: Path, git_dir: Path, common_dir: Path) -> None:
        """Use `GitRepo.open` (or `worktree_repo`), which check the preconditions."""
        self._git = runner
        self.root = root
        #: The repository's git directory (`.git`, or elsewhere for a worktree).
        self.git_dir = git_dir
        #: The repository's shared git directory (refs, objects), also from a worktree.
        self.common_dir = common_dir

    @classmethod
    def open(cls, root: Path) -> Self:
        """Open the repository at `root`, which must have at least one commit."""
        root = Path(root).expanduser().absolute()
        if not root.is_dir():
            raise GitError(f"{root} does not exist or is not a folder")
        try:
            repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise GitError(cls._not_a_repository(root)) from None
        if repo.bare or repo.working_tree_dir is None:
            repo.close()
            raise GitError(f"{root} is a bare git repository; Anima needs a working tree")
        self = cls(repo.git, Path(repo.working_tree_dir), Path(repo.git_dir),
                   Path(os.path.normpath(repo.common_dir)))
        repo.close()
        if self._run(["rev-parse", "--verify", "-q", "HEAD"], check=False)[0] != 0:
            raise GitError(
                f"{root} has no commits yet; commit your files first "
                "(e.g. `git add -A && git commit -m 'Initial commit'`)"
            )
        return self

    @classmethod
    def create(cls, root: Path) -> Self:
        """`git init` in a folder that is not a repository yet, with an empty first commit
        (`anima init --git-init`), so that `open` accepts it."""
        root = Path(root).expanduser().absolute()
        try:
            repo = git.Repo.init(root)
        except git.GitCommandError as exc:
            raise GitError(f"Cannot run `git init` in {root}: {exc.stderr.strip()}") from None
        self = cls(repo.git, root, Path(repo.git_dir), Path(os.path.normpath(repo.common_dir)))
        repo.close()
        self._run([*self._identity_args(), "commit", "-q", "--allow-empty", "-m", "chore: start"],
                  what=f"Cannot make the first commit in {root}")
        return self

    @staticmethod
    def _not_a_repository(root: Path) -> str:
        """Say why `root` is not a repository root, pointing at the enclosing one if any."""
        try:
            outer = git.Repo(root, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            return f"{root} is not a git repository (run `git init` in {root}, then commit)"
        top = outer.working_tree_dir
        outer.close()
        return (
            f"{root} is not a git repository's top folder (it is inside {top}); "
            f"open {top} instead, or run `git init` in {root}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def _run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        stdin: bytes | None = None,
        what: str | None = None,
        work_tree: Path | None = None,
    ) -> tuple[int, bytes, str]:
        """Run one git command in the project; return (exit code, stdout bytes, stderr).
        In a milestone's loop it is watched (anima.git.watch): a stop may end it.

        With `check`, a non-zero exit raises GitError starting with `what` (or the command)
        and git's own message. No program named in git's configuration runs (`git_options`),
        and the work tree is named (`work_tree`, also where git runs, else the project's): a
        `core.worktree` (or `core.bare`) an agent put in the worktree's own `config.worktree`
        would point git at another tree.
        """
        with _stdin(stdin) as stream:
            handle = self._execute(args, istream=stream, as_process=True,  # kept: see _output
                                   work_tree=work_tree)
            with watched(handle.proc, args, self.root):
                out, err = handle.proc.communicate()
            code = handle.proc.returncode
        stderr = err.decode(errors="replace").removesuffix("\n")
        if check and code != 0:
            self._failed(args, what, stderr.strip() or out.decode(errors="replace").strip())
        return code, out, stderr

    @contextlib.contextmanager
    def _output(self, args: Sequence[str], *, what: str | None = None, check: bool = True,
                stdin: bytes | None = None) -> Iterator[BinaryIO]:
        """git's output to read as it prints it (by line: each ends at a line feed only): a patch
        can be many times larger than Anima should hold. Leaving early stops git; with
        `check`, a failure is a GitError once the output is read."""
        with _stdin(stdin) as stream:  # git holds its own copy of the file once started
            handle = self._execute(args, istream=stream, as_process=True)  # kept: its end
            # would stop git
        proc = handle.proc
        read_all = False
        with watched(proc, args, self.root):
            try:
                yield proc.stdout
                read_all = not proc.stdout.read(1)
            finally:
                if not read_all:
                    proc.kill()
                err = proc.stderr.read()
                proc.stdout.close()
                proc.stderr.close()
                code = proc.wait()
        if check and read_all and code != 0:
            self._failed(args, what, err.decode(errors="replace").strip())

    def _execute(self, args: Sequence[str], work_tree: Path | None = None,
                 **options: Any) -> Any:
        """GitPython's `execute` of `git args` with the options every Anima git runs with."""
        try:
            return self._git.execute(
                ["git", *NO_AGENT_CODE, *(["-C", str(work_tree)] if work_tree else []),
                 f"--git-dir={self.git_dir}", f"--work-tree={work_tree or self.root}",
                 *self._human_config().overrides, *args],
                env=ANIMA_GIT_ENV,
                # Not in the terminal's process group: Ctrl+C is for Anima, which stops
                # politely; a git killed mid-command would fail the milestone instead.
                start_new_session=True,
                **options,
            )
        except git.GitCommandNotFound as exc:
            if not self.root.is_dir():  # GitPython says so for a missing folder too
                raise GitError(f"{self.root} no longer exists") from None
            raise GitError(f"git is not installed or not on PATH: {exc}") from None

    def _failed(self, args: Sequence[str], what: str | None, detail: str) -> NoReturn:
        head = what or f"`git {' '.join(args)}` failed in {self.root}"
        raise GitError(f"{head}: {detail}" if detail else head)

    def _text(self, args: Sequence[str], *, what: str | None = None) -> str:
        return os.fsdecode(self._run(args, what=what)[1]).strip()

    def _on_paths(self, args: Sequence[str], paths: Iterable[str], what: str) -> None:
        """`git args` on exactly `paths` (literal pathspecs, NUL-separated on stdin: any name,
        any number of them)."""
        self._run(["--literal-pathspecs", *args, "--pathspec-from-file=-",
                   "--pathspec-file-nul"],
                  stdin=b"".join(os.fsencode(p) + b"\0" for p in paths), what=what)

    def _human_config(self) -> HumanConfig:
        """The per-repository part of how Anima runs git here (cached: a few `stat`s)."""
        return human_config(self.root, self.git_dir, self.common_dir)

    def _identity_args(self) -> list[str]:
        """`-c user.*` for Anima's commits: the identity the human's own git would use (the
        global config included, which Anima's git does not read), else Anima's."""
        found = dict(self._human_config().identity)
        args = [arg for key, value in found.items() for arg in ("-c", f"{key}={value}")]
        env = os.environ
        if "user.name" not in found and not (
            env.get("GIT_AUTHOR_NAME") and env.get("GIT_COMMITTER_NAME")
        ):
            args += ["-c", f"user.name={_FALLBACK_NAME}"]
        if "user.email" not in found and not (
            (env.get("GIT_AUTHOR_EMAIL") and env.get("GIT_COMMITTER_EMAIL")) or env.get("EMAIL")
        ):
            args += ["-c", f"user.email={_FALLBACK_EMAIL}"]
        return args

    def _status(self) -> TreeStatus:
        """HEAD, branch and every changed path in one `git status` call."""
        _, out, _ = self._run(
            [
                "status",
                "--porcelain=v2",
                "-z",
                "--branch",
                "--untracked-files=all",
                "--no-renames",
                # A submodule's status runs git inside it, where its own config's filters
                # would run in Anima's name.
                "--ignore-submodules=dirty",
            ],
            what=f"Cannot read the git status of {self.root}",
        )
        head: str | None = None
        branch: str | None = None
        entries: list[StatusEntry] = []
        for token in out.split(b"\0"):
            if not token:
                continue
            line = os.fsdecode(token)
            kind = line[0]
            if line.startswith("# branch.oid "):
                oid = line[len("# branch.oid ") :]
                head = None if oid == "(initial)" else oid
            elif line.startswith("# branch.head "):
                name = line[len("# branch.head ") :]
                branch = None if name == "(detached)" else name
            elif kind in ("1", "u"):  # 8 fields before the path; an unmerged one's, 10
                n = 8 if kind == "1" else 10
                parts = line.split(" ", n)
                entries.append(StatusEntry(parts[n], kind, parts[1], " ".join(parts[1:n])))
            elif kind == "?":
                entries.append(StatusEntry(line[2:], "?", "??", ""))
        return TreeStatus(head, branch, tuple(entries))

    def _fingerprint(self, entries: Iterable[StatusEntry]) -> tuple[tuple[str, str, str], ...]:
        return tuple(
            sorted(
                (e.path, e.code, _digest(self.root / e.path))
                for e in entries
                if not is_under_anima(e.path)
            )
        )

    @staticmethod
    def _checked_rev(rev: str) -> str | None:
        """Refuse strings git would read as options or as several arguments."""
        rev = rev.strip()
        if not rev or rev.startswith("-") or any(c.isspace() or ord(c) < 32 for c in rev):
            return None
        return rev

    def _rev_arg(self, rev: str, role: str = "revision") -> str:
        """A revision safe to pass positionally, or a GitError naming it."""
        checked = self._checked_rev(rev)
        if checked is None:
            raise GitError(f"{rev!r} is not a valid {role} in {self.root}")
        return checked

    def main_branch(self, configured: str | None = None) -> str:
        """The branch milestones start from and merge into: configured, else main, else master."""
        if configured:
            if not self.branch_exists(configured):
                raise GitError(
                    f"The configured main branch {configured!r} does not exist in {self.root}"
                )
            return configured
        for name in ("main", "master"):
            if self.branch_exists(name):
                return name
        raise GitError(
            f"{self.root} has neither a `main` nor a `master` branch; "
            "set `main_branch` in .anima/config.json"
        )

    def head(self) -> str:
        """Full hash of HEAD."""
        return self._text(["rev-parse", "--verify", "HEAD"], what=f"{self.root} has no HEAD")

    def current_branch(self) -> str | None:
        """The checked-out branch, or None when HEAD is detached."""
        # Not --short: with a tag of the same name it answers "heads/<name>".
        code, out, _ = self._run(["symbolic-ref", "-q", "HEAD"], check=False)
        name = os.fsdecode(out).strip().removeprefix("refs/heads/")
        return name if code == 0 and name else None

    def branch_exists(self, name: str) -> bool:
        """True when `refs/heads/<name>` exists."""
        return self.resolve(f"refs/heads/{name}") is not None

    def branch_head(self, name: str) -> str:
        """Full hash of a branch's tip."""
        commit = self.resolve(f"refs/heads/{name}")
        if commit is None:
            raise GitError(f"There is no branch {name!r} in {self.root}")
        return commit

    def resolve(self, rev: str) -> str | None:
        """Full hash of a commit named by a (possibly abbreviated) hash or ref; None if none."""
        checked = self._checked_rev(rev)
        if checked is None:
            return None
        code, out, _ = self._run(
            ["rev-parse", "--verify", "-q", f"{checked}^{{commit}}"], check=False
        )
        commit = os.fsdecode(out).strip()
        return commit if code == 0 and commit else None

    def _resolve_many(self, revs: Sequence[str]) -> list[str | None]:
        """Resolve several revisions in one call when all exist, else one by one."""
        checked = [self._checked_rev(r) for r in revs]
        if all(checked):
            code, out, _ = self._run(
                ["rev-parse", *(f"{r}^{{commit}}" for r in checked)], check=False
            )
            lines = os.fsdecode(out).split()
            if code == 0 and len(lines) == len(revs):
                return list(lines)
        return [self.resolve(r) for r in revs]

    def is_ancestor(self, a: str, b: str) -> bool:
        """True when commit `a` is `b` or one of its ancestors."""
        code, _, err = self._run(
            ["merge-base", "--is-ancestor", self._rev_arg(a), self._rev_arg(b)], check=False
        )
        if code in (0, 1):
            return code == 0
        raise GitError(
            f"Cannot tell whether {a} is an ancestor of {b} in {self.root}: {err.strip()}"
        )

    def gitlinks(self) -> list[str]:
        """The index's submodules (gitlinks): where a `git status` or `git diff` in the tree
        runs git in the folder's own repository, when it has one."""
        _, out, _ = self._run(["ls-files", "-s", "-z"],
                              what=f"Cannot read the index of {self.root}")
        entries = (item.partition(b"\t") for item in out.split(b"\0") if item)
        return [os.fsdecode(path) for meta, _, path in entries if meta.startswith(b"160000 ")]

    def dirty_paths(self) -> list[str]:
        """Uncommitted changes and untracked files outside `.anima/`, in git's order."""
        return [e.path for e in self._status().entries if not is_under_anima(e.path)]

    def ensure_clean(self) -> None:
        """Raise unless the tree is clean outside `.anima/` (Anima's own files never count)."""
        paths = self.dirty_paths()
        if paths:
            raise GitError(
                f"{self.root} has uncommitted changes outside .anima/: {listing(paths)}; "
                "commit or stash them first"
            )
