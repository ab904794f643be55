"""Putting back what an agent running as the user (`sandbox: "off"`, or no bubblewrap)
changed that it may not: the human's definitions, the other milestones' records, its own
queue of work.

Before each Developer turn Anima takes its own copy of the human's definitions
(`.anima/config.json`, `soul.md`, `.anima/.gitignore`, every milestone `.md`, and `.git/config`
for the keys that run programs). After the turn it compares with that copy — never with the
files on disk, which may be the Developer's by then — puts the human's bytes back and says what
the turn changed. The copy also goes to `.anima/turn_guard.json` (ignored by git) while the
turn runs, so a kill during the turn is repaired on the next start before the config is read.
A milestone file the agents' tool calls named is held instead of queued (`put_back`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from anima.atomic import read_regular, write_model_atomic, write_text_atomic
from anima.events import Event, ToolUse
from anima.git import GitRepo
from anima.git.branches import Tips
from anima.git_options import NO_AGENT_CODE, git_environment
from anima.guard.turns import (
    GIT_CONFIG,
    PutBack,
    ReviewStart,
    TurnFindings,
    TurnGuard,
    TurnStart,
    read_definitions,
    read_files,
)
from anima.paths import ProjectPaths, is_milestone_md
from anima.sandbox import own_dir
from anima.store.store import SaveListener

# Keys that run a program, or change which tree and objects git reads (a bare flag, a
# worktree elsewhere, sparse or submodule checkouts, repository extensions).
_UNSAFE_GIT_KEYS = re.compile(
    r"(filter|diff|merge|gpg|credential|include|includeif|pager|difftool|mergetool|sequence|"
    r"uploadpack|receive|submodule|protocol|extensions)\..*|core\.(fsmonitor|hookspath|"
    r"editor|pager|sshcommand|askpass|attributesfile|gitproxy|alternaterefscommand|worktree|"
    r"bare|sparsecheckout|sparsecheckoutcone|repositoryformatversion)"
    r"|(commit|tag|push)\.gpgsign",
    re.IGNORECASE)


def read_records(paths: ProjectPaths, running: str) -> dict[str, bytes]:
    """Every milestone record but the running milestone's, and state.json (what users'
    scripts poll), by repository-relative path."""
    return read_files(paths, [paths.state, *sorted(
        p for p in paths.milestones.glob("*.json") if p.stem != running)])


def put_back(paths: ProjectPaths, copy: dict[str, bytes],
             agents_wrote: Callable[[Path], bool]) -> PutBack:
    """Make the definitions on disk equal `copy` again.

    A milestone `.md` that is new is the human's (they drop milestones in while one runs),
    unless `agents_wrote` it: an agent may not set itself work, so that one is held in
    `.anima/held/` until the human adds it again. Any other new definition is removed.
    """
    done = PutBack()
    now = read_definitions(paths)
    for rel in sorted(set(copy) | set(now)):
        before, after = copy.get(rel), now.get(rel)
        if before == after or (rel == GIT_CONFIG and not _adds_unsafe_git_keys(before, after)):
            continue
        target = paths.root / rel
        if before is None and is_milestone_md(rel):
            if agents_wrote(target):
                done.held.append((rel, hold(paths, target).relative_to(paths.root).as_posix()))
            continue
        if after is not None:  # perhaps the human's edit: kept, never lost
            done.kept.append(set_aside(paths, target).relative_to(paths.root).as_posix())
        if before is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_dir():
                target.unlink()
            target.write_bytes(before)
        word = "added" if before is None else "deleted" if after is None else "modified"
        done.changed.append(f"{rel} ({word})")
    return done


def _adds_unsafe_git_keys(before: bytes | None, after: bytes | None) -> bool:
    """Whether a change to git's settings adds or changes a key that runs a program or moves
    what git reads (an agent may set its commit identity; not a clean filter that runs in
    Anima's name, nor `core.bare`)."""
    old, new = _config_entries(before), _config_entries(after)
    return after is None or any(_UNSAFE_GIT_KEYS.fullmatch(key) for key, _ in new - old)


def _config_entries(data: bytes | None) -> set[tuple[str, str]]:
    """A git config file's (key, value) pairs; one that git cannot read counts as a key
    that runs programs, so it is put back."""
    if data is None:
        return set()
    done = subprocess.run(["git", *NO_AGENT_CODE, "config", "--file", "-", "--list", "-z"],
                          input=data, capture_output=True, check=False, env=git_environment(),
                          start_new_session=True)
    if done.returncode != 0:
        return {("include.path", "(unreadable)")}
    pairs = (item.decode("utf-8", "replace").partition("\n") for item in done.stdout.split(b"\0"))
    return {(key, value) for key, _, value in pairs if key}


def set_aside(paths: ProjectPaths, path: Path) -> Path:
    """Move `path` into `.anima/held/`, never over another file, nor through a link an agent
    put there (your file would go where it points)."""
    own_dir(paths.held)
    target, n = paths.held / path.name, 2
    while target.exists():
        target, n = paths.held / f"{path.stem}-{n}{path.suffix}", n + 1
    path.rename(target)
    return target


def hold(paths: ProjectPaths, md: Path) -> Path:
    """Move `md` out of the queue into `.anima/held/`; the record registered for it
    meanwhile (pending, never run) goes: it is only the file's echo."""
    target = set_aside(paths, md)
    record = paths.milestone_record(md.stem)
    with contextlib.suppress(OSError):
        if _registration_only(read_regular(record)):
            record.unlink()
    return target


def _registration_only(data: bytes) -> bool:
    """Whether a record says no more than a registration: pending, never run."""
    try:
        fields = json.loads(data)
    except ValueError:
        return False
    return isinstance(fields, dict) and fields.get("status") == "pending" \
        and not fields.get("iterations") and not fields.get("merge")


class ToolMentions:
    """The milestone files the agents' tool calls name: a bus subscriber for one milestone's
    run. Once a call that can write (anything but the read-only tools) names the milestones
    folder, every `*.md` name in such a call, before or after, is marked: a Write or Edit of
    `.anima/milestones/x.md`, `cat > .anima/milestones/x.md`, a `cd .anima/milestones` (or a
    link made to it) in one call and `… > x.md` in the next, which the shell's cwd carries.
    The project's checks run code the Developer wrote, so the marks last the run."""

    #: Tools that cannot write a file; every other one (Bash above all) can.
    READ_ONLY = frozenset({"Read", "Glob", "Grep", "LS", "WebFetch", "WebSearch", "TodoWrite"})

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._folder_named = False

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ToolUse) or event.tool in self.READ_ONLY:
            return
        text = "\n".join(_strings(event.input))
        with self._lock:
            self._folder_named = self._folder_named or "milestones" in text
            self._names.update(m.lower() for m in _MD_NAME.findall(text))

    def named(self, path: Path) -> bool:
        with self._lock:
            return self._folder_named and path.name.lower() in self._names


