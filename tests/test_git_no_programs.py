"""Anima's own git runs none of the programs git's configuration names: not a filter, diff or
merge driver, textconv, external diff, fsmonitor, hook, pager, signing program nor a fetch's
upload-pack, whether the repository's, the global or the system config names it.

Real repositories, a temporary HOME (global config) and system config file. Each program is a
script that notes its run in a marker file; every test shows that the same program does run
for a plain `git` command, so it would catch Anima's git running it.
"""

from __future__ import annotations

import os
import pty
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.diffs import diff_between, milestone_changes
from anima.git import GitRepo
from anima.remotes import remote_refs
from anima.store.models import MilestoneRecord, MilestoneStatus

BRANCH = "milestone/m1"
LINES = [f"line {n}\n" for n in range(1, 11)]


class Env:
    """The test's HOME, system config and marker file."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "home"
        self.bin = tmp / "bin"
        self.marker = tmp / "marker"
        self.system = tmp / "system-gitconfig"
        for folder in (self.home, self.bin):
            folder.mkdir()
        self.marker.write_text("")
        self.system.write_text("")

    def program(self, name: str, then: str = "exit 0") -> str:
        """A script that notes `name` in the marker file, then runs `then`; its path."""
        path = self.bin / name
        path.write_text(f"#!/bin/sh\necho {name} >> {shlex.quote(str(self.marker))}\n{then}\n")
        path.chmod(0o755)
        return str(path)

    def ran(self) -> list[str]:
        return self.marker.read_text().split()

    def clear(self) -> None:
        self.marker.write_text("")

    def global_config(self, *pairs: tuple[str, str]) -> None:
        for key, value in pairs:
            git(self.home, "config", "--global", "--add", key, value)

    def system_config(self, *pairs: tuple[str, str]) -> None:
        for key, value in pairs:
            git(self.home, "config", "--file", str(self.system), "--add", key, value)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    found = Env(tmp_path)
    monkeypatch.setenv("HOME", str(found.home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(found.home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(found.system))
    for var in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_PARAMETERS",
                "GIT_CONFIG_COUNT", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                "GIT_COMMITTER_EMAIL", "EMAIL", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE",
                "GIT_EXTERNAL_DIFF", "GIT_PAGER", "PAGER", "GIT_EDITOR", "GIT_ALLOW_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    return found


def git(root: Path, *args: str, check: bool = True) -> str:
    """git as the human (or an agent) runs it, outside Anima."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    assert not check or done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_repo(env: Env, identity: bool = True) -> Path:
    """main with `a.txt` (ten lines), whose filter, diff and merge drivers are named `ev`,
    and `.anima/` ignored."""
    root = env.tmp / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    if identity:
        git(root, "config", "user.name", "Repo Owner")
        git(root, "config", "user.email", "owner@example.invalid")
    write(root, ".gitattributes", "*.txt filter=ev diff=ev merge=ev\n")
    write(root, ".gitignore", ".anima/\n")
    write(root, "a.txt", "".join(LINES))
    git(root, "add", "-A")
    git(root, "-c", "user.name=Setup", "-c", "user.email=setup@example.invalid", "commit", "-q",
        "-m", "chore: start")
    return root


def edit_line(root: Path, index: int, text: str) -> None:
    lines = (root / "a.txt").read_text().splitlines(keepends=True)
    lines[index] = text
    (root / "a.txt").write_text("".join(lines))


