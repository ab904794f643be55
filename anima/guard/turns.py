"""Where main stood when a Developer turn began, and who moved it since.

Confined (the sandbox), an agent cannot write the human's definitions, the records or Anima's
notes, nor main's ref: this is all a turn needs watching for. Unconfined, `RestoringGuard`
(`anima.guard.restore`) adds putting back what the agent changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from anima.events import Event
from anima.git import GitRepo
from anima.git.branches import Tips
from anima.paths import DEFINITION_FILES, ProjectPaths
from anima.store.store import SaveListener

#: Git's settings for the repository: a key that names a program (a filter or diff driver
#: `.gitattributes` can switch on, a signing program, an editor, an included file) would run
#: it in Anima's git commands, at the merge into main too.
GIT_CONFIG = ".git/config"


def read_files(paths: ProjectPaths, files: Iterable[Path]) -> dict[str, bytes]:
    """Those of `files` that are regular files on disk now (not links), by
    repository-relative path."""
    return {p.relative_to(paths.root).as_posix(): p.read_bytes() for p in files
            if p.is_file() and not p.is_symlink()}


def read_definitions(paths: ProjectPaths) -> dict[str, bytes]:
    """The human's definitions as they are on disk now, by repository-relative path."""
    return read_files(paths, [*(paths.root / rel for rel in (*DEFINITION_FILES, GIT_CONFIG)),
                              *sorted(paths.milestones.glob("*.md"))])


class TurnStart(BaseModel):
    """Where main and HEAD stood when an agent's turn (or a check run) began: kept on disk
    while it runs, so a kill during it is judged at the next start as at its end."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    milestone: str
    started: float
    main_before: str
    head_before: str


class ReviewStart(TurnStart):
    """The same before a review or a check run, and whose it is."""

    who: str


@dataclass
class TurnFindings:
    """What one Developer turn did that it may not."""

    definitions: list[str] = field(default_factory=list)  # put back in the working tree
    records: list[str] = field(default_factory=list)  # other milestones' records, put back
    held: list[tuple[str, str]] = field(default_factory=list)  # milestones that arrived
    kept: list[str] = field(default_factory=list)  # where what was put back is kept
    head_before: str = ""  # HEAD when the turn began
    main_before: str = ""
    main_after: str = ""
    #: main's new commits (hash, subject), when main moved during the turn
    main_commits: list[tuple[str, str]] = field(default_factory=list)
    #: True when the Developer's own working tree was on main's new commits
    developer_moved_main: bool = False


@dataclass
class PutBack:
    """What putting back what agents may not change did (unconfined only)."""

    #: "<path> (added|deleted|modified)": what an agent may not change, undone
    changed: list[str] = field(default_factory=list)
    #: milestones that arrived meanwhile, and where each one is held (repository-relative)
    held: list[tuple[str, str]] = field(default_factory=list)
    #: where what the files put back held is kept (repository-relative)
    kept: list[str] = field(default_factory=list)
    #: the running milestone's record, put back as Anima last wrote it (after a kill)
    record: str | None = None


class TurnGuard:
    """One milestone's guard for confined agents: `begin` before each Developer turn, `end`
    after it. The hooks below do nothing here; `RestoringGuard` fills them in."""

    #: Whether the agents can write main's ref: confined, a visit of their HEAD to a new
    #: commit of main (a look, a rebase onto it) is no move of theirs.
    agents_write_main = False

    def __init__(self, paths: ProjectPaths, repo: GitRepo, milestone: str) -> None:
        self.paths = paths
        self.repo = repo
        self.milestone = milestone
        self._start: TurnStart | None = None
        self._main = ""

    @property
    def definitions(self) -> Mapping[str, bytes]:
        """The human's definitions a commit is checked against: in the human's checkout,
        which no confined agent can write (the worktree's copies are the Developer's)."""
        return read_definitions(self.paths)

    def listen(self, subscribe: Callable[[Callable[[Event], None]], Callable[[], None]],
               on_save: list[SaveListener]) -> list[Callable[[], None]]:
        """Follow the agents' events and Anima's own record writes for the run; returns how
        to stop."""
        return []

    def admit(self, rel: str, content: bytes) -> None:
        """The human adds a milestone through Anima while an agent works."""

    def before_review(self, start: ReviewStart) -> None:
        """Before an Acceptor review or the project's checks (confined, neither can move
        main: nothing to keep for after a kill)."""

    def after_review(self) -> PutBack:
        """After them: what they changed that they may not, put back."""
        return PutBack()

    def interrupted_review(self) -> ReviewStart | None:
        """This milestone's review or check run that a kill cut short."""
        return None

    def begin(self, main: str, tips: Tips | None = None) -> None:
        """Note main's tip and HEAD (`tips`, when the caller has just read them)."""
        if tips is not None and tips.on_branch and tips.main and tips.branch:
            main_before, head_before = tips.main, tips.branch
        else:
            main_before, head_before = self.repo.branch_head(main), self.repo.head()
        self._main = main
        self._start = TurnStart(milestone=self.milestone, started=time.time(),
                                main_before=main_before, head_before=head_before)

    def end(self) -> TurnFindings:
        """Say whether main moved during the turn, and whether the Developer moved it."""
        start, self._start = self._start, None
        return TurnFindings() if start is None else self._main_findings(start, self._main)

    def resume_interrupted(self) -> TurnFindings | None:
        """A Developer turn that a kill cut short, judged now (confined: nothing to judge,
        main's ref was not the agent's to write)."""
        return None

    def _main_findings(self, start: TurnStart, main: str,
                       findings: TurnFindings | None = None) -> TurnFindings:
        findings = findings or TurnFindings()
        findings.main_before, findings.head_before = start.main_before, start.head_before
        after = self.repo.resolve(f"refs/heads/{main}")
        if after is not None and after != start.main_before:
            findings.main_after = after
            findings.main_commits = list(self.repo.ancestry(start.main_before, after).commits)
            if self.agents_write_main:
                visited = self.repo.agent_visits_since(start.started, main)
                findings.developer_moved_main = after in visited or any(
                    c in visited for c, _ in findings.main_commits)
        return findings
