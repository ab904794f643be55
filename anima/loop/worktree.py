"""A milestone's worktree as the loop uses it: made (or re-attached after a crash) when the
milestone starts, set up once (the `.worktreeinclude` files, `worktree_setup_command`), and
removed when the milestone ends, merged or cancelled. Paused, failed and awaiting-review
milestones keep theirs."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable

from anima import procfs
from anima.config import Config
from anima.git import GitRepo
from anima.git.worktree_include import copy_included
from anima.loop.checks import CheckResult, Confine, display, run_check
from anima.loop.recovery import stash_changes
from anima.paths import ProjectPaths
from anima.store.models import MilestoneRecord, MilestoneStatus, now


class MilestoneWorktree:
    """`.anima/worktrees/<id>` of one milestone, seen from the human's checkout."""

    def __init__(self, project: GitRepo, paths: ProjectPaths, milestone_id: str,
                 config: Config, log: Callable[[str], None]) -> None:
        self.project = project
        self.paths = paths
        self.id = milestone_id
        self.config = config
        self._log = log
        self.path = paths.worktree(milestone_id)
        self.base = ""

    def open(self, branch: str, main: str) -> GitRepo:
        """The worktree on `branch` (created from `main` when missing), as a repository."""
        known = any(w.path == self.path for w in self.project.worktrees()) \
            and self.path.is_dir()
        self.base = self.project.add_worktree(self.path, branch, main)
        if not known:
            self.paths.setup_done(self.id).unlink(missing_ok=True)
            copied = copy_included(self.project.root, self.path)
            self._log(f"worktree {self.path.relative_to(self.project.root)} made for {branch}"
                      + (f"; copied from .worktreeinclude: {', '.join(copied)}"
                         if copied else ""))
        return GitRepo.open(self.path)

    def setup(self, cancel: threading.Event, confine: Confine | None) -> CheckResult | None:
        """Run `worktree_setup_command` once in the new worktree; None when there is none
        or it already ran. The caller turns a failure into a pause."""
        command, done = self.config.worktree_setup_command, self.paths.setup_done(self.id)
        if command is None or done.exists():
            return None
        self._log(f"worktree setup: running `{display(command)}`")
        result = run_check(command, self.path, timeout=self.config.check_timeout_seconds,
                           cancel=cancel, confine=confine,
                           marker=procfs.agent_marker(self.project.root, self.id, "setup"))
        self._log(f"worktree setup: `{display(command)}` {result.outcome}"
                  + (f"\n{result.tail}" if result.tail else ""))
        if result.passed:
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(f"{now().isoformat()}\n", encoding="utf-8")
        return result


def remove_worktree(project: GitRepo, paths: ProjectPaths, record: MilestoneRecord,
                    log: Callable[[str], None], why: str) -> None:
    """The milestone ended: its worktree goes (work left uncommitted in it first goes to a
    named stash, noted in the record), and so do its agents' own folders. The branch stays."""
    path = paths.worktree(record.id)
    if path.is_dir() and (path / ".git").exists():
        tree = GitRepo.open(path)
        if tree.dirty_paths():
            stash_changes(record, tree, log, f"uncommitted changes in the worktree when {why}")
    if project.remove_worktree(path) or path.exists():
        log(f"removed the worktree {path.relative_to(paths.root)} ({why}); "
            f"{record.branch_name or 'the branch'} is kept")
    shutil.rmtree(paths.sandbox(record.id), ignore_errors=True)


#: A milestone in one of these keeps its worktree (a restart re-attaches it).
_KEEPS_WORKTREE = frozenset({MilestoneStatus.IN_PROGRESS, MilestoneStatus.PAUSED,
                             MilestoneStatus.FAILED, MilestoneStatus.AWAITING_REVIEW})


def prune_leftover_worktrees(project: GitRepo, paths: ProjectPaths,
                             records: list[MilestoneRecord]) -> list[str]:
    """After a crash: worktrees under `.anima/worktrees/` whose milestone has ended (merged,
    cancelled) or is unknown go, each named in the returned log lines; the others stay for
    their milestone to re-attach."""
    by_id = {r.id: r for r in records}
    lines: list[str] = []
    leftovers = {w.path for w in project.worktrees() if w.path.parent == paths.worktrees}
    if paths.worktrees.is_dir():
        leftovers |= {p for p in paths.worktrees.iterdir() if p.is_dir()}
    for path in sorted(leftovers):
        record = by_id.get(path.name)
        if record is not None and record.status in _KEEPS_WORKTREE:
            continue
        if record is None:
            record = MilestoneRecord(id=path.name, title=path.name, created_at=now())
        remove_worktree(project, paths, record, lines.append,
                        f"found after a restart; its milestone is {record.status.value}"
                        if path.name in by_id else "found after a restart; no milestone has it")
    return lines
