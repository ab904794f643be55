"""anima.sandbox: real processes in real bubblewrap, on real git repositories. An agent confined
to milestone m1 may commit on `milestone/m1` and write nothing else that matters."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anima import sandbox
from anima.agents.claude.backend import CLAUDE
from anima.agents.dialect import AgentBinary
from anima.git.objects import take_objects
from anima.sandbox import Confinement

if sandbox.unavailable() == sandbox.NOT_INSTALLED:
    pytest.skip(f"{sandbox.NOT_INSTALLED}: the sandbox cannot be tested here",
                allow_module_level=True)

IDENTITY = ('Ada "The Countess" Lovelace', "ada@example.invalid")


def _base_env() -> dict[str, str]:
    """The test's environment without its git variables, and no system git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "GIT_CONFIG_NOSYSTEM": "1"}


def git(root: Path, *args: str) -> str:
    """Git run by the test itself (setting up, asserting): no user config, a fixed identity."""
    env = {**_base_env(), "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "Fixture", "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
           "GIT_COMMITTER_NAME": "Fixture", "GIT_COMMITTER_EMAIL": "fixture@example.invalid"}
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=False, env=env)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@dataclass
class World:
    """A project with two milestone worktrees and a bare `origin`; the fake user's home."""

    root: Path
    repo: Path
    m1: Path
    m2: Path
    remote: Path
    real_home: Path
    state: Path

    @property
    def common(self) -> Path:
        return self.repo / ".git"

    @property
    def store(self) -> Path:
        """Where m1's Developer's git writes objects (see `take_objects`)."""
        return self.state / "objects"

    def refs(self) -> dict[str, str]:
        """Every ref of the project and of the remote, read from outside."""
        found = {}
        for where, repo in (("", self.repo), ("origin:", self.remote)):
            for line in git(repo, "for-each-ref", "--format=%(refname) %(objectname)").split("\n"):
                if line:
                    name, sha = line.split()
                    found[where + name] = sha
        return found

    def prepare(self, home: Path, identity: tuple[str | None, str | None] = IDENTITY
                ) -> tuple[tuple[Path, Path], ...]:
        """The private HOME as Anima prepares it for a `claude` agent."""
        sandbox.prepare_home(home, identity)
        return CLAUDE.prepare_home(home, self.real_home)

    def confine(self, **changes: Any) -> Confinement:
        """The Developer of m1, as Anima would confine it; `changes` override fields."""
        admin = Path(git(self.m1, "rev-parse", "--absolute-git-dir"))
        access = sandbox.git_writable(self.common, admin, "milestone/m1", self.store,
                                      self.state / "repository-objects")
        home = self.state / "home"
        c = Confinement(
            cwd=self.m1, home=home, tmp=self.state / "tmp",
            writable=(self.m1, *access.writable),
            protected=(self.m1 / ".git", *access.protected),
            rebound=(*self.prepare(home), *access.rebound), rebound_ro=access.rebound_ro,
            # Everything outside /tmp stays visible; so must the test's folder.
            visible=(self.root,))
        return dataclasses.replace(c, **changes)

    def run(self, script: str, c: Confinement | None = None, *args: str
            ) -> subprocess.CompletedProcess[str]:
        """`sh -c script` inside the sandbox; `$1`… are `args`."""
        c = c or self.confine()
        argv = sandbox.wrap(["sh", "-c", script, "sh", *args], c)
        return subprocess.run(argv, env=self.env(c), capture_output=True, text=True,
                              timeout=30, check=False)

    def env(self, c: Confinement) -> dict[str, str]:
        """Anima's environment as the user's (whose global git config is named outright),
        with the sandbox's laid over it."""
        user = {"HOME": str(self.real_home),
                "GIT_CONFIG_GLOBAL": str(self.real_home / ".gitconfig")}
        return {**_base_env(), **user, **sandbox.environment(c)}