_MD_NAME = re.compile(r"[\w.-]+\.md\b", re.IGNORECASE)


def _strings(value: object) -> Iterator[str]:
    """Every string in a tool call's input (a command, a path, a file's new content)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _strings(item)


def describe_held(held: list[tuple[str, str]], who: str) -> str:
    """The line the log, the round and the window give held arrivals."""
    names = ", ".join(f"{rel} (held as {target})" for rel, target in held)
    return (f"{names} arrived while {who} was working: not queued, because Anima cannot tell "
            "whether you or the agent wrote it; if it is yours, add it again (File ▸ Add "
            "milestone, or `anima add`)")


def describe_kept(kept: list[str]) -> str:
    """What a put-back file held, where it is kept (your edit, perhaps)."""
    return (f"what they held is kept as {', '.join(kept)} (Anima cannot tell your edit from "
            "an agent's: if it was yours, take it from there)")


_Note = TypeVar("_Note", bound=TurnStart)


class _Saved(TurnStart):
    """`.anima/turn_guard.json`: the copy and the main tip taken before a Developer turn."""

    main: str
    definitions: dict[str, str]  # base64 of each file
    #: base64 of the running milestone's record as Anima last wrote it ("": none yet)
    record: str = ""
    #: Put back by a start already: kept only for the resume to judge who moved main. Put
    #: back again, it would undo what you did since (an abort; an edit of the config).
    applied: bool = False


def _load(model: type[_Note], note: Path) -> _Note | None:
    """One of Anima's notes of a turn or review under way (None: none, or unreadable)."""
    try:
        return model.model_validate(json.loads(read_regular(note)))
    except (OSError, ValueError):
        return None


