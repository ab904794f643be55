"""Git operations on the managed project, shaped for the scheduler's per-round checks.

Each method shells out through GitPython's `Git.execute` (one short-lived `git` process per
call; no persistent `cat-file` helpers are started, so nothing is left running), and uses as
few calls as it can: the scheduler runs `check_developer_commit`, `commit_leftovers`,
`snapshot` and `restore` every round. Every failure is a `GitError` naming the folder, branch,
commit or files involved.

Anima's own files live under `.anima/`: runtime files (records, state, logs, transcripts, the
lock) are never reported dirty, committed, stashed, reverted or deleted here; definitions
(milestone `.md` files, `soul.md`, `config.json`) and `memory/` may be tracked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import git

from anima.errors import GitError

ANIMA_DIR = ".anima"
#: Where `switch` keeps a copy of the human's files it must step aside for a moment.
KEPT_DIR = ".anima/.kept"
_ANIMA_PREFIX = ".anima/"
_MEMORY_PREFIX = ".anima/memory/"
_DEFINITION_FILES = frozenset({".anima/soul.md", ".anima/config.json", ".anima/.gitignore"})
_MILESTONE_MD = re.compile(r"\.anima/milestones/[^/]+\.md")
_MAX_LISTED = 10
_FALLBACK_NAME = "Anima"
_FALLBACK_EMAIL = "anima@localhost"
# Git's own states for an operation left half done (a reviewer may start one and walk away).
_IN_PROGRESS = (
    ("MERGE_HEAD", ("merge", "--quit"), "an unfinished merge"),
    ("CHERRY_PICK_HEAD", ("cherry-pick", "--quit"), "an unfinished cherry-pick"),
    ("REVERT_HEAD", ("revert", "--quit"), "an unfinished revert"),
    ("rebase-merge", ("rebase", "--quit"), "an unfinished rebase"),
    ("rebase-apply", ("rebase", "--quit"), "an unfinished rebase or am"),
)


def is_under_anima(path: str) -> bool:
    """True for `.anima` itself and anything below it (repository-relative, `/`-separated)."""
    return path == ANIMA_DIR or path.startswith(_ANIMA_PREFIX)


def is_memory_path(path: str) -> bool:
    """The Developer keeps `.anima/memory/` current, so it may commit there."""
    return path.startswith(_MEMORY_PREFIX)


def is_definition_path(path: str) -> bool:
    """Files the human writes under `.anima/` and may track; committing them as-is is fine."""
    return path in _DEFINITION_FILES or _MILESTONE_MD.fullmatch(path) is not None


def _short(commit: str) -> str:
    return commit[:7] if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) else commit


def _listing(paths: Sequence[str], limit: int = _MAX_LISTED) -> str:
    """Name up to `limit` paths, then say how many more there are."""
    shown = ", ".join(paths[:limit])
    rest = len(paths) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


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
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"!{exc.errno}"
    return f"{st.st_mode & 0o111:o}:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def _bytes_blob_id(data: bytes, object_id_length: int) -> str:
    """Git's blob id of some content, without running git."""
    algo = hashlib.sha256 if object_id_length == 64 else hashlib.sha1
    return algo(b"blob %d\0" % len(data) + data).hexdigest()


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

    @property
    def untracked(self) -> frozenset[str]:
        """Untracked paths that existed at snapshot time; `restore` never deletes them."""
        return frozenset(path for path, code, _ in self.fingerprint if code == "?")


@dataclass(frozen=True)
class MergeOutcome:
    """Result of merging a milestone branch; `detail` is a sentence for the record and log."""

    merged: bool
    detail: str


@dataclass(frozen=True)
class _Entry:
    """One path of `git status --porcelain=v2`: kind is "1" (tracked), "u" or "?"."""

    path: str
    kind: str
    xy: str
    header: str

    @property
    def code(self) -> str:
        return "?" if self.kind == "?" else f"{self.kind} {self.header}"


@dataclass(frozen=True)
class _Status:
    head: str | None
    branch: str | None
    entries: tuple[_Entry, ...]