def make_world(root: Path) -> World:
    real_home = root / "realhome"
    (real_home / ".claude").mkdir(parents=True)
    (real_home / ".gitconfig").write_text(
        "[user]\n\tname = Real Person\n\temail = real@example.invalid\n"
        "[alias]\n\treal-alias = status\n", encoding="utf-8")
    (real_home / ".claude.json").write_text('{"hasCompletedOnboarding": true}\n')
    (real_home / ".claude" / ".credentials.json").write_text('{"token": "real"}\n')

    repo = root / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# project\n")
    (repo / ".anima" / "milestones").mkdir(parents=True)
    (repo / ".anima" / "milestones" / "m1.md").write_text("# m1\n")
    (repo / ".anima" / ".gitignore").write_text("worktrees/\nsandbox/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    m1, m2 = repo / ".anima" / "worktrees" / "m1", repo / ".anima" / "worktrees" / "m2"
    git(repo, "worktree", "add", "-q", str(m1), "-b", "milestone/m1")
    git(repo, "worktree", "add", "-q", str(m2), "-b", "milestone/m2")
    # m1 is ahead of main and m2, so moving either to m1's HEAD would show.
    (m1 / "work.txt").write_text("m1 work\n")
    git(m1, "add", "-A")
    git(m1, "commit", "-q", "-m", "m1 work")
    remote = root / "remote.git"
    git(root, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    return World(root, repo, m1, m2, remote, real_home, repo / ".anima" / "sandbox" / "m1")


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fresh world, for tests that change it."""
    return make_world(tmp_path)


@pytest.fixture(scope="module")
def untouched(tmp_path_factory: pytest.TempPathFactory) -> World:
    """One world for the tests whose every attempt must fail and change nothing."""
    return make_world(tmp_path_factory.mktemp("untouched"))


def test_probe_names_a_missing_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert sandbox.unavailable() is None  # installed here: it must work, not be skipped
    monkeypatch.setenv(sandbox.BWRAP_VAR, str(tmp_path / "no-such-bwrap"))
    assert sandbox.unavailable() == sandbox.NOT_INSTALLED


def test_probe_quotes_a_failing_bubblewrap(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(sandbox.BWRAP_VAR, str(fake))
    assert sandbox.unavailable() == ("bubblewrap cannot create a sandbox here: "
                                     "bwrap: No permissions to create new namespace")


def test_confinement_wants_absolute_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        Confinement(cwd=Path("work"), home=tmp_path, tmp=tmp_path)


def test_commit_on_own_branch(world: World) -> None:
    before = world.refs()
    done = world.run("echo new > new.txt && git add new.txt && git commit -q -m 'agent work' "
                     "&& git status --porcelain")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    after = world.refs()
    assert after.pop("refs/heads/milestone/m1") != before.pop("refs/heads/milestone/m1")
    assert after == before
    assert take_objects(world.store, world.common) == []
    assert git(world.repo, "show", "milestone/m1:new.txt") == "new"
    author = git(world.repo, "log", "-1", "--format=%an <%ae>", "milestone/m1")
    assert author == f"{IDENTITY[0]} <{IDENTITY[1]}>"
    assert "agent work" in git(world.repo, "reflog", "milestone/m1")


@pytest.mark.parametrize("target", [
    "project/README.md",
    "project/.anima/turn_guard.json",
    "project/.anima/milestones/x.md",
    "project/.anima/milestones/m1.md",
    "project/.git/config",
    "project/.git/hooks/pre-commit",
    "project/.git/packed-refs",
    "project/.git/worktrees/m1/gitdir",
    "project/.git/worktrees/m2/HEAD",
    "project/.git/worktrees/m1/commondir",
    "project/.git/worktrees/m1/config.worktree",
    "project/.anima/sandbox/m1/repository-objects/info/alternates",
    "project/.anima/worktrees/m1/.git",
    "project/.anima/worktrees/m2/README.md",
    "project/.anima/worktrees/m2/new.txt",
    "realhome/.gitconfig",
    "remote.git/config",
])
def test_writes_outside_the_worktree_fail(untouched: World, target: str) -> None:
    path = untouched.root / target
    c = untouched.confine()  # (it makes the files it binds read-only, `config.worktree`)
    before = path.read_bytes() if path.exists() else None
    done = untouched.run('echo evil >> "$1"', c, str(path))
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr
    assert (path.read_bytes() if path.exists() else None) == before


@pytest.mark.parametrize("command", [
    "git branch -f main HEAD",
    "git update-ref refs/heads/main HEAD",
    "git branch -f milestone/m2 HEAD",
    "git update-ref refs/heads/milestone/m2 HEAD",
    "git update-ref -d refs/heads/milestone/m2",
    "git rev-parse HEAD > ../../../.git/refs/heads/milestone/m2",
    "rm ../../../.git/refs/heads/milestone/m2",
    "git tag v1 HEAD",
    "git push origin HEAD",
    "git push origin HEAD:main",
    "git push ../../../.git HEAD:refs/heads/main",
])
def test_other_refs_cannot_move(untouched: World, command: str) -> None:
    before = untouched.refs()
    done = untouched.run(command)
    assert done.returncode != 0, done.stdout + done.stderr
    assert untouched.refs() == before


def test_protected_ref_without_reflog_fails_on_the_rename(world: World) -> None:
    """A ref file is protected by its own mount: renaming `<ref>.lock` over it fails."""
    (world.common / "logs" / "refs" / "heads" / "milestone" / "m2").unlink()
    before = world.refs()
    done = world.run("git update-ref refs/heads/milestone/m2 HEAD")
    assert done.returncode != 0
    assert world.refs() == before


def test_packed_refs_are_protected_too(world: World) -> None:
    """After a `git gc` every branch lives in packed-refs only; an agent could shadow one
    with a loose file. The confinement gives them loose copies first, and m1 still commits."""
    git(world.repo, "pack-refs", "--all")
    assert not (world.common / "refs" / "heads" / "milestone").exists()
    before = world.refs()
    c = world.confine()
    assert world.refs() == before
    done = world.run("git rev-parse HEAD > ../../../.git/refs/heads/milestone/m2", c)
    assert done.returncode != 0
    assert world.refs() == before
    done = world.run("git commit -q --allow-empty -m more", c)
    assert done.returncode == 0, done.stderr
    take_objects(world.store, world.common)
    assert git(world.repo, "log", "-1", "--format=%s", "milestone/m1") == "more"


def test_the_repositorys_objects_stay_as_they_are(world: World) -> None:
    """The agent's git writes objects to a store of its own, over `objects/`; the
    repository's, which it reads there as an alternate, it can neither delete nor rewrite.
    What it writes comes in only as what it is: a forged object stays out."""
    real = world.common / "objects"
    git(world.repo, "repack", "-q")
    files = {p: p.read_bytes() for p in real.rglob("*") if p.is_file()}
    readme = git(world.repo, "rev-parse", "main:README.md")
    view = world.state / "repository-objects"
    forged = "import sys, zlib; sys.stdout.buffer.write(zlib.compress(b'blob 5\\0evil\\n'))"
    done = world.run(
        'for f in $(find "$1" -type f); do rm -f "$f" 2>/dev/null && echo "deleted $f"; '
        'echo x 2>/dev/null >> "$f" && echo "wrote $f"; done; '
        'rm -rf "$2/pack"; '  # `objects/` is its own store in there: nothing of main's
        f'mkdir -p "$2/{readme[:2]}" && python3 -c "{forged}" > "$2/{readme[:2]}/{readme[2:]}"; '
        'echo new > new.txt && git add new.txt && git commit -q -m new && echo committed',
        None, str(view), str(real))
    assert "deleted" not in done.stdout and "wrote" not in done.stdout, done.stdout
    assert "committed" in done.stdout, done.stderr
    assert {p: p.read_bytes() for p in real.rglob("*") if p.is_file()} == files
    notes = take_objects(world.store, world.common)
    assert len(notes) == 1 and f"({readme[:12]})" in notes[0]
    assert git(world.repo, "show", "milestone/m1:new.txt") == "new"
    assert git(world.repo, "show", f"{readme}") == "# project"
    assert git(world.repo, "fsck", "--strict", "--no-dangling") == ""
    assert not any(world.store.glob("??/*"))  # taken in (or refused) once


def test_capabilities_are_dropped(world: World) -> None:
    """bwrap run by root keeps its capabilities unless told: a remount would undo it all."""
    readme = world.repo / "README.md"
    done = world.run('grep CapEff /proc/self/status; '
                     'for m in $(cut -d" " -f5 /proc/self/mountinfo); do '
                     'mount -o remount,rw,bind "$m" 2>/dev/null; done; echo evil >> "$1"',
                     None, str(readme))
    assert done.returncode != 0
    assert done.stdout.split() == ["CapEff:", "0000000000000000"]
    assert readme.read_text() == "# project\n"


def test_git_config_is_private(world: World) -> None:
    real = (world.real_home / ".gitconfig").read_text()
    done = world.run("git config --global user.name && git config --global --list && "
                     "git config --global x.y z && git config --global x.y")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == IDENTITY[0]
    assert not any("real" in line for line in lines)
    assert lines[-1] == "z"
    assert (world.real_home / ".gitconfig").read_text() == real
    assert "[x]" in (world.state / "home" / ".gitconfig").read_text()
    # The next start rewrites it: nothing an agent adds survives.
    world.prepare(world.state / "home")
    assert "[x]" not in (world.state / "home" / ".gitconfig").read_text()


def test_tmp_is_private(world: World) -> None:
    name = f"anima-sandbox-test-{uuid.uuid4().hex}"
    done = world.run('echo hi > "/tmp/$1" && echo "$TMPDIR"', None, name)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "/tmp\n"
    assert (world.state / "tmp" / name).read_text() == "hi\n"
    assert not (Path("/tmp") / name).exists()


def test_read_only_reviewer(world: World) -> None:
    c = world.confine(writable=(), protected=())
    done = world.run("echo evil >> work.txt", c)
    assert done.returncode != 0
    assert (world.m1 / "work.txt").read_text() == "m1 work\n"
    assert world.run("cat work.txt && echo x > /tmp/x && echo y > ~/y", c).returncode == 0


def test_emptied_folders_are_empty_and_read_only_over_a_writable_tree(world: World) -> None:
    """A nested repository's folder, shown empty (its `.git` too) even inside the writable
    worktree: git finds no repository there to run the commands of."""
    nested = world.m1 / "sub"
    (nested / ".git").mkdir(parents=True)
    (nested / "a").write_text("a\n")
    c = world.confine(emptied=(nested,))
    assert world.run("ls -A sub", c).stdout == ""
    assert world.run("touch sub/b", c).returncode != 0
    assert world.run("echo more >> work.txt", c).returncode == 0
    assert sorted(p.name for p in nested.iterdir()) == [".git", "a"]


def test_hidden_folders_show_only_what_is_visible(world: World) -> None:
    """Hide the user's whole HOME (keys, tokens), show the project inside it again."""
    c = world.confine(hidden=(world.root,), visible=(world.repo,))
    secret = world.real_home / ".gitconfig"
    done = world.run('ls -A "$1"; cat "$2"', c, str(world.root), str(secret))
    assert done.returncode != 0
    assert done.stdout == "project\n"
    assert world.run("git commit -q --allow-empty -m hidden", c).returncode == 0


def test_login_file_is_shared_and_settings_copied(world: World) -> None:
    home = world.state / "home"
    c = world.confine()
    assert (home / ".claude.json").read_text() == '{"hasCompletedOnboarding": true}\n'
    done = world.run('cat ~/.claude/.credentials.json && echo \'{"token": "new"}\' '
                     '> ~/.claude/.credentials.json', c)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"token": "real"}\n'
    assert (world.real_home / ".claude" / ".credentials.json").read_text() == '{"token": "new"}\n'
    # Only the private copy changes from now on; a second prepare keeps it.
    (home / ".claude.json").write_text("{}\n")
    world.prepare(home)
    assert (home / ".claude.json").read_text() == "{}\n"


def test_prepare_home_writes_through_no_symlink(world: World) -> None:
    """An agent may leave symlinks in its HOME; Anima prepares it outside the sandbox."""
    home, victim = world.state / "home", world.root / "victim"
    victim.mkdir()
    home.mkdir(parents=True)
    (home / ".claude").symlink_to(victim)
    (home / ".claude.json").symlink_to(victim / "settings.json")
    world.prepare(home, (None, None))
    assert list(victim.iterdir()) == []
    assert (home / ".claude").is_dir() and not (home / ".claude").is_symlink()
    assert (home / ".gitconfig").read_text() == "[gc]\n\tauto = 0\n"


def test_prepare_home_forgets_the_git_settings_an_earlier_process_left(world: World) -> None:
    """The private HOME is kept across restarts; what git reads there is Anima's again at each
    start (an Acceptor's run Developer code could have written it before it was protected)."""
    home = world.state / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "attributes").write_text("* diff=lgtm\n")
    (home / ".gitconfig").write_text("[diff]\n\texternal = /bin/lgtm\n")
    world.prepare(home, (None, None))
    assert (home / ".gitconfig").read_text() == "[gc]\n\tauto = 0\n"
    assert (home / ".config" / "git").is_dir() and not any((home / ".config" / "git").iterdir())


