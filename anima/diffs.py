"""What a milestone changed, file by file: the data behind the window's Changes view.

A `ChangeSet` is one `git diff` between two commits — the whole milestone (its base commit to
the branch head, or the merge's first parent to the merge once it is merged) or one round's
commit (its parent to it) — split into `FileDiff`s with added/removed counts. Files whose
change is whitespace only, or that are generated (lock files, minified or compiled output),
are flagged so the view can collapse them. Anima's own files (`.anima/…`: the config, soul.md,
the milestone definitions) are set apart: listed, never folded as generated, never counted in
the milestone's totals, so a commit that touched the supervisor's files shows it. Parsing a
file's hunks into numbered rows is left until the file is shown (`FileDiff.rows`): a
500-file change costs one pass to split. No Qt here: the engine computes this on a worker
thread and the UI only draws it.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

from anima.errors import AnimaError
from anima.git import GitRepo
from anima.paths import is_under_anima, printable
from anima.store.models import MilestoneRecord, MilestoneStatus
from anima.text.redact import LineRedactor, redact

#: Paths (fnmatch, matched against the whole path and its file name) shown collapsed.
GENERATED_PATTERNS = (
    "*.lock", "package-lock.json", "npm-shrinkwrap.json", "pnpm-lock.yaml", "go.sum",
    "*.min.js", "*.min.css", "*.map", "*_pb2.py", "*_pb2_grpc.py", "*.pb.go", "*.snap",
    "dist/*", "build/*", "*/dist/*", "*/build/*", "node_modules/*", "*/node_modules/*",
    "*.pyc",
)
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def is_generated(path: str) -> bool:
    """Whether a path looks machine-written (lock files, build output)."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(name, p)
               for p in GENERATED_PATTERNS)


#: The note in place of a secret file's content.
NOT_SHOWN = "Not shown:"


@dataclass(frozen=True)
class DiffRow:
    """One displayed line of a file's diff: '+', '-', ' ' (context), '@' (hunk) or '~' (note)."""

    kind: str
    text: str
    old_line: int | None = None
    new_line: int | None = None


@dataclass(frozen=True)
class FileDiff:
    #: As the record keeps a name (`anima.paths.printable`): a byte that is not UTF-8 written
    #: `\\xNN`, so a comment on the file names it as the diff does (and Qt, which drops a
    #: lone surrogate, can carry it).
    path: str
    old_path: str | None  # set when the file was renamed or copied
    added: int
    removed: int
    binary: bool
    whitespace_only: bool
    generated: bool
    patch: str  # git's text for this file, from `diff --git` on

    @property
    def collapsed(self) -> bool:
        """Shown folded until asked: nothing a reviewer reads line by line."""
        return self.whitespace_only or self.generated

    @property
    def anima_file(self) -> bool:
        """One of Anima's own files (`.anima/…`), not the milestone's work."""
        return is_under_anima(self.path)

    @cached_property
    def rows(self) -> list[DiffRow]:
        """The hunks as numbered rows (old and new line numbers), parsed on first use."""
        rows: list[DiffRow] = []
        old_no = new_no = 0
        in_hunks = False
        for line in self.patch.splitlines():
            match = _HUNK.match(line)
            if match:
                in_hunks = True
                old_no, new_no = int(match.group(1)), int(match.group(2))
                rows.append(DiffRow("@", line))
            elif not in_hunks:
                if line.startswith(("Binary files", "rename from", "rename to", "new file mode",
                                    "deleted file mode", "old mode", "new mode", NOT_SHOWN)):
                    rows.append(DiffRow("~", line))
            elif line.startswith("+"):
                rows.append(DiffRow("+", line[1:], None, new_no))
                new_no += 1
            elif line.startswith("-"):
                rows.append(DiffRow("-", line[1:], old_no, None))
                old_no += 1
            elif line.startswith("\\"):
                rows.append(DiffRow("~", line))
            else:
                rows.append(DiffRow(" ", line[1:], old_no, new_no))
                old_no += 1
                new_no += 1
        return rows


@dataclass(frozen=True)
class ChangeSet:
    label: str  # "whole milestone", "round 3"
    old: str
    new: str
    files: tuple[FileDiff, ...]

    @property
    def work_files(self) -> tuple[FileDiff, ...]:
        """The milestone's own changes, without Anima's files."""
        return tuple(f for f in self.files if not f.anima_file)

    @property
    def anima_files(self) -> tuple[FileDiff, ...]:
        return tuple(f for f in self.files if f.anima_file)

    @property
    def added(self) -> int:
        """Lines added by the milestone's work (Anima's files are not counted)."""
        return sum(f.added for f in self.work_files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.work_files)

    def file(self, path: str) -> FileDiff | None:
        return next((f for f in self.files if f.path == path), None)


def _numstat(raw: bytes) -> list[tuple[int | None, int | None, str | None, str]]:
    """`--numstat -z` → (added, removed, old path or None, path); None counts for binary."""
    fields = raw.split(b"\0")
    out: list[tuple[int | None, int | None, str | None, str]] = []
    i = 0
    while i < len(fields) and fields[i]:
        added, removed, path = fields[i].split(b"\t", 2)
        old_path: str | None = None
        if not path:  # a rename: the two paths follow as their own fields
            old_path, path = os.fsdecode(fields[i + 1]), fields[i + 2]
            i += 2
        i += 1
        out.append((None if added == b"-" else int(added), None if removed == b"-" else
                    int(removed), old_path, os.fsdecode(path)))
    return out


