"""GitRepo against real repositories in tmp_path: every rule the scheduler relies on.

`root` is the human's checkout, which stays on main; a milestone's branch lives in its own
worktree (`wt`, at `.anima/worktrees/m1`), where the Developer commits and the Acceptor
reviews, so the branch-side operations run on `tree` (`GitRepo.open(wt)`)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from anima.errors import GitError
from anima.git import GitRepo, MergeOutcome, TreeSnapshot, Worktree
from anima.git.branches import Leftovers
from anima.guard.turns import read_definitions
from anima.paths import ProjectPaths
from tests.conftest import init_repo, run_git

GITIGNORE = ("*.json\n!config.json\nstate.json\nlogs/\ntranscripts/\nanima.lock\nanima.flock\n"
             "worktrees/\nsandbox/\n")
BRANCH = "milestone/m1"


@pytest.fixture(autouse=True)
def _isolated_git(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """No user or system git config (identity, signing, hooks) leaks into these tests."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "EMAIL",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
    ):
        monkeypatch.delenv(var, raising=False)


def git(root: Path, *args: str) -> str:
    """Run git the way a human or an agent would, outside the code under test."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


def make_repo(root: Path, branch: str = "main", identity: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", branch)
    if identity:
        git(root, "config", "user.name", "Tester")
        git(root, "config", "user.email", "tester@example.com")
    write(root, "README.md", "# project\n")
    write(root, "src/app.py", "print('hi')\n")
    write(root, ".anima/.gitignore", GITIGNORE)
    write(root, ".anima/soul.md", "be good\n")
    write(root, ".anima/milestones/m1.md", "# M1\n")
    git(root, "add", "-A")
    env = None
    if not identity:
        env = {**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x"}
        env |= {"GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=root, check=True, env=env)
    write(root, ".anima/state.json", '{"status": "awake"}\n')
    write(root, ".anima/logs/m1.log", "[00:00:00] hello\n")
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj")


@pytest.fixture
def repo(root: Path) -> GitRepo:
    return GitRepo.open(root)


@pytest.fixture
def wt(root: Path) -> Path:
    """Where the milestone's worktree goes (as Anima places it)."""
    return root / ".anima" / "worktrees" / "m1"


@pytest.fixture
def tree(wt: Path, milestone: dict[str, str]) -> GitRepo:
    """The milestone's worktree, as the loop opens it for every branch-side git command."""
    return GitRepo.open(wt)


def away_to_main(wt: Path) -> None:
    """What an unconfined agent can do in its worktree: put it on main (which the human's
    checkout already has: git wants `--ignore-other-worktrees` for that)."""
    git(wt, "switch", "-q", "--ignore-other-worktrees", "main")


@pytest.fixture
def milestone(root: Path, repo: GitRepo, wt: Path) -> dict[str, str]:
    """A started milestone with one Developer commit (made in its worktree); the kwargs
    check_developer_commit takes."""
    base = repo.add_worktree(wt, BRANCH, "main")
    write(wt, "src/feature.py", "x = 1\n")
    commit = commit_all(wt, "feat: F1")
    return {
        "commit": commit,
        "branch": BRANCH,
        "base_commit": base,
        "main": "main",
    }


def check(repo: GitRepo, ms: dict[str, str], **changes: str) -> list[str]:
    """`check_developer_commit`, run in the milestone's worktree as the loop runs it, against
    the human's definitions as they are in their checkout."""
    args = {**ms, **changes}
    commit = args.pop("commit")
    return GitRepo.open(repo.root / ".anima" / "worktrees" / "m1").check_developer_commit(
        commit, **args, definitions=read_definitions(ProjectPaths(repo.root)))


# ------------------------------------------------------------------------------ opening


def test_open_rejects_a_folder_that_is_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(GitError, match=r"is not a git repository \(run `git init`"):
        GitRepo.open(tmp_path)


def test_open_rejects_a_subfolder_of_a_repository(root: Path) -> None:
    with pytest.raises(GitError, match="top folder") as info:
        GitRepo.open(root / "src")
    assert f"inside {root}" in str(info.value)


def test_open_rejects_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(GitError, match="does not exist"):
        GitRepo.open(tmp_path / "nope")


def test_open_rejects_a_repository_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    with pytest.raises(GitError, match="has no commits yet") as info:
        GitRepo.open(tmp_path)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize("branch", ["main", "master"])
def test_main_branch_is_main_else_master(tmp_path: Path, branch: str) -> None:
    repo = GitRepo.open(make_repo(tmp_path / "p", branch=branch))
    assert repo.main_branch() == branch
    assert repo.current_branch() == branch


def test_main_branch_prefers_the_configured_one(root: Path, repo: GitRepo) -> None:
    git(root, "branch", "trunk")
    assert repo.main_branch("trunk") == "trunk"
    with pytest.raises(GitError, match="'develop' does not exist"):
        repo.main_branch("develop")


def test_main_branch_without_main_or_master_is_an_error(tmp_path: Path) -> None:
    repo = GitRepo.open(make_repo(tmp_path / "p", branch="trunk"))
    with pytest.raises(GitError, match="neither a `main` nor a `master`"):
        repo.main_branch()


def test_refs_and_resolution(root: Path, repo: GitRepo) -> None:
    head = git(root, "rev-parse", "HEAD")
    assert repo.head() == head
    assert repo.branch_head("main") == head
    assert repo.branch_exists("main") and not repo.branch_exists("nope")
    assert repo.resolve(head[:8]) == head
    assert repo.resolve("main") == head
    assert repo.resolve("0" * 40) is None
    assert repo.resolve("--all") is None
    assert repo.resolve("HEAD^{tree}") is None
    assert repo.resolve(git(root, "rev-parse", "HEAD^{tree}")) is None  # a tree, not a commit
    with pytest.raises(GitError, match="no branch 'nope'"):
        repo.branch_head("nope")
    git(root, "checkout", "-q", "--detach")
    assert repo.current_branch() is None


# ---------------------------------------------------------------------------- dirty tree


def test_changes_inside_anima_do_not_make_the_tree_dirty(root: Path, repo: GitRepo) -> None:
    write(root, ".anima/milestones/m2.md", "# M2\n")  # untracked definition
    write(root, ".anima/soul.md", "be better\n")  # tracked definition, modified
    write(root, ".anima/transcripts/m1/dev.jsonl", "{}\n")
    assert repo.dirty_paths() == []
    repo.ensure_clean()


def test_changes_outside_anima_are_listed(root: Path, repo: GitRepo) -> None:
    write(root, "src/app.py", "print('bye')\n")
    write(root, "new dir/notes.txt", "n\n")
    (root / "README.md").unlink()
    assert sorted(repo.dirty_paths()) == ["README.md", "new dir/notes.txt", "src/app.py"]
    with pytest.raises(GitError, match=r"uncommitted changes outside \.anima/") as info:
        repo.ensure_clean()
    assert "src/app.py" in str(info.value) and str(root) in str(info.value)


def test_ensure_clean_lists_at_most_ten_paths(root: Path, repo: GitRepo) -> None:
    for i in range(14):
        write(root, f"f{i:02}.txt", "x\n")
    with pytest.raises(GitError, match="and 4 more"):
        repo.ensure_clean()


# ---------------------------------------------------------------------------- worktrees


