""""Continue from round N": the branch goes back to an accepted round, nothing is lost."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from anima.config import Config
from anima.git import GitRepo
from anima.loop.rewind import RewindError, accepted_rounds, continue_from_round
from anima.paths import ProjectPaths
from anima.store.models import (
    FeatureStatus,
    MilestoneRecord,
    MilestoneStatus,
    RoundKind,
    Verdict,
    Withdrawn,
)
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine
from tests.test_crash import git_shim

OK = {"auto": True}
NO = {"text": "REJECTED: F3 is wrong"}


def paused_after_two_accepted(git_repo: Path, fake_claude: FakeClaude,
                              monkeypatch: pytest.MonkeyPatch) -> MilestoneRecord:
    """m1 (three features) paused after rounds 1–2 accepted and 3–5 rejected. Six rounds:
    five are used when it pauses, and F2 and F3 need two more after a rewind to round 1,
    which the four dropped rounds give back."""
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"acceptor": [OK, OK, NO, NO, NO]})
    make_project(git_repo, {"m1": milestone_md("Three", ["One", "Two", "Three"])},
                 config={"max_iterations_per_milestone": 6})
    run_engine(git_repo, summarizer={"enabled": False})
    return record(git_repo, "m1")


def test_continue_from_an_accepted_round_keeps_the_dropped_commits(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    paused = paused_after_two_accepted(git_repo, fake_claude, monkeypatch)
    assert paused.status is MilestoneStatus.PAUSED
    assert accepted_rounds(paused) == [1, 2]
    round1, old_head = paused.iterations[0].commit, paused.iterations[-1].commit
    store, repo = Store(ProjectPaths(git_repo)), GitRepo.open(git_repo)

    with pytest.raises(RewindError, match="not an accepted round"):
        continue_from_round(store, repo, Config(), "m1", 3)
    resumed = continue_from_round(store, repo, Config(), "m1", 1, "F2 again, smaller")

    assert resumed.status is MilestoneStatus.IN_PROGRESS
    assert run_git(git_repo, "rev-parse", "milestone/m1").strip() == round1
    kept = run_git(git_repo, "for-each-ref", "--format=%(refname) %(objectname)",
                   "refs/anima/dropped/").split()
    assert kept == ["refs/anima/dropped/m1/1", old_head]
    assert [f.status for f in resumed.features] == [FeatureStatus.DONE, FeatureStatus.PENDING,
                                                    FeatureStatus.PENDING]
    last = paused.iterations[-1].round
    assert f"continued from round 1 (rounds 2–{last} dropped)" in resumed.notes[-1]
    assert [it.withdrawn for it in resumed.iterations] == [None] + [Withdrawn.DROPPED] * 4
    assert "refs/anima/dropped/m1/1" in resumed.notes[-1]
    assert "no longer count toward the round limit" in resumed.notes[-1]
    assert resumed.max_iterations == 6 + 4

    run_engine(git_repo, summarizer={"enabled": False})
    done = record(git_repo, "m1")
    assert done.status is MilestoneStatus.COMPLETED
    assert any("F2 again, smaller" in p for p in fake_claude.prompts("developer"))
    assert repo.is_ancestor(round1, "main")
    # What you dropped stays dropped: the next round builds F2 anew (it used to be rejected
    # as "history was rewritten", the branch put back to the dropped rounds, which main then
    # received), and it is not a fix of a dropped round's rejection.
    after = done.iterations[last:]
    assert after[0].kind is RoundKind.FEATURE and after[0].verdict is Verdict.ACCEPTED, after[0]
    assert not any("rewritten" in it.reason for it in after), [it.reason for it in after]
    for dropped in (paused.iterations[1].commit, old_head):
        assert dropped and not repo.is_ancestor(dropped, "main")


@pytest.mark.parametrize("killed_after", [" reset -q --hard ", " update-ref --no-deref "])
def test_a_continue_from_round_that_a_kill_cut_short_is_finished_or_undone_at_restart(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, killed_after: str) -> None:
    """"Continue from round 1", killed once the branch was back at round 1 but before the
    record said so: on resume the next review took the move for the Developer rewriting
    history, put the dropped rounds back and paused again. The restart finishes it; killed
    before the branch moved, nothing was done, and the restart says so."""
    paused = paused_after_two_accepted(git_repo, fake_claude, monkeypatch)
    round1, old_head = paused.iterations[0].commit, paused.iterations[-1].commit
    # the real git first, then the kill of its caller
    _, env = git_shim(tmp_path, fake_claude, killed_after,
                      f'{shutil.which("git")} "$@"; rc=$?; kill -9 $PPID; exit $rc')
    code = ("import sys; from pathlib import Path; from anima.config import Config; "
            "from anima.git import GitRepo; from anima.loop.rewind import continue_from_round; "
            "from anima.paths import ProjectPaths; from anima.store.store import Store; "
            "root = Path(sys.argv[1]); continue_from_round(Store(ProjectPaths(root)), "
            "GitRepo.open(root), Config(), 'm1', 1)")
    killed = subprocess.run([sys.executable, "-c", code, str(git_repo)], env=env, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert record(git_repo, "m1").status is MilestoneStatus.PAUSED  # the record never knew
    moved = killed_after.startswith(" reset")
    assert run_git(git_repo, "rev-parse", "milestone/m1").strip() == (
        round1 if moved else old_head)

    run_engine(git_repo, summarizer={"enabled": False})
    done = record(git_repo, "m1")
    log = (git_repo / ".anima" / "logs" / "anima.log").read_text(encoding="utf-8")
    if not moved:
        assert "had not moved the branch yet: nothing was done; choose it again" in log
        assert done.status is MilestoneStatus.PAUSED and done.notes == paused.notes
        assert not run_git(git_repo, "for-each-ref", "refs/anima/dropped/")
        return
    assert any("continued from round 1" in n and "finished at the restart" in n
               for n in done.notes), done.notes
    assert done.status is MilestoneStatus.COMPLETED, done.pause_reason
    last = paused.iterations[-1].round
    assert not any("rewritten" in it.reason for it in done.iterations[last:])
    assert not GitRepo.open(git_repo).is_ancestor(old_head, "main")


def test_a_cut_short_continue_whose_branch_you_deleted_does_not_stop_every_start(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A "Continue from round" a kill cut short (its ref kept, no note names it), then the
    milestone branch deleted by you: every start ended on "There is no branch
    'milestone/m1'", the project never ran again. The rewind is left as it is (its ref kept)
    and the start goes on."""
    paused = paused_after_two_accepted(git_repo, fake_claude, monkeypatch)
    old_head = paused.iterations[-1].commit
    assert old_head is not None
    run_git(git_repo, "update-ref", "refs/anima/dropped/m1/99", old_head)  # as the kill left
    run_git(git_repo, "update-ref", "-d", "refs/heads/milestone/m1")
    run_engine(git_repo, summarizer={"enabled": False})
    assert run_git(git_repo, "rev-parse", "refs/anima/dropped/m1/99").strip() == old_head
    assert record(git_repo, "m1").status is MilestoneStatus.PAUSED
