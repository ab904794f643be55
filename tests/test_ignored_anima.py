"""A project whose own .gitignore ignores `.anima/` (issue 10.11): a real
`python -m anima run … --headless` is SIGKILLed at several moments with work left in the tree,
and the next run recovers (stashing what nobody committed) and finishes the milestone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record
from tests.test_completion import kill_with_children, slow_git
from tests.test_recovery import (
    AUTO,
    ONE,
    TWO,
    Runner,
    assert_consistent,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    run_to_end,
    wait_until,
)

LEAVE_IT = {"text": "I am not sure that file is mine; leaving it as it is."}


def round_recorded(project: Path) -> bool:
    path = project / ".anima" / "milestones" / "m1.json"
    return path.exists() and bool(json.loads(path.read_text())["iterations"])


MOMENTS = {
    # moment: (milestone, script, wait for…, a file a leftover tool writes after the kill)
    "developer-turn": (TWO, {"developer": [AUTO, {"shell": ["echo wip > wip.txt && sleep 60"]},
                                           LEAVE_IT]},
                       lambda p: (p / "wip.txt").exists(), None),
    "acceptor-review": (TWO, {"acceptor": [{"shell": ["echo x > scratch.txt && sleep 60"]}],
                              "developer": [AUTO, LEAVE_IT]},
                        lambda p: (p / "scratch.txt").exists(), None),
    "between-rounds": (TWO, {"developer": [AUTO, LEAVE_IT],
                             "developer_default": {"auto": True, "delay": 0.5}},
                       round_recorded, "generated.txt"),
}


@pytest.fixture
def ignoring(git_repo: Path) -> Path:
    (git_repo / ".gitignore").write_text("*.pyc\n.anima/\n", encoding="utf-8")
    run_git(git_repo, "add", ".gitignore")
    run_git(git_repo, "commit", "-q", "-m", "chore: ignore .anima")
    return git_repo


def assert_finished_cleanly(project: Path) -> None:
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert_consistent(rec)
    assert run_git(project, "status", "--porcelain") == ""  # nothing left half-staged
    assert "anima-recovery-m1-" in run_git(project, "stash", "list")
    assert any("anima-recovery-m1-" in n for n in rec.notes)


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_recovery_works_when_the_project_ignores_anima(
        ignoring: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        moment: str) -> None:
    md, script, when, leftover = MOMENTS[moment]
    make_project(ignoring, {"m1": md})
    fake_claude.write_script(script)
    first = Runner(ignoring, fake_claude)
    wait_until(lambda: when(ignoring), what=moment, timeout=30)
    first.kill()
    if leftover:
        (ignoring / leftover).write_text("a tool kept writing\n", encoding="utf-8")

    second = run_to_end(ignoring, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert_finished_cleanly(ignoring)
    assert our_processes() == []


def test_a_kill_during_the_merge_when_the_project_ignores_anima(
        ignoring: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]]) -> None:
    make_project(ignoring, {"m1": ONE})
    env, marker = slow_git(tmp_path, 30.0)
    first = Runner(ignoring, fake_claude, env=env)
    wait_until(marker.exists, what="the merge into main", timeout=30)
    kill_with_children(first.pid)
    first.kill()
    (ignoring / "notes.txt").write_text("written after the kill\n", encoding="utf-8")

    second = run_to_end(ignoring, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert_finished_cleanly(ignoring)
    assert "notes.txt" in run_git(ignoring, "show", "--name-only", "--format=", "stash@{0}^3")
    assert our_processes() == []
