"""The project's checks run the Developer's code: a push they make is caught like one the
Developer makes (the milestone pauses, naming it), inside the sandbox and without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anima.loop.confinement import WRITABLE_VAR, sandbox_problem
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine

NO_BWRAP = sandbox_problem("auto")
SANDBOXES = [pytest.param("auto", marks=pytest.mark.skipif(
    NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")), "off"]


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_push_made_by_the_checks_pauses_the_milestone(
        git_repo: Path, tmp_path: Path, fake_claude: FakeClaude,
        monkeypatch: pytest.MonkeyPatch, sandbox: str) -> None:
    fake_claude.use_env(monkeypatch)
    bare = tmp_path / "origin.git"
    run_git(tmp_path, "init", "-q", "--bare", str(bare))
    run_git(git_repo, "remote", "add", "origin", str(bare))
    run_git(git_repo, "push", "-q", "origin", "main")
    # Standing for a remote over the network, which the sandbox cannot make read-only.
    monkeypatch.setenv(WRITABLE_VAR, os.pathsep.join([os.environ[WRITABLE_VAR], str(bare)]))
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet command"])})
    check = f"git push -q {bare} HEAD:refs/heads/from-the-checks 2>&1 || true"
    _, outcome = run_engine(git_repo, sandbox=sandbox, check_command=check)
    rec = record(git_repo, "m1")
    assert "from-the-checks" in run_git(bare, "for-each-ref")  # the push went through…
    assert rec.status is MilestoneStatus.PAUSED and outcome.paused == ("m1",)  # …and is caught
    assert "the checks pushed" in (rec.pause_reason or "")
