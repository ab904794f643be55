"""Git left mid-way never fails a milestone: a lock file of a git an agent killed, a rebase it
walked away from, locks a power cut left. Anima's next git command would fail on each ("File
exists", "cannot switch branch while rebasing"); the real engine and the fake `claude`."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import TWO, log_text, report

F1 = ["mkdir -p features && echo F1 > features/F1.txt", "git add -A && git commit -qm 'feat: F1'"]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def merged(project: Path) -> None:
    """The milestone went on to the end, and git is at rest on main."""
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged, rec.error
    assert run_git(project, "branch", "--show-current") == "main"
    assert "features/F1.txt" in run_git(project, "ls-tree", "-r", "--name-only", "main")
    git_dir = project / ".git"
    assert not [p for p in git_dir.rglob("*.lock")]
    assert not (git_dir / "rebase-merge").exists() and not (git_dir / "MERGE_HEAD").exists()


def test_a_lock_the_developer_left_is_removed_and_its_work_committed(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo more > notes.txt", "touch .git/index.lock .git/HEAD.lock"],
        "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED and first.auto_committed
    assert ".git/index.lock was left by a git command that no longer runs; removed" \
        in first.notes
    assert run_git(project, "show", "main:notes.txt") == "more"
    merged(project)


def test_a_rebase_the_developer_walked_away_from_is_aborted_and_the_round_rejected(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo a > a.txt && git add a.txt && git commit -qm a",
        "echo b > a.txt && git commit -qam b",
        # a conflicting rebase, left stopped half way
        "git checkout -q -b side HEAD~1 && echo c > a.txt && git commit -qam c",
        "git rebase milestone/m1 || true"], "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert "the round left git mid-operation: an unfinished rebase was aborted" in first.reason
    assert "an unfinished rebase was aborted" in log_text(project)
    merged(project)


def test_locks_the_acceptor_left_do_not_stop_the_merge(project: Path,
                                                       fake_claude: FakeClaude) -> None:
    fake_claude.write_script({
        "developer": [{"shell": F1, "text": report()}],
        "acceptor": [{"shell": ["touch .git/index.lock .git/refs/heads/main.lock"]}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED
    assert any("refs/heads/main.lock was left" in n for n in first.notes)
    merged(project)


def test_locks_a_power_cut_left_are_removed_at_the_next_start(project: Path,
                                                             fake_claude: FakeClaude) -> None:
    for lock in ("index.lock", "HEAD.lock", "refs/heads/main.lock"):
        (project / ".git" / lock).touch()
    run_engine(project)
    merged(project)
