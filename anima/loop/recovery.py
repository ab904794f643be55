"""Bring a project, and an interrupted milestone, back to a state the loop can continue from.

Anima may die at any instant (a crash, SIGKILL, a power cut). Everything it persists is
written atomically, so what is left is always a valid snapshot; this module deals with what a
dead Anima leaves *outside* its records:

- its agents, which run in their own sessions and so outlive it: every agent is on
  record in `.anima/agents.json` while it lives (pid, start time, session), and a new Anima
  stops the leftovers, and everything they started (`anima.procfs` markers), before touching
  anything (`reap_leftover_agents`);
- a stale `.git/index.lock`, temp files of interrupted atomic writes, a torn last line in a
  log or transcript (`recover_project`);
- an interrupted milestone: the wrong branch checked out in its worktree, a dirty tree the
  Developer left mid-round (`recover_milestone`, the M4 seed's "重启恢复" steps 2–4).

Nothing here discards work: a tree that stays dirty after the Developer's clean-up turn is
stashed under a recorded name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from anima import procfs
from anima.atomic import read_regular, write_text_atomic
from anima.errors import AgentCrashed, TurnTimeout
from anima.git import GitRepo
from anima.git.locks import clear_stale_locks, wait_for_git
from anima.paths import TRANSCRIPT, ProjectPaths
from anima.store.models import MilestoneRecord, now
from anima.text.prompts import render

# A temp file of an atomic write older than this belongs to a dead writer.
_STALE_TEMP_SECONDS = 5.0
# A git command of the dead Anima may still be finishing: give it this long.
_GIT_WAIT = 10.0


# --------------------------------------------------------------------------- agents


#: (command line, session id) -> whether it is an agent on that session (the backends know).
OwnsProcess = Callable[[list[str], str], bool]


def is_our_agent(pid: int, root: Path, session_id: str, owns: OwnsProcess) -> bool:
    """Is `pid` an agent of this project on `session_id`, as its backend recognises it?

    Both must hold, so a human's own `claude --resume <id>` in a terminal or an unrelated
    process that reused the pid is never touched.
    """
    if pid == os.getpid() or not owns(procfs.cmdline(pid), session_id):
        return False
    return procfs.in_tree(pid, root)  # the project, or one of its milestones' worktrees


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class AgentEntry:
    """One live agent as recorded in `.anima/agents.json`."""

    role: str
    pid: int
    start_time: int
    session_id: str
    milestone: str | None = None


class AgentRegistry:
    """`.anima/agents.json`: the agents this Anima runs, rewritten atomically on each change.

    Thread-safe: agents start on the engine worker and may be stopped from a signal helper.
    """

    def __init__(self, paths: ProjectPaths) -> None:
        self.path = paths.agents
        self._lock = threading.Lock()

    def entries(self) -> list[AgentEntry]:
        """What is on record; an unreadable file (from a kill mid-rename cannot happen, but a
        human edit can) counts as empty: the session scan still finds leftovers."""
        try:
            data = json.loads(read_regular(self.path))
            return [AgentEntry(**e) for e in data.get("agents", [])]
        except (OSError, ValueError, TypeError, AttributeError):
            return []

    def add(self, role: str, pid: int, session_id: str, milestone: str | None) -> None:
        start = procfs.start_time(pid)
        if start is None:
            return  # already gone
        with self._lock:
            kept = [e for e in self.entries() if e.pid != pid]
            self._write([*kept, AgentEntry(role, pid, start, session_id, milestone)])

    def remove(self, pid: int | None) -> None:
        if pid is None:
            return
        with self._lock:
            entries = self.entries()
            kept = [e for e in entries if e.pid != pid]
            if len(kept) != len(entries):
                self._write(kept)

    def clear(self) -> None:
        with self._lock:
            self._write([])

    def _write(self, entries: list[AgentEntry]) -> None:
        text = json.dumps({"agents": [asdict(e) for e in entries]}, indent=2) + "\n"
        write_text_atomic(self.path, text)


class TrackedAgent:
    """An agent process whose pid is on record while it lives (see `AgentRegistry`).

    Stops are serialized: the worker and a stop request from another thread may both stop it.
    """

    def __init__(self, agent: Any, registry: AgentRegistry, milestone: str | None) -> None:
        self._agent = agent
        self._registry = registry
        self._stop_lock = threading.Lock()
        registry.add(agent.role, agent.pid, agent.session_id, milestone)

    @property
    def session_id(self) -> str:
        return str(self._agent.session_id)

    @property
    def pid(self) -> int | None:
        return self._agent.pid  # type: ignore[no-any-return]

    @property
    def went_on(self) -> bool:
        return bool(self._agent.went_on)

    @property
    def held_still(self) -> bool:
        return bool(self._agent.held_still)

    def send(self, prompt: str, waiting: Callable[[], None] | None = None) -> Any:
        return self._agent.send(prompt, waiting)

    def take_unclaimed(self) -> Any:
        return self._agent.take_unclaimed()

    def interrupt(self, timeout: float = 10.0) -> None:
        self._agent.interrupt(timeout)

    def stop(self, grace: float = 5.0) -> None:
        with self._stop_lock:
            pid = self._agent.pid
            self._agent.stop(grace)
            self._registry.remove(pid)


def reap_leftover_agents(paths: ProjectPaths, registry: AgentRegistry,
                         session_ids: set[str], owns: OwnsProcess) -> list[str]:
    """Stop every agent a dead Anima left running on this project; describe each one.

    Candidates are the registry's entries (pid and start time must still match) and any
    process carrying one of the project's session ids (covers an agent killed between its
    spawn and its registration). Each must pass `is_our_agent` before it is signalled.
    Call only while holding the project lock: then no live Anima owns these agents.
    """
    found: dict[int, tuple[str, str]] = {}
    for e in registry.entries():
        if procfs.start_time(e.pid) == e.start_time and is_our_agent(e.pid, paths.root,
                                                                      e.session_id, owns):
            found[e.pid] = (e.role, e.session_id)
    if session_ids:
        for pid in procfs.pids():
            if pid in found:
                continue
            argv = procfs.cmdline(pid)
            hit = next((s for s in session_ids if s in argv), None)
            if hit is not None and is_our_agent(pid, paths.root, hit, owns):
                found[pid] = ("agent", hit)
    done = []
    for pid, (role, session_id) in sorted(found.items()):
        procfs.stop_group(pid)
        done.append(f"stopped a leftover {role} agent of a previous run (pid {pid}, "
                    f"session {session_id[:8]})")
    # The agents died with Anima (PR_SET_PDEATHSIG) or just now, but what they started (a
    # test run, a build, a server sent to the background in a session of its own) lives on:
    # it carries the project's marker.
    if tools := procfs.stop_marked(procfs.marker_prefix(paths.root)):
        done.append(f"stopped {len(tools)} leftover tool process(es) of the agents of a "
                    f"previous run (pids {', '.join(map(str, tools))})")
    registry.clear()
    return done


# --------------------------------------------------------------------------- the project


def remove_stale_temps(paths: ProjectPaths) -> list[Path]:
    """Temp files of atomic writes (records, state, the lock) whose writer died mid-write."""
    removed = []
    limit = time.time() - _STALE_TEMP_SECONDS
    for folder in (paths.anima, paths.milestones):
        if not folder.is_dir():
            continue
        for tmp in folder.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.is_file() and tmp.stat().st_mtime < limit:
                    tmp.unlink()
                    removed.append(tmp)
    return removed


def repair_torn_tail(path: Path) -> bool:
    """Cut a last line that a kill left half-written, so the next append starts cleanly."""
    try:
        with path.open("rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return False
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return False
            keep = 0
            step = 65536
            pos = size
            while pos > 0:  # find the last newline, reading backwards
                start = max(0, pos - step)
                fh.seek(start)
                chunk = fh.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            fh.truncate(keep)
            return True
    except OSError:
        return False


def recover_project(paths: ProjectPaths, registry: AgentRegistry,
                    records: list[MilestoneRecord], repo: GitRepo,
                    owns: OwnsProcess) -> list[str]:
    """Everything a dead Anima may have left, fixed in a safe order; returns log lines.

    Agents first (a leftover Developer could still be committing while we look), then the
    dead Anima's own git commands are allowed to finish, then files are tidied.
    """
    lines = reap_leftover_agents(paths, registry, session_ids(records), owns)
    if still := wait_for_git(paths.root, _GIT_WAIT):
        lines.append(f"git still busy in the project after {_GIT_WAIT:g}s (pids "
                     f"{', '.join(map(str, still))}); going on")
    for git_dir in [repo.git_dir, *sorted((repo.git_dir / "worktrees").glob("*"))]:
        lines += [f"removed a stale {git_dir.relative_to(paths.root)}/{lock} left by a git "
                  "command killed with the previous run"
                  for lock in clear_stale_locks(paths.root, git_dir)]
    for tmp in remove_stale_temps(paths):
        lines.append(f"removed {tmp.name}, left by an interrupted write")
    torn = [*paths.logs.glob("*.log"), *paths.all_transcripts.glob(f"*/{TRANSCRIPT}")] \
        if paths.anima.is_dir() else []
    for path in torn:
        if repair_torn_tail(path):
            lines.append(f"cut a half-written last line from {path.relative_to(paths.root)}")
    return lines


def session_ids(records: list[MilestoneRecord]) -> set[str]:
    return {s for r in records for s in (r.sessions.developer, r.sessions.acceptor) if s}


# --------------------------------------------------------------------------- the milestone


def recovery_section(record: MilestoneRecord, log: str) -> str:
    """The seed's recovery context (rounds done, branch log, "continue where it stopped")."""
    return render("recovery", rounds=record.rounds, accepted=record.iteration_count,
                  branch=record.branch_name, log=log.strip() or "(no commits yet)")


