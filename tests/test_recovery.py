"""Restart recovery, end to end: a real `python -m anima run … --headless` is SIGKILLed at a
controlled moment (a fake turn that hangs or sleeps, found in the fake's prompt log or the
record), then run again on the same project; the fake `claude` and git are real processes.

Each milestone works in its own worktree (`.anima/worktrees/<id>`): the agents' files, a dirty
tree and a stash-worthy leftover are there, never in the human's checkout.

Unconfined (`sandbox: off`), the killed runner's agents outlive it (they run in their own
sessions): the next run stops them. Confined (the default where bubblewrap works), everything
in an agent's sandbox dies with Anima. `our_processes` kills whatever a failing test leaves.
Inside the sandbox pids are the namespace's: the fake's logged `started` tells agents apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anima.paths import ProjectPaths
from anima.store.models import MilestoneRecord, MilestoneStatus, RoundKind, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record

RECOVERY_MARK = "This milestone was interrupted by a restart"
TWO = milestone_md("Greeter", ["Greet command", "Version flag"])
ONE = milestone_md("Solo", ["Greet command"])
AUTO = {"auto": True}


# --------------------------------------------------------------------------- helpers


def wait_until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def processes_with_env(marker: str) -> list[int]:
    """Live pids whose environment holds `marker` (e.g. the fake's FAKE_CLAUDE_STATE=…)."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


class Runner:
    """`anima run PROJECT --headless [--watch]` in a subprocess, output in a file."""

    def __init__(self, repo: Path, fake: FakeClaude, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.repo = repo
        self.fake = fake
        self.out_path = fake.root / f"run-{time.monotonic_ns()}.out"
        self.err_path = self.out_path.with_suffix(".err")
        base = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        full_env = {**base, "ANIMA_CLAUDE_COMMAND": fake.command, **fake.env, **(env or {})}
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "anima", "run", str(repo), "--headless", *args],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=full_env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed or stopped."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"runner did not finish in {timeout}s\n{self.stdout[-3000:]}"
                                 f"\n{self.stderr[-2000:]}") from None


def run_to_end(repo: Path, fake: FakeClaude, timeout: float = 60.0) -> Runner:
    runner = Runner(repo, fake)
    runner.wait(timeout)
    return runner


def assert_consistent(rec: MilestoneRecord) -> None:
    """The record's counters are what its iterations say; rounds are 1..n, none doubled."""
    its = rec.iterations
    assert [i.round for i in its] == list(range(1, len(its) + 1))
    assert rec.iteration_count == sum(1 for i in its if i.verdict is Verdict.ACCEPTED
                                      and i.kind is not RoundKind.FINAL)
    trailing = 0
    for it in reversed([i for i in its if i.kind is not RoundKind.FINAL]):
        if it.verdict is Verdict.ACCEPTED:
            break
        trailing += 1
    assert rec.consecutive_rejections == trailing
    # Plus what rounds that were redone had spent (a stop, a kill mid-round): said in notes.
    redone = [re.search(r"\$(\d+\.\d+) and (\d+) tokens", n) for n in rec.notes]
    assert rec.tokens_used == sum(i.tokens for i in its) + sum(int(m[2]) for m in redone if m)
    assert rec.cost_usd == pytest.approx(sum(i.cost_usd for i in its)
                                         + sum(float(m[1]) for m in redone if m))
    assert rec.in_flight.cost_usd == 0 and rec.in_flight.usage.total == 0
    for f in rec.features:
        assert f.rounds == sum(1 for i in its if i.feature == f.id)


def developer_prompts_after(fake: FakeClaude, started: float) -> list[dict[str, Any]]:
    """Developer entries logged by agents other than the one that started at `started` (the
    first run's), in order."""
    return [e for e in fake.entries("developer") if e["started"] != started]


def worktree(project: Path, milestone_id: str = "m1") -> Path:
    """Where the milestone's agents work (and leave their files)."""
    return project / ".anima" / "worktrees" / milestone_id


def set_config(project: Path, **values: Any) -> None:
    path = project / ".anima" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}), encoding="utf-8")


def assert_checkout_untouched(project: Path) -> None:
    """The human's checkout: on main, nothing of the milestone's in it."""
    assert run_git(project, "branch", "--show-current") == "main"
    assert run_git(project, "status", "--porcelain", "--", ".", ":(exclude).anima") == ""


