"""What a Developer turn may not change: the human's definitions, and main.

Before each Developer turn Anima takes its own copy of the human's definitions
(`.anima/config.json`, `soul.md`, `.anima/.gitignore`, every milestone `.md`) and notes where
main stands. After the turn it compares with that copy — never with the files on disk, which
may be the Developer's by then — puts the human's bytes back, and says what the turn changed
and whether it moved main itself (its working tree's HEAD was on main's new commits) or
someone else did. The copy also goes to `.anima/turn_guard.json` (ignored by git) while the
turn runs, so a kill during the turn is repaired on the next start before the config is read.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from anima.atomic import write_model_atomic
from anima.git import GitRepo
from anima.paths import ProjectPaths

_FIXED = (".anima/config.json", ".anima/soul.md", ".anima/.gitignore")


def read_definitions(paths: ProjectPaths) -> dict[str, bytes]:
    """The human's definitions as they are on disk now, by repository-relative path."""
    found: dict[str, bytes] = {}
    files = [paths.root / rel for rel in _FIXED]
    if paths.milestones.is_dir():
        files += sorted(paths.milestones.glob("*.md"))
    for path in files:
        if path.is_file() and not path.is_symlink():
            found[path.relative_to(paths.root).as_posix()] = path.read_bytes()
    return found


def put_back(paths: ProjectPaths, copy: dict[str, bytes]) -> list[str]:
    """Make the definitions on disk equal `copy` again; describe each one changed.

    A milestone `.md` that is new on disk is left alone: the human drops milestones into the
    folder while one runs. Any other new definition is removed.
    """
    changed: list[str] = []
    now = read_definitions(paths)
    for rel in sorted(set(copy) | set(now)):
        before, after = copy.get(rel), now.get(rel)
        if before == after or (before is None and rel.endswith(".md")
                               and rel.startswith(".anima/milestones/")):
            continue
        target = paths.root / rel
        if before is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_dir():
                target.unlink()
            target.write_bytes(before)
        word = "added" if before is None else "deleted" if after is None else "modified"
        changed.append(f"{rel} ({word})")
    return changed


class _Saved(BaseModel):
    """`.anima/turn_guard.json`: the copy and the main tip taken before a Developer turn."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    milestone: str
    started: float
    main: str
    main_before: str
    head_before: str
    definitions: dict[str, str]  # base64 of each file


@dataclass
class TurnFindings:
    """What one Developer turn did that it may not."""

    definitions: list[str] = field(default_factory=list)  # put back in the working tree
    head_before: str = ""  # HEAD when the turn began
    main_before: str = ""
    main_after: str = ""
    #: main's new commits (hash, subject), when main moved during the turn
    main_commits: list[tuple[str, str]] = field(default_factory=list)
    #: True when the Developer's own working tree was on main's new commits
    developer_moved_main: bool = False


class TurnGuard:
    """One milestone's guard: `begin` before each Developer turn, `end` after it."""

    def __init__(self, paths: ProjectPaths, repo: GitRepo, milestone: str) -> None:
        self.paths = paths
        self.repo = repo
        self.milestone = milestone
        self.copy: dict[str, bytes] = read_definitions(paths)
        self._saved: _Saved | None = None

    def begin(self, main: str) -> None:
        """Take the copy of the definitions and note main's tip, on disk too."""
        self.copy = read_definitions(self.paths)
        self._saved = _Saved(
            milestone=self.milestone, started=time.time(), main=main,
            main_before=self.repo.branch_head(main), head_before=self.repo.head(),
            definitions={k: base64.b64encode(v).decode() for k, v in self.copy.items()})
        write_model_atomic(self.paths.turn_guard, self._saved)

    def end(self) -> TurnFindings:
        """Put the human's definitions back; say what the turn changed, and who moved main."""
        saved, self._saved = self._saved, None
        if saved is None:
            return TurnFindings()
        findings = TurnFindings(definitions=put_back(self.paths, self.copy),
                                main_before=saved.main_before, head_before=saved.head_before)
        self.copy = read_definitions(self.paths)  # a milestone dropped meanwhile joins it
        after = self.repo.resolve(f"refs/heads/{saved.main}")
        if after is not None and after != saved.main_before:
            findings.main_after = after
            findings.main_commits = self.repo.branch_log(saved.main_before, after)
            visited = self.repo.head_visits_since(saved.started)
            findings.developer_moved_main = after in visited or any(
                c in visited for c, _ in findings.main_commits)
        with contextlib.suppress(FileNotFoundError):
            self.paths.turn_guard.unlink()
        return findings

    def resume_interrupted(self) -> TurnFindings | None:
        """A Developer turn of this milestone that a kill cut short: check it now."""
        saved = load_saved(self.paths)
        if saved is None or saved.milestone != self.milestone:
            return None
        self._saved = saved
        self.copy = _decoded(saved)
        return self.end()


def load_saved(paths: ProjectPaths) -> _Saved | None:
    path: Path = paths.turn_guard
    try:
        return _Saved.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _decoded(saved: _Saved) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in saved.definitions.items()}


def put_back_interrupted(paths: ProjectPaths) -> list[str]:
    """At start-up, before the config is read: a Developer turn was running when Anima was
    killed, so its copy is the truth for the human's definitions."""
    saved = load_saved(paths)
    return put_back(paths, _decoded(saved)) if saved is not None else []
