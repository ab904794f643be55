"""A milestone's worktree as the loop uses it: made (or re-attached after a crash) when the
milestone starts, set up once (the `.worktreeinclude` files, `worktree_setup_command`), and
removed when the milestone ends, merged or cancelled. Paused, failed and awaiting-review
milestones keep theirs."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from anima import procfs
from anima.atomic import no_link_above, read_regular, write_model_atomic, write_text_atomic
from anima.config import Config
from anima.errors import InTheWay
from anima.git import GitRepo
from anima.git.locks import admin_dir, remove_links, worktree_git_dir
from anima.git.objects import take_objects
from anima.git.worktree_include import copy_included, included_paths
from anima.loop.checks import CheckResult, Confine, display, run_check
from anima.loop.recovery import stash_changes
from anima.paths import ProjectPaths
from anima.store.models import MergeState, MilestoneRecord, MilestoneStatus, now
from anima.text.redact import add_known_secrets, secret_values

#: How much of a copied-in file is read for its secret values (a `.env` is small).
_SECRET_FILE_BYTES = 1 << 16
#: Where the memory notes a worktree started from are kept (see `memory_as_started`).
_MEMORY_BASE = "memory-base"


class CopiedIn(BaseModel):
    """`.anima/sandbox/<id>/copied.done`: the `.worktreeinclude` files and memory notes were
    copied into the new worktree (a kill before that copies them at the next start)."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int = 1
    at: datetime
    #: What `.worktreeinclude` listed and git ignored: secrets, never to be committed.
    secrets: list[str] = []


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
        self._secrets: frozenset[str] | None = None

    def open(self, branch: str, main: str, never_started: bool = False) -> GitRepo:
        """The worktree on `branch` (created from `main` when missing), as a repository.

        A milestone that never started starts from main: a branch of its name that holds
        commits main lacks is someone else's (another milestone's Developer can create
        branches), so it is kept under a ref and the milestone starts without it."""
        try:
            admin: Path | None = admin_dir(self.project.common_dir, self.path)
        except FileNotFoundError:
            admin = None
        for link in remove_links(self.project.common_dir, admin, branch):
            self._log(f".git/{link} was a link (or a special file) in git's own folder, through "
                      "which git would write the file it names; removed")
        self._not_checked_out_elsewhere(branch)
        # The confined Developer's last commits may still be in its own store (taken in every
        # few seconds): the branch would name a commit git lacks, read as no branch at all.
        take_objects(self.paths.agent_objects(self.id), self.project.common_dir, report=False)
        if never_started:
            self._set_aside(branch, main)
        known = any(w.path == self.path and not w.half_made
                    for w in self.project.worktrees()) and self.path.is_dir()
        self.base = self.project.add_worktree(self.path, branch, main)
        copied_in = self.paths.copied_in(self.id)
        if not known:
            self.paths.setup_done(self.id).unlink(missing_ok=True)
            copied_in.unlink(missing_ok=True)
        if not copied_in.exists():
            secrets = included_paths(self.project.root)
            included = copy_included(self.project.root, self.path, secrets)
            memory = self._copy_memory()
            self._log(f"worktree {self.path.relative_to(self.project.root)} made for {branch}"
                      + (f"; copied from .worktreeinclude: {', '.join(included)}"
                         if included else "")
                      + (f"; your memory notes: {', '.join(memory)}" if memory else ""))
            copied_in.parent.mkdir(parents=True, exist_ok=True)
            write_model_atomic(copied_in, CopiedIn(at=now(), secrets=secrets))
            self._secrets = frozenset(secrets)
        elif again := self.copy_secrets_again():
            # Gone from the tree re-attached: a kill came between the reset that took them
            # out with a secret's commit (`secrets_committed`) and their copy back.
            self._log("copied in again from .worktreeinclude, missing from the worktree: "
                      + ", ".join(again))
        self._hide_secret_values()
        tree = self.project.worktree_repo(self.path)
        self._point_at(tree.git_dir)
        # A Developer turn a kill cut short may have left its git folder broken by hand.
        mended = tree.mend_git_folder(branch)
        for note in mended.notes + mended.forged:
            self._log(note)
        if mended.reindex:
            tree.rebuild_index()
        return tree

    def _point_at(self, admin: Path) -> None:
        """The worktree's `.git` names its own git folder again: the agents' git reads it
        (Anima's never does), and an unconfined agent or check may have pointed it at a
        repository of its own."""
        dot_git = self.path / ".git"
        with contextlib.suppress(OSError):
            if worktree_git_dir(self.path) == Path(os.path.realpath(admin)):
                return
        if dot_git.is_dir() and not dot_git.is_symlink():
            shutil.rmtree(dot_git)
        write_text_atomic(dot_git, f"gitdir: {admin}\n")
        self._log(f"{dot_git.relative_to(self.paths.root)} did not name the worktree's git "
                  "folder (something in the tree rewrote it); pointed back at it")

    def _hide_secret_values(self) -> None:
        """What the copied-in files hold is hidden from every agent output from now on, as
        it is (`add_known_secrets`): an agent that prints its `.env` shows none of it."""
        add_known_secrets(self.secret_values())

    def secret_values(self, min_length: int = 0) -> list[str]:
        """The secret values the copied-in files hold (`secret_values`), as the human's
        checkout has them now, of at least `min_length` characters."""
        return [v for v in values_held(self.project.root, self.secrets())
                if len(v) >= min_length]

    def secrets(self) -> frozenset[str]:
        """The paths copied in from `.worktreeinclude` (see `secret_paths`)."""
        if self._secrets is None:
            self._secrets = secret_paths(self.paths, self.id)
        return self._secrets

    def copy_secrets_again(self) -> list[str]:
        """Put back the copied-in files a reset took away (never over an existing file)."""
        return copy_included(self.project.root, self.path, sorted(self.secrets()))

    def _not_checked_out_elsewhere(self, branch: str) -> None:
        """The branch is the milestone's worktree's alone: one the human has checked out
        (here or in a worktree of theirs) is theirs to move, not Anima's."""
        mine = self.path.resolve()
        holder = next((w.path for w in self.project.worktrees()
                       if w.branch == branch and w.path.resolve() != mine), None)
        if holder is None and self.project.current_branch() == branch:
            holder = self.project.root
        if holder is not None:
            raise InTheWay(f"{branch} is checked out in {holder}: the milestone works on it in "
                           f"its own worktree; switch {holder} to another branch, then resume "
                           f"{self.id}")

    def _set_aside(self, branch: str, main: str) -> None:
        stamp = int(time.time())
        # Refs in a folder of the branch's name would keep it from being made at all.
        for ref, oid in self.project.refs_under(f"refs/heads/{branch}/"):
            kept = f"refs/anima/set-aside/{self.id}/{stamp}-in-the-way/" \
                   f"{ref.removeprefix(f'refs/heads/{branch}/')}"
            self.project.keep_ref(kept, oid)
            self.project.delete_ref(ref, oid)
            self._log(f"{ref.removeprefix('refs/heads/')} stood where the branch {branch} must "
                      f"be made: kept under {kept}")
        tip = self.project.resolve(f"refs/heads/{branch}")
        reflog = self.project.common_dir / "logs" / "refs" / "heads" / branch
        if tip is None and reflog.is_dir() and not reflog.is_symlink():
            shutil.rmtree(reflog)  # the reflogs of those refs, or a folder planted in the way
        if tip is None or self.project.is_ancestor(tip, self.project.branch_head(main)):
            return
        ref = f"refs/anima/set-aside/{self.id}/{stamp}"
        self.project.keep_ref(ref, tip)
        if self.path.exists():
            self.project.remove_worktree(self.path)
        self.project.delete_ref(f"refs/heads/{branch}", tip)
        self._log(f"{branch} existed before the milestone started, with commits main lacks "
                  f"(up to {tip[:7]}): kept under {ref}; the milestone starts from {main}")

    def _copy_memory(self) -> list[str]:
        """The project's memory notes that main does not track: the Developer keeps them
        current in its worktree and commits them, starting from yours. What it started from
        is kept, so that the merge may replace your untracked copy only while it is unchanged
        (`memory_as_started`)."""
        copied = []
        base = self.paths.sandbox(self.id) / _MEMORY_BASE
        for source in sorted(self.paths.memory.parent.glob("*.md")):
            rel = source.relative_to(self.project.root).as_posix()
            target = self.path / rel
            if os.path.lexists(target) or not no_link_above(self.path, rel) \
                    or source.is_symlink() or not source.is_file():
                continue
            content = read_regular(source)
            # What it started from first: a kill between the two leaves no copy that the
            # next start would skip while its base is missing (the merge would wait for ever).
            for path in (base / rel, target):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            copied.append(rel)
        return copied

    def setup(self, cancel: threading.Event, confine: Confine | None) -> CheckResult | None:
        """Run `worktree_setup_command` once in the new worktree; None when there is none
        or it already ran. The caller turns a failure into a pause."""
        command, done = self.config.worktree_setup_command, self.paths.setup_done(self.id)
        if command is None or done.exists():
            return None
        self._log(f"worktree setup: running `{display(command)}`")
        result = run_check(command, self.path, timeout=self.config.check_timeout_seconds,
                           cancel=cancel, confine=confine, keep=self.config.pass_env,
                           marker=procfs.agent_marker(self.project.root, self.id, "setup"))
        self._log(f"worktree setup: `{display(command)}` {result.outcome}"
                  + (f"\n{result.tail}" if result.tail else ""))
        if result.passed:
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(f"{now().isoformat()}\n", encoding="utf-8")
        return result