def recover_milestone(record: MilestoneRecord, repo: GitRepo, *,
                      ask_developer: Callable[[str], str],
                      log: Callable[[str], None]) -> str | None:
    """The seed's restart steps 2–3 for an in_progress milestone; step 4's branch log back.

    2. Check out `milestone/<id>` if HEAD is elsewhere (changes found on another branch are
       not the Developer's: they are stashed under a recorded name first).
    3. A dirty tree goes to the Developer to commit or revert; still dirty → stashed, named
       in the record's notes. Only when the loop was running (`record.interrupted`): a
       milestone resumed from a pause starts its next round as usual.
    Returns `git log --oneline base..branch` for the recovery prompt, or None when the
    milestone was not interrupted. Agent failures in the clean-up turn are logged, not fatal.
    """
    branch = record.branch_name or f"milestone/{record.id}"
    if repo.current_branch() != branch:
        if repo.dirty_paths():
            where = repo.current_branch() or "a detached HEAD"
            stash_changes(record, repo, log,
                          f"changes found on {where} before switching to {branch}")
        log(f"switching to {branch}")
        repo.switch(branch)
    if not record.interrupted:
        return None
    history = repo.oneline_log(record.base_commit or "", branch)
    dirty = repo.dirty_paths()
    if dirty:
        log(f"tree dirty after the restart ({len(dirty)} paths): asking the Developer to commit "
            "or revert")
        prompt = recovery_section(record, history) + "\n" + render(
            "developer_cleanup", milestone_id=record.id, branch=branch,
            dirty="\n".join(dirty[:50]) + ("\n…" if len(dirty) > 50 else ""))
        try:
            ask_developer(prompt)
        except (TurnTimeout, AgentCrashed) as e:
            log(f"the clean-up turn failed: {e}")
        if repo.dirty_paths():
            stash_changes(record, repo, log, "the tree was still dirty after the clean-up turn")
        history = repo.oneline_log(record.base_commit or "", branch)
    return history


