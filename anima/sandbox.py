"""Confine a whole agent process with bubblewrap: it sees the machine read-only and may write
only what its `Confinement` names (its milestone's worktree, the bits of `.git` a commit on its
own branch needs, a private HOME and /tmp). A prompt cannot promise that; a mount can.

Why each flag: `--cap-drop ALL`, because bwrap run by root keeps every capability and the agent
could simply remount `/` read-write; `--unshare-pid` with `--die-with-parent`, so killing the
sandbox (or Anima) kills everything started in it, background jobs included; `--new-session`,
so nothing inside can push keystrokes into the terminal Anima was started from. The network
stays shared: agents need their API. What the mounts cannot stop (abstract Unix sockets, which
have no file; signals) the Landlock scopes of `anima.landlock` stop where the kernel has them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from anima import landlock
from anima.atomic import write_text_atomic

#: Names another bubblewrap binary (the tests point it at a missing one).
BWRAP_VAR = "ANIMA_BWRAP"
NOT_INSTALLED = "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
#: What confined processes can still reach where they are not scoped (`unscoped`).
UNSCOPED = ("abstract Unix sockets outside the sandbox (an X display, which can type into your "
            "terminal) stay reachable")

# The base every sandbox (and the probe) starts from.
_BASE = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc")
_FLAGS = ("--unshare-pid", "--die-with-parent", "--new-session", "--cap-drop", "ALL")

_probe_lock = threading.Lock()
_probed: dict[str, _Probe] = {}


@dataclass(frozen=True)
class _Probe:
    #: Why bubblewrap cannot confine a process here (None: it can).
    problem: str | None
    #: Why confined processes are not also scoped by Landlock (`anima.landlock`; None: they
    #: are, so they are confined at all).
    unscoped: str | None


def _binary() -> str:
    return os.environ.get(BWRAP_VAR) or "bwrap"


def _probed_once() -> _Probe:
    """Probed once per binary: a desktop app asks often, and the answer does not change while
    it runs."""
    name = _binary()
    with _probe_lock:
        if name not in _probed:
            _probed[name] = _probe(name)
        return _probed[name]


def unavailable() -> str | None:
    """None when bubblewrap can make a sandbox here, else one sentence saying why not."""
    return _probed_once().problem


def unscoped() -> str | None:
    """None when confined processes are also scoped (no abstract socket or signal outside the
    sandbox, `anima.landlock`), else one sentence saying why not."""
    return _probed_once().unscoped


def before_exec() -> Callable[[], None] | None:
    """What the child of a confined process runs between fork and exec (asked in the parent:
    the child may only call it)."""
    return landlock.restrict if _probed_once().unscoped is None else None


def _probe(name: str) -> _Probe:
    path = shutil.which(name)
    if path is None:
        return _Probe(NOT_INSTALLED, NOT_INSTALLED)
    unscoped = landlock.unavailable()
    problem = _try(path, None if unscoped is not None else landlock.restrict)
    if problem is not None and unscoped is None and _try(path, None) is None:
        # A set-uid bubblewrap loses its privileges under Landlock's no_new_privs.
        return _Probe(None, f"bubblewrap does not start under Landlock here ({problem})")
    return _Probe(problem, unscoped if problem is None else problem)


def _try(path: str, child: Callable[[], None] | None) -> str | None:
    try:
        done = subprocess.run([path, *_BASE, *_FLAGS, "true"], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL,
                              start_new_session=True, preexec_fn=child)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap cannot create a sandbox here: {exc}"
    if done.returncode != 0:
        detail = done.stderr.strip() or f"exit status {done.returncode}"
        return f"bubblewrap cannot create a sandbox here: {detail}"
    return None


@dataclass(frozen=True)
class Confinement:
    """What one confined process may write, and what it must still see. Paths are absolute;
    `wrap` resolves them, since a mount follows symlinks anyway."""

    #: Where the process starts.
    cwd: Path
    #: A private HOME, bound read-write (its CLI state, its git identity).
    home: Path
    #: A private folder mounted at /tmp: temp files of different agents never meet.
    tmp: Path
    #: Folders and files bound read-write (the worktree, `git_writable`'s paths; none for a
    #: read-only reviewer).
    writable: tuple[Path, ...] = ()
    #: Existing paths bound read-only on top of a writable bind (other branches' ref files;
    #: the reviewer's CLI instructions and git config in its home).
    protected: tuple[Path, ...] = ()
    #: Bound read-write elsewhere, as (real path, where it appears): the CLI's login file in
    #: the private HOME; the Developer's own object store over the repository's `objects/`.
    rebound: tuple[tuple[Path, Path], ...] = ()
    #: Bound read-only elsewhere: the repository's objects, which the Developer's git reads
    #: as an alternate of its own store.
    rebound_ro: tuple[tuple[Path, Path], ...] = ()
    #: Paths shown again, read-only, although the private /tmp or a `hidden` folder covers
    #: them: the project when it lives there, the CLI's install folder.
    visible: tuple[Path, ...] = ()
    #: Folders replaced by an empty tmpfs (before `visible`): what the agent must not reach
    #: although it could only read it, e.g. the real HOME (ssh keys, tokens) or /run/user
    #: (the session bus and `systemd-run --user` would run a command outside the sandbox).
    hidden: tuple[Path, ...] = ()
    #: Files read as empty, sockets no connect reaches (`/dev/null` in their place): tokens
    #: no build needs, daemons that act as root.
    hidden_files: tuple[Path, ...] = ()
    #: Folders shown empty and read-only (a tmpfs), over every other mount: the submodules of
    #: a tree the process only reads, whose own repositories its git would run commands of.
    emptied: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        files = [p for pair in (*self.rebound, *self.rebound_ro) for p in pair]
        for path in (self.cwd, self.home, self.tmp, *self.writable, *self.protected, *files,
                     *self.visible, *self.hidden, *self.hidden_files, *self.emptied):
            if not path.is_absolute():
                raise ValueError(f"sandbox paths must be absolute: {path}")


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _through_covered(path: Path, covered: tuple[Path, ...], depth: int = 0) -> bool:
    """Whether reaching `path` follows a symlink that lies where a mount in `covered` puts
    something else (the private /tmp, a hidden folder): inside, that link is gone."""
    for prefix in (path, *path.parents):
        if prefix.is_symlink() and depth < 40:
            link = Path(_real(prefix.parent)) / prefix.name
            if _under(link, covered) or _through_covered(link.parent / os.readlink(link),
                                                         covered, depth + 1):
                return True
    return False


def _named(word: str, covered: tuple[Path, ...]) -> str:
    """`word` as the sandbox can reach it: its real path when a covered symlink is on its way
    (as the mounts resolve theirs), else as given, since a program may read its own name
    (the shell names itself `/bin/sh` in "not found")."""
    if os.path.isabs(word) and os.path.exists(word) and _through_covered(Path(word), covered):
        return _real(Path(word))
    return word


def wrap(argv: list[str], c: Confinement) -> list[str]:
    """`argv` run inside bubblewrap under `c`. Later mounts cover earlier ones, so the order
    is the policy: all read-only, private /tmp, hidden, visible again, writable, rebound,
    protected, emptied. A path `argv` names through a symlink those mounts cover (a CLI's folder
    linked under /tmp) is named by its real path."""
    c.home.mkdir(parents=True, exist_ok=True)
    c.tmp.mkdir(parents=True, exist_ok=True)
    args = [shutil.which(_binary()) or _binary(), *_BASE, "--bind", _real(c.tmp), "/tmp"]
    for path in c.hidden:
        if path.is_dir():
            args += ["--tmpfs", _real(path)]
    for path in c.hidden_files:
        if path.exists() and not path.is_dir():
            args += ["--ro-bind", os.devnull, _real(path)]
    for path in c.visible:
        if path.exists():
            args += ["--ro-bind", _real(path), _real(path)]
    for path in (*c.writable, c.home):
        if path.exists():
            args += ["--bind", _real(path), _real(path)]
    for flag, pairs in (("--ro-bind", c.rebound_ro), ("--bind", c.rebound)):
        for source, target in pairs:
            if source.exists() and target.exists():
                args += [flag, _real(source), _real(target)]
    for path in c.protected:
        if path.exists():
            args += ["--ro-bind", _real(path), _real(path)]
    for path in c.emptied:
        if path.is_dir():
            args += ["--tmpfs", _real(path), "--remount-ro", _real(path)]
    covered = (Path("/tmp"), *(Path(_real(path)) for path in c.hidden if path.is_dir()))
    named = [_named(word, covered) for word in argv]
    return [*args, "--chdir", _real(c.cwd), *_FLAGS, "--", *named]


def environment(c: Confinement) -> dict[str, str]:
    """Variables to lay over the child's environment: its tools write their config, caches
    and temp files where they can, and git reads only the private global config (an inherited
    GIT_CONFIG_GLOBAL would point at the user's)."""
    home = _real(c.home)
    return {
        "HOME": home,
        "TMPDIR": "/tmp",
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_STATE_HOME": f"{home}/.local/state",
        "GIT_CONFIG_GLOBAL": f"{home}/.gitconfig",
        "GIT_CONFIG_NOSYSTEM": "1",
    }


@dataclass(frozen=True)
class GitAccess:
    """What a worktree's git needs to commit on one branch, and nothing more."""

    writable: tuple[Path, ...]
    protected: tuple[Path, ...]
    rebound: tuple[tuple[Path, Path], ...]
    rebound_ro: tuple[tuple[Path, Path], ...]


def git_writable(common_dir: Path, admin_dir: Path, branch: str, store: Path,
                 view: Path) -> GitAccess:
    """What a worktree's git needs to commit on `branch`: new objects, the worktree's own
    admin dir (index, HEAD, its reflog) and the branch's loose ref and reflog, replacing the
    ref file by renaming `<ref>.lock` over it.

    The objects go to `store`, a store of the agent's own mounted over the repository's
    `objects/`: that one holds main's whole history, and its files can be deleted or
    rewritten (an object's name is not checked when git reads it). The repository's objects
    appear read-only at `view`, the store's alternate; Anima takes the store's objects in,
    checked, after the agent's turn (`anima.git.objects`).

    The folders holding the ref and its reflog are bound whole (a lock file must be
    creatable), so every other ref in them is protected: a rename onto a mount point fails
    (EBUSY). Unbound, hence read-only: config, hooks, packed-refs, every other ref. Also
    protected: the files that say where the repository is (`commondir`, `gitdir`; the
    worktree's `.git` is the caller's), so git run by Anima in this worktree outside the
    sandbox reads no repository the agent made up; and the worktree's own config
    (`config.worktree`, read where the repository has `extensions.worktreeConfig`), whose
    `core.worktree` would point Anima's git in this worktree at the human's checkout. Packed
    refs in those folders get a loose copy first, so they can be protected too."""
    common = Path(_real(common_dir))
    admin = Path(_real(admin_dir))
    _unpack(common, f"refs/heads/{branch}")
    for folder in (store / "info", view):
        own_dir(folder)
    write_text_atomic(store / "info" / "alternates", f"{_real(view)}\n")
    writable = [admin]
    protected: list[Path] = []
    for leaf in (common / "refs" / "heads" / branch, common / "logs" / "refs" / "heads" / branch):
        leaf.parent.mkdir(parents=True, exist_ok=True)
        writable.append(leaf.parent)
        own = {leaf.name, f"{leaf.name}.lock"}
        # A symlink cannot be a mount point (the mount would land on its target): skip them;
        # git makes none.
        protected += sorted(p for p in leaf.parent.iterdir()
                            if p.name not in own and not p.is_symlink())
    own_file(admin / "config.worktree")
    protected += [admin / "commondir", admin / "gitdir", admin / "config.worktree"]
    return GitAccess(tuple(writable), tuple(p for p in protected if p.exists()),
                     rebound=((store, common / "objects"),),
                     rebound_ro=((common / "objects", view),))


def _unpack(common: Path, ref: str) -> None:
    """Give every packed ref beside `ref` a loose copy, as git itself does before moving one
    (the loose file wins over packed-refs). A packed-only ref has no file to protect, and an
    agent could shadow it by writing one; a `git gc` packs every branch. Done under git's own
    lock file protocol, so a concurrent git never loses an update to a stale packed value."""
    folder = ref.rpartition("/")[0] + "/"
    packed = common / "packed-refs"
    try:
        lines = packed.read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        name = line.partition(" ")[2]
        if not name.startswith(folder) or name == ref or line.startswith(("#", "^")):
            continue
        path = common / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(f"{path.name}.lock")
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # git is moving it now, which leaves it loose
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(line.partition(" ")[0] + "\n")
        still_packed = line in packed.read_text(encoding="utf-8").splitlines()
        if still_packed and not os.path.lexists(path):
            os.rename(lock, path)
        else:
            os.unlink(lock)


def _gitconfig(name: str | None, email: str | None) -> str:
    def quoted(value: str) -> str:
        value = " ".join(value.splitlines())
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    user = [f"\t{key} = {quoted(value)}\n" for key, value in (("name", name), ("email", email))
            if value]
    return ("[user]\n" + "".join(user) if user else "") + "[gc]\n\tauto = 0\n"


def own_dir(path: Path) -> Path:
    """`path` as a real folder. An agent could have left a symlink there, and Anima prepares
    the home outside the sandbox: writing through it would write where the agent chose."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def own_file(path: Path) -> None:
    """`path` as a regular file (an empty one if it was not): a file bind's mount point."""
    if path.is_file() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.touch(mode=0o600)


def own_paths(home: Path, names: tuple[str, ...]) -> list[Path]:
    """`names` under `home` made as `own_dir` (a name ending in "/") or `own_file` (an empty
    one where there was none, `{}` for a `.json`: the CLI reads it, and says at every start
    that it cannot parse an empty one), to be bound read-only over themselves: a path that
    did not exist would be created through the writable home."""
    made = []
    for name in names:
        path = home / name
        own_dir(path.parent)
        if name.endswith("/"):
            own_dir(path)
        else:
            own_file(path)
            if path.suffix == ".json" and path.stat().st_size == 0:
                path.write_text("{}\n", encoding="utf-8")
        made.append(path)
    return made


#: What git reads in the private HOME (`environment`): its global config, and the attributes
#: and ignore files of `$XDG_CONFIG_HOME/git`. Bound read-only for a reviewer
#: (`MilestoneSandbox.confine`).
GIT_HOME = (".gitconfig", ".config/git/")
#: What a shell reads at its start in the private HOME (a login shell, as Codex runs each of
#: its commands, an interactive one, a non-interactive bash through BASH_ENV's usual home):
#: the Developer's code a reviewer runs (its tests) would define a `git` there that the
#: reviewer's later commands call, and show it what the Developer likes. Emptied at every
#: start; bound read-only for a reviewer (`MilestoneSandbox.confine`).
SHELL_HOME = (".profile", ".bash_profile", ".bash_login", ".bashrc", ".bash_logout",
              ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".config/fish/")


def prepare_home(home: Path, identity: tuple[str | None, str | None]) -> None:
    """Make the private HOME: a `.gitconfig` with the human's identity and no automatic gc,
    an empty `.config/git/`, no shell start-up file (`SHELL_HOME`), and nothing else (the
    user's real one may define filters or hooks that would run inside; an agent's earlier
    process, or code it ran, may have left its own). What the agent's CLI needs there is its
    backend's (`Backend.prepare_home`). Idempotent."""
    own_dir(home)
    write_text_atomic(home / ".gitconfig", _gitconfig(*identity))
    for name in (".config/git/", *SHELL_HOME):
        path = home / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
    own_dir(home / ".config" / "git")


def carry_login(real: Path, placeholder: Path) -> tuple[tuple[Path, Path], ...]:
    """A CLI's login file bound read-write over a placeholder in the private home (the CLI
    refreshes its token in place when a rename onto the bind fails); none when the user has
    no such file."""
    if not real.is_file():
        return ()
    own_file(placeholder)
    return ((real, placeholder),)