def secret_paths(paths: ProjectPaths, milestone_id: str) -> frozenset[str]:
    """The paths copied into the milestone's worktree from `.worktreeinclude` (a `.env`):
    secrets, which no commit of the milestone may hold and the Changes view never shows."""
    try:
        return frozenset(CopiedIn.model_validate_json(
            read_regular(paths.copied_in(milestone_id))).secrets)
    except (OSError, ValueError):  # made by an Anima that kept no list, or gone with the tree
        if not paths.worktree(milestone_id).is_dir():
            return frozenset()  # what was committed was checked while it ran
        return frozenset(included_paths(paths.root))


def values_held(root: Path, rels: Iterable[str]) -> list[str]:
    """The secret values (`secret_values`) the files `rels` of the checkout `root` hold now."""
    values: list[str] = []
    for rel in sorted(rels):
        with contextlib.suppress(OSError):
            text = read_regular(root / rel, _SECRET_FILE_BYTES)
            values += secret_values(text.decode("utf-8", errors="replace"))
    return values


def hide_copied_in(paths: ProjectPaths, milestone_id: str) -> frozenset[str]:
    """`secret_paths`, with the values those files hold hidden from then on wherever
    `redact` runs in this process (`add_known_secrets`), or, once that list went with the
    tree, the values of the project's `.worktreeinclude` files now. Only a process that
    opened the milestone's worktree knew them: a window started after the run showed one
    written into another file as it is."""
    hidden = secret_paths(paths, milestone_id)
    add_known_secrets(values_held(paths.root, hidden or included_paths(paths.root)))
    return hidden


