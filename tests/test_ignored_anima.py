"""A project whose own .gitignore ignores `.anima/` (issue 10.11): a real
`python -m anima run … --headless` is SIGKILLed at several moments with work left in the
milestone's worktree (`.anima/worktrees/m1`, itself under the ignored folder), and the next run
recovers (stashing what nobody committed) and finishes the milestone; the human's checkout
stays clean throughout. In both modes: with the sandbox (`auto`) the Acceptor cannot leave
anything in the worktree, so nothing is stashed for it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record
from tests.test_completion import kill_with_children, slow_git
from tests.test_integrity import MODES, confined, worktree
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


def round_recorded(project: Path, marker: Path) -> bool:
    path = project / ".anima" / "milestones" / "m1.json"
    return path.exists() and bool(json.loads(path.read_text())["iterations"])


def script(moment: str, marker: Path) -> dict[str, Any]:
    """The fake's script for `moment`; its turn touches `marker` once it left its file."""
    scripts: dict[str, dict[str, Any]] = {
        "developer-turn": {"developer": [AUTO, {"shell": [
            f"echo wip > wip.txt && touch {marker} && sleep 60"]}, LEAVE_IT]},
        # The Acceptor's write is refused in the sandbox: the marker comes after it all the
        # same (before it, a loaded machine killed Anima before the write was made).
        "acceptor-review": {"acceptor": [{"shell": [
            f"echo x > scratch.txt; touch {marker}; sleep 60"]}],
                            "developer": [AUTO, LEAVE_IT]},
        "between-rounds": {"developer": [AUTO, LEAVE_IT],
                           "developer_default": {"auto": True, "delay": 0.5}},
    }
    return scripts[moment]


MOMENTS: dict[str, tuple[Callable[[Path, Path], bool], str | None, str | None]] = {
    # moment: (wait for…, the file left in the worktree before the kill (the agent's), a file
    # a leftover tool writes in the worktree after the kill)
    "developer-turn": (lambda p, m: m.exists(), "wip.txt", None),
    "acceptor-review": (lambda p, m: m.exists(), "scratch.txt", None),
    "between-rounds": (round_recorded, None, "generated.txt"),
}


@pytest.fixture
def ignoring(git_repo: Path) -> Path:
    (git_repo / ".gitignore").write_text("*.pyc\n.anima/\n", encoding="utf-8")
    run_git(git_repo, "add", ".gitignore")
    run_git(git_repo, "commit", "-q", "-m", "chore: ignore .anima")
    return git_repo


def assert_finished_cleanly(project: Path, stashed: bool = True) -> None:
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert_consistent(rec)
    assert run_git(project, "status", "--porcelain") == ""  # nothing left half-staged
    assert ("anima-recovery-m1-" in run_git(project, "stash", "list")) is stashed
    assert any("anima-recovery-m1-" in n for n in rec.notes) is stashed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_recovery_works_when_the_project_ignores_anima(
        ignoring: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        moment: str, mode: str) -> None:
    when, left, leftover = MOMENTS[moment]
    make_project(ignoring, {"m1": TWO}, {"sandbox": mode})
    marker = fake_claude.root / "left-it"
    fake_claude.write_script(script(moment, marker))
    first = Runner(ignoring, fake_claude)
    wait_until(lambda: when(ignoring, marker), what=moment, timeout=30)
    first.kill()
    refused = moment == "acceptor-review" and confined(mode)  # the Acceptor's read-only tree
    if left:
        assert (worktree(ignoring) / left).exists() is not refused
    if leftover:
        (worktree(ignoring) / leftover).write_text("a tool kept writing\n", encoding="utf-8")

    second = run_to_end(ignoring, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert_finished_cleanly(ignoring, stashed=not refused)
    assert our_processes() == []


@pytest.mark.parametrize("mode", MODES)
def test_a_kill_during_the_merge_when_the_project_ignores_anima(
        ignoring: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]], mode: str) -> None:
    make_project(ignoring, {"m1": ONE}, {"sandbox": mode})
    env, marker = slow_git(tmp_path, 30.0)
    first = Runner(ignoring, fake_claude, env=env)
    wait_until(marker.exists, what="the merge into main", timeout=30)
    kill_with_children(first.pid)
    first.kill()
    # a tool of the agents' still writing in the worktree, which the merge has not removed
    (worktree(ignoring) / "notes.txt").write_text("written after the kill\n", encoding="utf-8")

    second = run_to_end(ignoring, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    assert_finished_cleanly(ignoring)
    assert "notes.txt" in run_git(ignoring, "show", "--name-only", "--format=", "stash@{0}^3")
    assert not (ignoring / "notes.txt").exists()  # never the human's checkout's
    assert our_processes() == []
