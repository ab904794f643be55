"""GitRepo against real repositories in tmp_path: every rule the scheduler relies on."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from anima.errors import GitError
from anima.git import GitRepo, MergeOutcome, TreeSnapshot

GITIGNORE = "*.json\n!config.json\nstate.json\nlogs/\ntranscripts/\nanima.lock\nanima.flock\n"
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
def milestone(root: Path, repo: GitRepo) -> dict[str, str]:
    """A started milestone with one Developer commit; the kwargs check_developer_commit takes."""
    base = repo.start_milestone_branch(BRANCH, "main")
    write(root, "src/feature.py", "x = 1\n")
    commit = commit_all(root, "feat: F1")
    return {
        "commit": commit,
        "branch": BRANCH,
        "base_commit": base,
        "main": "main",
        "main_head": base,
    }


def check(repo: GitRepo, ms: dict[str, str], **changes: str) -> list[str]:
    args = {**ms, **changes}
    commit = args.pop("commit")
    return repo.check_developer_commit(commit, **args)


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


# ----------------------------------------------------------------------------- branches


def test_start_milestone_branch_creates_then_reenters(root: Path, repo: GitRepo) -> None:
    main_head = repo.head()
    assert repo.start_milestone_branch(BRANCH, "main") == main_head
    assert repo.current_branch() == BRANCH
    write(root, "src/feature.py", "x = 1\n")
    commit_all(root, "feat")
    repo.switch("main")
    assert repo.current_branch() == "main"
    # A restart: the branch is kept as it is, its base is where it left main.
    assert repo.start_milestone_branch(BRANCH, "main") == main_head
    assert repo.current_branch() == BRANCH
    assert (root / "src/feature.py").exists()


def test_start_milestone_branch_starts_from_main(root: Path, repo: GitRepo) -> None:
    git(root, "checkout", "-q", "-b", "elsewhere")
    write(root, "other.txt", "o\n")
    commit_all(root, "other")
    base = repo.start_milestone_branch(BRANCH, "main")
    assert base == repo.branch_head("main")
    assert not (root / "other.txt").exists()


def test_bad_branch_names_and_switches(repo: GitRepo) -> None:
    with pytest.raises(GitError, match="not a valid git branch name"):
        repo.start_milestone_branch("milestone/bad..name", "main")
    with pytest.raises(GitError, match="'ghost': it does not exist"):
        repo.switch("ghost")


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
    git(root, "checkout", "-q", "main")
    write(root, "hotfix.py", "y = 2\n")
    on_main = commit_all(root, "oops, on main")
    problems = check(repo, milestone, commit=on_main)
    assert any("main has moved" in p for p in problems)
    assert any(f"not on the milestone branch {BRANCH} (it is on main)" in p for p in problems)


def test_main_moving_is_reported_even_for_a_good_commit(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    git(root, "checkout", "-q", "main")
    write(root, "human.txt", "h\n")
    moved = commit_all(root, "human work")
    git(root, "checkout", "-q", BRANCH)
    [problem] = check(repo, milestone)
    assert problem.startswith(f"The main branch main has moved from {milestone['main_head'][:7]}")
    assert moved[:7] in problem


def test_a_commit_on_another_branch_is_rejected(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    git(root, "checkout", "-q", "-b", "side", milestone["base_commit"])
    write(root, "side.txt", "s\n")
    side = commit_all(root, "side work")
    [problem] = check(repo, milestone, commit=side)
    assert problem.startswith(f"Commit {side} is not on the milestone branch {BRANCH}")
    assert "side" in problem


def test_no_new_work_is_rejected(repo: GitRepo, milestone: dict[str, str]) -> None:
    [problem] = check(repo, milestone, commit=milestone["base_commit"])
    assert "is the milestone's base commit: there is no new work" in problem


def test_a_commit_before_the_base_is_rejected(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    older = git(root, "rev-parse", "main")
    git(root, "checkout", "-q", "main")
    # Re-base the milestone on a later main commit, then report the old main commit.
    write(root, "later.txt", "l\n")
    later = commit_all(root, "later")
    git(root, "checkout", "-q", BRANCH)
    git(root, "merge", "-q", "--no-edit", "main")
    problems = check(repo, milestone, commit=older, base_commit=later, main_head=later)
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
    root: Path, repo: GitRepo, milestone: dict[str, str], rel: str, text: str
) -> None:
    write(root, rel, text)
    git(root, "add", "-f", rel)
    git(root, "commit", "-q", "-m", "sneaky")
    [problem] = check(repo, milestone, commit=git(root, "rev-parse", "HEAD"))
    assert f"{rel} (added)" in problem and "Only .anima/memory/ may be committed" in problem


def test_a_developer_edit_to_a_milestone_definition_is_rejected(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, ".anima/milestones/m1.md", "# M1\nall done, trust me\n")
    commit = commit_all(root, "edit milestone")
    write(root, ".anima/milestones/m1.md", "# M1\n")  # the human's version stays on disk
    [problem] = check(repo, milestone, commit=commit)
    assert ".anima/milestones/m1.md (modified)" in problem
    # Reverting it in a new commit fixes the range.
    fixed = commit_all(root, "revert milestone edit")
    assert check(repo, milestone, commit=fixed) == []


def test_memory_and_as_is_definitions_may_be_committed(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, ".anima/memory/project.md", "architecture\n")
    write(root, ".anima/milestones/m2.md", "# M2, written by the human\n")
    write(root, ".anima/soul.md", "be good, and kind\n")  # the human edited it
    write(root, "src/more.py", "z = 3\n")
    commit = commit_all(root, "feat: F2 (git add -A)")
    assert check(repo, milestone, commit=commit) == []


# ------------------------------------------------------------------------- leftovers


def test_commit_leftovers_with_nothing_to_do(root: Path, repo: GitRepo) -> None:
    write(root, ".anima/milestones/m2.md", "# M2\n")  # a human's draft: not a leftover
    assert repo.commit_leftovers("chore: leftovers") is None
    assert not git(root, "status", "--porcelain", "--", "src", "README.md")


def test_commit_leftovers_commits_outside_anima_and_memory_never_definitions(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    write(root, "src/app.py", "print('changed')\n")
    write(root, "src/new.py", "n = 1\n")
    (root / "README.md").unlink()
    write(root, ".anima/memory/project.md", "notes\n")
    write(root, ".anima/milestones/m2.md", "# M2\n")
    (root / ".anima/.gitignore").unlink()  # even then, runtime files stay out
    before = repo.head()
    commit = repo.commit_leftovers("chore(anima): commit the Developer's leftovers")
    assert commit == repo.head()
    assert git(root, "log", "-1", "--format=%s%n%an") == (
        "chore(anima): commit the Developer's leftovers\nTester"
    )
    assert sorted(repo.changed_files_between(before, commit)) == [
        ".anima/memory/project.md",
        "README.md",
        "src/app.py",
        "src/new.py",
    ]
    assert repo.dirty_paths() == []
    assert check(repo, milestone, commit=commit) == []


def test_memory_alone_is_not_a_leftover(root: Path, repo: GitRepo) -> None:
    """An untracked memory/project.md (from `anima init`) is not the Developer's work."""
    write(root, ".anima/memory/project.md", "notes\n")
    assert repo.commit_leftovers("chore: leftovers") is None


