"""Failures are named (issue 10.10) and exit codes tell the truth (10.6), end to end with a
real `python -m anima run … --headless` and the fake `claude`: an unexpected error fails one
milestone (record, log, anima.log with its traceback) while the others go on, `anima resume`
retries it, and `anima abort` cancels a milestone and removes its worktree (its branch kept,
the human's checkout untouched).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anima.loop.confinement import sandbox_problem
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record
from tests.test_recovery import (
    AUTO,
    ONE,
    TWO,
    Runner,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    run_to_end,
    wait_until,
)

OTHER = milestone_md("Other", ["Farewell command"])
NO = {"text": "REJECTED: not yet"}
#: The Developer throws its own branch away: the next round cannot go back to it.
# The branch deleted and a branch under its name in the way: Anima cannot recreate it. In the
# sandbox the deletion is refused (`packed-refs` is read-only there), so only `sandbox: "off"`
# reaches the unexpected error.
BRANCH_GONE = {"shell": ["git checkout -q --detach && git branch -q -D milestone/m1 && "
                         "git branch milestone/m1/blocker"], "auto": True}


def anima(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "anima", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


def state(project: Path) -> tuple[str, str | None]:
    data = json.loads((project / ".anima" / "state.json").read_text())
    return data["status"], data["current_milestone"]


def test_an_unexpected_error_fails_one_milestone_the_others_go_on_and_resume_retries(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    # m2 waits for review, so main stays where m1 started (a moved main is another story).
    make_project(git_repo, {"m1": ONE, "m2": "---\nrequires_human_review: true\n---\n" + OTHER},
                 config={"sandbox": "off"})
    fake_claude.write_script({"developer": [BRANCH_GONE]})
    first = run_to_end(git_repo, fake_claude)
    assert first.proc.returncode == 1, first.stdout[-2000:] + first.stderr
    m1, m2 = record(git_repo, "m1"), record(git_repo, "m2")
    assert m1.status is MilestoneStatus.FAILED and m1.phase == "failed"
    assert m1.error is not None and "milestone/m1" in m1.error
    assert m2.status is MilestoneStatus.AWAITING_REVIEW
    assert "[anima] failed: m1" in first.stdout
    assert f"`anima resume {git_repo} m1` retries it" in first.stdout
    assert "unexpected error" in (git_repo / ".anima" / "logs" / "m1.log").read_text()
    anima_log = (git_repo / ".anima" / "logs" / "anima.log").read_text()
    assert "Traceback (most recent call last)" in anima_log and "milestone m1 failed" in anima_log
    assert state(git_repo) == ("sleeping", None)
    status = anima("status", str(git_repo))
    assert "failed: " in status.stdout and "milestone/m1" in status.stdout
    # The failed milestone keeps its worktree as it is; the human's checkout stayed on main.
    assert (git_repo / ".anima" / "worktrees" / "m1").is_dir()
    assert run_git(git_repo, "branch", "--show-current") == "main"

    # The human puts the branch back and retries.
    run_git(git_repo, "branch", "-D", "milestone/m1/blocker")
    run_git(git_repo, "branch", "milestone/m1", m1.base_commit or "")
    resumed = anima("resume", str(git_repo), "m1")
    assert resumed.returncode == 0, resumed.stderr
    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    m1 = record(git_repo, "m1")
    assert m1.status is MilestoneStatus.COMPLETED and m1.error is None
    assert m1.merge and m1.merge.merged
    assert our_processes() == []


@pytest.mark.skipif(sandbox_problem("auto") is not None, reason="bubblewrap cannot run here")
def test_in_the_sandbox_the_developer_cannot_throw_its_branch_away(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """The same Developer as above, confined: deleting its branch fails (git's `packed-refs`
    is read-only to it), its commit on a detached HEAD is rejected, and the milestone goes on
    on its branch to the end."""
    make_project(git_repo, {"m1": ONE}, config={"sandbox": "required"})
    base = run_git(git_repo, "rev-parse", "main")
    fake_claude.write_script({"developer": [BRANCH_GONE]})
    run = run_to_end(git_repo, fake_claude)
    assert run.proc.returncode == 0, run.stdout[-2000:] + run.stderr
    m1 = record(git_repo, "m1")
    assert m1.status is MilestoneStatus.COMPLETED and m1.error is None
    assert m1.merge and m1.merge.merged
    assert "not on the milestone branch" in (m1.iterations[0].reason or "")
    transcript = (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert "could not delete reference refs/heads/milestone/m1" in transcript
    assert "Read-only file system" in transcript
    assert run_git(git_repo, "branch", "--list", "milestone/m1/*") == ""
    assert run_git(git_repo, "merge-base", "--is-ancestor", base, "milestone/m1") == ""
    assert our_processes() == []


@pytest.mark.skipif(sandbox_problem("auto") is not None, reason="bubblewrap cannot run here")
def test_a_write_the_sandbox_refused_the_developer_is_named_in_the_round_and_the_log(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """A Developer command that wrote outside its worktree and went on succeeded: the
    "Read-only file system" reached only the model. The round's notes, the log and `anima run`
    name the write; output that only quotes the words, and a write the read-only Acceptor was
    refused (a test run's cache), are no note, and the milestone goes on as before."""
    make_project(git_repo, {"m1": ONE}, config={"sandbox": "required"})
    planted = git_repo / "planted.txt"
    quoted = 'app.py:3:    raise OSError("cache: Read-only file system")'
    fake_claude.write_script({
        "developer": [{"shell": [f"echo x > {planted}; echo '{quoted}'"], "auto": True}],
        "acceptor": [{"shell": ["echo x > .test-cache; echo ran"], "auto": True}]})
    run = run_to_end(git_repo, fake_claude)
    assert run.proc.returncode == 0, run.stdout[-2000:] + run.stderr
    m1 = record(git_repo, "m1")
    assert m1.status is MilestoneStatus.COMPLETED and not planted.exists()
    refused = f"{planted}: Read-only file system"
    (note,) = [n for it in m1.iterations for n in it.notes]
    assert note.startswith("developer: the sandbox refused a write: ") and refused in note
    assert "app.py" not in note
    assert note in (git_repo / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    assert refused in run.stdout
    transcript = (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert ".test-cache: Read-only file system" in transcript  # the Acceptor's, no note
    assert our_processes() == []


def test_an_unexpected_cli_error_prints_one_line_pointing_at_the_log(git_repo: Path) -> None:
    make_project(git_repo, {"m1": ONE})
    # Nested deeper than the JSON parser can go: an error nothing in Anima expects.
    (git_repo / ".anima" / "state.json").write_text("[" * 200_000, encoding="utf-8")
    out = anima("status", str(git_repo))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unexpected error" in lines[0] and "anima.log" in lines[0]
    assert "Traceback" in (git_repo / ".anima" / "logs" / "anima.log").read_text()


def test_abort_cancels_a_paused_milestone_and_removes_its_worktree(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": TWO})
    leave_a_file = {"shell": ["echo draft > draft.txt"], "auto": True}
    fake_claude.write_script({"acceptor": [NO, NO, NO], "developer": [AUTO, AUTO,
                                                                      leave_a_file]})
    paused = run_to_end(git_repo, fake_claude)
    assert paused.proc.returncode == 3, paused.stdout[-2000:]
    worktree = git_repo / ".anima" / "worktrees" / "m1"
    assert (worktree / "draft.txt").is_file()  # a paused milestone keeps its worktree
    # The human adds something in their own checkout before aborting: nothing of Anima's
    # touches it. Something left uncommitted in the milestone's worktree is kept in a stash.
    (git_repo / "idea.txt").write_text("an idea\n", encoding="utf-8")
    (worktree / "unfinished.txt").write_text("half done\n", encoding="utf-8")
    tip = run_git(git_repo, "rev-parse", "milestone/m1")
    main = run_git(git_repo, "rev-parse", "main")

    out = anima("abort", str(git_repo), "m1")
    assert out.returncode == 0, out.stderr
    assert "aborted m1: cancelled" in out.stdout
    assert "removed the worktree .anima/worktrees/m1" in out.stdout
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.CANCELLED and rec.phase == "cancelled"
    # It is not paused any more: why it was is a note now.
    assert rec.pause_reason is None
    assert any(n.startswith("paused before it was cancelled: ") for n in rec.notes)
    assert "paused:" not in anima("status", str(git_repo)).stdout
    # The worktree is gone, the branch is kept, main did not move.
    assert not worktree.exists()
    assert "worktrees/m1" not in run_git(git_repo, "worktree", "list")
    assert run_git(git_repo, "rev-parse", "milestone/m1") == tip
    assert run_git(git_repo, "rev-parse", "main") == main
    # The human's checkout: still on main, their file where they left it, nothing of the
    # milestone's carried into it.
    assert run_git(git_repo, "branch", "--show-current") == "main"
    assert (git_repo / "idea.txt").read_text(encoding="utf-8") == "an idea\n"
    assert run_git(git_repo, "status", "--porcelain", "--", ".", ":!.anima") == "?? idea.txt"
    assert not (git_repo / "draft.txt").exists()
    # The worktree's uncommitted file is in a stash the record names.
    assert "unfinished.txt" in run_git(git_repo, "show", "--name-only", "--format=",
                                       "stash@{0}^3")
    assert any("stash" in n for n in rec.notes)
    assert state(git_repo) == ("sleeping", None)
    assert "cancelled by you" in (git_repo / ".anima" / "logs" / "m1.log").read_text()
    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0 and "nothing left to do" in again.stdout
    assert not worktree.exists()

    refused = anima("abort", str(git_repo), "m1")  # cancelled is final
    assert refused.returncode == 2 and "cancelled" in refused.stderr
    assert our_processes() == []


def test_a_paused_project_stays_paused_and_exits_3_whatever_its_definitions(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": TWO})
    fake_claude.write_script({"acceptor": [NO, NO, NO]})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 3
    assert state(git_repo) == ("paused", "m1")
    # The definition is gone (swept into a commit elsewhere, deleted by hand): the record is
    # still the truth about where the project stands.
    (git_repo / ".anima" / "milestones" / "m1.md").unlink()
    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 3, again.stdout[-2000:]
    assert "nothing left to do" not in again.stdout and "paused for a human: m1" in again.stdout
    assert state(git_repo) == ("paused", "m1")
    status = json.loads(anima("status", str(git_repo), "--json").stdout)
    assert [m["status"] for m in status["milestones"]] == ["paused"]
    assert our_processes() == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MB file system of its own (tmpfs), to fill up."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def small_repo(small_disk: Path) -> Path:
    """A repository with one commit on the small file system."""
    repo = small_disk / "repo"
    run_git(small_disk, "init", "-q", "-b", "main", str(repo))
    (repo / "README.md").write_text("# small\n", encoding="utf-8")
    run_git(repo, "add", "-A")
    run_git(repo, "-c", "user.name=T", "-c", "user.email=t@example.invalid", "commit", "-qm",
            "init")
    return repo


def test_a_full_disk_is_named_and_the_records_keep_their_last_state(
        small_disk: Path, fake_claude: FakeClaude) -> None:
    """A Developer that fills the disk (a build's output, a runaway log): the run stops
    saying the disk is full and what to do, once, without a traceback per line logged, and
    every record on disk is still whole."""
    repo = small_repo(small_disk)
    make_project(repo, {"m1": ONE})
    fill = "dd if=/dev/zero of=big.bin bs=1M count=100 2>/dev/null; true"
    fake_claude.write_script({"developer": [{"shell": [fill], "auto": True}]})
    runner = run_to_end(repo, fake_claude)

    assert runner.proc.returncode != 0
    said = runner.stdout + runner.stderr
    assert "the disk is full" in said and "free some space" in said, said[-2000:]
    assert "Traceback" not in said and said.count("cannot write") <= 1
    assert record(repo, "m1").id == "m1"  # whole, as last written


def test_a_command_that_meets_a_full_disk_says_so(small_disk: Path, tmp_path: Path) -> None:
    repo = small_repo(small_disk)
    make_project(repo, {})
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'filler'}", "bs=64k"],
                   capture_output=True, check=False)
    source = tmp_path / "m2.md"
    source.write_text(ONE, encoding="utf-8")
    added = anima("add", str(repo), str(source))
    assert added.returncode == 1 and "the disk is full" in added.stderr, added.stderr
    assert "unexpected error" not in added.stderr


@pytest.mark.parametrize("at", ["read-tree", "update-ref"])
def test_a_disk_that_fills_during_the_merge_is_named_and_the_next_start_merges(
        small_disk: Path, fake_claude: FakeClaude, tmp_path: Path, at: str) -> None:
    """Your checkout on main takes the merge's files (`read-tree`), then main moves
    (`update-ref`): the disk filling at either left files half written that later read as
    your changes (the merge waited for ever), emptied your memory notes, or read as "main
    moved" (exit 0, the merge not done). Now the run stops naming the full disk, your files
    are as they were, and once there is room the next start merges."""
    repo = small_repo(small_disk)
    make_project(repo, {"m1": ONE}, config={"sandbox": "off"})
    notes = repo / ".anima" / "memory" / "project.md"
    mine = notes.read_bytes()
    armed, filler = tmp_path / "armed", small_disk / "filler"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "git").write_text(  # fills the disk as Anima's merge runs that command
        f'#!/bin/sh\nif [ -e {armed} ]; then case " $* " in *" {at} "*) rm -f {armed}; '
        f"dd if=/dev/zero of={filler} bs=64k 2>/dev/null;; esac; fi\n"
        f'exec {shutil.which("git")} "$@"\n', encoding="utf-8")
    (shim / "git").chmod(0o755)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    fake_claude.write_script({"acceptor": [AUTO, {"shell": [f"touch {armed}"], "auto": True}]})
    main = run_git(repo, "rev-parse", "main")
    first = Runner(repo, fake_claude, env=env)
    assert first.wait(60) == 1, first.stdout[-2000:]
    assert "the disk is full" in first.stdout + first.stderr
    assert run_git(repo, "rev-parse", "main") == main
    assert notes.read_bytes() == mine and not (repo / "features").exists()
    filler.unlink()
    second = Runner(repo, fake_claude, env=env)
    assert second.wait(60) == 0, second.stdout[-2000:]
    rec = record(repo, "m1")
    assert rec.merge is not None and rec.merge.merged, rec.merge
    assert (repo / "features" / "F1.txt").read_text().strip() == run_git(
        repo, "show", "main:features/F1.txt")
    assert run_git(repo, "status", "--porcelain", "--", "features") == ""


@pytest.mark.parametrize("lock", ["index.lock", "HEAD.lock", "refs/heads/main.lock"])
def test_a_stale_lock_in_the_projects_git_does_not_keep_main_from_the_merge(
        git_repo: Path, fake_claude: FakeClaude, lock: str) -> None:
    """A git of yours killed during the final acceptance leaves its lock: the merge used to
    wait for the next start ("main moved while …", exit 0, nothing merged)."""
    make_project(git_repo, {"m1": ONE})
    fake_claude.write_script({"acceptor_default": {"auto": True, "delay": 1.5}})
    runner = Runner(git_repo, fake_claude)
    wait_until(lambda: len(fake_claude.entries("acceptor")) >= 2, what="the final acceptance")
    (git_repo / ".git" / lock).write_text("", encoding="utf-8")
    assert runner.wait(60) == 0, runner.stdout[-2000:]
    rec = record(git_repo, "m1")
    assert rec.merge is not None and rec.merge.merged, rec.merge
    assert f".git/{lock} was left by a git command that no longer runs; removed" in \
        runner.stdout
    assert not (git_repo / ".git" / lock).exists()


def test_worktrees_a_restart_finds_are_kept_for_their_milestone_or_removed_and_named(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """A kill can leave a worktree behind: one whose milestone is over (a removal cut short)
    and one no milestone has go, each named; a paused milestone's stays for its resume."""
    make_project(git_repo, {"m1": ONE, "m2": OTHER}, config={"max_parallel_milestones": 1})
    fake_claude.write_script({"milestones": {"m2": {"acceptor": [NO, NO, NO]}}})
    first = run_to_end(git_repo, fake_claude)
    assert first.proc.returncode == 3, first.stdout[-2000:]  # m1 merged, m2 paused
    worktrees = git_repo / ".anima" / "worktrees"
    assert sorted(p.name for p in worktrees.iterdir()) == ["m2"]
    run_git(git_repo, "worktree", "add", "-q", str(worktrees / "m1"), "milestone/m1")
    (worktrees / "m1" / "draft.txt").write_text("left in it\n", encoding="utf-8")
    (worktrees / "zz").mkdir()
    (worktrees / "zz" / "x.txt").write_text("x\n", encoding="utf-8")
    second = run_to_end(git_repo, fake_claude)
    said = second.stdout + (git_repo / ".anima" / "logs" / "anima.log").read_text()
    assert "found after a restart; its milestone is completed" in said, said[-3000:]
    assert "found after a restart; no milestone has it" in said
    assert sorted(p.name for p in worktrees.iterdir()) == ["m2"]
    assert "worktrees/m1" not in run_git(git_repo, "worktree", "list")
    assert record(git_repo, "m2").status is MilestoneStatus.PAUSED
