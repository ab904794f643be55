"""The merge into main after a kill at its worst instant: the human's checkout on main half
updated by a checkout that a kill cut short is finished, never taken for the human's edits."""

from __future__ import annotations

from pathlib import Path

from anima.git import GitRepo
from tests.conftest import init_repo, run_git


def test_a_checkout_cut_short_by_a_kill_is_finished_not_waited_on(tmp_path: Path) -> None:
    project = init_repo(tmp_path / "p", {"a.txt": "a\n", "b.txt": "b\n", "mine.txt": "m\n"})
    repo = GitRepo.open(project)
    worktree = project / ".anima" / "worktrees" / "m1"
    repo.add_worktree(worktree, "milestone/m1", "main")
    for name in ("a.txt", "b.txt"):
        (worktree / name).write_text(f"{name} from the milestone\n", encoding="utf-8")
    run_git(worktree, "commit", "-qam", "feat: both")
    # The kill: one of the two files was already written in the human's checkout, the index
    # not yet; the human has an unrelated edit of their own.
    (project / "a.txt").write_text("a.txt from the milestone\n", encoding="utf-8")
    (project / "mine.txt").write_text("my edit\n", encoding="utf-8")
    before = run_git(project, "rev-parse", "main")
    outcome = repo.merge_branch("milestone/m1", "main", "Merge milestone/m1")
    assert outcome.merged, outcome.detail
    assert run_git(project, "rev-parse", "main^1") == before
    assert (project / "b.txt").read_text() == "b.txt from the milestone\n"
    assert (project / "mine.txt").read_text() == "my edit\n"  # the human's edit is intact
    assert run_git(project, "status", "--porcelain", "--untracked-files=no") == "M mine.txt"
