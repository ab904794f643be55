"""What is checked and reviewed is what gets merged: the milestone branch's commits, wherever
the Developer left its tree and whatever commit its report names. The real engine and loop,
the fake `claude`."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus, RoundKind, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import TWO, report

DONE = "## ALL_FEATURES_COMPLETE\n\n### Summary\nall done"
F1 = ["mkdir -p features && echo F1 > features/F1.txt", "git add -A",
      "git commit -qm 'feat: F1'"]
#: Once the scripted turns are spent: every later review rejects, so the run pauses.
STOP = {"acceptor_default": {"text": "REJECTED: stop"}, "developer_default": {"text": "x"}}


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def files_at(project: Path, commit: str) -> list[str]:
    return run_git(project, "ls-tree", "-r", "--name-only", commit).splitlines()


def test_the_final_acceptance_judges_the_milestone_branch_not_a_side_branch(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        "git switch -q -c side", *F1[:2], "git commit -qm 'feat: everything, on side'"],
        "text": DONE}]})
    run_engine(project)
    rec = record(project, "m1")
    final = rec.iterations[0]
    assert final.kind is RoundKind.FINAL
    assert final.commit == run_git(project, "rev-parse", "milestone/m1")
    assert "the tree was on side; back on milestone/m1" in final.notes
    # what the Acceptor accepted is what main got
    if rec.status is MilestoneStatus.COMPLETED:
        assert set(files_at(project, final.commit)) <= set(files_at(project, "main"))


def test_uncommitted_work_at_the_end_is_committed_before_the_final_review(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        "mkdir -p features && echo F1 > features/F1.txt && echo F2 > features/F2.txt"],
        "text": DONE}]})
    run_engine(project)
    rec = record(project, "m1")
    final = rec.iterations[0]
    assert final.auto_committed and "features/F1.txt" in files_at(project, final.commit or "")
    assert rec.status is MilestoneStatus.COMPLETED
    assert "features/F2.txt" in files_at(project, "main")


def test_checks_and_review_run_on_the_branch_not_where_the_developer_left_its_tree(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "git switch -q -c side", "echo ok > ok.txt", "git add ok.txt",
        "git commit -qm 'side: makes the check pass'"], "text": report(commit="")}],
        "acceptor": [{"shell": ["git branch --show-current > /dev/null"],
                      "text": "ACCEPTED"}], **STOP})
    run_engine(project, check_command="test -f ok.txt", max_iterations_per_milestone=1)
    first = record(project, "m1").iterations[0]
    assert first.check is not None and not first.check.passed
    assert first.verdict is Verdict.REJECTED


def test_commits_on_top_of_the_reported_one_are_reviewed_too(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "git rm -q README.md", "git commit -qm 'chore: sneaky removal'"],
        "text": report(commit="{head~1}")}], **STOP})
    run_engine(project, max_iterations_per_milestone=1)
    first = record(project, "m1").iterations[0]
    assert first.commit == run_git(project, "rev-parse", "milestone/m1")
    assert "sneaky removal" in fake_claude.prompts("acceptor")[0]


def test_a_wrong_hash_beside_uncommitted_work_is_said(project: Path,
                                                     fake_claude: FakeClaude) -> None:
    base = run_git(project, "rev-parse", "main")
    fake_claude.write_script({"developer": [{
        "shell": ["mkdir -p features && echo F1 > features/F1.txt"],
        "text": report(commit=base)}], **STOP})
    run_engine(project, max_iterations_per_milestone=1)
    first = record(project, "m1").iterations[0]
    assert any(f"the report named {base[:7]}, which is not a commit of this round" in n
               for n in first.notes)