def test_commit_leftovers_without_an_identity_uses_anima(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "p", identity=False)
    repo = GitRepo.open(root)
    write(root, "left.txt", "l\n")
    commit = repo.commit_leftovers("chore: leftovers")
    assert commit is not None
    assert git(root, "log", "-1", "--format=%an <%ae>") == "Anima <anima@localhost>"


# -------------------------------------------------------------------- snapshot/restore


@pytest.fixture
def reviewed(root: Path, repo: GitRepo, milestone: dict[str, str]) -> TreeSnapshot:
    """A snapshot taken just before a review, with a pre-existing untracked file."""
    write(root, "scratch/keep.txt", "the human's\n")
    write(root, ".anima/transcripts/m1/acceptor.jsonl", "{}\n")
    return repo.snapshot()


def test_snapshot_of_an_unchanged_tree_is_stable(repo: GitRepo, reviewed: TreeSnapshot) -> None:
    assert repo.snapshot() == reviewed
    assert reviewed.branch == BRANCH and reviewed.head == repo.head()
    assert reviewed.untracked == {"scratch/keep.txt"}
    assert repo.restore(reviewed) == []


def test_restore_reverts_a_modification(root: Path, repo: GitRepo, reviewed: TreeSnapshot) -> None:
    write(root, "src/app.py", "print('reviewer was here')\n")
    (root / "README.md").unlink()
    assert sorted(repo.restore(reviewed)) == [
        "deleted README.md restored",
        "modified src/app.py reverted",
    ]
    assert (root / "src/app.py").read_text() == "print('hi')\n"
    assert repo.snapshot() == reviewed


