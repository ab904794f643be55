""""Continue from round N": the branch goes back to an accepted round, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.config import Config
from anima.git import GitRepo
from anima.loop.rewind import RewindError, accepted_rounds, continue_from_round
from anima.paths import ProjectPaths
from anima.store.models import FeatureStatus, MilestoneStatus, RoundKind, Verdict, Withdrawn
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine

OK = {"auto": True}
NO = {"text": "REJECTED: F3 is wrong"}


def test_continue_from_an_accepted_round_keeps_the_dropped_commits(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"acceptor": [OK, OK, NO, NO, NO]})
    # Six rounds: five are used when it pauses, and F2 and F3 need two more after the rewind,
    # which the four dropped rounds give back.
    make_project(git_repo, {"m1": milestone_md("Three", ["One", "Two", "Three"])},
                 config={"max_iterations_per_milestone": 6})
    run_engine(git_repo, summarizer={"enabled": False})
    paused = record(git_repo, "m1")
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