def work_like_anima(env: Env, root: Path) -> tuple[bool, str]:
    """What Anima does to a milestone, through its public git API: the status, a milestone
    worktree and branch, the Developer's leftovers committed, main moving meanwhile, the
    Changes view's diffs, the merge into main, a switch. Returns (merged, merge detail)."""
    repo = GitRepo.open(root)
    base = repo.head()
    worktree = env.tmp / "worktree"
    assert repo.add_worktree(worktree, BRANCH, "main") == base
    dev = GitRepo.open(worktree)
    edit_line(worktree, 9, "line 10, the milestone's\n")
    write(worktree, "b.txt", "new\n")
    assert dev.dirty_paths() == ["a.txt", "b.txt"]
    tip = dev.commit_leftovers("feat: the Developer's work").commit
    assert tip is not None and dev.dirty_paths() == []
    # Someone changes line 1 on main meanwhile: the merge is a real three-way one.
    edit_line(root, 0, "line 1, main's\n")
    assert repo.dirty_paths() == ["a.txt"]
    assert repo.commit_leftovers("fix: main moves on").commit is not None
    assert [c.path for c in repo.raw_changes(base, tip)] == ["a.txt", "b.txt"]
    assert [f.path for f in diff_between(repo, base, tip, "whole milestone").files] == \
        ["a.txt", "b.txt"]
    record = MilestoneRecord(id="m1", title="M1", created_at=datetime.now(UTC),
                             status=MilestoneStatus.IN_PROGRESS, branch_name=BRANCH,
                             base_commit=base, main_branch="main")
    assert milestone_changes(repo, record).added == 2
    dev.snapshot()
    repo.remove_worktree(worktree)
    outcome = repo.merge_branch(BRANCH, "main", "Merge milestone m1")
    repo.switch(BRANCH)
    repo.switch("main")
    repo.dirty_paths()
    return outcome.merged, outcome.detail


def assert_merged(root: Path, outcome: tuple[bool, str]) -> None:
    assert outcome[0], outcome[1]
    assert git(root, "show", "main:a.txt").splitlines()[::9] == \
        ["line 1, main's", "line 10, the milestone's"]


def filter_config(env: Env) -> list[tuple[str, str]]:
    passing = env.program("filter", "cat")
    return [("filter.ev.clean", passing), ("filter.ev.smudge", passing),
            ("filter.ev.required", "true")]


def plain_add_runs_filter(env: Env, root: Path) -> None:
    """The control: the human's own `git add` and checkout run the filter."""
    env.clear()
    edit_line(root, 4, "line 5, the human's\n")
    git(root, "add", "a.txt")
    assert "filter" in env.ran()
    env.clear()
    git(root, "checkout", "-q", "HEAD", "--", "a.txt")
    (root / "a.txt").unlink()
    git(root, "checkout", "-q", "HEAD", "--", "a.txt")
    assert "filter" in env.ran()


# ------------------------------------------------------------------------- filters


def test_a_filter_in_the_global_config_never_runs(env: Env) -> None:
    root = make_repo(env)
    env.global_config(*filter_config(env))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    plain_add_runs_filter(env, root)


def test_a_filter_in_the_system_config_never_runs(env: Env) -> None:
    root = make_repo(env)
    env.system_config(*filter_config(env))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    plain_add_runs_filter(env, root)