@pytest.fixture(name="our_processes")
def our_processes_fixture(fake_claude: FakeClaude) -> Iterator[Callable[[], list[int]]]:
    """Lists the live processes of this test's fake (agents and their tools); kills any left
    at the end, so a failing test does not leak them."""
    marker = f"FAKE_CLAUDE_STATE={fake_claude.state_dir}"

    def current() -> list[int]:
        return processes_with_env(marker)

    yield current
    for pid in current():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def project(git_repo: Path) -> Path:
    return make_project(git_repo, {"m1": TWO})


# --------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_killed_during_a_developer_turn_resumes_with_the_recovery_context(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        sandbox: str) -> None:
    # A wedged agent ignores the SIGTERM it gets when Anima dies: unconfined, the next run
    # stops it; confined, its sandbox dies with Anima.
    set_config(project, sandbox=sandbox)
    fake_claude.write_script({"developer": [AUTO, {"hang": True, "ignore_sigterm": True}]})
    first = Runner(project, fake_claude)
    wait_until(lambda: len(fake_claude.entries("developer")) >= 2, what="round 2 started")
    first.kill()
    hung = fake_claude.entries("developer")[-1]
    if sandbox == "off":
        time.sleep(0.3)
        assert alive(hung["pid"]), "an agent that ignores SIGTERM outlives a SIGKILLed Anima"
    else:
        wait_until(lambda: our_processes() == [], timeout=5,
                   what="the sandboxed agent to die with Anima")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.phase == "developer"
    assert rec.rounds == 1  # the round in flight is not in the record
    assert_consistent(rec)

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    if sandbox == "off":
        assert not alive(hung["pid"])
        assert "stopped a leftover" in second.stdout
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert [(i.round, i.kind, i.feature, i.verdict) for i in rec.iterations] == [
        (1, RoundKind.FEATURE, "F1", Verdict.ACCEPTED),
        (2, RoundKind.RECOVERY, "F2", Verdict.ACCEPTED),
        (3, RoundKind.FINAL, None, Verdict.ACCEPTED)]
    assert_consistent(rec)
    # The first Developer prompt after the restart carries the recovery context.
    prompt = developer_prompts_after(fake_claude, hung["started"])[0]["prompt"]
    f1 = rec.iterations[0].commit
    assert RECOVERY_MARK in prompt and "Rounds completed before the interruption: 1" in prompt
    assert f"{f1[:7]} feat: F1" in prompt
    assert "Project memory" in prompt  # memory/project.md, as in every Developer prompt
    # Both sessions were resumed, not replaced.
    restarted = developer_prompts_after(fake_claude, hung["started"])[0]
    assert restarted["resume"] and restarted["session_id"] == rec.sessions.developer
    assert_checkout_untouched(project)
    assert our_processes() == []


@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_killed_with_a_dirty_tree_the_developer_commits_it_first(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        sandbox: str) -> None:
    set_config(project, sandbox=sandbox)
    commit_wip = {"shell": ["git add wip.txt && git commit -q -m 'feat: F2 work in progress'"],
                  "text": "Committed wip.txt (finished work)."}
    fake_claude.write_script({"developer": [
        AUTO, {"shell": ["echo unfinished > wip.txt && sleep 60"]}, commit_wip]})
    first = Runner(project, fake_claude)
    wip = worktree(project) / "wip.txt"
    wait_until(wip.exists, what="the Developer's edit")
    assert not (project / "wip.txt").exists()  # in its worktree, not the human's checkout
    first.kill()
    if sandbox == "auto":  # the tool dies with the sandbox, the edit stays
        wait_until(lambda: our_processes() == [], timeout=5, what="the sandbox to die")

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert_consistent(rec)
    assert "feat: F2 work in progress" in run_git(project, "log", "--format=%s", "milestone/m1")
    assert "wip.txt" in run_git(project, "ls-tree", "--name-only", "main")  # merged
    assert run_git(project, "stash", "list") == ""
    first_run = fake_claude.entries("developer")[1]["started"]
    cleanup = developer_prompts_after(fake_claude, first_run)[0]
    assert "wip.txt" in cleanup["prompt"] and "commit" in cleanup["prompt"]
    assert RECOVERY_MARK in cleanup["prompt"]
    assert "tree dirty after the restart" in second.stdout
    if sandbox == "off":
        # The agent died with Anima; its `sleep 60` tool was stopped by the next start.
        assert "leftover tool process" in second.stdout
    assert_checkout_untouched(project)
    assert our_processes() == []