def memory_as_started(paths: ProjectPaths, record: MilestoneRecord) -> dict[str, bytes]:
    """Your untracked memory notes as the milestone's worktree started from them: while your
    copy is still exactly that, the merge may replace it with the Developer's (otherwise it
    waits, naming it)."""
    base = paths.sandbox(record.id) / _MEMORY_BASE
    if not base.is_dir():
        return {}
    return {copy.relative_to(base).as_posix(): read_regular(copy)
            for copy in sorted(base.rglob("*")) if copy.is_file() and not copy.is_symlink()}


def remove_worktree(project: GitRepo, paths: ProjectPaths, record: MilestoneRecord,
                    log: Callable[[str], None], why: str) -> None:
    """The milestone ended: its worktree goes (work left uncommitted in it first goes to a
    named stash, noted in the record), and so do its agents' own folders. The branch stays."""
    path = paths.worktree(record.id)
    half_made = any(w.path == path and w.half_made for w in project.worktrees())
    # git deletes the tree's files before its `.git`: what a removal that a kill cut short
    # left reads as deletions, which are git's, not work to stash.
    half_removed = paths.removing(record.id).exists()
    for note in take_objects(paths.agent_objects(record.id), project.common_dir):
        log(note)
    if path.is_dir() and (path / ".git").exists() and not (half_made or half_removed):
        tree = project.worktree_repo(path)
        if tree.dirty_paths():
            stash_changes(record, tree, log, f"uncommitted changes in the worktree when {why}")
    if path.is_dir():
        paths.removing(record.id).parent.mkdir(parents=True, exist_ok=True)
        paths.removing(record.id).touch()
    there = path.exists()  # a folder git does not know is removed too: said all the same
    if project.remove_worktree(path) or there:
        log(f"removed the worktree {path.relative_to(paths.root)} ({why}); "
            f"{record.branch_name or 'the branch'} is kept")
    shutil.rmtree(paths.sandbox(record.id), ignore_errors=True)


#: A milestone in one of these keeps its worktree (a restart re-attaches it).
_KEEPS_WORKTREE = frozenset({MilestoneStatus.IN_PROGRESS, MilestoneStatus.PAUSED,
                             MilestoneStatus.FAILED, MilestoneStatus.AWAITING_REVIEW})


def _merge_owed(record: MilestoneRecord) -> bool:
    """Completed with its merge still pending: `finish_completed` removes the worktree once
    the merge is done, and needs what its folder keeps until then (`memory_as_started`)."""
    return record.status is MilestoneStatus.COMPLETED and record.merge is not None \
        and record.merge.state is MergeState.PENDING


def prune_leftover_worktrees(project: GitRepo, paths: ProjectPaths,
                             records: list[MilestoneRecord]) -> list[str]:
    """After a crash: worktrees under `.anima/worktrees/` whose milestone has ended (merged,
    cancelled; not one whose merge is still owed) or is unknown go, each named in the
    returned log lines; the others stay for their milestone to re-attach, and so does one
    whose record is there but does not read (not among `records`: refused and left as it
    is, its milestone's all the same)."""
    by_id = {r.id: r for r in records}
    lines: list[str] = []
    leftovers = {w.path for w in project.worktrees() if w.path.parent == paths.worktrees}
    if paths.worktrees.is_dir():
        leftovers |= {p for p in paths.worktrees.iterdir() if p.is_dir()}
    for path in sorted(leftovers):
        record = by_id.get(path.name)
        if record is not None and (record.status in _KEEPS_WORKTREE or _merge_owed(record)):
            continue
        if record is None and os.path.lexists(paths.milestone_record(path.name)):
            continue
        if record is None:
            record = MilestoneRecord(id=path.name, title=path.name, created_at=now())
        remove_worktree(project, paths, record, lines.append,
                        f"found after a restart; its milestone is {record.status.value}"
                        if path.name in by_id else "found after a restart; no milestone has it")
    return lines
