"""The M4 loop end to end: the fake `claude` in a real temp git repo, the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.store import FeatureStatus, MilestoneStatus, RoundKind, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine, state

TWO = milestone_md("Greeter", ["Greet command", "Version flag"], ["greet prints hello",
                                                                 "--version prints it"])


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def test_whole_milestone_completes_on_its_branch_and_merges(project: Path,
                                                            fake_claude: FakeClaude) -> None:
    main_before = run_git(project, "rev-parse", "main")
    _, outcome = run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert outcome.paused == ()
    assert [(i.kind, i.feature, i.verdict) for i in rec.iterations] == [
        (RoundKind.FEATURE, "F1", Verdict.ACCEPTED),
        (RoundKind.FEATURE, "F2", Verdict.ACCEPTED),
        (RoundKind.FINAL, None, Verdict.ACCEPTED)]
    assert rec.iteration_count == 2 and rec.consecutive_rejections == 0
    assert all(f.status is FeatureStatus.DONE for f in rec.features)
    assert rec.branch_name == "milestone/m1" and rec.base_commit == main_before
    # Both features were committed on the milestone branch, then merged into main.
    branch_log = run_git(project, "log", "--format=%s", "milestone/m1")
    assert "feat: F1" in branch_log and "feat: F2" in branch_log
    assert rec.merge is not None and rec.merge.merged
    assert run_git(project, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert (project / "features" / "F2.txt").exists()
    assert state(project) == {**state(project), "status": "sleeping", "current_milestone": None}
    # One persistent process per role for the whole milestone.
    assert len({e["pid"] for e in fake_claude.entries("developer")}) == 1
    assert len({e["pid"] for e in fake_claude.entries("acceptor")}) == 1
    # The Acceptor was told which commit to inspect with git show.
    review = fake_claude.prompts("acceptor")[0]
    assert f"git show {rec.iterations[0].commit}" in review
    log = (project / ".anima" / "logs" / "m1.log").read_text()
    assert "ACCEPTED" in log and "phase" in log
