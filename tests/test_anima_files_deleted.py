"""An agent's shell reaches `.anima/`: `git clean -fdx` (a common "clean build" step),
`git stash --all` or `rm -rf .anima` delete the runtime files Anima holds. The records come
back (the guard's copies), the milestone's log and transcript keep everything written before,
and the lock goes on excluding a second Anima. The real engine, the fake `claude`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import TWO, log_text, report

# Run by the Developer's shell in round 2: can another Anima take the project now?
TRY_LOCK = (f"{sys.executable} -c \"from pathlib import Path; from anima.lock import "
            "ProjectLock; ProjectLock(Path('.anima/anima.lock')).acquire()\" "
            "&& echo taken > lock.txt || echo refused > lock.txt")


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


@pytest.mark.parametrize("wipe", ["git clean -fdxq", "git stash -q --all", "rm -rf .anima"])
def test_what_a_wipe_of_anima_files_deletes_comes_back(project: Path, fake_claude: FakeClaude,
                                                       wipe: str) -> None:
    fake_claude.write_script({"developer": [
        {"shell": ["mkdir -p features && echo F1 > features/F1.txt",
                   "git add -A && git commit -qm 'feat: F1'", wipe], "text": report()},
        {"shell": [TRY_LOCK, "git add -A && git commit -qm 'feat: F2'"],
         "text": report(feature="F2")}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    # the log still starts at the beginning, and goes on after the wipe
    log = log_text(project)
    assert "phase idle → starting" in log and "merged milestone/m1 into main" in log
    assert "anima.flock was deleted (by an agent's command, most likely); Anima took it again" \
        in log
    # the transcript has every turn's result, from before the wipe and after
    events = [json.loads(line) for line in
              (project / ".anima/transcripts/m1/events.jsonl").read_text().splitlines()]
    assert events[0]["type"] == "SessionStarted"
    assert sum(e["type"] == "TurnResult" for e in events) == len(fake_claude.prompts()) >= 6
    # no second Anima could take the project in round 2
    assert run_git(project, "show", "main:lock.txt") == "refused"