def _sleepers(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if cmdline == f"sleep\0{tag}\0".encode() and state != "Z":
            found.append(int(entry))
    return found


def _wait_for(condition: Callable[[], bool], limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_killing_the_sandbox_kills_its_background_jobs(world: World) -> None:
    tag = str(900000 + uuid.uuid4().int % 99999)
    c = world.confine()
    proc = subprocess.Popen(sandbox.wrap(["sh", "-c", f"sleep {tag} & echo started; wait"], c),
                            env=world.env(c), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        assert _wait_for(lambda: len(_sleepers(tag)) == 1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert _wait_for(lambda: not _sleepers(tag))


def test_a_cli_reached_through_a_symlinked_folder_under_tmp_runs_confined(world: World) -> None:
    """An agent command named through a symlink that the private /tmp covers (an npm install
    linked into /tmp; the install lives elsewhere) still starts: it ran only unconfined,
    confined it failed with "execvp …: No such file or directory"."""
    package = world.root / "install" / "node_modules" / "pkg"
    package.mkdir(parents=True)
    (package / "cli.sh").write_text("#!/bin/sh\necho started\n")
    (package / "cli.sh").chmod(0o755)
    (world.root / "install" / "node_modules" / ".bin").mkdir()
    (world.root / "install" / "node_modules" / ".bin" / "cli").symlink_to("../pkg/cli.sh")
    (world.root / "linked").symlink_to(world.root / "install")
    command = str(world.root / "linked" / "node_modules" / ".bin" / "cli")
    c = world.confine(visible=(world.repo, *AgentBinary([command], "1").install_paths()))
    done = subprocess.run(sandbox.wrap([command], c), env=world.env(c), capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "started\n"