class RestoringGuard(TurnGuard):
    """The guard for agents that run as the user: it also keeps Anima's copy of the human's
    definitions (on disk while a Developer turn runs) and of the other milestones' records,
    and puts them back after every turn, review and check run."""

    agents_write_main = True

    def __init__(self, paths: ProjectPaths, repo: GitRepo, milestone: str) -> None:
        super().__init__(paths, repo, milestone)
        self.copy: dict[str, bytes] = read_definitions(paths)
        self._saved: _Saved | None = None
        self.mentions = ToolMentions()
        #: The other milestones' records as Anima left them (see `before_review`).
        self.records: dict[str, bytes] = {}
        # `admit…` come from other threads while the worker begins or ends a turn.
        self._lock = threading.RLock()

    @property
    def definitions(self) -> Mapping[str, bytes]:
        return self.copy

    def listen(self, subscribe: Callable[[Callable[[Event], None]], Callable[[], None]],
               on_save: list[SaveListener]) -> list[Callable[[], None]]:
        on_save.append(self.admit_record)
        return [subscribe(self.mentions), lambda: on_save.remove(self.admit_record)]

    def admit(self, rel: str, content: bytes) -> None:
        """A milestone the human adds through Anima while an agent works is theirs: it joins
        the copy (on disk too) before the file is written, so it is not held."""
        with self._lock:
            self.copy = {**self.copy, rel: content}
            if self._saved is not None:
                self._saved.definitions[rel] = base64.b64encode(content).decode()
                write_model_atomic(self.paths.turn_guard, self._saved)

    def _note_records(self) -> None:
        """Before an agent or the project's checks run: the other milestones' records, which
        only Anima writes (the running one's it rewrites from memory anyway)."""
        with self._lock:
            self.records = read_records(self.paths, self.milestone)

    def before_review(self, start: ReviewStart) -> None:
        """Also kept on disk (`.anima/review_guard.json`): a kill during the review still
        tells main the reviewer moved from main someone else moved. The definitions are
        copied again: what changed since the Developer's turn ended (its processes are held
        meanwhile) is yours."""
        self._note_records()
        with self._lock:
            self.copy = read_definitions(self.paths)
        write_model_atomic(self.paths.review_guard, start)

    def interrupted_review(self) -> ReviewStart | None:
        start = _load(ReviewStart, self.paths.review_guard)
        if start is None or start.milestone != self.milestone:  # another's: its own restart
            return None
        self.paths.review_guard.unlink()
        return start

    def after_review(self) -> PutBack:
        self.paths.review_guard.unlink(missing_ok=True)
        records = self._restore_records()  # first: holding an arrival drops its record
        forged = self._drop_note(self.paths.turn_guard)
        done = put_back(self.paths, self.copy, self.mentions.named)
        done.changed = ([f"{r} put back" for r in records] + forged
                        + [f"the human's {d} put back" for d in done.changed]
                        + ([describe_kept(done.kept)] if done.kept else []))
        return done

    @contextlib.contextmanager
    def admit_record(self, path: Path, content: bytes) -> Iterator[None]:
        """The store's listener, told before each record is written and held until it is:
        Anima writes this (a registration, your action, the running milestone's progress).
        Held, so that a turn ending meanwhile on another thread (a registration comes from
        the scan) does not take the record it was told of, not yet on disk, for one deleted."""
        with self._lock:
            if path != self.paths.milestone_record(self.milestone):
                self.records[path.relative_to(self.paths.root).as_posix()] = content
            elif self._saved is not None:  # what a kill is repaired from
                self._saved.record = base64.b64encode(content).decode()
                write_model_atomic(self.paths.turn_guard, self._saved)
            yield

    def _restore_records(self) -> list[str]:
        """Put back every other milestone's record the work changed or deleted, so no agent
        resumes a paused milestone, retries a cancelled one or passes a review by editing a
        file. A new record that only registers a milestone is left (it never runs without its
        definition; `anima add` writes one from another process); one that says more (a
        final acceptance, a merge owed) is not Anima's and is set aside."""
        with self._lock:
            now = read_records(self.paths, self.milestone)
            changed = []
            for rel, before in sorted(self.records.items()):
                if (after := now.get(rel)) != before:
                    write_text_atomic(self.paths.root / rel, before.decode("utf-8"))
                    word = "deleted" if after is None else "modified"
                    changed.append(f"{rel} ({word})")
            for rel in sorted(set(now) - set(self.records)):
                path = self.paths.root / rel
                if path.parent == self.paths.milestones and not _registration_only(now[rel]):
                    target = set_aside(self.paths, path)
                    changed.append(f"{rel} (added; set aside as "
                                   f"{target.relative_to(self.paths.root).as_posix()})")
            return changed

    def begin(self, main: str, tips: Tips | None = None) -> None:
        """Also take the copy of the definitions, on disk too."""
        with self._lock:
            self._note_records()
            self.copy = read_definitions(self.paths)
            super().begin(main, tips)
            assert self._start is not None
            own = self.paths.milestone_record(self.milestone)
            self._saved = _Saved(
                **self._start.model_dump(), main=main,
                definitions={k: base64.b64encode(v).decode() for k, v in self.copy.items()},
                record=base64.b64encode(own.read_bytes()).decode() if own.is_file() else "")
            write_model_atomic(self.paths.turn_guard, self._saved)

    def end(self) -> TurnFindings:
        """Also put the human's definitions back, and say what the turn changed."""
        with self._lock:
            self._start, saved, self._saved = None, self._saved, None
            if saved is None:
                return TurnFindings()
            records = self._restore_records()  # first: holding an arrival drops its record
            if (own := _restore_own_record(self.paths, saved)) is not None:
                records.append(f"{own} (its own)")
            done = put_back(self.paths, self.copy, self.mentions.named)
            findings = TurnFindings(definitions=done.changed, records=records,
                                    held=done.held, kept=done.kept)
            self.copy = read_definitions(self.paths)
            self._main_findings(saved, saved.main, findings)
            self.paths.turn_guard.unlink(missing_ok=True)
            return findings

    def _drop_note(self, note: Path) -> list[str]:
        """Anima's note of a Developer turn is on disk only while one runs: one there after a
        review or a check run was written by their code (the Developer's), and the next
        start would take it for a turn a kill cut short, writing the definitions and the
        record it holds."""
        try:
            note.unlink()
        except FileNotFoundError:
            return []
        return [f"{note.relative_to(self.paths.root).as_posix()} (Anima's note, written while "
                "what it notes did not run: removed)"]

    def resume_interrupted(self) -> TurnFindings | None:
        """A Developer turn of this milestone that a kill cut short: who moved main. What
        it changed of the definitions and its own record was put back at start-up
        (`put_back_interrupted`); the other records' copy died with Anima."""
        saved = _load(_Saved, self.paths.turn_guard)
        if saved is None or saved.milestone != self.milestone:
            return None
        findings = self._main_findings(saved, saved.main)
        self.paths.turn_guard.unlink(missing_ok=True)
        return findings