def test_add_worktree_creates_the_branch_then_reattaches(root: Path, repo: GitRepo,
                                                         wt: Path) -> None:
    main_head = repo.head()
    write(root, "src/app.py", "print('the human is editing')\n")
    assert repo.add_worktree(wt, BRANCH, "main") == main_head
    tree = GitRepo.open(wt)
    assert tree.current_branch() == BRANCH and tree.head() == main_head
    assert repo.worktrees() == [Worktree(wt, BRANCH, False)]
    # The human's checkout is neither switched nor cleaned.
    assert repo.current_branch() == "main"
    assert (root / "src/app.py").read_text() == "print('the human is editing')\n"
    assert (wt / "src/app.py").read_text() == "print('hi')\n"
    write(wt, "src/feature.py", "x = 1\n")
    commit_all(wt, "feat")
    write(wt, "wip.txt", "the Developer's uncommitted work\n")
    # A restart: the worktree is kept as it is, its base is where the branch left main.
    assert repo.add_worktree(wt, BRANCH, "main") == main_head
    assert (wt / "wip.txt").exists() and (wt / "src/feature.py").exists()
    assert not (root / "src/feature.py").exists()
    # An agent left it elsewhere (a detached HEAD, with an edit) when Anima was killed: kept
    # as it is, for the loop to put back on the branch (and stash what cannot come along).
    git(wt, "checkout", "-q", "--detach", "HEAD~1")
    write(wt, "wip.txt", "still there\n")
    assert repo.add_worktree(wt, BRANCH, "main") == main_head
    assert GitRepo.open(wt).current_branch() is None
    assert (wt / "wip.txt").read_text() == "still there\n"
    git(wt, "switch", "-q", BRANCH)
    # Its folder gone (deleted by hand): the registration is pruned, the branch checked out
    # again with its commits.
    shutil.rmtree(wt)
    assert repo.add_worktree(wt, BRANCH, "main") == main_head
    assert (wt / "src/feature.py").exists() and GitRepo.open(wt).current_branch() == BRANCH


def test_add_worktree_starts_from_main_whatever_the_human_has_checked_out(
        root: Path, repo: GitRepo, wt: Path) -> None:
    git(root, "checkout", "-q", "-b", "elsewhere")
    write(root, "other.txt", "o\n")
    elsewhere = commit_all(root, "other")
    base = repo.add_worktree(wt, BRANCH, "main")
    assert base == repo.branch_head("main") != elsewhere
    assert not (wt / "other.txt").exists()
    assert repo.current_branch() == "elsewhere" and (root / "other.txt").exists()


def test_bad_branch_names_paths_and_switches(root: Path, repo: GitRepo, wt: Path) -> None:
    with pytest.raises(GitError, match="not a valid git branch name"):
        repo.add_worktree(wt, "milestone/bad..name", "main")
    with pytest.raises(GitError, match="'ghost': it does not exist"):
        repo.switch("ghost")
    write(wt, "stray.txt", "not a worktree\n")  # something else at the path: never overwritten
    with pytest.raises(GitError, match="is not a worktree of"):
        repo.add_worktree(wt, BRANCH, "main")
    assert (wt / "stray.txt").read_text() == "not a worktree\n"


def test_remove_worktree_keeps_the_branch(root: Path, repo: GitRepo, wt: Path,
                                          milestone: dict[str, str]) -> None:
    assert repo.remove_worktree(wt) is True
    assert not wt.exists() and repo.worktrees() == []
    assert repo.branch_head(BRANCH) == milestone["commit"]
    assert repo.current_branch() == "main" and repo.dirty_paths() == []
    write(wt, "half-made.txt", "x\n")  # a folder git does not know: Anima's anyway
    assert repo.remove_worktree(wt) is False and not wt.exists()


# --------------------------------------------------------------- check_developer_commit


def test_a_good_commit_passes(repo: GitRepo, milestone: dict[str, str]) -> None:
    assert check(repo, milestone) == []
    assert check(repo, milestone, commit=milestone["commit"][:7]) == []  # abbreviated


def test_a_missing_or_forged_hash_is_rejected(repo: GitRepo, milestone: dict[str, str]) -> None:
    [problem] = check(repo, milestone, commit="deadbeef")
    assert problem == "Commit deadbeef does not exist in the repository."
    forged = "0123456789abcdef0123456789abcdef01234567"
    assert check(repo, milestone, commit=forged) == [
        f"Commit {forged} does not exist in the repository."
    ]
    assert "does not exist" in check(repo, milestone, commit="")[0]


def test_a_commit_made_on_main_is_rejected(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, "hotfix.py", "y = 2\n")  # on main, in the human's checkout
    on_main = commit_all(root, "oops, on main")
    problems = check(repo, milestone, commit=on_main)
    assert any(f"not on the milestone branch {BRANCH} (it is on main)" in p for p in problems)


