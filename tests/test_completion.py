"""Completion and merge are one crash-safe step (issue 10.2), end to end: a real
`python -m anima run … --headless` (or `anima approve`) is SIGKILLed around the final
acceptance and the merge into main, then Anima runs again on the same project.

Two ways of stopping a runner at an exact instant, without touching its code: a `git` on PATH
that sleeps at a chosen step of the merge (the kill lands while the merge runs), and the
milestone's log turned into a FIFO that the test stops reading (the runner blocks on its next
log line).

The merge into main checks nothing out: `merge-tree` computes it, the human's checkout (on
main) follows with `read-tree`, and `update-ref` moves main last; a kill at any step leaves
either the old main or the merge.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anima.git import GitRepo
from anima.loop.completion import MergeQueue
from anima.paths import ProjectPaths
from anima.store.models import MergeInfo, MergeState, MilestoneStatus, RoundKind, Verdict, now
from anima.store.store import Store
from tests.conftest import FakeClaude, descendants, run_git
from tests.helpers import make_project, record
from tests.test_recovery import (
    AUTO,
    ONE,
    Runner,
    assert_consistent,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    run_to_end,
    wait_until,
)

#: The steps of the merge into main a kill can land in (a `case` pattern on git's arguments):
#: where it begins, and where the human's checkout has followed but main has not moved yet.
# The merge itself, not the conflict check before it (which names main by its ref).
MERGE_STEPS = {"merge-tree": '*" merge-tree "*" --no-messages "[0-9a-f]*',
               "update-ref": '*" update-ref -m anima: Merge "*'}


def slow_git(where: Path, sleep: float, step: str = "merge-tree") -> tuple[dict[str, str], Path]:
    """A `git` first on PATH that marks and sleeps before one `step` of the merge into main,
    then runs the real one: a kill while the marker exists lands in the merge, there. Returns
    (env, marker)."""
    real = shutil.which("git")
    assert real is not None
    folder = where / "slow-git"
    folder.mkdir()
    marker = where / "merging"
    shim = folder / "git"
    shim.write_text(f'#!/bin/sh\ncase " $* " in {MERGE_STEPS[step]}) touch {marker}; '
                    f'sleep {sleep};; esac\nexec {real} "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}, marker


def kill_with_children(pid: int) -> None:
    """A power cut: the process and everything it started (its git, its agents). The tree
    is frozen first, so nothing forks a child that would escape the kill."""
    frozen: set[int] = set()
    while new := ({pid, *descendants(pid)} - frozen):
        for victim in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGSTOP)
        frozen |= new
    for victim in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def finals(project: Path) -> list[Verdict]:
    return [i.verdict for i in record(project, "m1").iterations if i.kind is RoundKind.FINAL]


def anima(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "anima", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=60)


def outside_anima(project: Path) -> str:
    """`git status` of the human's checkout, Anima's own folder aside."""
    return run_git(project, "status", "--porcelain", "--", ".", ":(exclude).anima")


def assert_merged(project: Path) -> None:
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.merge is not None and rec.merge.state is MergeState.MERGED and rec.merge.merged
    assert subprocess.run(["git", "merge-base", "--is-ancestor", "milestone/m1", "main"],
                          cwd=project).returncode == 0
    # The human's checkout stayed on main and followed it: the merged files, nothing half done.
    assert run_git(project, "branch", "--show-current") == "main"
    assert run_git(project, "rev-parse", "HEAD") == run_git(project, "rev-parse", "main")
    assert outside_anima(project) == ""
    assert (project / "features" / "F1.txt").is_file()
    assert not (project / ".git" / "MERGE_HEAD").exists()
    assert not (project / ".anima" / "worktrees" / "m1").exists()  # removed once merged
    assert finals(project) == [Verdict.ACCEPTED]
    assert_consistent(rec)
    state = json.loads((project / ".anima" / "state.json").read_text())
    assert (state["status"], state["current_milestone"]) == ("sleeping", None)


def old_main_or_the_merge(project: Path, base: str) -> None:
    """What a kill mid-merge may leave: main where it was, or the whole merge; never half."""
    main = run_git(project, "rev-parse", "main")
    tip = run_git(project, "rev-parse", "milestone/m1")
    assert main in (base, GitRepo.open(project).merge_of(tip, "main")), main
    assert not (project / ".git" / "MERGE_HEAD").exists()


@pytest.mark.parametrize("step", list(MERGE_STEPS))
@pytest.mark.parametrize("power_cut", [False, True], ids=["anima-killed", "anima-and-git-killed"])
def test_a_kill_during_the_merge_into_main_is_finished_by_the_next_run(
        git_repo: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]], power_cut: bool, step: str) -> None:
    make_project(git_repo, {"m1": ONE})
    base = run_git(git_repo, "rev-parse", "main")
    env, marker = slow_git(tmp_path, 1.0, step)
    first = Runner(git_repo, fake_claude, env=env)
    wait_until(marker.exists, what="the merge into main", timeout=30)
    if power_cut:
        kill_with_children(first.pid)
    first.kill()
    rec = record(git_repo, "m1")
    # The intent to merge was on disk before git was asked to merge.
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.merge is not None and rec.merge.state is MergeState.PENDING
    if power_cut:
        old_main_or_the_merge(git_repo, base)
    status = anima("status", str(git_repo))
    assert "merge pending" in status.stdout, status.stdout
    # The killed runner's merge goes on without it (through the shim, which the next start
    # cannot tell from git): let it end first.
    wait_until(lambda: our_processes() == [], what="the orphaned merge to end", timeout=15)
    old_main_or_the_merge(git_repo, base)

    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert "finishing the merge into main that a restart cut short" in second.stdout
    assert_merged(git_repo)
    assert "merged:" in anima("status", str(git_repo)).stdout
    assert "finishing the merge" in (git_repo / ".anima" / "logs" / "m1.log").read_text()
    assert our_processes() == []


@pytest.fixture
def solo(git_repo: Path) -> Path:
    return make_project(git_repo, {"m1": ONE})


@pytest.fixture
def frozen_log(solo: Path) -> Iterator[Callable[[], None]]:
    """`.anima/logs/m1.log` as a FIFO the test reads; calling the fixture's value fills it,
    so the runner blocks on its next log line, exactly where it is."""
    log = solo / ".anima" / "logs" / "m1.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(log)
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(log, os.O_WRONLY | os.O_NONBLOCK)
    seen = bytearray()
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            try:
                seen.extend(os.read(reader, 65536))
            except BlockingIOError:
                time.sleep(0.005)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()

    def freeze() -> None:
        stop.set()
        thread.join()
        try:
            while True:
                os.write(writer, b"x" * 4096)
        except BlockingIOError:
            pass

    freeze.seen = seen  # type: ignore[attr-defined]
    yield freeze
    stop.set()
    thread.join()
    os.close(reader)
    os.close(writer)
    log.unlink(missing_ok=True)


def test_a_kill_right_after_the_final_acceptance_records_it_once(
        git_repo: Path, fake_claude: FakeClaude, frozen_log: Callable[[], None],
        our_processes: Callable[[], list[int]]) -> None:
    fake_claude.write_script({"acceptor": [AUTO, {"auto": True, "delay": 1.0}]})
    first = Runner(git_repo, fake_claude)
    seen: bytearray = frozen_log.seen  # type: ignore[attr-defined]
    wait_until(lambda: b"final_acceptance" in seen, what="final acceptance", timeout=30)
    frozen_log()  # the next log line is the final verdict's: the runner stops right there
    wait_until(lambda: first.stdout.count("[acceptor] — turn done") >= 2,
               what="the final verdict", timeout=30)
    time.sleep(0.5)
    first.kill()
    (git_repo / ".anima" / "logs" / "m1.log").unlink()

    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert_merged(git_repo)  # one final acceptance on record, not two


def test_uncommitted_leftovers_at_completion_are_reviewed_and_merged_not_stashed(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": ONE})
    leftover = {"shell": ["echo scratch > scratch.txt"], "auto": True}
    fake_claude.write_script({"developer": [AUTO, leftover]})
    runner = run_to_end(git_repo, fake_claude)
    assert runner.proc.returncode == 0, runner.stdout[-2000:] + runner.stderr
    assert_merged(git_repo)
    # What the final Acceptor saw in the tree is what reached main: nothing hidden in a stash.
    assert "scratch.txt" in run_git(git_repo, "ls-tree", "--name-only", "main")
    assert "anima-recovery-m1-" not in run_git(git_repo, "stash", "list")


def test_a_kill_during_the_merge_of_an_approval_is_finished_by_the_next_run(
        git_repo: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    runner = run_to_end(git_repo, fake_claude)
    assert runner.proc.returncode == 0, runner.stdout[-2000:] + runner.stderr
    assert record(git_repo, "m1").status is MilestoneStatus.AWAITING_REVIEW
    base = run_git(git_repo, "rev-parse", "main")
    # Killed at the worst instant: the human's checkout has followed the merge, main not yet.
    env, marker = slow_git(tmp_path, 30.0, "update-ref")
    approve = subprocess.Popen([sys.executable, "-m", "anima", "approve", str(git_repo), "m1"],
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_until(marker.exists, what="the approval's merge", timeout=30)
    finally:
        kill_with_children(approve.pid)
        approve.wait(10)
    assert record(git_repo, "m1").merge.state is MergeState.PENDING  # type: ignore[union-attr]
    assert run_git(git_repo, "rev-parse", "main") == base

    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    assert_merged(git_repo)


def test_an_approval_that_conflicts_with_main_is_resolved_in_a_merge_round(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 0
    # While it waits for review, the human writes the same file differently on main.
    run_git(git_repo, "switch", "-q", "main")
    (git_repo / "features").mkdir()
    (git_repo / "features" / "F1.txt").write_text("the human's F1\n", encoding="utf-8")
    run_git(git_repo, "add", "features/F1.txt")
    run_git(git_repo, "commit", "-q", "-m", "feat: F1 by hand")
    main = run_git(git_repo, "rev-parse", "main")

    approved = anima("approve", str(git_repo), "m1")
    assert approved.returncode == 0, approved.stderr
    assert "features/F1.txt" in approved.stdout and "merge round" in approved.stdout
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.merge is None
    assert run_git(git_repo, "rev-parse", "main") == main  # nothing half merged
    assert "merge round" in (git_repo / ".anima" / "logs" / "m1.log").read_text()
    # The next run has its Developer merge main in, reviewed, then main takes it.
    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:]
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert [it.kind for it in rec.iterations][-1] is RoundKind.MERGE
    assert "the human's F1" in (git_repo / "features" / "F1.txt").read_text()
    assert our_processes() == []


# ------------------------------------------- only what a final acceptance judged reaches main


def pending_merge(project: Path, edit: Callable[[Any], None]) -> tuple[str, str]:
    """A milestone awaiting review, its record then edited by `edit` and made to say
    "completed, merge pending" (what a kill right after `begin_completion` leaves, or a hand
    edit). Returns (main, the branch's tip)."""
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    edit(rec)
    rec.status = MilestoneStatus.COMPLETED
    rec.merge = MergeInfo(state=MergeState.PENDING, at=now(),
                          detail=f"merging {rec.branch_name} into {rec.main_branch}")
    Store(ProjectPaths(project)).save_record(rec)
    return run_git(project, "rev-parse", "main"), run_git(project, "rev-parse", "milestone/m1")


def assert_not_merged(project: Path, main: str, tip: str, why: str) -> None:
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.merge is not None and rec.merge.state is MergeState.FAILED
    assert not rec.merge.merged
    assert why in rec.merge.detail, rec.merge.detail
    assert "main is unchanged and milestone/m1 is kept" in rec.merge.detail
    assert run_git(project, "rev-parse", "main") == main
    assert run_git(project, "rev-parse", "milestone/m1") == tip
    assert outside_anima(project) == ""
    assert "not merged" in (project / ".anima" / "logs" / "m1.log").read_text()


def test_a_pending_merge_of_a_tip_the_final_acceptance_did_not_judge_is_not_merged(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 0
    judged = [i for i in record(git_repo, "m1").iterations if i.kind is RoundKind.FINAL]
    assert [i.verdict for i in judged] == [Verdict.ACCEPTED]
    assert judged[0].commit == run_git(git_repo, "rev-parse", "milestone/m1")
    # After the final acceptance, a commit nobody reviewed reaches the branch (its worktree is
    # kept while the milestone awaits review).
    worktree = git_repo / ".anima" / "worktrees" / "m1"
    (worktree / "unreviewed.txt").write_text("never judged\n", encoding="utf-8")
    run_git(worktree, "add", "unreviewed.txt")
    run_git(worktree, "commit", "-q", "-m", "feat: after the final acceptance")
    main, tip = pending_merge(git_repo, lambda rec: None)
    assert tip != judged[0].commit

    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    assert "finishing the merge into main that a restart cut short" in again.stdout
    assert_not_merged(git_repo, main, tip,
                      f"milestone/m1 is at {tip[:7]}, not at {judged[0].commit[:7]}, the commit "
                      "its final acceptance judged")
    assert "unreviewed.txt" not in run_git(git_repo, "ls-tree", "-r", "--name-only", "main")
    assert not (git_repo / "unreviewed.txt").exists()


def test_a_branch_you_deleted_while_its_merge_was_owed_is_kept_not_merged(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """Finally accepted, its merge owed (waiting for a file of yours, or cut short), you
    delete the branch (`git update-ref -d`: its worktree has it checked out). The record
    said "milestone/m1 is at nothing … milestone/m1 is kept" while no ref held the work any
    more, its worktree went, and git's next gc would have deleted it. It is not merged (you
    deleted it), and the branch is back at the commit the final acceptance judged."""
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 0
    main, tip = pending_merge(git_repo, lambda rec: None)
    run_git(git_repo, "update-ref", "-d", "refs/heads/milestone/m1")

    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    assert_not_merged(git_repo, main, tip,
                      f"milestone/m1 was deleted before it was merged; it is back at {tip[:7]}, "
                      "the commit its final acceptance judged")
    assert run_git(git_repo, "stash", "list") == ""
    assert not (git_repo / ".anima" / "worktrees" / "m1").exists()


@pytest.mark.parametrize("final", ["none", "rejected"])
def test_a_pending_merge_without_a_final_acceptance_is_not_merged(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        final: str) -> None:
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 0

    def no_final_acceptance(rec: Any) -> None:
        if final == "none":
            rec.iterations = [i for i in rec.iterations if i.kind is not RoundKind.FINAL]
        else:
            for i in rec.iterations:
                if i.kind is RoundKind.FINAL:
                    i.verdict = Verdict.REJECTED

    main, tip = pending_merge(git_repo, no_final_acceptance)
    assert main != tip  # the branch has work main lacks: merging it would change main

    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    assert_not_merged(git_repo, main, tip, "no final acceptance is on record")
    assert not (git_repo / "features" / "F1.txt").exists()


def test_a_pending_merge_that_now_conflicts_goes_back_for_a_merge_round(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """Finally accepted, the merge still owed when Anima died; meanwhile the human wrote the
    same file differently on main. The next start does not end it "completed, not merged":
    its Developer merges main in, its Acceptor reviews that, then main takes it."""
    make_project(git_repo, {"m1": ONE}, config={"requires_human_review": True})
    assert run_to_end(git_repo, fake_claude).proc.returncode == 0
    pending_merge(git_repo, lambda rec: None)
    (git_repo / "features").mkdir()
    (git_repo / "features" / "F1.txt").write_text("the human's F1\n", encoding="utf-8")
    run_git(git_repo, "add", "features/F1.txt")
    run_git(git_repo, "commit", "-q", "-m", "feat: F1 by hand")

    again = run_to_end(git_repo, fake_claude)

    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert [it.kind for it in rec.iterations][-1] is RoundKind.MERGE
    assert any("a merge round resolves it first" in n for n in rec.notes)
    assert "the human's F1" in (git_repo / "features" / "F1.txt").read_text()
    assert our_processes() == []


def test_a_milestone_accepted_earlier_that_arrives_late_does_not_cut_in() -> None:
    """After a restart each run comes back to the merge queue when it gets there: one whose
    final acceptance is older, arriving while another merges, waits for that merge to end.
    Cutting in, both found that they merged cleanly, both merged, and the second conflicted:
    a finally accepted milestone ended "completed, not merged" instead of a merge round."""
    queue, stop = MergeQueue(), threading.Event()
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()
    accepted = now()

    def take_turn(milestone: str, at: datetime.datetime, hold: bool) -> None:
        with queue.turn(milestone, at, stop) as ours:
            assert ours
            order.append(f"{milestone} merges")
            if hold:
                holding.set()
                release.wait(5)
            order.append(f"{milestone} done")

    later = threading.Thread(target=take_turn,
                             args=("later", accepted + datetime.timedelta(seconds=9), True))
    later.start()
    assert holding.wait(5)
    earlier = threading.Thread(target=take_turn, args=("earlier", accepted, False))
    earlier.start()
    time.sleep(0.3)
    assert order == ["later merges"]  # it waits
    release.set()
    later.join(5)
    earlier.join(5)
    assert order == ["later merges", "later done", "earlier merges", "earlier done"]