@pytest.mark.parametrize("dirty", [False, True], ids=["clean", "dirty-reverted"])
def test_killed_during_an_acceptor_review_redoes_the_round_once(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        dirty: bool) -> None:
    if dirty:  # only an unconfined Acceptor can write its tree
        set_config(project, sandbox="off")
    review = {"shell": ["echo scratch > scratch.txt && sleep 60"]} if dirty else {"hang": True}
    revert = {"shell": ["rm -f scratch.txt"], "text": "Reverted scratch.txt."}
    fake_claude.write_script({"acceptor": [review],
                              "developer": [AUTO, revert] if dirty else [AUTO]})
    first = Runner(project, fake_claude)
    if dirty:
        wait_until((worktree(project) / "scratch.txt").exists, what="the reviewer's file")
    else:
        wait_until(lambda: fake_claude.entries("acceptor"), what="the review")
    first.kill()
    assert record(project, "m1").phase == "acceptor"

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert_consistent(rec)
    # Round 1 was redone after the restart and counted once.
    assert [(i.kind, i.feature) for i in rec.iterations] == [
        (RoundKind.RECOVERY, "F1"), (RoundKind.FEATURE, "F2"), (RoundKind.FINAL, None)]
    assert rec.iteration_count == 2
    assert not (project / "scratch.txt").exists()
    assert "scratch.txt" not in run_git(project, "ls-tree", "-r", "--name-only", "main")
    assert run_git(project, "stash", "list") == ""
    assert_checkout_untouched(project)
    assert our_processes() == []


@pytest.mark.parametrize("dirty", [False, True], ids=["clean", "dirty-stashed"])
def test_killed_during_final_acceptance(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        dirty: bool) -> None:
    make_project(git_repo, {"m1": ONE})
    undecided = {"text": "I cannot tell whether notes.txt is finished; leaving it."}
    fake_claude.write_script({"acceptor": [AUTO, {"hang": True}],
                              "developer": [AUTO, AUTO, undecided] if dirty else []})
    first = Runner(git_repo, fake_claude)
    wait_until(lambda: len(fake_claude.entries("acceptor")) >= 2, what="final acceptance")
    first.kill()
    assert record(git_repo, "m1").phase == "final_acceptance"
    if dirty:  # an edit the killed round left behind, in the milestone's worktree
        (worktree(git_repo) / "notes.txt").write_text("half a thought\n", encoding="utf-8")

    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert_consistent(rec)
    assert [(i.kind, i.verdict) for i in rec.iterations] == [
        (RoundKind.FEATURE, Verdict.ACCEPTED), (RoundKind.FINAL, Verdict.ACCEPTED)]
    if dirty:
        stashes = run_git(git_repo, "stash", "list")
        assert "anima-recovery-m1-" in stashes
        assert any("anima-recovery-m1-" in n and "stash" in n for n in rec.notes)
        assert not (git_repo / "notes.txt").exists()
        assert "notes.txt" not in run_git(git_repo, "ls-tree", "-r", "--name-only", "main")
        stashed = run_git(git_repo, "show", "--name-only", "--format=", "stash@{0}^3")
        assert "notes.txt" in stashed  # nothing discarded: it is in the stash
    assert_checkout_untouched(git_repo)
    assert our_processes() == []


@pytest.mark.parametrize(("role", "sandbox"), [("developer", "auto"), ("acceptor", "off")])
def test_killed_while_an_agent_had_its_worktree_on_main_continues(
        project: Path, fake_claude: FakeClaude, role: str, sandbox: str) -> None:
    """An agent that put its worktree on main (git wants `--ignore-other-worktrees`, main
    being the human's; the Developer can in its sandbox, the Acceptor only unconfined) when
    Anima died: the next run puts the worktree back on the milestone's branch and goes on.
    The human's checkout, and the milestone's definition in it, were never touched."""
    set_config(project, sandbox=sandbox)
    away = {"shell": ["git switch -q --ignore-other-worktrees main"], "hang_after": True}
    fake_claude.write_script({role: [{"auto": True}, away]})
    definition = project / ".anima" / "milestones" / "m1.md"
    first = Runner(project, fake_claude)
    wait_until(lambda: len(fake_claude.entries(role)) >= 2 and worktree(project).is_dir()
               and run_git(worktree(project), "branch", "--show-current") == "main",
               what="the worktree on main")
    first.kill()
    assert definition.read_text(encoding="utf-8") == TWO
    assert_checkout_untouched(project)
    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert "switching to milestone/m1" in second.stdout, second.stdout
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert_consistent(rec)
    assert definition.read_text(encoding="utf-8") == TWO
    assert_checkout_untouched(project)