class GitRepo:
    """The managed project's git repository, as the scheduler needs it."""

    def __init__(self, repo: git.Repo, root: Path) -> None:
        """Use `GitRepo.open`, which checks the preconditions."""
        self._repo = repo
        self.root = root

    # ----------------------------------------------------------------------------- opening

    @classmethod
    def open(cls, root: Path) -> GitRepo:
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
        self = cls(repo, Path(repo.working_tree_dir))
        if self._run(["rev-parse", "--verify", "-q", "HEAD"], check=False)[0] != 0:
            repo.close()
            raise GitError(
                f"{root} has no commits yet; commit your files first "
                "(e.g. `git add -A && git commit -m 'Initial commit'`)"
            )
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

    def close(self) -> None:
        """Release GitPython's resources (kept for symmetry; no process is held open)."""
        self._repo.close()

    def __repr__(self) -> str:
        return f"GitRepo({str(self.root)!r})"

    # ------------------------------------------------------------------------ running git

    def _run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        stdin: bytes | None = None,
        what: str | None = None,
    ) -> tuple[int, bytes, str]:
        """Run one git command in the project; return (exit code, stdout bytes, stderr).

        With `check`, a non-zero exit raises GitError starting with `what` (or the command)
        and git's own message.
        """
        with contextlib.ExitStack() as stack:
            stream = None
            if stdin is not None:  # GitPython wants a real file for stdin
                stream = stack.enter_context(tempfile.TemporaryFile())
                stream.write(stdin)
                stream.seek(0)
            try:
                code, out, err = self._repo.git.execute(
                    ["git", *args],
                    istream=stream,
                    with_extended_output=True,
                    with_exceptions=False,
                    stdout_as_string=False,
                    strip_newline_in_stdout=False,
                )
            except git.GitCommandNotFound as exc:
                raise GitError(f"git is not installed or not on PATH: {exc}") from None
        stderr = err.decode(errors="replace") if isinstance(err, bytes) else str(err or "")
        if check and code != 0:
            head = what or f"`git {' '.join(args)}` failed in {self.root}"
            detail = stderr.strip() or out.decode(errors="replace").strip()
            raise GitError(f"{head}: {detail}" if detail else head)
        return code, out, stderr

    def _text(self, args: Sequence[str], *, what: str | None = None) -> str:
        return os.fsdecode(self._run(args, what=what)[1]).strip()

    def _identity_args(self) -> list[str]:
        """`-c user.*` overrides for whatever identity the repository does not configure."""
        code, out, _ = self._run(["config", "--get-regexp", r"^user\.(name|email)$"], check=False)
        lines = os.fsdecode(out).splitlines() if code == 0 else []
        keys = {line.split(" ", 1)[0] for line in lines}
        env = os.environ
        args: list[str] = []
        if "user.name" not in keys and not (
            env.get("GIT_AUTHOR_NAME") and env.get("GIT_COMMITTER_NAME")
        ):
            args += ["-c", f"user.name={_FALLBACK_NAME}"]
        if "user.email" not in keys and not (
            (env.get("GIT_AUTHOR_EMAIL") and env.get("GIT_COMMITTER_EMAIL")) or env.get("EMAIL")
        ):
            args += ["-c", f"user.email={_FALLBACK_EMAIL}"]
        return args

    def _status(self) -> _Status:
        """HEAD, branch and every changed path in one `git status` call."""
        _, out, _ = self._run(
            [
                "status",
                "--porcelain=v2",
                "-z",
                "--branch",
                "--untracked-files=all",
                "--no-renames",
            ],
            what=f"Cannot read the git status of {self.root}",
        )
        head: str | None = None
        branch: str | None = None
        entries: list[_Entry] = []
        tokens = iter(out.split(b"\0"))
        for token in tokens:
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
            elif kind == "1":
                parts = line.split(" ", 8)
                entries.append(_Entry(parts[8], "1", parts[1], " ".join(parts[1:8])))
            elif kind == "2":  # only with rename detection, which we turn off
                parts = line.split(" ", 9)
                entries.append(_Entry(parts[9], "1", parts[1], " ".join(parts[1:9])))
                next(tokens, None)
            elif kind == "u":
                parts = line.split(" ", 10)
                entries.append(_Entry(parts[10], "u", parts[1], " ".join(parts[1:10])))
            elif kind == "?":
                entries.append(_Entry(line[2:], "?", "??", ""))
        return _Status(head, branch, tuple(entries))

    def _fingerprint(self, entries: Iterable[_Entry]) -> tuple[tuple[str, str, str], ...]:
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

    # -------------------------------------------------------------------------- branches

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
        code, out, _ = self._run(["symbolic-ref", "-q", "--short", "HEAD"], check=False)
        name = os.fsdecode(out).strip()
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

    # ---------------------------------------------------------------------- dirty trees

    def dirty_paths(self) -> list[str]:
        """Uncommitted changes and untracked files outside `.anima/`, in git's order."""
        return [e.path for e in self._status().entries if not is_under_anima(e.path)]

    def ensure_clean(self) -> None:
        """Raise unless the tree is clean outside `.anima/` (Anima's own files never count)."""
        paths = self.dirty_paths()
        if paths:
            raise GitError(
                f"{self.root} has uncommitted changes outside .anima/: {_listing(paths)}; "
                "commit or stash them first"
            )

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
        what = f"Cannot commit the leftover changes in {self.root} ({_listing(paths)})"
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
            what=f"Cannot stash the changes in {self.root} ({_listing(paths)})",
        )
        return self._text(["rev-parse", "--verify", "refs/stash"])

    # ------------------------------------------------------------- the Developer's commit

    def check_developer_commit(
        self,
        commit: str,
        *,
        branch: str,
        base_commit: str,
        main: str,
        main_head: str,
        definitions: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        """Why the Developer's reported commit cannot go to review (empty list: it can).

        `definitions` is Anima's copy of the human's definitions taken before the round (see
        `anima_changes`): the files on disk may be the Developer's by now.

        Each problem is a sentence that can be handed back to the Developer as a rejection.
        Usually three git calls: resolve everything, walk base..branch, diff `.anima/`.
        """
        problems: list[str] = []
        c, base, tip, main_tip, main_was = self._resolve_many(
            [commit, base_commit, f"refs/heads/{branch}", f"refs/heads/{main}", main_head]
        )
        if c is None:
            problems.append(f"Commit {commit} does not exist in the repository.")
        if base is None:
            problems.append(f"The milestone's base commit {base_commit} does not exist.")
        if tip is None:
            problems.append(f"The milestone branch {branch} does not exist.")
        if main_tip is None:
            problems.append(f"The main branch {main} does not exist.")
        elif main_tip != main_was:
            problems.append(
                f"The main branch {main} has moved from {_short(main_head)} to "
                f"{_short(main_tip)}: someone committed on {main}; milestone work must be "
                f"committed on {branch} only."
            )
        if c is not None and base is not None and tip is not None:
            _, out, _ = self._run(
                ["rev-list", "--ancestry-path", f"{base}..{tip}"],
                what=f"Cannot read the history of {branch} in {self.root}",
            )
            if c not in set(os.fsdecode(out).split()):
                problems += self._off_branch(commit, c, branch, tip, base_commit, base)
        if c is not None and base is not None:
            problems += self._anima_violations(commit, c, base, definitions)
        return problems

    def _off_branch(
        self, commit: str, c: str, branch: str, tip: str, base_commit: str, base: str
    ) -> list[str]:
        """Explain why `c` is not strictly between base and the branch tip (failure path)."""
        if c == base:
            return [
                f"Commit {commit} is the milestone's base commit: there is no new work on {branch}."
            ]
        problems: list[str] = []
        if not self.is_ancestor(c, tip):
            _, out, _ = self._run(
                ["branch", "--contains", c, "--format=%(refname:short)"], check=False
            )
            holders = os.fsdecode(out).split()
            where = f" (it is on {_listing(holders, 3)})" if holders else ""
            problems.append(
                f"Commit {commit} is not on the milestone branch {branch}{where}; "
                f"commit your work on {branch}."
            )
        if not self.is_ancestor(base, c):
            problems.append(
                f"Commit {commit} does not descend from the milestone's base commit "
                f"{_short(base_commit)}."
            )
        return problems or [
            f"Commit {commit} is not between the base commit {_short(base_commit)} and the "
            f"tip of {branch}."
        ]

    def _anima_violations(
        self, commit: str, c: str, base: str, definitions: Mapping[str, bytes] | None
    ) -> list[str]:
        """Say which paths under `.anima/` base..commit may not change."""
        offending = self.anima_changes(base, c, definitions)
        if not offending:
            return []
        words = {"A": "added", "D": "deleted", "M": "modified", "T": "type changed"}
        named = [f"{p} ({words.get(letter, 'changed')})" for p, letter in offending]
        return [
            f"Commit {commit} changes files under .anima/ that belong to Anima or the human: "
            f"{_listing(named)}. Only .anima/memory/ may be committed (a milestone, soul.md "
            "or config.json only exactly as the human wrote it)."
        ]

    def anima_changes(
        self, base: str, commit: str, definitions: Mapping[str, bytes] | None = None
    ) -> list[tuple[str, str]]:
        """(path, git status letter) of each path under `.anima/` that base..commit may not
        change, sorted: memory/ is free; a definition may be committed only byte for byte
        as in `definitions` (Anima's copy of the human's files; None: as on disk now)."""
        _, out, _ = self._run(
            ["diff", "--raw", "-z", "--no-renames", "--no-abbrev", base, commit, "--", ANIMA_DIR],
            what=f"Cannot diff {_short(base)}..{_short(commit)} in {self.root}",
        )
        tokens = out.split(b"\0")
        offending: list[tuple[str, str]] = []
        for meta, raw_path in zip(tokens[0::2], tokens[1::2], strict=False):
            fields = os.fsdecode(meta).split()
            if len(fields) < 5:
                continue
            path, letter, blob = os.fsdecode(raw_path), fields[4][0], fields[3]
            if is_memory_path(path) or (
                is_definition_path(path) and self._as_written(path, letter, blob, definitions)
            ):
                continue
            offending.append((path, letter))
        return sorted(offending)

    def _as_written(
        self, path: str, letter: str, blob: str, definitions: Mapping[str, bytes] | None
    ) -> bool:
        """True when a committed definition is the human's file as it is (or a deletion of
        one the human does not have)."""
        full = self.root / path
        if definitions is None:
            content = full.read_bytes() if full.is_file() else None
        else:
            content = definitions.get(path)
        if letter == "D":
            return content is None and not (definitions is None and os.path.lexists(full))
        if content is None:
            return False
        if _bytes_blob_id(content, len(blob)) == blob:
            return True
        # Content filters (e.g. autocrlf) may explain a difference: ask git.
        _, out, _ = self._run(
            ["hash-object", "--stdin", f"--path={path}"], stdin=content, check=False
        )
        return os.fsdecode(out).strip() == blob

    # ----------------------------------------------------------------- snapshot/restore

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
        undone = self._quit_in_progress()
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
            self._run(
                [
                    "--literal-pathspecs",
                    "reset",
                    "-q",
                    "--pathspec-from-file=-",
                    "--pathspec-file-nul",
                ],
                stdin=b"\0".join(os.fsencode(p) for p in restaged) + b"\0",
                what=f"Cannot unstage {_listing(restaged)} in {self.root}",
            )
            undone += [f"{path} unstaged" for path in restaged]
            status = self._status()
            fingerprint = self._fingerprint(status.entries)
        now = {path: (code, digest) for path, code, digest in fingerprint}
        entries = {e.path: e for e in status.entries}
        tracked: list[_Entry] = []
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
            self._run(
                [
                    "--literal-pathspecs",
                    "restore",
                    f"--source={snap.head}",
                    "--staged",
                    "--worktree",
                    "--pathspec-from-file=-",
                    "--pathspec-file-nul",
                ],
                stdin=b"\0".join(os.fsencode(e.path) for e in tracked) + b"\0",
                what=f"Cannot restore {_listing([e.path for e in tracked])} in {self.root}",
            )
            undone += [self._describe_reverted(e) for e in tracked]
        for path in untracked:
            if self._remove_untracked(path):
                undone.append(f"untracked {path} removed")
            else:
                undone.append(f"untracked folder {path} (a nested repository) left in place")
        return undone

    def _quit_in_progress(self) -> list[str]:
        """Forget a merge/rebase/cherry-pick left half done (index and files stay for now)."""
        done: list[str] = []
        for marker, command, label in _IN_PROGRESS:
            if os.path.lexists(self.git_dir / marker):
                code, _, err = self._run(list(command), check=False)
                if code != 0 and marker == "rebase-apply":
                    code, _, err = self._run(["am", "--quit"], check=False)
                if code != 0:
                    raise GitError(f"Cannot abandon {label} in {self.root}: {err.strip()}")
                done.append(f"{label} was abandoned")
        return done

    def _move_head(self, snap: TreeSnapshot, status: _Status) -> list[str]:
        """Point HEAD (and the snapshot's branch) back at the snapshot without touching files."""
        done: list[str] = []
        now_at = _short(status.head or "nothing")
        if snap.branch is None:
            self._run(["update-ref", "--no-deref", "HEAD", snap.head])
            done.append(f"HEAD moved to {now_at}; reset to {_short(snap.head)}")
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
                done.append(f"HEAD moved to {now_at}; reset to {_short(snap.head)}")
            elif tip is None:
                done.append(f"branch {snap.branch} was deleted; recreated at {_short(snap.head)}")
            else:
                done.append(
                    f"branch {snap.branch} moved to {_short(tip or 'nothing')}; "
                    f"reset to {_short(snap.head)}"
                )
        return done

    @staticmethod
    def _describe_reverted(entry: _Entry) -> str:
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
            full.unlink()
        except FileNotFoundError:
            pass
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

    # ------------------------------------------------------------- guarding the branch

    @property
    def private_dir(self) -> Path:
        """A folder inside the git directory: no git command (clean, stash, checkout) of the
        Developer's touches it, unlike anything in the working tree."""
        return self.git_dir / "anima"

    def head_visits_since(self, since: float) -> set[str]:
        """Commits this working tree's HEAD pointed at since `since` (Unix time), from its
        reflog: what was checked out or committed here."""
        code, out, _ = self._run(
            ["reflog", "show", "--date=unix", "--format=%H %gd", "HEAD", "--"], check=False
        )
        visits: set[str] = set()
        for line in os.fsdecode(out).splitlines() if code == 0 else []:
            commit, _, selector = line.partition(" ")
            stamp = selector[selector.find("{") + 1 : -1]
            if stamp.isdigit() and int(stamp) >= int(since):
                visits.add(commit)
        return visits

    def keep_ref(self, ref: str, commit: str) -> None:
        """Point `ref` (under refs/anima/) at `commit`, so it stays reachable."""
        self._run(["update-ref", ref, commit], what=f"Cannot create {ref} in {self.root}")

    def commit_anima_revert(self, base: str, paths: Sequence[str], message: str) -> str:
        """Commit `paths` back to how `base` has them (absent if it lacks them), leaving the
        working tree alone; return the new HEAD. Hooks are skipped (Anima's bookkeeping)."""
        spec = b"\0".join(os.fsencode(p) for p in paths) + b"\0"
        what = f"Cannot put back {_listing(list(paths))} in a commit in {self.root}"
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
                      what=f"Cannot reset {branch} to {_short(commit)} in {self.root}")

    # ---------------------------------------------------------------------- history

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
            what=f"Cannot read the log of {branch} since {_short(base_commit)} in {self.root}",
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
            what=f"Cannot read the log of {branch} since {_short(base)} in {self.root}",
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
            what=f"Cannot diff {_short(old)}..{_short(new)} in {self.root}",
        )
        return out

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

    # ------------------------------------------------------------------------ merging

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
        return MergeOutcome(True, f"merged {branch} into {main} as {_short(self.head())}")

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

    @property
    def git_dir(self) -> Path:
        """The repository's git directory (`.git`, or elsewhere for a worktree)."""
        return Path(self._repo.git_dir)

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
                f"merging {branch} into {main} conflicts in {_listing(conflicts)}; the merge "
                f"was aborted, {main} is unchanged and {branch} is kept"
            )
        else:
            reason = (err.strip() or out.decode(errors="replace").strip()).splitlines()
            detail = (
                f"merging {branch} into {main} failed ({' '.join(reason[-3:]) or 'no detail'}); "
                f"{main} is unchanged and {branch} is kept"
            )
        return MergeOutcome(False, detail)
