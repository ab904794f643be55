"""What is checked and reviewed is what gets merged: the milestone branch's commits, wherever
the Developer left its tree and whatever commit its report names. The real engine and loop,
the fake `claude`."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.loop.confinement import sandbox_problem
from anima.store.models import MilestoneStatus, RoundKind, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import TWO, report

DONE = "## ALL_FEATURES_COMPLETE\n\n### Summary\nall done"
F1 = ["mkdir -p features && echo F1 > features/F1.txt", "git add -A",
      "git commit -qm 'feat: F1'"]
#: Once the scripted turns are spent: every later review rejects, so the run pauses.
STOP = {"acceptor_default": {"text": "REJECTED: stop"}, "developer_default": {"text": "x"}}
NO_BWRAP = sandbox_problem("auto")
#: How the Developer leaves the milestone branch, by `sandbox` setting, and how Anima's note
#: names where it found the tree. Confined, it cannot create a branch (refs/heads/ is
#: read-only to it) but can detach its worktree's HEAD and commit there.
LEAVE_BRANCH = [
    pytest.param("auto", "git switch -q --detach", "a detached HEAD at ",
                 id="sandbox-detached", marks=pytest.mark.skipif(
                     NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")),
    pytest.param("off", "git switch -q -c side", "side", id="off-side-branch"),
]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def files_at(project: Path, commit: str) -> list[str]:
    return run_git(project, "ls-tree", "-r", "--name-only", commit).splitlines()


@pytest.mark.parametrize(("sandbox", "leave", "where"), LEAVE_BRANCH)
def test_the_final_acceptance_judges_the_milestone_branch_not_a_side_branch(
        project: Path, fake_claude: FakeClaude, sandbox: str, leave: str, where: str) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        leave, *F1[:2], "git commit -qm 'feat: everything, on side'"],
        "text": DONE}]})
    run_engine(project, sandbox=sandbox)
    rec = record(project, "m1")
    final = rec.iterations[0]
    assert final.kind is RoundKind.FINAL
    assert final.commit == run_git(project, "rev-parse", "milestone/m1")
    assert any(n.startswith(f"the tree was on {where}") and n.endswith("back on milestone/m1")
               for n in final.notes), final.notes
    assert "feat: everything, on side" not in run_git(project, "log", "--format=%s",
                                                      "milestone/m1")
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


@pytest.mark.parametrize(("sandbox", "leave", "where"), LEAVE_BRANCH)
def test_checks_and_review_run_on_the_branch_not_where_the_developer_left_its_tree(
        project: Path, fake_claude: FakeClaude, sandbox: str, leave: str, where: str) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, leave, "echo ok > ok.txt", "git add ok.txt",
        "git commit -qm 'side: makes the check pass'"], "text": report(commit="")}],
        "acceptor": [{"shell": ["git branch --show-current > /dev/null"],
                      "text": "ACCEPTED"}], **STOP})
    run_engine(project, check_command="test -f ok.txt", max_iterations_per_milestone=1,
               sandbox=sandbox)
    first = record(project, "m1").iterations[0]
    assert any(n.startswith(f"the tree was on {where}") for n in first.notes), first.notes
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
