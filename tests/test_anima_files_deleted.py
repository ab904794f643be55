"""An agent's shell reaches the project's `.anima/` (by absolute path: its cwd is the
milestone's worktree): `git clean -fdx` (a common "clean build" step), `git stash --all` or
`rm -rf .anima` run in the human's checkout would delete the runtime files Anima holds. In the
sandbox the checkout is read-only and each of them fails; without it the records come back
(the guard's copies), the milestone's log and transcript keep everything written before, and
the lock goes on excluding a second Anima. The real engine, the fake `claude`."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import (
    MODES,
    TWO,
    assert_attempts,
    attempt,
    confined,
    has_ref,
    log_text,
    report,
    use_sandbox,
)
from tests.test_recovery import wait_until


def try_lock(project: Path) -> str:
    """Run by the Developer's shell in round 2: can another Anima take the project now?"""
    lock = project / ".anima" / "anima.lock"
    return (f"{sys.executable} -c \"from pathlib import Path; from anima.lock import "
            f"ProjectLock; ProjectLock(Path('{lock}')).acquire()\" "
            "&& echo taken > lock.txt || echo refused > lock.txt")


#: Each wipe, and what it says when the sandbox refuses it (`git stash` fails silently).
WIPES = {"git clean -fdxq": "Read-only file system", "git stash -q --all": "",
         "rm -rf .anima": "Read-only file system"}


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wipe", list(WIPES))
def test_what_a_wipe_of_anima_files_deletes_comes_back(project: Path, fake_claude: FakeClaude,
                                                       wipe: str, mode: str) -> None:
    use_sandbox(project, mode)
    config = (project / ".anima" / "config.json").read_bytes()
    fake_claude.write_script({"developer": [
        {"shell": ["mkdir -p features && echo F1 > features/F1.txt",
                   "git add -A && git commit -qm 'feat: F1'",
                   attempt(fake_claude, "wipe", f"cd {project} && {wipe}")], "text": report()},
        {"shell": [try_lock(project), "git add -A && git commit -qm 'feat: F2'"],
         "text": report(feature="F2")}]})
    run_engine(project)
    assert_attempts(fake_claude, mode, "wipe", because=WIPES[wipe])
    # refused: nothing stashed, nothing to take back (the stash of `off` is the agent's wipe)
    assert has_ref(project, "refs/stash") is (wipe.startswith("git stash") and not confined(mode))
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert (project / ".anima" / "config.json").read_bytes() == config
    # the log still starts at the beginning, and goes on after the wipe
    log = log_text(project)
    assert "phase idle → starting" in log and "merged milestone/m1 into main" in log
    retaken = "anima.flock was deleted (by an agent's command, most likely); Anima took it again"
    assert (retaken in log) is not confined(mode)
    # the transcript has every turn, from before the wipe and after: its result, or the
    # agent's end (`rm -rf .anima` without the sandbox takes the worktree, the agent's cwd,
    # from under it: the round is rejected and the worktree made again)
    events = [json.loads(line) for line in
              (project / ".anima/transcripts/m1/events.jsonl").read_text().splitlines()]
    assert events[0]["type"] == "SessionStarted"
    ended = sum(e["type"] == "TurnResult" or (e["type"] == "AgentExited" and not e["expected"])
                for e in events)
    assert ended == len(fake_claude.prompts()) >= 6
    # no second Anima could take the project in round 2
    assert run_git(project, "show", "main:lock.txt") == "refused"


def test_the_worktree_you_delete_while_the_developer_works_is_made_again(
        project: Path, fake_claude: FakeClaude) -> None:
    """Its CLI dies without a folder to work in, and its restart cannot be confined to one:
    the round is rejected for what was lost, the worktree made again from the branch, and
    the milestone goes on (it used to fail: "No such file … worktrees/m1/.git")."""
    fake_claude.write_script({"developer": [{"delay": 2.0, "auto": True}],
                              "developer_default": {"auto": True}})
    engine = Engine(project)
    worker = threading.Thread(target=engine.run, kwargs={"watch": False, "start_all": True})
    worker.start()
    try:
        wait_until(lambda: fake_claude.entries("developer"), what="the first Developer turn")
        shutil.rmtree(project / ".anima" / "worktrees" / "m1")
        worker.join(90)
    finally:
        engine.shutdown()
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.error is None, rec.error
    assert rec.iterations[0].verdict is Verdict.REJECTED
    assert "the milestone's worktree was deleted during the Developer's turn" in \
        (rec.iterations[0].reason or "")
