"""How one milestone's processes are confined (config `sandbox`, see `anima.sandbox`).

The Developer writes its worktree and what git needs to commit on its branch; the Acceptor
reads it (it reviews, it does not change); the checks and the setup command, which run the
Developer's code, write the worktree but not git. Each has its own HOME (its CLI's sessions:
the Developer cannot edit the Acceptor's, nor another milestone's) and its own /tmp. The
human's checkout, `.anima/` (records, config, Anima's own notes), `.git/config`, hooks, main
and the other branches, other worktrees and `~/.gitconfig` stay read-only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path

from anima import sandbox
from anima.errors import ConfigError, GitError
from anima.git import GitRepo
from anima.git.locks import admin_dir
from anima.git_options import human_config, reviewer_git_env
from anima.loop.checks import Confine
from anima.paths import ProjectPaths

#: (private HOME, the user's real HOME) -> (real file, file in the private HOME) to bind rw.
CliHome = Callable[[Path, Path], tuple[tuple[Path, Path], ...]]
#: Nested repositories of a worktree: (submodule path, its folder's (device, inode)) each.
_Nested = tuple[tuple[str, tuple[int, int]], ...]
#: Extra folders confined processes may write (a shared build cache), separated by ':'.
WRITABLE_VAR = "ANIMA_SANDBOX_WRITABLE"
#: Writers of the agent's role: the Developer commits; the others do not touch git.
_COMMITS = frozenset({"developer"})
_READS_ONLY = frozenset({"acceptor"})
#: Hidden (an empty folder in their place): the user's session bus and `systemd-run --user`
#: would run a command outside the sandbox; keys and tokens would let a push or a deploy past
#: Anima (the rest of the home stays readable: the user's toolchains live there).
_HIDDEN = (Path("/run/user"),)
#: Folders named by the environment: where the user's runtime folder is not under /run/user,
#: Anima's control sockets (`anima.engine.control`) in its `anima/` are hidden all the same (a
#: connect needs no write access; a socket there stops or approves milestones).
_HIDDEN_FROM_ENV = (("XDG_RUNTIME_DIR", "anima"),)
_HIDDEN_IN_HOME = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gh",
                   ".config/gcloud",
                   # browsers' profiles (their cookies are your sessions) and password stores:
                   # no build reads them, and the network is open
                   ".mozilla", ".thunderbird", ".config/google-chrome", ".config/chromium",
                   ".config/BraveSoftware", ".config/microsoft-edge", ".config/vivaldi",
                   "snap/firefox", "snap/chromium", ".var/app", ".password-store",
                   ".local/share/keyrings", ".config/op")
#: Files read as empty: tokens that only publishing uses, and the logins git's `store` helper,
#: curl and npm keep. Nothing confined reads them where they are: its HOME is a private one
#: (a `git push`, an `npm publish` with them would go past Anima).
_HIDDEN_FILES_IN_HOME = (".pypirc", ".gem/credentials", ".cargo/credentials.toml",
                         ".cargo/credentials", ".vault-token", ".git-credentials",
                         ".config/git/credentials", ".netrc", ".npmrc", ".yarnrc.yml")
#: Sockets of daemons that run whatever their caller asks, as root (a container with `/`
#: mounted): a read-only mount does not stop a connect. Made unconnectable; a project whose
#: checks need one lists it in ANIMA_SANDBOX_WRITABLE, and gives them root's reach.
_HIDDEN_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock", "/run/podman/podman.sock",
                   "/run/containerd/containerd.sock", "/var/run/libvirt/libvirt-sock",
                   "/var/snap/lxd/common/lxd/unix.socket", "/var/lib/incus/unix.socket")
#: Sockets named by the environment, made unconnectable wherever they are: your SSH agent
#: signs with the keys `~/.ssh` holds (one under /tmp or /run/user is hidden with its folder;
#: 1Password's listens in your home), and the network is open.
_HIDDEN_SOCKETS_FROM_ENV = ("SSH_AUTH_SOCK",)


def sandbox_problem(mode: str) -> str | None:
    """Why agents will run unconfined under `mode` (None: they are confined, or it is off);
    `required` without bubblewrap is a configuration error naming what is missing."""
    if mode == "off":
        return None
    problem = sandbox.unavailable()
    if problem is not None and mode == "required":
        raise ConfigError(f".anima/config.json: sandbox is \"required\" but {problem}")
    return problem


class SandboxPolicy:
    """Whether processes run confined under config `sandbox`; where `"auto"` cannot confine
    them, that is said once, plainly, through `say` (the window, the headless output, the
    log)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._said = False

    def active(self, mode: str) -> bool:
        if mode == "off":
            return False
        problem = sandbox_problem(mode)
        if problem is not None:
            self._say_once(f"agents run unconfined: {problem}; they can write anything you "
                           "can (sandbox \"auto\" in .anima/config.json; \"off\" to hide this)")
        elif (unscoped := sandbox.unscoped()) is not None:
            self._say_once(f"agents run confined, but {sandbox.UNSCOPED}: {unscoped}")
        return problem is None

    def _say_once(self, text: str) -> None:
        if not self._said:
            self._said = True
            self._say(text)