def test_main_moved_by_another_milestones_merge_does_not_reject_a_good_commit(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    """With several milestones, main moves whenever one of them merges; who moved it is the
    turn guard's to judge, not the commit check's."""
    write(root, "other.txt", "merged meanwhile\n")
    commit_all(root, "Merge milestone/other")
    assert check(repo, milestone) == []


def test_a_commit_on_another_branch_is_rejected(
    wt: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    git(wt, "checkout", "-q", "-b", "side", milestone["base_commit"])
    write(wt, "side.txt", "s\n")
    side = commit_all(wt, "side work")
    [problem] = check(repo, milestone, commit=side)
    assert problem.startswith(f"Commit {side} is not on the milestone branch {BRANCH}")
    assert "side" in problem


def test_no_new_work_is_rejected(repo: GitRepo, milestone: dict[str, str]) -> None:
    [problem] = check(repo, milestone, commit=milestone["base_commit"])
    assert "is the milestone's base commit: there is no new work" in problem


def test_a_commit_before_the_base_is_rejected(
    root: Path, wt: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    older = git(root, "rev-parse", "main")
    # Re-base the milestone on a later main commit, then report the old main commit.
    write(root, "later.txt", "l\n")
    later = commit_all(root, "later")
    git(wt, "merge", "-q", "--no-edit", "main")
    problems = check(repo, milestone, commit=older, base_commit=later)
    assert any("does not descend from the milestone's base commit" in p for p in problems)


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        (".anima/state.json", '{"status": "sleeping"}\n'),
        (".anima/milestones/m1.json", "{}\n"),
        (".anima/notes.txt", "mine\n"),
    ],
)
def test_committing_anima_runtime_files_is_rejected(
    wt: Path, repo: GitRepo, milestone: dict[str, str], rel: str, text: str
) -> None:
    write(wt, rel, text)
    git(wt, "add", "-f", rel)
    git(wt, "commit", "-q", "-m", "sneaky")
    [problem] = check(repo, milestone, commit=git(wt, "rev-parse", "HEAD"))
    assert f"{rel} (added)" in problem and "Only .anima/memory/ may be committed" in problem


def test_a_developer_edit_to_a_milestone_definition_is_rejected(
    wt: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(wt, ".anima/milestones/m1.md", "# M1\nall done, trust me\n")
    commit = commit_all(wt, "edit milestone")
    write(wt, ".anima/milestones/m1.md", "# M1\n")  # the human's version stays on disk
    [problem] = check(repo, milestone, commit=commit)
    assert ".anima/milestones/m1.md (modified)" in problem
    # Reverting it in a new commit fixes the range.
    fixed = commit_all(wt, "revert milestone edit")
    assert check(repo, milestone, commit=fixed) == []


def test_memory_and_as_is_definitions_may_be_committed(
    root: Path, wt: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    """A definition committed exactly as the human's checkout has it (their copy, never the
    worktree's, which is the Developer's) is no change of theirs."""
    write(wt, ".anima/memory/project.md", "architecture\n")
    for where in (root, wt):
        write(where, ".anima/milestones/m2.md", "# M2, written by the human\n")
        write(where, ".anima/soul.md", "be good, and kind\n")  # the human edited it
    write(wt, "src/more.py", "z = 3\n")
    commit = commit_all(wt, "feat: F2 (git add -A)")
    assert check(repo, milestone, commit=commit) == []


# ------------------------------------------------------------------------- leftovers


def test_commit_leftovers_with_nothing_to_do(root: Path, repo: GitRepo) -> None:
    write(root, ".anima/milestones/m2.md", "# M2\n")  # a human's draft: not a leftover
    assert repo.commit_leftovers("chore: leftovers").commit is None
    assert not git(root, "status", "--porcelain", "--", "src", "README.md")


def test_commit_leftovers_commits_outside_anima_and_memory_never_definitions(
    wt: Path, tree: GitRepo, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(wt, "src/app.py", "print('changed')\n")
    write(wt, "src/new.py", "n = 1\n")
    (wt / "README.md").unlink()
    write(wt, ".anima/memory/project.md", "notes\n")
    write(wt, ".anima/milestones/m2.md", "# M2\n")
    write(wt, ".anima/state.json", "{}\n")
    (wt / ".anima/.gitignore").unlink()  # even then, runtime files stay out
    before = tree.head()
    commit = tree.commit_leftovers("chore(anima): commit the Developer's leftovers").commit
    assert commit == tree.head() == tree.branch_head(BRANCH)
    assert repo.branch_head("main") == milestone["base_commit"]  # on the branch, not main
    assert git(wt, "log", "-1", "--format=%s%n%an") == (
        "chore(anima): commit the Developer's leftovers\nTester"
    )
    assert sorted(c.path for c in tree.raw_changes(before, commit)) == [
        ".anima/memory/project.md",
        "README.md",
        "src/app.py",
        "src/new.py",
    ]
    assert tree.dirty_paths() == []
    assert check(repo, milestone, commit=commit) == []


def test_memory_alone_is_not_a_leftover(root: Path, repo: GitRepo) -> None:
    """An untracked memory/project.md (from `anima init`) is not the Developer's work."""
    write(root, ".anima/memory/project.md", "notes\n")
    assert repo.commit_leftovers("chore: leftovers").commit is None


@pytest.mark.parametrize("committed", [False, True], ids=["empty", "with-a-commit"])
def test_commit_leftovers_leaves_a_nested_repository_out(
        wt: Path, tree: GitRepo, committed: bool) -> None:
    """An agent's `git init scratch`: with no commit there, `git add` stops ("does not have a
    commit checked out") and the round failed; with one, main would get a submodule whose
    commit only this disk holds."""
    git(wt, "init", "-q", "scratch")
    if committed:
        write(wt / "scratch", "f.txt", "f\n")
        git(wt / "scratch", "add", "f.txt")
        git(wt / "scratch", "-c", "user.name=a", "-c", "user.email=a@b.invalid", "commit",
            "-qm", "x")
    assert tree.commit_leftovers("chore: leftovers") == Leftovers(None, ("scratch/",))
    write(wt, "src/new.py", "n = 1\n")
    done = tree.commit_leftovers("chore: leftovers")
    assert done.commit == tree.head() and done.nested == ("scratch/",)
    assert git(wt, "ls-tree", "-r", "--name-only", "HEAD").split().count("scratch") == 0
    assert tree.stash_all("anima-test") is None  # nothing else to stash, and no error


def test_commit_leftovers_without_an_identity_uses_anima(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", identity=False)
    repo = GitRepo.open(root)
    write(root, "left.txt", "l\n")
    commit = repo.commit_leftovers("chore: leftovers").commit
    assert commit is not None
    assert git(root, "log", "-1", "--format=%an <%ae>") == "Anima <anima@localhost>"


# -------------------------------------------------------------------- snapshot/restore


@pytest.fixture
def reviewed(wt: Path, tree: GitRepo) -> TreeSnapshot:
    """A snapshot of the worktree taken just before a review, with a pre-existing untracked
    file."""
    write(wt, "scratch/keep.txt", "the human's\n")
    write(wt, ".anima/transcripts/m1/acceptor.jsonl", "{}\n")
    return tree.snapshot()


def test_snapshot_of_an_unchanged_tree_is_stable(tree: GitRepo, reviewed: TreeSnapshot) -> None:
    assert tree.snapshot() == reviewed
    assert reviewed.branch == BRANCH and reviewed.head == tree.head()
    assert [(path, code) for path, code, _ in reviewed.fingerprint] == [("scratch/keep.txt", "?")]
    assert tree.restore(reviewed) == []


def test_restore_reverts_a_modification(wt: Path, tree: GitRepo, reviewed: TreeSnapshot) -> None:
    write(wt, "src/app.py", "print('reviewer was here')\n")
    (wt / "README.md").unlink()
    assert sorted(tree.restore(reviewed)) == [
        "deleted README.md restored",
        "modified src/app.py reverted",
    ]
    assert (wt / "src/app.py").read_text() == "print('hi')\n"
    assert tree.snapshot() == reviewed


def test_restore_removes_new_files_but_keeps_old_untracked_and_anima(
    wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(wt, "tmp/probe/test_x.py", "assert True\n")
    write(wt, "staged.txt", "s\n")
    git(wt, "add", "staged.txt")
    write(wt, ".anima/logs/m1.log", "[00:00:01] more\n")
    write(wt, ".anima/milestones/m3.md", "# M3 dropped in during the review\n")
    undone = tree.restore(reviewed)
    assert sorted(undone) == [
        "new file staged.txt removed",
        "untracked tmp/probe/test_x.py removed",
    ]
    assert not (wt / "tmp").exists() and not (wt / "staged.txt").exists()
    assert (wt / "scratch/keep.txt").read_text() == "the human's\n"
    assert (wt / ".anima/milestones/m3.md").exists()
    assert (wt / ".anima/transcripts/m1/acceptor.jsonl").exists()
    assert tree.snapshot() == reviewed


def test_restore_undoes_a_reviewer_commit(
    wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(wt, "src/app.py", "print('fixed by reviewer')\n")
    write(wt, "src/extra.py", "e = 1\n")
    git(wt, "add", "src")
    git(wt, "commit", "-q", "-m", "reviewer commit")
    moved = git(wt, "rev-parse", "HEAD")
    undone = tree.restore(reviewed)
    assert undone[0] == f"HEAD moved to {moved[:7]}; reset to {reviewed.head[:7]}"
    assert "modified src/app.py reverted" in undone
    assert "untracked src/extra.py removed" in undone
    assert tree.branch_head(BRANCH) == reviewed.head
    assert (wt / "scratch/keep.txt").exists()
    assert tree.snapshot() == reviewed


def test_restore_undoes_a_branch_switch(
    root: Path, wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    away_to_main(wt)
    assert not (wt / "src/feature.py").exists()
    undone = tree.restore(reviewed)
    assert (
        undone[0] == f"switched to branch main at {tree.branch_head('main')[:7]}; "
        f"switched back to {BRANCH}"
    )
    assert "deleted src/feature.py restored" in undone
    assert tree.current_branch() == BRANCH
    assert tree.snapshot() == reviewed
    assert git(root, "branch", "--show-current") == "main"  # the human's checkout: untouched
    assert git(root, "status", "--porcelain", "--", "src", "README.md") == ""


def test_restore_undoes_a_detached_checkout_and_an_unfinished_merge(
    root: Path, wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(root, "src/feature.py", "x = 'conflict'\n")
    commit_all(root, "conflicting")  # on main, in the human's checkout
    git(wt, "checkout", "-q", "--detach", reviewed.head)
    subprocess.run(["git", "merge", "main"], cwd=wt, capture_output=True, check=False)
    assert (tree.git_dir / "MERGE_HEAD").exists()
    undone = tree.restore(reviewed)
    assert "an unfinished merge was abandoned" in undone
    assert tree.current_branch() == BRANCH
    assert not (tree.git_dir / "MERGE_HEAD").exists()
    assert (wt / "src/feature.py").read_text() == "x = 1\n"
    assert tree.snapshot() == reviewed


def test_restore_recreates_a_deleted_branch(
    wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    away_to_main(wt)
    git(wt, "branch", "-q", "-D", BRANCH)
    undone = tree.restore(reviewed)
    assert f"branch {BRANCH} was deleted; recreated at {reviewed.head[:7]}" in undone
    assert tree.current_branch() == BRANCH and tree.head() == reviewed.head
    assert tree.snapshot() == reviewed


def test_option_like_revisions_are_refused(repo: GitRepo) -> None:
    with pytest.raises(GitError, match="not a valid revision"):
        repo.is_ancestor("--help", "main")
    with pytest.raises(GitError, match="not a valid revision"):
        repo.oneline_log("--output=/tmp/x", "main")
    with pytest.raises(GitError, match="not a valid branch name"):
        repo.switch("-f")


def test_restore_keeps_an_old_untracked_file_the_reviewer_staged(
    wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    git(wt, "add", "scratch/keep.txt")
    assert tree.restore(reviewed) == ["scratch/keep.txt unstaged"]
    assert (wt / "scratch/keep.txt").exists()
    assert tree.snapshot() == reviewed


def test_restore_reports_but_keeps_a_changed_preexisting_file(
    wt: Path, tree: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(wt, "scratch/keep.txt", "the reviewer's\n")
    [note] = tree.restore(reviewed)
    assert "scratch/keep.txt" in note and "left as is" in note
    assert (wt / "scratch/keep.txt").read_text() == "the reviewer's\n"


def test_restore_is_cheap_when_nothing_changed(tree: GitRepo, reviewed: TreeSnapshot) -> None:
    timings = []
    for _ in range(15):
        start = time.perf_counter()
        tree.restore(reviewed)
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 0.1  # one git call; typically a few ms


# ----------------------------------------------------------------------------- history


def test_logs_changed_files_and_diff(wt: Path, repo: GitRepo, milestone: dict[str, str]) -> None:
    write(wt, "src/second.py", "s = 2\n")
    second = commit_all(wt, "feat: F2")
    log = list(repo.ancestry(milestone["base_commit"], repo.branch_head(BRANCH)).commits)
    assert log == [(milestone["commit"], "feat: F1"), (second, "feat: F2")]
    oneline = repo.oneline_log(milestone["base_commit"], BRANCH).splitlines()
    assert oneline[0].endswith("feat: F2") and oneline[1].startswith(milestone["commit"][:7])
    assert [c.path for c in repo.raw_changes(milestone["commit"], second)] == ["src/second.py"]
    assert [c.path for c in repo.raw_changes(milestone["base_commit"], second[:9])] == [
        "src/feature.py",
        "src/second.py",
    ]
    text = repo.diff_bytes(milestone["commit"], second, "-p").decode()
    assert "b/src/second.py" in text and "+s = 2" in text
    with pytest.raises(GitError, match="Cannot diff nope"):
        repo.diff_bytes("nope", second)
    assert repo.is_ancestor(milestone["base_commit"], second)
    assert not repo.is_ancestor(second, milestone["base_commit"])


# ----------------------------------------------------------------------------- merging
#
# merge_branch runs on the human's checkout and never checks anything out: main gets the
# merge whatever branch that checkout is on; when it is on main its files follow, unless a
# file of the human's is in the way (then the merge waits, naming it).


def merge(repo: GitRepo) -> MergeOutcome:
    return repo.merge_branch(BRANCH, "main", "Merge milestone m1")


def status(root: Path) -> str:
    """Everything git sees in a checkout: staged, modified, untracked (ignored files aside)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root,
                          capture_output=True, text=True, check=True).stdout.rstrip("\n")


def parents(root: Path, rev: str = "main") -> list[str]:
    return git(root, "log", "-1", "--format=%P", rev).split()


class Killed(BaseException):
    """Anima dying at an exact instant (nothing after it runs, no handler cleans up)."""


def intercept(monkeypatch: pytest.MonkeyPatch, repo: GitRepo, command: str,
              action: object, after: bool = False) -> None:
    """Run `action()` once, just before (or after) the first `git <command> …` of `repo`."""
    real = repo._run
    fired: list[bool] = []

    def run(args, **kwargs):  # type: ignore[no-untyped-def]
        hit = not fired and list(args)[:1] == [command]
        if hit and not after:
            fired.append(True)
            action()  # type: ignore[operator]
        result = real(args, **kwargs)
        if hit and after:
            fired.append(True)
            action()  # type: ignore[operator]
        return result

    monkeypatch.setattr(repo, "_run", run)


def test_merge_clean(root: Path, repo: GitRepo, milestone: dict[str, str]) -> None:
    outcome = merge(repo)
    assert outcome.merged and outcome.detail.startswith(f"merged {BRANCH} into main as ")
    assert outcome.waiting == [] and not outcome.retry
    assert repo.current_branch() == "main"
    assert git(root, "log", "-1", "--format=%s%n%an") == "Merge milestone m1\nTester"
    # A merge commit (never a fast-forward): old main first, the milestone's tip second.
    assert parents(root) == [milestone["base_commit"], milestone["commit"]]
    assert repo.head() == repo.branch_head("main")
    # The human's checkout, on main, followed: the merged file is there, nothing is dirty.
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert status(root) == "" and repo.dirty_paths() == []
    again = merge(repo)
    assert again == MergeOutcome(True, f"main already contains {BRANCH}; nothing to merge")
    with pytest.raises(GitError, match="no branch 'ghost'"):
        repo.merge_branch("ghost", "main", "Merge")


@pytest.mark.parametrize("where", ["untracked", "their branch"])
def test_the_attributes_in_your_checkout_do_not_decide_a_merge(
        root: Path, repo: GitRepo, wt: Path, milestone: dict[str, str], where: str) -> None:
    """Your checkout's `.gitattributes` (a file you have not committed, or a branch of yours
    nobody reviewed) saying `merge=union` would have main take both sides of a conflict,
    silently: the conflict goes to a merge round instead, as it would without that file."""
    write(root, "src/app.py", "print('main')\n")
    commit_all(root, "fix: main's greeting")
    write(wt, "src/app.py", "print('milestone')\n")
    tip = commit_all(wt, "feat: the milestone's greeting")
    if where == "their branch":
        git(root, "switch", "-q", "-c", "wip")
        write(root, ".gitattributes", "*.py merge=union\n")
        commit_all(root, "chore: union everything")
    else:
        write(root, ".gitattributes", "*.py merge=union\n")
    assert repo.merge_conflicts(tip, "main") == ["src/app.py"]
    outcome = merge(repo)
    assert not outcome.merged and "src/app.py" in outcome.detail
    assert git(root, "show", "main:src/app.py") == "print('main')"


def test_merge_while_the_human_is_on_another_branch_moves_only_main(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    git(root, "switch", "-q", "-c", "mine")
    write(root, "mine.txt", "staged\n")
    git(root, "add", "mine.txt")
    write(root, "src/app.py", "print('editing')\n")
    write(root, "src/feature.py", "the human's own draft\n")  # untracked, where main gets one
    mine, before = repo.head(), status(root)
    outcome = merge(repo)
    assert outcome.merged, outcome.detail
    assert parents(root) == [milestone["base_commit"], milestone["commit"]]
    # Their checkout is untouched: its branch, HEAD, index and every file.
    assert repo.current_branch() == "mine" and repo.head() == mine
    assert repo.branch_head("mine") == mine
    assert status(root) == before
    assert (root / "src/feature.py").read_text() == "the human's own draft\n"
    assert (root / "src/app.py").read_text() == "print('editing')\n"


def test_merge_on_main_keeps_the_humans_unrelated_edits(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, "src/app.py", "print('editing')\n")
    write(root, "staged.txt", "staged\n")
    git(root, "add", "staged.txt")
    write(root, "notes.txt", "untracked\n")
    before = status(root)
    outcome = merge(repo)
    assert outcome.merged, outcome.detail
    assert repo.current_branch() == "main" and repo.head() == repo.branch_head("main")
    assert parents(root) == [milestone["base_commit"], milestone["commit"]]
    assert (root / "src/feature.py").read_text() == "x = 1\n"  # merged in, clean
    assert git(root, "status", "--porcelain", "--", "src/feature.py") == ""
    # The human's work is as it was: same edits, same index, same untracked file.
    assert status(root) == before
    assert (root / "src/app.py").read_text() == "print('editing')\n"
    assert (root / "staged.txt").read_text() == "staged\n"
    assert (root / "notes.txt").read_text() == "untracked\n"


def test_merge_into_main_checked_out_in_a_worktree_of_the_humans_elsewhere(
    root: Path, repo: GitRepo, milestone: dict[str, str], tmp_path: Path
) -> None:
    """The human works on a branch here and keeps main in a worktree of their own: that
    tree shows the merge, with their edits kept; left on the old main, its index would read
    as undoing the milestone, and their next commit would."""
    git(root, "switch", "-q", "-c", "mine")
    theirs = tmp_path / "main-tree"
    git(root, "worktree", "add", "-q", str(theirs), "main")
    write(theirs, "README.md", "# edited in their main tree\n")
    write(theirs, "notes.txt", "untracked\n")
    before = status(theirs)
    outcome = merge(repo)
    assert outcome.merged, outcome.detail
    assert parents(root) == [milestone["base_commit"], milestone["commit"]]
    assert (theirs / "src/feature.py").read_text() == "x = 1\n"
    assert status(theirs) == before  # nothing staged that undoes the merge
    assert (theirs / "README.md").read_text() == "# edited in their main tree\n"
    assert repo.current_branch() == "mine" and status(root) == ""


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_merge_waits_while_the_human_rebases_main(
    root: Path, repo: GitRepo, milestone: dict[str, str], tmp_path: Path, where: str
) -> None:
    """Their rebase of main, stopped at a commit to edit (HEAD detached meanwhile): main
    moved under it, `git rebase --continue` failed at the end ("cannot lock ref")."""
    checkout = root
    if where == "elsewhere":
        git(root, "switch", "-q", "-c", "mine")
        checkout = tmp_path / "main-tree"
        git(root, "worktree", "add", "-q", str(checkout), "main")
    write(checkout, "a.txt", "one\n")
    commit_all(checkout, "one")
    write(checkout, "b.txt", "two\n")
    main = commit_all(checkout, "two")
    subprocess.run(["git", "rebase", "-q", "-i", "HEAD~2"], cwd=checkout, check=True,
                   env={**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i 1s/pick/edit/"})
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry
    assert f"{checkout} is in the middle of a rebase of main" in outcome.detail
    assert repo.branch_head("main") == main
    subprocess.run(["git", "rebase", "--continue"], cwd=checkout, check=True,
                   capture_output=True, env={**os.environ, "GIT_EDITOR": "true"})
    assert merge(repo).merged
    assert parents(root) == [main, milestone["commit"]]


def test_merge_waits_for_a_file_changed_in_a_worktree_of_the_humans_on_main(
    root: Path, repo: GitRepo, milestone: dict[str, str], tmp_path: Path
) -> None:
    git(root, "switch", "-q", "-c", "mine")
    theirs = tmp_path / "main-tree"
    git(root, "worktree", "add", "-q", str(theirs), "main")
    write(theirs, "src/feature.py", "the human's own draft\n")
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry
    assert outcome.waiting == ["src/feature.py"]
    assert str(theirs) in outcome.detail and "src/feature.py" in outcome.detail
    assert repo.branch_head("main") == milestone["base_commit"]
    assert (theirs / "src/feature.py").read_text() == "the human's own draft\n"
    (theirs / "src/feature.py").unlink()
    assert merge(repo).merged
    assert (theirs / "src/feature.py").read_text() == "x = 1\n" and status(theirs) == ""


LINES = "".join(f"line {i}\n" for i in range(1, 11))


def test_merge_waits_for_a_file_the_human_changed_then_goes_on_once_committed(
    root: Path, repo: GitRepo, wt: Path
) -> None:
    write(root, "src/lines.txt", LINES)
    base = commit_all(root, "ten lines")
    repo.add_worktree(wt, BRANCH, "main")
    write(wt, "src/lines.txt", LINES.replace("line 1\n", "line 1, the Developer's\n"))
    write(wt, "src/feature.py", "x = 1\n")
    tip = commit_all(wt, "feat")
    mine = LINES.replace("line 10\n", "line 10, the human's\n")
    write(root, "src/lines.txt", mine)  # uncommitted, in their checkout on main
    before = status(root)

    outcome = merge(repo)
    assert not outcome.merged and outcome.retry
    assert outcome.waiting == ["src/lines.txt"]
    assert "waits" in outcome.detail and "src/lines.txt" in outcome.detail
    # Nothing changed: main, the checkout, the human's edit.
    assert repo.branch_head("main") == base and repo.head() == base
    assert (root / "src/lines.txt").read_text() == mine
    assert not (root / "src/feature.py").exists()
    assert status(root) == before
    assert repo.branch_head(BRANCH) == tip

    mine_committed = commit_all(root, "the human's line 10")
    outcome = merge(repo)
    assert outcome.merged, outcome.detail
    assert parents(root) == [mine_committed, tip]
    assert (root / "src/lines.txt").read_text() == LINES.replace(
        "line 1\n", "line 1, the Developer's\n").replace("line 10\n", "line 10, the human's\n")
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert status(root) == ""


def test_merge_waits_for_an_untracked_file_in_the_way(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, "src/feature.py", "the human's own draft\n")
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry
    assert outcome.waiting == ["src/feature.py"] and "src/feature.py" in outcome.detail
    assert repo.branch_head("main") == milestone["base_commit"] == repo.head()
    assert (root / "src/feature.py").read_text() == "the human's own draft\n"
    assert status(root) == "?? src/feature.py"
    (root / "src/feature.py").rename(root / "draft.py")  # the human moves it away
    assert merge(repo).merged
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert status(root) == "?? draft.py"


def test_merge_waits_for_an_ignored_file_of_the_humans_that_the_branch_adds(
    root: Path, repo: GitRepo, wt: Path
) -> None:
    """The human's local config, which git ignores, and a branch that un-ignores and commits
    one of its own: git's checkout would overwrite the human's silently (ignored files are
    expendable to git), and `git status` does not list it."""
    write(root, ".gitignore", "local.cfg\n")
    commit_all(root, "chore: ignore local.cfg")
    write(root, "local.cfg", "the human's settings\n")
    repo.add_worktree(wt, BRANCH, "main")
    write(wt, ".gitignore", "")
    write(wt, "local.cfg", "the Developer's settings\n")
    commit_all(wt, "feat: a config of its own")
    base = repo.branch_head("main")
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry, outcome.detail
    assert outcome.waiting == ["local.cfg"] and "local.cfg" in outcome.detail
    assert (root / "local.cfg").read_text() == "the human's settings\n"
    assert repo.branch_head("main") == base
    (root / "local.cfg").rename(root / "local.cfg.mine")  # the human moves it away
    assert merge(repo).merged
    assert (root / "local.cfg").read_text() == "the Developer's settings\n"


@pytest.mark.parametrize("mine", ["file-where-a-folder-comes", "folder-where-a-file-comes"])
def test_merge_waits_for_an_untracked_file_or_folder_on_the_path_of_a_new_one(
    root: Path, repo: GitRepo, wt: Path, mine: str
) -> None:
    """git names the path the merge adds (`d`, or `d/f.py`), status the human's (`d/notes.txt`,
    or `d`): the human's file is still in the way, never removed."""
    repo.add_worktree(wt, BRANCH, "main")
    if mine == "file-where-a-folder-comes":
        write(wt, "d/f.py", "the Developer's\n")
        write(root, "d", "the human's file\n")
    else:
        write(wt, "d", "the Developer's\n")
        write(root, "d/notes.txt", "the human's notes\n")
    commit_all(wt, "feat: d")
    base, before = repo.branch_head("main"), status(root)
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry and "waits" in outcome.detail
    assert repo.branch_head("main") == base == repo.head()
    assert status(root) == before
    if mine == "file-where-a-folder-comes":
        assert (root / "d").read_text() == "the human's file\n"
    else:
        assert (root / "d/notes.txt").read_text() == "the human's notes\n"


def test_merge_waits_while_the_human_finishes_a_merge_of_their_own_on_main(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    """The human's own `git merge`, conflicted and half resolved in their checkout on main:
    the milestone's merge touches none of it (their index, their resolution, MERGE_HEAD)."""
    git(root, "switch", "-q", "-c", "theirs")
    write(root, "src/app.py", "print('theirs')\n")
    commit_all(root, "theirs")
    git(root, "switch", "-q", "main")
    write(root, "src/app.py", "print('main')\n")
    main = commit_all(root, "main")
    subprocess.run(["git", "merge", "theirs"], cwd=root, capture_output=True, check=False)
    write(root, "src/app.py", "print('my resolution, half done')\n")
    before = status(root)
    assert before == "UU src/app.py"
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry and "waits" in outcome.detail
    assert repo.branch_head("main") == main
    assert status(root) == before and (root / ".git/MERGE_HEAD").exists()
    assert (root / "src/app.py").read_text() == "print('my resolution, half done')\n"
    assert not (root / "src/feature.py").exists()


@pytest.mark.parametrize("yours", ["cherry-pick", "revert", "stash pop", "merge"])
def test_a_merge_waiting_for_your_unresolved_conflicts_names_them_and_what_left_them(
    root: Path, repo: GitRepo, milestone: dict[str, str], yours: str
) -> None:
    """Your checkout on main, its index holding a conflict in a file the milestone does not
    touch: git takes no tree into it, and the merge waited saying only "You need to resolve
    your current index first", which named no file (the record, the window and `anima
    status` show that sentence)."""
    git(root, "switch", "-q", "-c", "theirs")
    write(root, "src/app.py", "print('theirs')\n")
    theirs = commit_all(root, "theirs")
    git(root, "switch", "-q", "main")
    if yours == "revert":
        git(root, "merge", "-q", "theirs")
        write(root, "src/app.py", "print('main, after theirs')\n")
    else:
        write(root, "src/app.py", "print('main')\n")
    main = commit_all(root, "main")
    if yours == "stash pop":
        write(root, "src/app.py", "print('stashed')\n")
        git(root, "stash", "-q")
        write(root, "src/app.py", "print('main, then')\n")
        main = commit_all(root, "main, then")
    command = {"cherry-pick": ["cherry-pick", "theirs"], "revert": ["revert", theirs],
               "stash pop": ["stash", "pop"], "merge": ["merge", "theirs"]}[yours]
    subprocess.run(["git", *command], cwd=root, capture_output=True, check=False)
    before = status(root)
    assert before.startswith("UU src/app.py"), before
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry and outcome.waiting == ["src/app.py"]
    label = {"cherry-pick": " (an unfinished cherry-pick of yours)",
             "revert": " (an unfinished revert of yours)", "stash pop": "",
             "merge": " (an unfinished merge of yours)"}[yours]
    assert outcome.detail == ("the merge of milestone/m1 into main waits: your checkout has "
                              f"unresolved conflicts in src/app.py{label}; resolve them"
                              + (" and finish or abort it" if label else "")
                              + ", and it goes on")
    assert repo.branch_head("main") == main and status(root) == before
    write(root, "src/app.py", "print('resolved')\n")
    git(root, "add", "src/app.py")
    if yours != "stash pop":
        subprocess.run(["git", "-c", "core.editor=true", yours, "--continue"], cwd=root,
                       capture_output=True, check=True)
    assert merge(repo).merged
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert (root / "src/app.py").read_text() == "print('resolved')\n"


def test_merge_conflict_leaves_main_the_branch_and_the_checkout_as_they_were(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, "src/feature.py", "x = 'main'\n")
    main_head = commit_all(root, "conflicting work on main")
    outcome = merge(repo)
    assert not outcome.merged and not outcome.retry and outcome.waiting == []
    assert "conflicts in src/feature.py" in outcome.detail and "is kept" in outcome.detail
    assert "main is unchanged" in outcome.detail
    assert repo.current_branch() == "main"
    assert repo.head() == repo.branch_head("main") == main_head
    assert repo.branch_head(BRANCH) == milestone["commit"]
    # No half merge anywhere: no conflict markers, no merge state, nothing staged.
    assert (root / "src/feature.py").read_text() == "x = 'main'\n"
    assert status(root) == "" and repo.dirty_paths() == []
    assert not (root / ".git/MERGE_HEAD").exists()
    assert not (root / ".git/AUTO_MERGE").exists()


@pytest.mark.parametrize("on_main", [True, False], ids=["on-main", "on-another-branch"])
def test_merge_refuses_when_main_moved_meanwhile(
    root: Path, repo: GitRepo, milestone: dict[str, str], monkeypatch: pytest.MonkeyPatch,
    on_main: bool,
) -> None:
    """main is moved last, compare-and-swap from where it was read: a commit that reached
    main meanwhile (another process, the human's push) is never overwritten."""
    if not on_main:
        git(root, "switch", "-q", "-c", "mine")
    # Same files as main: the human's checkout on main stays clean when main moves under it.
    concurrent = git(root, "commit-tree", "main^{tree}", "-p", "main", "-m", "concurrent")
    intercept(monkeypatch, repo, "update-ref",
              lambda: git(root, "update-ref", "refs/heads/main", concurrent))
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry
    assert "main moved while" in outcome.detail
    assert repo.branch_head("main") == concurrent  # not overwritten
    assert repo.branch_head(BRANCH) == milestone["commit"]
    # On main, the checkout's files followed the merge, then were put back.
    assert not (root / "src/feature.py").exists()
    assert status(root) == ""
    monkeypatch.undo()
    assert merge(repo).merged  # tried again: on top of the commit that came meanwhile
    assert parents(root) == [concurrent, milestone["commit"]]
    assert (root / "src/feature.py").exists() is on_main
    assert status(root) == ""


@pytest.mark.parametrize(("command", "after", "merged"), [
    ("read-tree", False, False),   # before the checkout follows
    ("update-ref", False, False),  # the checkout followed, main not moved yet
    ("update-ref", True, True),    # main moved: the merge is done
], ids=["before-the-checkout", "before-main-moves", "after-main-moved"])
def test_a_kill_mid_merge_leaves_old_main_or_the_merge_and_the_next_run_finishes(
    root: Path, repo: GitRepo, milestone: dict[str, str], monkeypatch: pytest.MonkeyPatch,
    command: str, after: bool, merged: bool,
) -> None:
    write(root, "src/app.py", "print('editing')\n")  # the human's, never touched

    def kill() -> None:
        raise Killed

    intercept(monkeypatch, repo, command, kill, after=after)
    with pytest.raises(Killed):
        merge(repo)
    main = repo.branch_head("main")
    assert main in (milestone["base_commit"], repo.merge_of(milestone["commit"], "main"))
    assert (main != milestone["base_commit"]) is merged
    assert not (root / ".git/MERGE_HEAD").exists()
    assert (root / "src/app.py").read_text() == "print('editing')\n"

    again = GitRepo.open(root).merge_branch(BRANCH, "main", "Merge milestone m1")
    assert again.merged, again.detail
    assert ("already contains" in again.detail) is merged
    assert parents(root) == [milestone["base_commit"], milestone["commit"]]
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert status(root) == " M src/app.py"
    assert (root / "src/app.py").read_text() == "print('editing')\n"


@pytest.mark.parametrize("human_commits", [False, True],
                         ids=["retried-as-left", "after-the-humans-commit-a"])
@pytest.mark.parametrize("developers", ["notes\n", "notes\nmore notes\n"],
                         ids=["notes-as-they-were", "notes-the-developer-added-to"])
def test_a_kill_before_main_moves_keeps_the_humans_memory_notes_on_the_retry(
    root: Path, repo: GitRepo, milestone: dict[str, str], wt: Path,
    monkeypatch: pytest.MonkeyPatch, human_commits: bool, developers: str,
) -> None:
    """The human's untracked memory notes (as `anima init` writes them) are set aside for
    the merge, which brings the Developer's; a kill after their checkout followed, before
    main moved. The retry (after the human's `git commit -a`, perhaps) must leave the notes
    as merged, nothing deleted, and no set-aside copy in their checkout for ever."""
    notes = write(root, ".anima/memory/project.md", "notes\n")
    write(wt, ".anima/memory/project.md", developers)
    commit_all(wt, "docs: memory")
    write(root, "src/app.py", "print('editing')\n")  # the human's, never touched
    replaceable = {".anima/memory/project.md": b"notes\n"}

    def kill() -> None:
        raise Killed

    intercept(monkeypatch, repo, "update-ref", kill)
    with pytest.raises(Killed):
        repo.merge_branch(BRANCH, "main", "Merge milestone m1", replaceable=replaceable)
    monkeypatch.undo()
    if human_commits:
        git(root, "commit", "-q", "-am", "the human's edit")
    again = GitRepo.open(root).merge_branch(BRANCH, "main", "Merge milestone m1",
                                            replaceable=replaceable)
    assert again.merged, again.detail
    assert notes.read_text() == developers
    assert sorted(p.name for p in notes.parent.iterdir()) == ["project.md"]
    assert status(root) == ("" if human_commits else " M src/app.py")


def test_a_human_commit_racing_the_merge_leaves_nothing_staged_in_their_checkout(
    root: Path, repo: GitRepo, milestone: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The human commits (`git commit -am`) in the instant between the merge's checkout of
    their files and main's move, so main moves under the merge. Putting their checkout back
    to where main was would stage the reversal of the milestone's files: their next commit
    would delete reviewed work from main."""
    write(root, "src/app.py", "print('editing')\n")
    intercept(monkeypatch, repo, "update-ref",
              lambda: git(root, "commit", "-q", "-am", "the human's edit"))
    outcome = merge(repo)
    assert not outcome.merged and outcome.retry, outcome.detail
    assert status(root) == ""  # nothing staged, nothing deleted
    monkeypatch.undo()
    assert merge(repo).merged
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert status(root) == ""


# ------------------------------------------------------------------------------ stash


def test_stash_all_names_the_stash_and_leaves_anima_alone(root: Path, repo: GitRepo) -> None:
    assert repo.stash_all("anima: before m1") is None
    write(root, "src/app.py", "wip\n")
    write(root, "untracked.txt", "u\n")
    write(root, ".anima/milestones/m2.md", "# M2\n")
    write(root, ".anima/soul.md", "edited by the human\n")
    stash = repo.stash_all("anima: before m1")
    assert stash is not None and stash == git(root, "rev-parse", "refs/stash")
    assert "anima: before m1" in git(root, "stash", "list")
    assert repo.dirty_paths() == []
    assert not (root / "untracked.txt").exists()
    assert (root / ".anima/milestones/m2.md").exists()
    assert (root / ".anima/soul.md").read_text() == "edited by the human\n"
    assert (root / ".anima/state.json").exists()
    git(root, "stash", "apply", "-q", stash)
    assert (root / "src/app.py").read_text() == "wip\n" and (root / "untracked.txt").exists()


def test_stash_all_keeps_a_deletion_the_developer_staged(root: Path, repo: GitRepo) -> None:
    """`git rm` left uncommitted: `git stash push <path>` alone refuses such a path, and a
    cancel, a pause or a restart that has to put the work aside would fail on it."""
    write(root, "src/app.py", "wip\n")
    git(root, "add", "src/app.py")
    git(root, "commit", "-q", "-m", "feat: app")
    git(root, "rm", "-q", "src/app.py")
    write(root, "notes.txt", "untracked\n")
    stash = repo.stash_all("anima: cancelled")
    assert stash is not None and repo.dirty_paths() == []
    assert (root / "src/app.py").exists()  # the tree is back as committed
    git(root, "stash", "apply", "-q", stash)
    assert not (root / "src/app.py").exists() and (root / "notes.txt").exists()


def test_a_merge_never_overwrites_the_humans_untracked_anima_files(
    root: Path, repo: GitRepo, wt: Path
) -> None:
    """main does not track .anima/, the branch does (a Developer's `git add -A`): the human's
    untracked definitions and memory in their checkout on main are never overwritten. Memory
    notes still as the worktree started from them are replaceable: the merge brings the
    Developer's; a definition in the way keeps the merge waiting, naming it."""
    git(root, "rm", "-r", "-q", "--cached", ".anima")
    git(root, "commit", "-q", "-m", "chore: .anima/ untracked on main")
    definition = write(root, ".anima/milestones/m1.md", "# M1\n")
    memory = write(root, ".anima/memory/project.md", "notes\n")
    runtime = write(root, ".anima/state.json", "{}")
    base = repo.add_worktree(wt, BRANCH, "main")
    assert not (wt / ".anima").exists()  # main tracks none of it
    write(wt, ".anima/memory/project.md", "notes\nmore notes\n")
    commit_all(wt, "docs: memory")
    replaceable = {".anima/memory/project.md": b"notes\n"}
    outcome = repo.merge_branch(BRANCH, "main", "Merge", replaceable=replaceable)
    assert outcome.merged, outcome.detail
    assert memory.read_text() == "notes\nmore notes\n"  # as merged, and tracked now
    assert git(root, "status", "--porcelain", "--", ".anima/memory") == ""

    merged = repo.branch_head("main")
    write(wt, ".anima/.gitignore", GITIGNORE)
    write(wt, ".anima/milestones/m1.md", "# M1\n")  # the human's, as is
    write(wt, "src/feature.py", "x = 1\n")
    commit_all(wt, "feat: with the definitions")
    definition.write_text("# M1, edited by the human after the commit\n")
    before = status(root)
    outcome = repo.merge_branch(BRANCH, "main", "Merge", replaceable=replaceable)
    assert not outcome.merged and outcome.retry and "waits" in outcome.detail
    # (.anima/.gitignore reads as the merge has it: not in the way.)
    assert outcome.waiting == [".anima/milestones/m1.md"]
    assert repo.branch_head("main") == merged != base
    assert definition.read_text() == "# M1, edited by the human after the commit\n"
    assert (root / ".anima" / ".gitignore").read_text() == GITIGNORE and runtime.exists()
    assert not (root / "src/feature.py").exists() and status(root) == before


def test_a_leak_is_looked_for_in_the_branchs_own_commits_not_in_mains(
    root: Path, repo: GitRepo, wt: Path
) -> None:
    """A merge round brings main's commits into the range: a value the human committed to
    main is not the Developer's leak; the same value in the Developer's commit is."""
    value = "zq81-looks-like-nothing-5521"
    base = repo.add_worktree(wt, BRANCH, "main")
    write(root, "settings.py", f"KEY = '{value}'\n")
    main = commit_all(root, "chore: the human's own settings")
    git(wt, "merge", "-q", "--no-edit", "main")
    write(wt, "a.py", "x = 1\n")
    tip = commit_all(wt, "feat: a")
    assert repo.first_leak(base, tip, {".env"}, [value], main) is None
    assert repo.first_leak(base, tip, {".env"}, [value]) == (main, "settings.py", True)
    write(wt, "b.py", f"K = '{value}'\n")
    leaked = commit_all(wt, "feat: b")
    assert repo.first_leak(base, leaked, {".env"}, [value], main) == (leaked, "b.py", True)
    write(wt, ".env", "X=1\n")
    env = commit_all(wt, "feat: env")
    assert repo.first_leak(leaked, env, {".env"}, [], main) == (env, ".env", False)


@pytest.mark.parametrize("resolution", ["main's", "added"])
def test_a_merge_is_looked_at_for_what_it_adds_not_for_what_it_brings_from_main(
    root: Path, repo: GitRepo, wt: Path, resolution: str
) -> None:
    """A merge round's conflict resolution: a line only main had (the human's value) is
    not the Developer's leak; a line that none of the merge's parents had is."""
    value = "zq81-looks-like-nothing-5521"
    write(root, "settings.py", "KEY = None\n")
    commit_all(root, "chore: settings")
    base = repo.add_worktree(wt, BRANCH, "main")
    write(root, "settings.py", f"KEY = '{value}'\n")
    main = commit_all(root, "chore: the human's own settings")
    write(wt, "settings.py", "KEY = 'dev'\n")
    commit_all(wt, "feat: dev settings")
    subprocess.run(["git", "merge", "-q", "main"], cwd=wt, capture_output=True, check=False)
    kept = f"KEY = '{value}'\n" + ("" if resolution == "main's" else f"OLD = '{value}-2'\n")
    write(wt, "settings.py", f"{kept}DEV = 'dev'\n")
    merge = commit_all(wt, "merge main")
    assert len(git(wt, "rev-parse", "HEAD^2")) == 40
    found = repo.first_leak(base, merge, {".env"}, [value], main)
    assert found == (None if resolution == "main's" else (merge, "settings.py", True))


@pytest.mark.parametrize("where", ["message", "binary", "name"])
def test_a_copied_in_value_is_found_beyond_the_lines_a_commit_adds(
    root: Path, repo: GitRepo, wt: Path, where: str
) -> None:
    """Its message, a binary file (git prints no lines of it) and a file's name reach main
    as much as a line does."""
    value = "zq81-looks-like-nothing-5521"
    base = repo.add_worktree(wt, BRANCH, "main")
    if where == "message":
        write(wt, "a.py", "x = 1\n")
        tip = commit_all(wt, f"feat: tested with {value}")
        found = "its commit message"
    elif where == "binary":
        (wt / "blob.bin").write_bytes(b"\0\1" + value.encode() + b"\0")
        tip = commit_all(wt, "feat: a blob")
        found = "blob.bin"
    else:
        write(wt, f"cfg-{value}.txt", "x\n")
        tip = commit_all(wt, "feat: a config")
        found = "a file's name"
    assert repo.first_leak(base, tip, {".env"}, [value]) == (tip, found, True)
    assert repo.first_leak(base, tip, {".env"}, ["something-else-entirely"]) is None


def test_a_path_longer_than_path_max_from_your_checkout_merges(tmp_path: Path) -> None:
    """git names files relative to the tree's top, so a Developer can commit a path of ~4080
    bytes: from your checkout's absolute path it is longer than PATH_MAX, and asking
    `Path.is_dir()` of it raises ENAMETOOLONG. The merge must still reach main, whole."""
    repo = init_repo(tmp_path / "r", {"README.md": "# x\n"})
    run_git(repo, "switch", "-q", "-c", "milestone/m1")
    room = 4090 - len("/f.txt")
    comps, used = [], 0
    while used < room:
        size = min(200, room - used - 1)
        comps.append(f"d{len(comps):02d}".ljust(size, "x"))
        used += size + 1
    assert len(str(repo)) + 1 + used > 4096
    fd = os.open(repo, os.O_RDONLY)
    for comp in comps:
        os.mkdir(comp, dir_fd=fd)
        fd, parent = os.open(comp, os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    file = os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(file, b"hi\n")
    os.close(file)
    os.close(fd)
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-qm", "feat: deep")
    run_git(repo, "switch", "-q", "main")
    outcome = GitRepo.open(repo).merge_branch("milestone/m1", "main", "merge")
    assert outcome.merged, outcome
    assert run_git(repo, "status", "--porcelain") == ""
    assert "/".join(comps) + "/f.txt" in run_git(repo, "ls-files")


@pytest.mark.parametrize("relative", [False, True])
def test_a_worktree_is_opened_from_the_repositorys_side(git_repo: Path, relative: bool) -> None:
    """Anima finds a worktree's git folder from the repository's side, never from the
    worktree's `.git` file (whatever writes the tree could point it elsewhere); git 2.48's
    `worktree.useRelativePaths` writes that side relative to the folder it is in."""
    repo = GitRepo.open(git_repo)
    tree = git_repo / ".anima" / "worktrees" / "m1"
    repo.add_worktree(tree, "milestone/m1", "main")
    admin = git_repo / ".git" / "worktrees" / "m1"
    if relative:
        (admin / "gitdir").write_text(os.path.relpath(tree / ".git", admin) + "\n",
                                      encoding="utf-8")
    (tree / ".git").write_text("gitdir: /nonexistent\n", encoding="utf-8")
    opened = repo.worktree_repo(tree)
    assert opened.git_dir == admin
    assert opened.current_branch() == "milestone/m1"