def put_back_interrupted(paths: ProjectPaths) -> PutBack:
    """At start-up, before the config or any record is read: a Developer turn was running
    when Anima was killed (perhaps by the Developer), so its copy is the truth for the human's
    definitions and for the running milestone's record, which the Developer may have edited
    (features done, rounds accepted) before the kill."""
    saved = _load(_Saved, paths.turn_guard)
    return PutBack() if saved is None else _apply(paths, saved)


def _apply(paths: ProjectPaths, saved: _Saved) -> PutBack:
    """Put the note's copy back, once: a note put back is kept only for the resume."""
    if saved.applied:
        return PutBack()
    # What its tool calls named died with Anima: what arrived after the turn began is held.
    done = put_back(paths, {k: base64.b64decode(v) for k, v in saved.definitions.items()},
                    lambda md: _changed_since(md, saved.started))
    done.record = _restore_own_record(paths, saved)
    write_model_atomic(paths.turn_guard, saved.model_copy(update={"applied": True}))
    return done


def drop_interrupted(paths: ProjectPaths, milestone: str) -> None:
    """You abort the milestone whose Developer turn a kill cut short: the note is put back
    first (if no start did yet), then dropped, as no resume will judge that turn."""
    saved = _load(_Saved, paths.turn_guard)
    if saved is None:
        return
    _apply(paths, saved)
    if saved.milestone == milestone:
        paths.turn_guard.unlink(missing_ok=True)


def _restore_own_record(paths: ProjectPaths, saved: _Saved) -> str | None:
    """The running milestone's record as Anima last wrote it, if the turn changed it."""
    own = paths.milestone_record(saved.milestone)
    if not saved.record:
        return None
    before = base64.b64decode(saved.record)
    if own.is_file() and not own.is_symlink() and own.read_bytes() == before:
        return None
    own.unlink(missing_ok=True)  # a symlink or a folder the agent put there: not written through
    write_text_atomic(own, before.decode("utf-8"))
    return own.relative_to(paths.root).as_posix()


def _changed_since(path: Path, started: float) -> bool:
    try:
        return path.lstat().st_ctime >= started - 1.0  # ctime: no program can set it back
    except FileNotFoundError:
        return False