class MilestoneSandbox:
    """The confinement of one milestone's agents, checks and setup command."""

    def __init__(self, paths: ProjectPaths, milestone_id: str, active: bool, common_dir: Path,
                 visible: tuple[Path, ...] = ()) -> None:
        """`common_dir`: the repository's shared git folder, as the human's checkout has it."""
        self.paths = paths
        self.id = milestone_id
        self.active = active
        self._common_dir = common_dir
        self._visible = (paths.root, *visible)
        #: role -> the nested repositories its running process's sandbox shows empty
        self._emptied: dict[str, _Nested] = {}

    @classmethod
    def off(cls) -> MilestoneSandbox:
        return cls(ProjectPaths(Path("/")), "", active=False, common_dir=Path("/"))

    def home(self, role: str) -> Path:
        """The private HOME of `role`'s processes (kept across restarts: its CLI's sessions)."""
        return self.paths.agent_state(self.id, role) / "home"

    def confine(self, role: str, cli_home: CliHome | None = None,
                cli_config: tuple[str, ...] = ()) -> Confine | None:
        """How to wrap a process of `role` ("developer", "acceptor", "checks", "setup"), or
        None when processes run unconfined. `cli_home` fills the private HOME with what the
        agent's CLI needs (its backend's), returning files to bind read-write; `cli_config`:
        what that CLI reads there as its user's instructions (`Backend.home_config`), which a
        reviewer's commands run the Developer's code and must not write."""
        if not self.active:
            return None
        worktree = self.paths.worktree(self.id)
        writable: list[Path] = [] if role in _READS_ONLY else [worktree]
        # Whatever writes the tree leaves its `.git` alone: pointed at a repository of its
        # own, the next agent's git, and this sandbox's binds, would follow it.
        protected = [] if role in _READS_ONLY else [worktree / ".git"]
        git = sandbox.GitAccess((), (), (), ())
        if role in _COMMITS:
            git = sandbox.git_writable(self._common_dir, admin_dir(self._common_dir, worktree),
                                       f"milestone/{self.id}",
                                       self.paths.agent_objects(self.id),
                                       self.paths.repository_objects_view(self.id))
        extra = [Path(p) for p in os.environ.get(WRITABLE_VAR, "").split(os.pathsep) if p]
        state, home = self.paths.agent_state(self.id, role), self.home(role)
        sandbox.prepare_home(home, self._user_identity())
        rw_files = cli_home(home, Path.home()) if cli_home is not None else ()
        emptied: tuple[Path, ...] = ()
        if role in _READS_ONLY:
            # Its git config too: the Developer's code, which its commands may run, would set
            # what its later `git diff` shows.
            protected += sandbox.own_paths(home, (*sandbox.GIT_HOME, *sandbox.SHELL_HOME,
                                                      *cli_config))
            self._emptied[role] = nested = self._nested_repositories()
            emptied = tuple(worktree / rel for rel, _ in nested)
        c = sandbox.Confinement(
            cwd=worktree, home=home, tmp=state / "tmp",
            writable=(*writable, *git.writable, *extra),
            protected=(*protected, *git.protected),
            rebound=(*rw_files, *git.rebound), rebound_ro=git.rebound_ro,
            visible=self._visible, hidden=_hidden(),
            hidden_files=_hidden_files(), emptied=emptied)
        env = sandbox.environment(c)
        if role in _READS_ONLY:
            env |= reviewer_git_env(os.environ)
        return lambda argv: (sandbox.wrap(argv, c), env)

    def outdated(self, role: str) -> str | None:
        """Why `role`'s running process must start again before its next turn, or None: the
        tree it reads has a nested repository its sandbox does not show empty (made, or its
        folder replaced, since the process started)."""
        if role not in self._emptied or not self.active:
            return None
        now = self._nested_repositories()
        if now == self._emptied[role]:
            return None
        names = sorted({rel for rel, _ in now} - {rel for rel, _ in self._emptied[role]})
        return ("its sandbox shows empty the submodules with a repository of their own in the "
                f"tree{': ' + ', '.join(names) if names else ''} (they changed since it started)")

    def _nested_repositories(self) -> _Nested:
        """The worktree's submodules that hold a repository of their own (a `.git` of any
        kind), each with its folder's identity (a folder made anew is another one, which an
        earlier sandbox does not cover): a `git status` or `git diff` in the tree runs git
        there, with that repository's filters, fsmonitor and hooks, which are the
        Developer's. A submodule's folder reached through a link is left: git goes through
        none. Read from the index, which a reviewer cannot write."""
        worktree = self.paths.worktree(self.id)
        real = os.path.realpath(worktree)
        found = []
        for rel in self._project_repo.worktree_repo(worktree).gitlinks():
            folder = worktree / rel
            if os.path.realpath(folder) != os.path.join(real, rel) or \
                    not os.path.lexists(folder / ".git"):
                continue
            with contextlib.suppress(OSError):
                st = folder.stat()
                found.append((rel, (st.st_dev, st.st_ino)))
        return tuple(found)

    @functools.cached_property
    def _project_repo(self) -> GitRepo:
        """The project's repository, opened once (a `git rev-parse`): asked before each of
        the reviewer's turns."""
        return GitRepo.open(self.paths.root)

    def _user_identity(self) -> tuple[str | None, str | None]:
        """The human's git identity, for the agents' private global config (their commits
        look as they did without the sandbox): the same cached read Anima's own commits use."""
        try:
            found = dict(human_config(self.paths.root).identity)
        except GitError:
            found = {}
        return found.get("user.name"), found.get("user.email")


def _hidden_files() -> tuple[Path, ...]:
    home = [Path.home() / name for name in _HIDDEN_FILES_IN_HOME]
    from_env = [Path(os.environ[var]) for var in _HIDDEN_SOCKETS_FROM_ENV
                if os.path.isabs(os.environ.get(var, ""))]
    return tuple(p for p in (*home, *map(Path, _HIDDEN_SOCKETS), *from_env)
                 if p.exists() and not p.is_dir())


def _hidden() -> tuple[Path, ...]:
    home = Path.home()
    from_env = [Path(os.environ[var], name) for var, name in _HIDDEN_FROM_ENV
                if os.path.isabs(os.environ.get(var, ""))]
    return tuple(p for p in (*_HIDDEN, *from_env, *(home / name for name in _HIDDEN_IN_HOME))
                 if p.is_dir())


class BranchEpoch:
    """How many milestone branches were made while agents run. The sandbox protects the
    branch refs that exist when an agent starts; a Developer confined before the newest one
    is restarted (on its session) before its next turn, so that branch is protected from it
    too. Shared by the runs of one engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    @property
    def value(self) -> int:
        with self._lock:
            return self._value

    def bump(self) -> None:
        with self._lock:
            self._value += 1