def _stash_name(milestone_id: str) -> str:
    return f"anima-recovery-{milestone_id}-{now():%Y%m%dT%H%M%S}"


def stash_changes(record: MilestoneRecord, repo: GitRepo, log: Callable[[str], None],
                  why: str) -> None:
    """Nothing is discarded: dirty work goes to a named stash, named in the record's notes."""
    name = _stash_name(record.id)
    commit = repo.stash_all(name)
    note = f"{why}: saved in stash {name!r} ({(commit or '')[:12]}); `git stash list` shows it"
    record.notes.append(note)
    log(note)


def note_unnamed_stashes(records: list[MilestoneRecord], repo: GitRepo) -> list[MilestoneRecord]:
    """A kill right after `stash_changes` stashed, before the record naming the stash was
    written: its milestone's record names it now (changed, not saved: returned)."""
    changed = []
    for record in records:
        stamp = re.compile(rf"anima-recovery-{re.escape(record.id)}-\d{{8}}T\d{{6}}")
        for commit, name in repo.stashes():
            if stamp.fullmatch(name) and not any(name in note for note in record.notes):
                record.notes.append(f"found at a restart: what was left uncommitted in its "
                                    f"worktree is in stash {name!r} ({commit[:12]}); "
                                    "`git stash list` shows it")
                if record not in changed:
                    changed.append(record)
    return changed