@pytest.mark.parametrize("dirty", [False, True], ids=["clean", "dirty-stashed"])
def test_killed_between_rounds(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        dirty: bool) -> None:
    # Killed the moment round 1's verdict is on disk: round 2 may or may not have been sent.
    fake_claude.write_script({"developer": [AUTO],
                              "developer_default": {"auto": True, "delay": 0.5}})
    first = Runner(project, fake_claude)
    path = project / ".anima" / "milestones" / "m1.json"
    wait_until(lambda: path.exists() and json.loads(path.read_text())["iterations"],
               what="round 1 recorded")
    first.kill()
    assert record(project, "m1").rounds == 1
    if dirty:  # a tool the killed round started kept writing, in the milestone's worktree
        (worktree(project) / "generated.txt").write_text("a tool kept writing\n",
                                                        encoding="utf-8")

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert_consistent(rec)
    assert [(i.kind, i.feature) for i in rec.iterations] == [
        (RoundKind.FEATURE, "F1"), (RoundKind.RECOVERY, "F2"), (RoundKind.FINAL, None)]
    if dirty:  # the clean-up turn committed nothing: stashed, named in the record
        assert "anima-recovery-m1-" in run_git(project, "stash", "list")
        assert any("anima-recovery-m1-" in n for n in rec.notes)
        assert not (project / "generated.txt").exists()
        assert "generated.txt" not in run_git(project, "ls-tree", "-r", "--name-only", "main")
    assert_checkout_untouched(project)
    assert our_processes() == []


