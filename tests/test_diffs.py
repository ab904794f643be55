"""The Changes view's data: per-file counts and hunks of a milestone or of one round."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.diffs import diff_between, milestone_changes
from anima.git import GitRepo
from anima.store.models import (
    Iteration,
    MergeInfo,
    MergeState,
    MilestoneRecord,
    MilestoneStatus,
    RoundKind,
    Verdict,
)
from tests.conftest import run_git


def commit_all(repo: Path, message: str) -> str:
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-q", "-m", message)
    return run_git(repo, "rev-parse", "HEAD").strip()


def a_record(base: str, **fields: object) -> MilestoneRecord:
    t = datetime.now(UTC)
    return MilestoneRecord(id="m1", title="M1", created_at=t, base_commit=base,
                           branch_name="milestone/m1", main_branch="main", **fields)


def an_iteration(n: int, commit: str) -> Iteration:
    t = datetime.now(UTC)
    return Iteration(round=n, kind=RoundKind.FEATURE, commit=commit, verdict=Verdict.ACCEPTED,
                     started_at=t, ended_at=t)


def test_files_counts_renames_binary_whitespace_and_generated(git_repo: Path) -> None:
    (git_repo / "app.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    (git_repo / "old_name.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    (git_repo / "style.css").write_text("a { color: red; }\n")
    base = commit_all(git_repo, "base")
    (git_repo / "app.py").write_text("def f():\n    return 10\n\n\ndef g():\n    return 2\n"
                                     "\n\ndef h():\n    return 3\n")
    run_git(git_repo, "mv", "old_name.txt", "new_name.txt")
    (git_repo / "style.css").write_text("a {  color:  red; }\n")
    (git_repo / "poetry.lock").write_text("[[package]]\nname = 'x'\n")
    (git_repo / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0binary")
    head = commit_all(git_repo, "change")

    changes = diff_between(GitRepo.open(git_repo), base, head, "whole milestone")

    by_path = {f.path: f for f in changes.files}
    assert set(by_path) == {"app.py", "new_name.txt", "style.css", "poetry.lock", "logo.png"}
    app = by_path["app.py"]
    assert (app.added, app.removed, app.collapsed) == (5, 1, False)
    # Rows carry the new file's line numbers: `return 10` is line 2, `def h` line 9.
    added = [(r.new_line, r.text) for r in app.rows if r.kind == "+"]
    assert added[0] == (2, "    return 10")
    assert (9, "def h():") in added
    removed = [(r.old_line, r.text) for r in app.rows if r.kind == "-"]
    assert removed == [(2, "    return 1")]
    assert by_path["new_name.txt"].old_path == "old_name.txt"
    assert by_path["style.css"].whitespace_only and by_path["style.css"].collapsed
    assert by_path["poetry.lock"].generated and by_path["poetry.lock"].collapsed
    assert by_path["logo.png"].binary
    assert changes.added == sum(f.added for f in changes.files)


def test_whole_milestone_and_one_round(git_repo: Path) -> None:
    base = run_git(git_repo, "rev-parse", "HEAD").strip()
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    (git_repo / "a.py").write_text("A = 1\n")
    first = commit_all(git_repo, "feat: a")
    (git_repo / "b.py").write_text("B = 2\n")
    second = commit_all(git_repo, "feat: b")
    record = a_record(base, iterations=[an_iteration(1, first), an_iteration(2, second)])
    repo = GitRepo.open(git_repo)

    whole = milestone_changes(repo, record)
    assert [f.path for f in whole.files] == ["a.py", "b.py"]
    assert (whole.old, whole.new) == (base, second)
    round2 = milestone_changes(repo, record, 2)
    assert [f.path for f in round2.files] == ["b.py"] and round2.label == "round 2"


def test_completed_milestone_shows_what_its_merge_brought_into_main(git_repo: Path) -> None:
    base = run_git(git_repo, "rev-parse", "HEAD").strip()
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    (git_repo / "a.py").write_text("A = 1\n")
    commit_all(git_repo, "feat: a")
    run_git(git_repo, "switch", "-q", "main")
    (git_repo / "other.txt").write_text("a human's change on main meanwhile\n")
    commit_all(git_repo, "docs: other")
    run_git(git_repo, "merge", "-q", "--no-ff", "-m", "Merge m1", "milestone/m1")
    (git_repo / "later.txt").write_text("after the merge\n")
    commit_all(git_repo, "later")
    record = a_record(base, status=MilestoneStatus.COMPLETED,
                      merge=MergeInfo(state=MergeState.MERGED, merged=True, detail="merged"))

    merged = milestone_changes(GitRepo.open(git_repo), record)

    assert [f.path for f in merged.files] == ["a.py"]
    assert merged.label == "the merge into main"


#: Peak memory of one read of the last commit, in a child process (a fresh peak to measure).
MEASURE = r'''
import resource, sys
from pathlib import Path
from anima.git import GitRepo
from anima.diffs import diff_between
repo = GitRepo.open(Path(sys.argv[1]))
base, tip = repo.resolve("HEAD~1"), repo.resolve("HEAD")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[2] == "first_leak":
    repo.first_leak(base, tip, {".env"}, ["sk-local-only-0123456789"])
else:
    print(diff_between(repo, base, tip, "whole milestone").files[0].patch, file=sys.stderr)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
'''


@pytest.mark.parametrize("what", ["first_leak", "changes_view"])
def test_a_big_text_file_keeps_animas_memory_bounded(git_repo: Path, what: str) -> None:
    """A commit adding a 20 MB text file of short lines (20 KB in git; under git's 512 MB
    big-file threshold it is diffed as text): the secret scan of every round and the Changes
    view held ~40 bytes per byte of it, ~16 GB for a 400 MB file, which the OOM killer ends."""
    (git_repo / "big.txt").write_bytes(b"a\n" * 10_000_000)
    commit_all(git_repo, "feat: data")
    done = subprocess.run([sys.executable, "-c", MEASURE, str(git_repo), what], check=True,
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    grown_mb = int(done.stdout.split()[-1]) / 1024
    assert grown_mb < 200, f"{what} grew by {grown_mb:.0f} MB for a 20 MB file"
    if what == "changes_view":
        assert "too large to show" in done.stderr
