"""What you do by hand to a running milestone's git, from your checkout: its worktree or its
branch removed while the Developer works. The milestone goes on from what git still has, the
round is rejected for what was lost, and your repository never holds a ref to a commit it
lacks. The real engine, the fake `claude`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import engine_held, hold, make_project, milestone_md, record

#: A Developer turn that commits, then waits until the test has done what you do.
COMMIT_THEN_HOLD = "mkdir -p x && echo 1 > x/one && git add -A && git commit -qm one"


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": milestone_md("M", ["A", "B"])})


def yours(project: Path, *args: str) -> None:
    done = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


WORKTREE_LOST = "the milestone's worktree was deleted during the Developer's turn"


@pytest.mark.parametrize(("hand", "said"), [
    (["worktree remove --force .anima/worktrees/m1"], WORKTREE_LOST),
    (["worktree remove --force .anima/worktrees/m1", "branch -D milestone/m1"], WORKTREE_LOST),
    (["update-ref -d refs/heads/milestone/m1"], "milestone/m1 was deleted; Anima recreated it"),
], ids=["worktree-removed", "worktree-and-branch-removed", "branch-deleted-under-it"])
def test_what_you_remove_while_the_developer_works_is_made_again(
        project: Path, fake_claude: FakeClaude, hand: list[str], said: str) -> None:
    """The Developer's commit, in its own object store until Anima takes it in, was what the
    branch named: with the worktree gone, the milestone failed ("a branch named
    'milestone/m1' already exists") and `git log --all` said "bad object". With the branch
    deleted under its worktree, Anima committed the round's work as a new root commit and
    failed ("bad revision …^")."""
    fake_claude.write_script({"developer": [{"shell": [COMMIT_THEN_HOLD,
                                                       hold(fake_claude.root)], "auto": True}]})
    with engine_held(project, fake_claude.root):
        for command in hand:
            yours(project, *command.split())
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.error is None, rec.error
    assert rec.merge and rec.merge.merged, rec.merge
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED and said in (first.reason or ""), first.reason
    yours(project, "fsck", "--no-dangling")
    run_git(project, "log", "--all")
    # one history: main's first commit is the milestone's base
    assert run_git(project, "rev-list", "--max-parents=0", "main").count("\n") == 0