def test_restore_removes_new_files_but_keeps_old_untracked_and_anima(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(root, "tmp/probe/test_x.py", "assert True\n")
    write(root, "staged.txt", "s\n")
    git(root, "add", "staged.txt")
    write(root, ".anima/logs/m1.log", "[00:00:01] more\n")
    write(root, ".anima/milestones/m3.md", "# M3 dropped in during the review\n")
    undone = repo.restore(reviewed)
    assert sorted(undone) == [
        "new file staged.txt removed",
        "untracked tmp/probe/test_x.py removed",
    ]
    assert not (root / "tmp").exists() and not (root / "staged.txt").exists()
    assert (root / "scratch/keep.txt").read_text() == "the human's\n"
    assert (root / ".anima/milestones/m3.md").exists()
    assert (root / ".anima/transcripts/m1/acceptor.jsonl").exists()
    assert repo.snapshot() == reviewed


def test_restore_undoes_a_reviewer_commit(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(root, "src/app.py", "print('fixed by reviewer')\n")
    write(root, "src/extra.py", "e = 1\n")
    git(root, "add", "src")
    git(root, "commit", "-q", "-m", "reviewer commit")
    moved = git(root, "rev-parse", "HEAD")
    undone = repo.restore(reviewed)
    assert undone[0] == f"HEAD moved to {moved[:7]}; reset to {reviewed.head[:7]}"
    assert "modified src/app.py reverted" in undone
    assert "untracked src/extra.py removed" in undone
    assert repo.branch_head(BRANCH) == reviewed.head
    assert (root / "scratch/keep.txt").exists()
    assert repo.snapshot() == reviewed


def test_restore_undoes_a_branch_switch(root: Path, repo: GitRepo, reviewed: TreeSnapshot) -> None:
    git(root, "checkout", "-q", "main")
    assert not (root / "src/feature.py").exists()
    undone = repo.restore(reviewed)
    assert (
        undone[0] == f"switched to branch main at {repo.branch_head('main')[:7]}; "
        f"switched back to {BRANCH}"
    )
    assert "deleted src/feature.py restored" in undone
    assert repo.current_branch() == BRANCH
    assert repo.snapshot() == reviewed


def test_restore_undoes_a_detached_checkout_and_an_unfinished_merge(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    git(root, "checkout", "-q", "main")
    write(root, "src/feature.py", "x = 'conflict'\n")
    commit_all(root, "conflicting")
    git(root, "checkout", "-q", "--detach", reviewed.head)
    subprocess.run(["git", "merge", "main"], cwd=root, capture_output=True, check=False)
    assert (root / ".git/MERGE_HEAD").exists()
    undone = repo.restore(reviewed)
    assert "an unfinished merge was abandoned" in undone
    assert repo.current_branch() == BRANCH
    assert not (root / ".git/MERGE_HEAD").exists()
    assert (root / "src/feature.py").read_text() == "x = 1\n"
    assert repo.snapshot() == reviewed


def test_restore_recreates_a_deleted_branch(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    git(root, "checkout", "-q", "main")
    git(root, "branch", "-q", "-D", BRANCH)
    undone = repo.restore(reviewed)
    assert f"branch {BRANCH} was deleted; recreated at {reviewed.head[:7]}" in undone
    assert repo.current_branch() == BRANCH and repo.head() == reviewed.head
    assert repo.snapshot() == reviewed


def test_option_like_revisions_are_refused(repo: GitRepo) -> None:
    with pytest.raises(GitError, match="not a valid revision"):
        repo.is_ancestor("--help", "main")
    with pytest.raises(GitError, match="not a valid revision"):
        repo.branch_log("--output=/tmp/x", "main")
    with pytest.raises(GitError, match="not a valid branch name"):
        repo.switch("-f")


def test_restore_keeps_an_old_untracked_file_the_reviewer_staged(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    git(root, "add", "scratch/keep.txt")
    assert repo.restore(reviewed) == ["scratch/keep.txt unstaged"]
    assert (root / "scratch/keep.txt").exists()
    assert repo.snapshot() == reviewed


def test_restore_reports_but_keeps_a_changed_preexisting_file(
    root: Path, repo: GitRepo, reviewed: TreeSnapshot
) -> None:
    write(root, "scratch/keep.txt", "the reviewer's\n")
    [note] = repo.restore(reviewed)
    assert "scratch/keep.txt" in note and "left as is" in note
    assert (root / "scratch/keep.txt").read_text() == "the reviewer's\n"


def test_restore_is_cheap_when_nothing_changed(repo: GitRepo, reviewed: TreeSnapshot) -> None:
    timings = []
    for _ in range(15):
        start = time.perf_counter()
        repo.restore(reviewed)
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 0.1  # one git call; typically a few ms


# ----------------------------------------------------------------------------- history


def test_logs_changed_files_and_diff(root: Path, repo: GitRepo, milestone: dict[str, str]) -> None:
    write(root, "src/second.py", "s = 2\n")
    second = commit_all(root, "feat: F2")
    log = repo.branch_log(milestone["base_commit"], BRANCH)
    assert log == [(milestone["commit"], "feat: F1"), (second, "feat: F2")]
    oneline = repo.oneline_log(milestone["base_commit"], BRANCH).splitlines()
    assert oneline[0].endswith("feat: F2") and oneline[1].startswith(milestone["commit"][:7])
    assert repo.changed_files_between(milestone["commit"], second) == ["src/second.py"]
    assert repo.changed_files_between(milestone["base_commit"], second[:9]) == [
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


def test_merge_clean(root: Path, repo: GitRepo, milestone: dict[str, str]) -> None:
    outcome = repo.merge_branch(BRANCH, "main", "Merge milestone m1")
    assert outcome.merged and outcome.detail.startswith(f"merged {BRANCH} into main as ")
    assert repo.current_branch() == "main"
    assert git(root, "log", "-1", "--format=%s%n%p").splitlines()[0] == "Merge milestone m1"
    assert len(git(root, "log", "-1", "--format=%p").split()) == 2  # --no-ff
    assert repo.is_ancestor(milestone["commit"], "main")
    assert repo.dirty_paths() == []
    again = repo.merge_branch(BRANCH, "main", "Merge milestone m1")
    assert again == MergeOutcome(True, f"main already contains {BRANCH}; nothing to merge")


def test_merge_conflict_is_aborted_and_the_branch_kept(
    root: Path, repo: GitRepo, milestone: dict[str, str]
) -> None:
    git(root, "checkout", "-q", "main")
    write(root, "src/feature.py", "x = 'main'\n")
    main_head = commit_all(root, "conflicting work on main")
    outcome = repo.merge_branch(BRANCH, "main", "Merge milestone m1")
    assert not outcome.merged
    assert "conflicts in src/feature.py" in outcome.detail and "is kept" in outcome.detail
    assert repo.current_branch() == "main"
    assert repo.head() == main_head
    assert repo.branch_head(BRANCH) == milestone["commit"]
    assert repo.dirty_paths() == []
    assert not (root / ".git/MERGE_HEAD").exists()


def test_merge_refuses_a_dirty_tree(root: Path, repo: GitRepo, milestone: dict[str, str]) -> None:
    write(root, "src/app.py", "dirty\n")
    with pytest.raises(GitError, match=r"src/app\.py"):
        repo.merge_branch(BRANCH, "main", "Merge")
    with pytest.raises(GitError, match="no branch 'ghost'"):
        repo.merge_branch("ghost", "main", "Merge")


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


def test_the_humans_anima_files_survive_switching_back_to_main(root: Path,
                                                               repo: GitRepo) -> None:
    """A milestone branch that tracks .anima/ definitions must not delete them on main."""
    git(root, "rm", "-r", "-q", "--cached", ".anima")
    git(root, "commit", "-q", "-m", "chore: .anima/ untracked on main")
    definition = write(root, ".anima/milestones/m1.md", "# M1\n")
    ignore = root / ".anima" / ".gitignore"
    runtime = write(root, ".anima/state.json", "{}")
    base = repo.start_milestone_branch("milestone/m1", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "feat: with the definitions")
    assert git(root, "ls-files", ".anima/.gitignore") == ".anima/.gitignore"
    repo.switch("main")
    assert definition.read_text() == "# M1\n" and ignore.exists() and runtime.exists()
    assert git(root, "status", "--porcelain", "--", ".anima/state.json") == ""
    # Merging brings them in as tracked files without complaining about untracked ones.
    repo.switch("milestone/m1")
    definition.write_text("# M1, edited by the human after the commit\n")
    outcome = repo.merge_branch("milestone/m1", "main", "Merge milestone/m1")
    assert outcome.merged, outcome.detail
    assert definition.read_text() == "# M1, edited by the human after the commit\n"
    assert repo.resolve("main") != base


def test_files_kept_aside_by_a_switch_come_back_after_a_kill(root: Path, repo: GitRepo) -> None:
    """The copy `switch` makes before stepping a human's file aside survives a kill."""
    backup = root / ".anima" / ".kept" / "milestones" / "m9.md"
    backup.parent.mkdir(parents=True)
    backup.write_text("# M9, the human's\n")
    assert repo.restore_kept_files() == [".anima/milestones/m9.md"]
    assert (root / ".anima" / "milestones" / "m9.md").read_text() == "# M9, the human's\n"
    assert not backup.parent.parent.exists()
    assert repo.restore_kept_files() == []