def test_a_commit_made_just_before_a_kill_is_found_and_reviewed(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """Confined, the Developer's git writes the commit's objects to a store of its own,
    which Anima takes into the repository after the turn (`anima.git.objects`). Killed
    before that, the restart takes them in before it reads the branch: the commit is
    reviewed as the killed round's, not lost nor a failure."""
    done = fake_claude.root / "committed"
    commit = ("printf 'def greet():\\n    return 1\\n' > greet.py && git add greet.py && "
              f"git commit -q -m 'feat: greet, just before the kill' && touch {done}")
    fake_claude.write_script({"developer": [{"shell": [commit], "hang_after": True}]})
    first = Runner(project, fake_claude)
    wait_until(done.exists, what="the commit")
    first.kill()
    store = ProjectPaths(project).agent_objects("m1")
    assert list(store.glob("??/*")), "the commit's objects are in the Developer's store"

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    first_round = rec.iterations[0]
    assert (first_round.kind, first_round.verdict) == (RoundKind.RECOVERY, Verdict.ACCEPTED)
    assert run_git(project, "log", "-1", "--format=%s", first_round.commit or "") == \
        "feat: greet, just before the kill"
    assert run_git(project, "fsck", "--no-dangling") == ""
    assert our_processes() == []


def test_a_worktree_git_folder_broken_just_before_a_kill_is_mended_at_the_restart(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """HEAD deleted and the index overwritten by hand, then Anima killed before it looked:
    the next start said the worktree "is not a git repository (run `git init` …)" at every
    start. It is mended; the commit made before the damage is reviewed."""
    done = fake_claude.root / "damaged"
    fake_claude.write_script({"developer": [{"shell": [
        "echo x > x.txt && git add x.txt && git commit -qm 'feat: x, before the damage'",
        'own="$(git rev-parse --git-dir)" && rm -f "$own/HEAD" && printf garbage > "$own/index"'
        f" && touch {done}"], "hang_after": True}]})
    first = Runner(project, fake_claude)
    wait_until(done.exists, what="the damage")
    first.kill()

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    log = (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    assert "HEAD was gone" in log and "index could not be read" in log
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert "feat: x, before the damage" in run_git(project, "log", "--format=%s", "main")
    assert our_processes() == []


def test_an_unresumable_session_is_replaced_and_noted(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    # Killed in the Developer's very first turn: the session file was never written.
    fake_claude.write_script({"lose_sessions": True, "developer": [{"hang": True}]})
    first = Runner(project, fake_claude)
    wait_until(lambda: fake_claude.entries("developer"), what="the first turn")
    lost = record(project, "m1").sessions.developer
    first.kill()

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert_consistent(rec)
    assert rec.sessions.developer not in (None, lost)
    assert any("could not be resumed" in n and "fresh" in n for n in rec.notes)
    tried = [e for e in fake_claude.entries("developer") if e["session_id"] == lost]
    assert tried[-1]["resume"] is True
    fresh = [e for e in fake_claude.entries("developer") if e["session_id"] != lost]
    assert not fresh[0]["resume"] and RECOVERY_MARK in fresh[0]["prompt"]
    assert our_processes() == []


def test_a_paused_milestone_stays_paused_after_a_restart(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    no = {"text": "REJECTED: not yet"}
    fake_claude.write_script({"acceptor": [no, no, no]})
    first = run_to_end(project, fake_claude)
    assert first.proc.returncode == 3, first.stdout[-2000:]
    before = record(project, "m1")
    prompts = len(fake_claude.entries())

    second = run_to_end(project, fake_claude)
    assert second.proc.returncode == 3
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and rec.pause_reason == before.pause_reason
    assert rec.iterations == before.iterations
    assert len(fake_claude.entries()) == prompts  # no agent was started
    assert json.loads((project / ".anima" / "state.json").read_text())["status"] == "paused"
    assert_consistent(rec)
    assert our_processes() == []


def test_a_kill_right_after_the_third_rejection_pauses_instead_of_a_fourth_round(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    no = {"text": "REJECTED: not yet"}
    fake_claude.write_script({"acceptor": [no, no, no], "developer": [AUTO, AUTO, AUTO,
                                                                      {"hang": True}]})
    first = Runner(project, fake_claude)
    path = project / ".anima" / "milestones" / "m1.json"
    wait_until(lambda: path.exists() and json.loads(path.read_text())["consecutive_rejections"]
               == 3, what="the third rejection")
    first.kill()
    rec = record(project, "m1")
    if rec.status is MilestoneStatus.IN_PROGRESS:  # the kill beat the pause: a restart pauses
        second = run_to_end(project, fake_claude)
        assert second.proc.returncode == 3
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and rec.rounds == 3
    assert len(fake_claude.entries("developer")) == 3
    assert_consistent(rec)


def test_a_merge_the_human_left_unfinished_in_their_checkout_is_left_alone(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    """Anima never merges in the human's checkout, so a MERGE_HEAD there is theirs: a start
    neither aborts nor commits it, and a milestone still runs beside it, in its worktree."""
    set_config(project, requires_human_review=True)  # no merge into main in this test
    run_git(project, "switch", "-q", "-c", "theirs")
    (project / "README.md").write_text("# theirs\n", encoding="utf-8")
    run_git(project, "commit", "-q", "-am", "theirs")
    run_git(project, "switch", "-q", "main")
    (project / "README.md").write_text("# mine\n", encoding="utf-8")
    run_git(project, "commit", "-q", "-am", "mine")
    main = run_git(project, "rev-parse", "main")
    subprocess.run(["git", "merge", "theirs"], cwd=project, capture_output=True, check=False)
    (project / "README.md").write_text("# my resolution, half done\n", encoding="utf-8")
    assert (project / ".git" / "MERGE_HEAD").exists()

    runner = run_to_end(project, fake_claude)
    assert runner.proc.returncode == 0, runner.stdout[-2000:] + runner.stderr
    assert record(project, "m1").status is MilestoneStatus.AWAITING_REVIEW
    assert (project / ".git" / "MERGE_HEAD").exists()
    assert run_git(project, "status", "--porcelain", "--", "README.md") == "UU README.md"
    assert (project / "README.md").read_text() == "# my resolution, half done\n"
    assert run_git(project, "rev-parse", "main") == main
    assert run_git(project, "branch", "--show-current") == "main"
    assert our_processes() == []


def test_status_after_a_kill_says_no_anima_runs(git_repo: Path, fake_claude: FakeClaude,
                                                 our_processes: None) -> None:
    """Killed while it waited for a usage limit, Anima left state.json saying it was awake
    and waiting: `anima status` kept saying so, long after the reset, and you waited for a
    run that no longer existed."""
    make_project(git_repo, {"m1": ONE})
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330", "resets_in": 3600}]})
    anima = [sys.executable, "-m", "anima", "status", str(git_repo)]
    first = Runner(git_repo, fake_claude)
    state = git_repo / ".anima" / "state.json"
    wait_until(lambda: state.exists() and json.loads(state.read_text()).get("waiting_reason"),
               what="the usage-limit wait")
    alive = subprocess.run(anima, capture_output=True, text=True, timeout=60).stdout
    assert alive.startswith("state: awake") and "usage limit" in alive, alive
    first.kill()
    dead = subprocess.run(anima, capture_output=True, text=True, timeout=60).stdout
    assert dead.startswith("state: not running (no Anima drives this project"), dead
    assert "usage limit" not in dead and "  was running m1: round 1" in dead, dead
