"""Reading a milestone's history: its commits, their changed files and their diffs."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from anima.errors import GitError
from anima.git.repo import (
    DIFF_SUBMODULES,
    RepoBase,
    short_hash,
)

_FULL_HASH = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_CHUNK = 1 << 20
_OBJECT_ID = re.compile(r"\b[0-9a-f]{40}(?:[0-9a-f]{24})?\b")


@dataclass(frozen=True)
class Ancestry:
    """The commits of `since..tip` (one `git log`): what a round adds on top of the last
    accepted commit. Two commits' ancestry never changes, so it can be kept and reused."""

    since: str
    tip: str
    #: (full hash, subject) of each commit in since..tip, parents before children
    commits: tuple[tuple[str, str], ...]
    #: those that descend from `since` (`git rev-list --ancestry-path since..tip`)
    path: frozenset[str]

    @property
    def descends(self) -> bool:
        """Whether `tip` is `since` or one of its descendants (`since` is on the branch)."""
        return self.tip == self.since or self.tip in self.path


@dataclass(frozen=True)
class RawChange:
    """One path of `git diff --raw` between two commits."""

    path: str
    letter: str  # A, D, M, T…
    blob: str  # the blob it has in the newer commit (zeros when deleted)



class History(RepoBase):
    """A milestone's commits, files and diffs."""

    def ancestry(self, since: str, tip: str) -> Ancestry:
        """`since..tip` with each commit's parents, in one call whose cost is the commits
        made since `since` (the round's), not the milestone's whole history. Both are full
        hashes (an abbreviated one could not be compared with the parents git prints). One
        commit per NUL (`-z`): a subject is the Developer's, and may hold what Python ends a
        line at (a carriage return, a file separator), read as one more commit of its making."""
        for commit in (since, tip):
            if not _FULL_HASH.fullmatch(commit):
                raise GitError(f"{commit!r} is not a full commit hash in {self.root}")
        out = self._text(
            [
                "log",
                "--topo-order",
                "--reverse",
                "--no-show-signature",
                "-z",
                "--format=%H%x1f%P%x1f%s",
                f"{since}..{tip}",
                "--",
            ],
            what=f"Cannot read the commits from {short_hash(since)} to {short_hash(tip)} in "
                 f"{self.root}",
        )
        commits: list[tuple[str, str]] = []
        path: set[str] = set()
        for line in filter(None, out.split("\0")):
            commit, _, rest = line.partition("\x1f")
            parents, _, subject = rest.partition("\x1f")
            commits.append((commit, subject))
            # parents come first (--topo-order --reverse): one pass finds the descendants
            if any(p == since or p in path for p in parents.split()):
                path.add(commit)
        return Ancestry(since, tip, tuple(commits), frozenset(path))

    def independent(self, commits: Sequence[str]) -> list[str]:
        """`git merge-base --independent`: those of `commits` that no other one reaches (one
        walk for all of them; `[tip]` when every other commit is an ancestor of `tip`)."""
        out = self._text(
            ["merge-base", "--independent", *(self._rev_arg(c) for c in commits)],
            what=f"Cannot compare the commits {', '.join(short_hash(c) for c in commits[:5])}"
                 f"{' …' if len(commits) > 5 else ''} in {self.root}",
        )
        return out.split()

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

    def raw_changes(self, base: str, commit: str, *paths: str) -> list[RawChange]:
        """The paths base..commit changes (all of them, or those under `paths`), in git's
        order (by path)."""
        _, out, _ = self._run(
            ["diff", DIFF_SUBMODULES, "--raw", "-z", "--no-renames", "--no-abbrev",
             f"{self._rev_arg(base)}^{{commit}}", f"{self._rev_arg(commit)}^{{commit}}", "--",
             *paths],
            what=f"Cannot diff {short_hash(base)}..{short_hash(commit)} in {self.root}",
        )
        tokens = out.split(b"\0")
        changes: list[RawChange] = []
        for meta, raw_path in zip(tokens[0::2], tokens[1::2], strict=False):
            fields = os.fsdecode(meta).split()
            if len(fields) >= 5:
                changes.append(RawChange(os.fsdecode(raw_path), fields[4][0], fields[3]))
        return changes

    def first_leak(self, since: str, tip: str, paths: Collection[str],
                   values: Collection[str], main: str | None = None
                   ) -> tuple[str, str, bool] | None:
        """The oldest commit of `since..tip` (and not of `main`: a merge round brings main's
        in) that adds, changes or deletes one of `paths` or holds one of `values` (in a line
        it adds, a binary file it writes, a file's name or its own message): (commit, the
        path it touched or the place of the value, whether it was a value), or None. One
        `git log -p`, and a read of each binary file it writes.

        A merge is read as git's combined diff (`--cc`): what it adds is what none of its
        parents had (a conflict resolution, a file the merge writes), not what it brings
        from a parent, whose own commits are looked at (or are main's). A commit's headers
        (its author, its committer, a line of the Developer's own) are read too."""
        if not paths and not values:
            return None
        mark = uuid.uuid4().hex  # no commit can hold it: it ends the message, not a NUL
        start, wanted = f"\0{mark}".encode(), [os.fsencode(v) for v in values]
        # one search per line, not one per value: a commit can add millions of lines
        holds = re.compile(b"|".join(map(re.escape, wanted)) or b"(?!)").search  # (?!): none
        revs = self._round_revs(since, tip, main)
        what = f"Cannot read the commits {short_hash(since)}..{short_hash(tip)}"
        in_headers = self._headers_holding(revs, wanted, holds, what) if wanted else set()
        args = ["-c", "core.quotepath=false", "log", DIFF_SUBMODULES, "--reverse",
                "--no-renames", "--no-color",
                "--no-ext-diff", "--no-textconv", "--full-history", "--src-prefix=a/",
                "--dst-prefix=b/", f"--format=%x00{mark}%H%n%B%x00{mark}", "-p", "--cc",
                *revs, "--"]
        commit, in_message, current, added = "", False, "", b"+"
        # read as git prints it, as bytes: a patch can be far larger than Anima should hold
        with self._output(args, what=what) as lines:
            for line in lines:  # git's lines end at \n only, as a file's do
                if in_message:
                    text, end, _ = line.partition(start)
                    if holds(text):
                        return commit, "its commit message", True
                    in_message = not end
                    current, added = "", b"+"
                # most lines; (an added `++x` reads `+++x`, and a `+++ b/` header is one)
                elif line.startswith(added):
                    if holds(line):
                        return commit, current, True
                elif line.startswith(start):
                    commit, in_message = line[len(start):].decode().strip(), True
                    if commit in in_headers:
                        return commit, "its commit's author, committer or headers", True
                elif line.startswith((b"diff --git ", b"diff --cc ")):
                    current, added = _patch_path(os.fsdecode(line.removesuffix(b"\n"))), b"+"
                    if current in paths:
                        return commit, current, False
                    if any(v in current for v in values):
                        return commit, "a file's name", True
                elif line.startswith(b"@@"):  # `@@@`: a merge's, a `+` column per parent
                    added = b"+" * (len(line) - len(line.lstrip(b"@")) - 1)
                elif line.startswith(b"Binary files ") and self._blob_holds(commit, current,
                                                                            wanted):
                    return commit, current, True
        return None

    def _round_revs(self, since: str, tip: str, main: str | None) -> list[str]:
        """The commits of `since..tip` and not of `main` (a merge round brings main's in), as
        git's revision arguments."""
        return [f"{self._rev_arg(since)}..{self._rev_arg(tip)}",
                *([f"^{self._rev_arg(main)}"] if main else [])]

    def _headers_holding(self, revs: Sequence[str], wanted: Sequence[bytes],
                         holds: Callable[[bytes], object], what: str) -> set[str]:
        """The commits of `revs` whose headers hold a value: its author or committer
        (`git -c user.name=…`), a line of the Developer's own (`git hash-object -t commit`
        takes any), which neither a patch nor a message shows. Read as git prints them, a
        piece at a time: a header (a signature) can be as large as the Developer likes."""
        _, listed, _ = self._run(["rev-list", *revs, "--"], what=what)
        overlap = max(map(len, wanted)) - 1
        found: set[str] = set()
        with self._output(["cat-file", "--batch"], stdin=listed, what=what) as out:
            while line := out.readline():  # "<id> commit <size>", then the object and a \n
                name, *rest = line.decode(errors="replace").split()
                left = int(rest[-1]) + 1 if len(rest) == 2 else 0  # else "<id> missing"
                seen, reading = b"", True
                while left and (chunk := out.read(min(left, _CHUNK))):
                    left -= len(chunk)
                    if reading:  # the headers end at the first empty line
                        seen = seen[-overlap:] + chunk
                        headers, end, _ = seen.partition(b"\n\n")
                        if holds(headers):
                            found.add(name)
                        reading = not end and name not in found
        return found

    def first_refused_tree(self, since: str, tip: str, main: str | None = None
                           ) -> tuple[str, str, str] | None:
        """The oldest commit of `since..tip` (and not of `main`) that adds a tree git's own
        checks refuse (an entry named `.git` in any spelling some system's checkout takes for
        it, `.`, `..`, an empty name, one with `/`; a `.gitmodules` naming a command as a
        submodule's update, or a URL or path git would take for an option): (commit, the
        tree's folder or the file, git's words), or None. git will not check out or index
        such a path, and a host that checks pushes refuses a history holding it. Only the
        trees these commits add are checked, by git itself (`index-pack --strict` of a pack
        of them): two git calls, whatever the size of the repository."""
        revs = self._round_revs(since, tip, main)
        what = f"Cannot check the trees of {short_hash(since)}..{short_hash(tip)}"
        _, pack, _ = self._run(["pack-objects", "-q", "--revs", "--stdout",
                                "--filter=object:type=tree"],
                               stdin="".join(f"{rev}\n" for rev in revs).encode(), what=what)
        with tempfile.TemporaryDirectory(prefix="anima-trees-") as folder:
            (Path(folder) / "trees.pack").write_bytes(pack)
            code, _, err = self._run(["index-pack", "--strict", "-o", f"{folder}/trees.idx",
                                      f"{folder}/trees.pack"], check=False)
        if code == 0:
            return None
        added = self._added_objects(revs, what)
        for line in err.splitlines():  # "error: object <id>: hasDotgit: contains '.git'"
            if (found := next((i for i in _OBJECT_ID.findall(line) if i in added), None)):
                first, where = added[found]
                words = line.removeprefix("error: ").removeprefix("fatal: ")
                return first, where, words.replace(f"object {found}: ", "")
        self._failed(["index-pack", "--strict"], what, err.strip())

    def _added_objects(self, revs: Sequence[str], what: str) -> dict[str, tuple[str, str]]:
        """Each tree and file the commits of `revs` add: (the oldest commit that has it, its
        path). git's checks of a tree read its `.gitmodules` file too."""
        # each new object after the first commit that has it, with its path
        _, listed, _ = self._run(["rev-list", "--objects", "--in-commit-order", "--reverse",
                                  *revs, "--"], what=what)
        _, typed, _ = self._run(["cat-file", "--batch-check=%(objecttype) %(objectname) %(rest)"],
                                stdin=listed, what=what)
        added: dict[str, tuple[str, str]] = {}
        commit = ""
        for line in os.fsdecode(typed).splitlines():
            kind, _, rest = line.partition(" ")
            name, _, path = rest.partition(" ")
            if kind == "commit":
                commit = name
            elif kind in ("tree", "blob"):
                added.setdefault(name, (commit, path))
        return added

    def _blob_holds(self, commit: str, path: str, wanted: Sequence[bytes]) -> bool:
        """Whether the file (none when the commit deletes it) holds a value, read in
        overlapping chunks: a binary file can be larger than Anima should hold."""
        overlap = max(map(len, wanted), default=1) - 1
        with self._output(["cat-file", "blob", f"{commit}:{path}"], check=False) as out:
            seen = b""
            while chunk := out.read(_CHUNK):
                seen = seen[-overlap:] + chunk if overlap else chunk
                if any(w in seen for w in wanted):
                    return True
        return False

    def diff_bytes(self, old: str, new: str, *options: str) -> bytes:
        """`git diff <options> old new` as raw bytes: the Changes view's numstat."""
        _, out, _ = self._run(self._diff_args(old, new, options), what=self._diff_what(old, new))
        return out

    @contextlib.contextmanager
    def diff_output(self, old: str, new: str, *options: str) -> Iterator[BinaryIO]:
        """`diff_bytes` to read as git prints it: the Changes view's patch, which can be
        many times larger than Anima should hold."""
        with self._output(self._diff_args(old, new, options),
                          what=self._diff_what(old, new)) as out:
            yield out

    def _diff_args(self, old: str, new: str, options: Sequence[str]) -> list[str]:
        """Prefixes, colour, external and textconv drivers are pinned so a user's git config
        cannot change the format the parser reads."""
        return ["-c", "core.quotepath=false", "diff", DIFF_SUBMODULES, "--no-color",
                "--no-ext-diff", "--no-textconv", "--no-relative", "-M", "--src-prefix=a/",
                "--dst-prefix=b/",
                *options, f"{self._rev_arg(old)}^{{commit}}", f"{self._rev_arg(new)}^{{commit}}",
                "--"]

    def _diff_what(self, old: str, new: str) -> str:
        return f"Cannot diff {short_hash(old)}..{short_hash(new)} in {self.root}"