def test_a_filter_in_the_repository_config_never_runs(env: Env) -> None:
    root = make_repo(env)
    for key, value in filter_config(env):
        git(root, "config", key, value)
    # One whose name holds "=" and ".", and a long-running filter process too.
    write(root, ".gitattributes", "*.txt filter=ev diff=ev merge=ev\n*.md filter=we=ird.one\n")
    git(root, "config", "filter.we=ird.one.clean", env.program("weird", "cat"))
    write(root, "c.md", "hello\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "chore: weird")
    git(root, "config", "filter.ev.process", env.program("process", "exit 1"))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    git(root, "config", "--unset", "filter.ev.process")
    env.clear()
    write(root, "c.md", "hello again\n")
    git(root, "add", "c.md")
    assert "weird" in env.ran()
    plain_add_runs_filter(env, root)


def test_a_filter_added_to_an_included_file_later_never_runs(env: Env) -> None:
    """The repository's config may include a file an agent can write (here one in the
    working tree, not there yet): Anima notices it, however warm its cache."""
    root = make_repo(env)
    git(root, "config", "include.path", "../shared.gitconfig")
    repo = GitRepo.open(root)
    assert repo.dirty_paths() == []
    time.sleep(0.1)  # past the racy window: the cache now holds the config as it was read
    assert repo.dirty_paths() == []
    passing = env.program("filter", "cat")
    write(root, "shared.gitconfig", f"[filter \"ev\"]\n\tclean = {passing}\n\tsmudge = {passing}\n")
    env.clear()
    edit_line(root, 2, "line 3, changed\n")
    assert repo.dirty_paths() == ["a.txt", "shared.gitconfig"]
    assert repo.commit_leftovers("chore: with a filter nearby").commit is not None
    assert env.ran() == []
    plain_add_runs_filter(env, root)


def test_a_fresh_config_is_read_once_and_a_change_of_the_same_size_still_noticed(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repository made a moment ago (every milestone's test, a clone just made) does not
    cost a `git config --list` per command of Anima's; its config changed in place a moment
    after it was read (same size) is read again."""
    root = make_repo(env)
    reads = env.tmp / "reads"
    real = shutil.which("git")
    (env.bin / "git").write_text(f'#!/bin/sh\ncase " $* " in *" config --list "*) '
                                 f'echo read >> {shlex.quote(str(reads))};; esac\n'
                                 f'exec {shlex.quote(str(real))} "$@"\n')
    (env.bin / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{env.bin}{os.pathsep}{os.environ['PATH']}")
    git(root, "config", "diff.ev.textconv", "cat")
    time.sleep(0.1)
    repo = GitRepo.open(root)
    for _ in range(5):
        assert repo.dirty_paths() == []
    assert reads.read_text().split() == ["read"]
    time.sleep(0.1)
    git(root, "config", "diff.ev.textconv", "tac")  # the same size
    edit_line(root, 2, "line 3, changed\n")
    assert repo.dirty_paths() == ["a.txt"]
    assert reads.read_text().split() == ["read", "read"]


# ------------------------------------------------------------- diff and merge drivers


@pytest.mark.parametrize("scope", ["global", "repository"])
def test_textconv_and_external_diffs_never_run(env: Env, scope: str) -> None:
    root = make_repo(env)
    pairs = [("diff.ev.textconv", env.program("textconv", 'cat "$1"')),
             ("diff.external", env.program("external"))]
    if scope == "global":
        env.global_config(*pairs)
    else:
        for key, value in pairs:
            git(root, "config", key, value)
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    repo = GitRepo.open(root)
    changes = diff_between(repo, "main~1", "main", "the merge")
    assert [f.path for f in changes.files] == ["a.txt", "b.txt"]
    assert "+line 10, the milestone's" in changes.files[0].patch  # the bytes, not a textconv
    assert env.ran() == []
    git(root, "diff", "main~1", "main")
    assert "external" in env.ran()
    env.clear()
    git(root, "log", "-p", "-1", "main~1")
    assert "textconv" in env.ran()


@pytest.mark.parametrize("scope", ["global", "repository"])
def test_a_merge_driver_never_runs(env: Env, scope: str) -> None:
    root = make_repo(env)
    driver = env.program("merge-driver") + " %O %A %B"
    if scope == "global":
        env.global_config(("merge.ev.driver", driver))
    else:
        git(root, "config", "merge.ev.driver", driver)
    env.clear()
    merged, detail = work_like_anima(env, root)
    assert env.ran() == []
    # Not run, nor asked for: Anima's merge reads no `.gitattributes` (git's own text merge).
    assert_merged(root, (merged, detail))
    for branch, line in (("left", 2), ("right", 6)):  # the control: two fresh sides
        git(root, "switch", "-q", "-c", branch, "main")
        edit_line(root, line, f"line {line + 1}, {branch}'s\n")
        git(root, "commit", "-q", "-am", branch)
    git(root, "merge-tree", "--write-tree", "left", "right", check=False)
    assert "merge-driver" in env.ran()


# ------------------------------------------------------- fsmonitor, hooks, signing, pager


def test_an_fsmonitor_in_the_global_config_never_runs(env: Env) -> None:
    root = make_repo(env)
    env.global_config(("core.fsmonitor", env.program("fsmonitor", "exit 1")))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    git(root, "status", "--short")
    assert "fsmonitor" in env.ran()


@pytest.mark.parametrize("scope", ["global", "repository"])
def test_hooks_never_run(env: Env, scope: str) -> None:
    root = make_repo(env)
    hooks = env.tmp / "hooks"
    hooks.mkdir()
    for name in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-merge",
                 "reference-transaction", "post-index-change", "pre-auto-gc"):
        (hooks / name).symlink_to(env.program(name))
    if scope == "global":
        env.global_config(("core.hooksPath", str(hooks)))
    else:
        git(root, "config", "core.hooksPath", str(hooks))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    git(root, "switch", "-q", BRANCH)
    git(root, "commit", "-q", "--allow-empty", "-m", "human")
    assert {"post-checkout", "pre-commit", "reference-transaction"} <= set(env.ran())


def test_commit_signing_never_runs_the_signing_program(env: Env) -> None:
    root = make_repo(env)
    env.global_config(("commit.gpgSign", "true"), ("tag.gpgSign", "true"),
                      ("gpg.program", env.program("gpg", "exit 1")),
                      ("merge.verifySignatures", "true"), ("log.showSignature", "true"))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    assert env.ran() == []
    assert git(root, "log", "--no-show-signature", "-1", "--format=%G?", "main") == "N"
    git(root, "commit", "-q", "--allow-empty", "-m", "signed", check=False)
    assert "gpg" in env.ran()


def test_a_pager_never_runs(env: Env) -> None:
    root = make_repo(env)
    env.global_config(("core.pager", env.program("pager", "cat >/dev/null")),
                      ("pager.log", env.program("log-pager", "cat >/dev/null")))
    env.clear()
    assert_merged(root, work_like_anima(env, root))
    repo = GitRepo.open(root)
    assert repo.oneline_log("main~1", "main")
    assert repo.ancestry(repo.resolve("main~1") or "", repo.branch_head("main")).commits
    assert env.ran() == []
    # A pager runs only on a terminal: the human's `git log` on one.
    leader, follower = pty.openpty()
    try:
        subprocess.run(["git", "log", "-1"], cwd=root, stdin=subprocess.DEVNULL,
                       stdout=follower, stderr=follower, check=False, timeout=30)
    finally:
        os.close(follower)
        os.close(leader)
    assert "log-pager" in env.ran()


# ------------------------------------------------------------------ no transport at all


def test_a_lazy_fetch_never_runs_the_repositorys_upload_pack(env: Env) -> None:
    """A partial clone fetches a missing object on demand: through its remote's
    `uploadpack` command, which a `protocol.<name>.allow` would let through."""
    origin = env.tmp / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    git(origin, "config", "uploadpack.allowFilter", "true")
    git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")
    for n in (1, 2):
        write(origin, "f.txt", f"version {n}\n")
        git(origin, "add", "f.txt")
        git(origin, "-c", "user.name=O", "-c", "user.email=o@example.invalid", "commit", "-q",
            "-m", f"v{n}")
    root = env.tmp / "clone"
    git(env.tmp, "clone", "-q", "--filter=blob:none", f"file://{origin}", str(root))
    git(root, "branch", "old", "main~1")
    git(root, "config", "remote.origin.uploadpack",
        f"{env.program('upload-pack')}; git-upload-pack")
    git(root, "config", "protocol.file.allow", "always")
    env.clear()
    repo = GitRepo.open(root)
    assert repo.blob("refs/heads/main", "f.txt") == b"version 2\n"
    assert repo.blob("refs/heads/old", "f.txt") is None  # missing here, and not fetched
    assert remote_refs(root) == {"refs/remotes/origin/HEAD": repo.head(),
                                 "refs/remotes/origin/main": repo.head(),
                                 "origin:refs/heads/main": repo.head()}
    assert env.ran() == []
    assert git(root, "show", "old:f.txt") == "version 1"
    assert "upload-pack" in env.ran()


# ---------------------------------------------- what Anima keeps of the human's config


def test_anima_commits_and_merges_as_the_identity_of_the_global_config(env: Env) -> None:
    root = make_repo(env, identity=False)
    env.global_config(("user.name", "Global Human"), ("user.email", "human@example.invalid"))
    assert_merged(root, work_like_anima(env, root))
    assert len(git(root, "log", "-1", "--format=%P", "main").split()) == 2  # the merge
    assert git(root, "log", "-1", "--format=%an <%ae>|%cn <%ce>", "main").split("|") == \
        ["Global Human <human@example.invalid>"] * 2
    assert git(root, "log", "-1", "--format=%an <%ae>", BRANCH) == \
        "Global Human <human@example.invalid>"


def test_without_any_identity_anima_commits_as_itself(env: Env) -> None:
    root = make_repo(env, identity=False)
    assert_merged(root, work_like_anima(env, root))
    assert git(root, "log", "-1", "--format=%an <%ae>", "main") == "Anima <anima@localhost>"


def test_the_global_ignore_file_still_counts(env: Env) -> None:
    """Anima's git reads no global config, yet what the human ignores stays ignored."""
    root = make_repo(env)
    write(env.home, ".gitignore_global", "*.log\n")
    env.global_config(("core.excludesFile", "~/.gitignore_global"))
    write(root, "debug.log", "noise\n")
    write(root, "new.py", "print()\n")
    repo = GitRepo.open(root)
    assert repo.dirty_paths() == ["new.py"]
    repo.commit_leftovers("feat: new")
    assert git(root, "ls-files").split() == [".gitattributes", ".gitignore", "a.txt", "new.py"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs to give the repository to another user")
def test_a_safe_directory_of_the_global_config_still_counts(env: Env) -> None:
    root = make_repo(env)
    for path in [root, *root.rglob("*")]:
        os.lchown(path, 65534, -1)
    assert git(root, "status", check=False) == ""  # dubious ownership: git refuses
    env.global_config(("safe.directory", str(root)))
    repo = GitRepo.open(root)
    assert repo.dirty_paths() == []


# ------------------------------------------------------------------ a nested repository


#: Your repository's settings that make git go into submodules: a checkout, switch or reset
#: updates each active one (`git clone --recurse-submodules` sets `submodule.active`), and a
#: diff or `log -p` shows each one's own diff, by running git inside it.
RECURSING = [("submodule.recurse", "true"), ("submodule.active", "."),
             ("diff.submodule", "diff")]


@pytest.mark.parametrize("yours", [[], RECURSING], ids=["default", "recursing"])
def test_a_filter_in_a_repository_the_developer_nests_in_its_tree_never_runs(
        env: Env, yours: list[tuple[str, str]]) -> None:
    """git runs git inside a submodule to see whether its files changed (or, with your
    `submodule.recurse` or `diff.submodule`, to check it out or show its diff), and that git
    reads the submodule's own config, which Anima never saw: a Developer that makes a
    repository in its worktree, with a filter and a diff driver, and commits it as a
    submodule, would have Anima's git (unconfined) run them."""
    root = make_repo(env)
    for key, value in yours:
        git(root, "config", key, value)
    repo = GitRepo.open(root)
    worktree = env.tmp / "worktree"
    repo.add_worktree(worktree, BRANCH, "main")
    sub = worktree / "sub"
    sub.mkdir()
    git(sub, "init", "-q", "-b", "main")
    for driver in ("filter.nested.clean", "filter.nested.smudge", "diff.nested.command"):
        git(sub, "config", driver, env.program("nested", "cat"))
    write(sub, ".gitattributes", "* filter=nested diff=nested\n")
    write(sub, "a", "a\n")
    git(sub, "add", "-A")
    git(sub, "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "commit", "-q",
        "-m", "nested")
    write(worktree, ".gitmodules", '[submodule "sub"]\n\tpath = sub\n\turl = ./sub\n')
    # the Developer commits it as a submodule (Anima would not)
    git(worktree, "add", "sub", ".gitmodules")
    git(worktree, "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "commit", "-q",
        "-m", "feat: a submodule")
    dev = GitRepo.open(worktree)

    def touched() -> None:
        """The file's times change, not its content: git must read it through the filter."""
        env.clear()
        later = (sub / "a").stat().st_mtime + 10
        os.utime(sub / "a", (later, later))

    steps: dict[str, Callable[[], object]] = {
        "status": dev.dirty_paths,
        "snapshot and restore": lambda: dev.restore(dev.snapshot()),
        "switch away and back": lambda: (dev.switch("main-copy"), dev.switch(BRANCH)),
        "leftovers": lambda: (write(worktree, "b.txt", "b\n"), dev.commit_leftovers("feat: b")),
        "stash": lambda: (write(worktree, "c.txt", "c\n"), dev.stash_all("anima-test")),
        "abort a merge": lambda: (git(worktree, "-c", "submodule.recurse=false", "merge",
                                      "--no-commit", "--no-ff", "main-copy", check=False),
                                  dev.end_operations("abort", BRANCH)),
        "the Changes view": lambda: diff_between(dev, "main", BRANCH, "whole milestone"),
        "put the branch back": lambda: dev.reset_branch(BRANCH, dev.resolve("HEAD~1") or ""),
    }
    git(root, "branch", "main-copy", "main")
    for name, step in steps.items():
        touched()
        step()
        assert env.ran() == [], name
    touched()
    git(worktree, "status", "--short")
    assert "nested" in env.ran()  # the control: the human's own git runs it