#: Past this much diff text a file's hunks are not kept, as GitHub and GitLab do: a 400 MB
#: file's patch would be gigabytes held and millions of rows drawn.
MAX_FILE_PATCH = 1 << 20


def _file_patches(lines: Iterable[bytes]) -> Iterator[tuple[str, bool]]:
    """(its text from its `diff --git` line on, whether it is whole) for each file of the
    patch, read as git prints it; a file's hunks past MAX_FILE_PATCH bytes are left out and
    a line says so."""
    kept: list[bytes] = []
    size, whole = 0, True
    for line in lines:
        if line.startswith(b"diff --git "):
            if kept:
                yield _file_patch(kept, whole)
            kept, size, whole = [], 0, True
        elif not whole:
            continue
        size += len(line)
        if size > MAX_FILE_PATCH:
            whole = False
            del kept[next((i for i, k in enumerate(kept) if k.startswith(b"@@")), len(kept)):]
        else:
            kept.append(line)
    if kept:
        yield _file_patch(kept, whole)


def _file_patch(lines: list[bytes], whole: bool) -> tuple[str, bool]:
    text = b"".join(lines).decode("utf-8", errors="replace")
    if not whole:
        text += (f"{NOT_SHOWN} the change is too large to show (over "
                 f"{MAX_FILE_PATCH >> 20} MB of diff); `git diff` shows it\n")
    return text, whole


def _whitespace_only(patch: str) -> bool:
    """True when the removed and added lines differ only in whitespace (like `git diff -w`)."""
    removed: list[str] = []
    added: list[str] = []
    hunks = patch.find("\n@@")
    for line in patch[hunks:].splitlines() if hunks >= 0 else ():
        if line.startswith("-"):
            removed.extend(line[1:].split())
        elif line.startswith("+"):
            added.extend(line[1:].split())
    return removed == added


def diff_between(repo: GitRepo, old: str, new: str, label: str,
                 hidden: frozenset[str] = frozenset()) -> ChangeSet:
    """The change from commit `old` to commit `new`, split per file; the content of the
    `hidden` paths (secrets copied in from `.worktreeinclude`) is not shown.

    The counts and the patch are two git processes run side by side (a 500-file change
    takes one git diff's time, not two).
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        numstat = pool.submit(repo.diff_bytes, old, new, "--numstat", "-z")
        with repo.diff_output(old, new, "-p") as out:
            patches = list(_file_patches(out))
        stats = _numstat(numstat.result())
    if len(patches) != len(stats):  # never expected; say so rather than mislabel files
        raise AnimaError(f"git diff {old[:7]}..{new[:7]} listed {len(stats)} files but "
                         f"printed {len(patches)} patches")
    files = []
    for (added, removed, old_path, path), (patch, whole) in zip(stats, patches, strict=True):
        binary = added is None
        if hidden and (path in hidden or old_path in hidden):
            patch = (patch.partition("\n")[0] + f"\n{NOT_SHOWN} {old_path or path} is copied "
                     "in from .worktreeinclude: a secret\n")
        files.append(FileDiff(
            path=redact(printable(path)), old_path=old_path and redact(printable(old_path)),
            added=added or 0,
            removed=removed or 0, binary=binary, whitespace_only=not binary and whole
            and bool(added or removed) and _whitespace_only(patch),
            generated=is_generated(path), patch=_redacted(patch)))
    return ChangeSet(label, old, new, tuple(files))


def _redacted(patch: str) -> str:
    """The patch with every secret `redact` knows replaced (a value of the copied-in files
    written into another file, a key of any shape): the line stays, so the reviewer sees
    one was added. One scan of the whole patch, usually finding nothing; else line by line,
    each keeping its `+`/`-`/` ` (a private key is one `<REDACTED>` per line of it)."""
    if redact(patch) == patch:
        return patch
    lines = LineRedactor()
    return "\n".join(line[:1] + lines(line[1:]) for line in patch.split("\n"))


def milestone_range(repo: GitRepo, record: MilestoneRecord, round_no: int | None = None
                    ) -> tuple[str, str, str]:
    """(old, new, label) for the whole milestone, or for one round's commit."""
    if round_no is not None:
        it = next((i for i in record.iterations if i.round == round_no), None)
        if it is None or not it.commit:
            raise AnimaError(f"round {round_no} of {record.id} has no commit to show")
        parent = repo.resolve(f"{it.commit}^")
        if parent is None:
            raise AnimaError(f"commit {it.commit[:7]} of round {round_no} has no parent")
        return parent, it.commit, f"round {round_no}"
    if not record.base_commit or not record.branch_name:
        raise AnimaError(f"{record.id} has not started: there is no change to show yet")
    head = repo.resolve(record.branch_name) or repo.resolve(record.base_commit)
    if head is None:
        raise AnimaError(f"neither {record.branch_name} nor the base commit "
                         f"{record.base_commit[:7]} of {record.id} exists any more")
    if record.status is MilestoneStatus.COMPLETED and record.merge and record.merge.merged \
            and record.main_branch:
        merge = repo.merge_of(head, record.main_branch)
        first_parent = repo.resolve(f"{merge}^1") if merge else None
        if merge and first_parent:
            return first_parent, merge, "the merge into " + record.main_branch
    return record.base_commit, head, "whole milestone"


def milestone_changes(repo: GitRepo, record: MilestoneRecord, round_no: int | None = None,
                      hidden: frozenset[str] = frozenset()) -> ChangeSet:
    old, new, label = milestone_range(repo, record, round_no)
    return diff_between(repo, old, new, label, hidden)