def _patch_path(header: str) -> str:
    """The path of a `diff --git a/P b/P` (no renames) or a merge's `diff --cc P` line. git
    C-quotes a name holding a `"`, a backslash or a control character even with
    `core.quotepath=false` (`diff --git "a/tab\\tbed" "b/tab\\tbed"`)."""
    if header.startswith("diff --cc "):
        return _unquoted(header[len("diff --cc "):])
    both = header[len("diff --git "):]
    if both.startswith('"'):
        return _unquoted(both)[len("a/"):]
    return both[len("a/"):][:(len(both) - 5) // 2]  # "a/P b/P"


_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(rb"\\([0-7]{3}|.)")
_ESCAPED = {b"a": b"\a", b"b": b"\b", b"t": b"\t", b"n": b"\n", b"v": b"\v", b"f": b"\f",
            b"r": b"\r"}


def _unquoted(name: str) -> str:
    """The first name of `name` as git wrote it: unquoted if it starts with a `"` (its
    octal escapes are the bytes of a name that is not UTF-8), else as it is."""
    quoted = _QUOTED.match(os.fsencode(name))
    if quoted is None:
        return name
    return os.fsdecode(_ESCAPE.sub(
        lambda m: bytes([int(m[1], 8)]) if len(m[1]) == 3 else _ESCAPED.get(m[1], m[1]),
        quoted[1]))
