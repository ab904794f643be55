"""Git's own files that a killed git or an agent's shell left broken, and who may mend them.

A `git` killed mid-command (with a dead Anima, or by an agent whose turn ended) leaves
`index.lock`, `HEAD.lock` or a ref's `.lock`; every later git command that writes then fails
with "File exists". A lock is stale only when no git process works in the repository. The
Developer's shell can also write its worktree's own git folder by hand: a HEAD it deleted
makes git see no repository there at all, an index it overwrote makes every command fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from anima import procfs
from anima.atomic import open_regular, read_regular

# Lock files git writes directly in its directory (refs' locks live under refs/).
_TOP_LOCKS = ("index.lock", "HEAD.lock", "ORIG_HEAD.lock", "config.lock", "packed-refs.lock",
              "shallow.lock")


#: Git's options before the command that take the next word as their value.
_VALUE_OPTIONS = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace",
                            "--config-env", "--super-prefix"})
#: Commands that only read, so they hold no lock: an editor keeps `cat-file --batch` running
#: in your checkout, a `git log` waits in its pager, the fsmonitor daemon runs for hours.
READERS = frozenset({"cat-file", "log", "show", "diff", "blame", "grep", "rev-list",
                      "rev-parse", "ls-files", "ls-tree", "for-each-ref", "shortlog", "describe",
                      "name-rev", "merge-base", "show-ref", "check-ignore", "check-attr",
                      "fsmonitor--daemon", "credential-cache--daemon", "help", "version"})


def git_command(argv: list[str]) -> str:
    """The git command an argv runs (`git -C x -c k=v log` runs `log`)."""
    words = iter(argv[1:])
    for word in words:
        if word in _VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def git_processes(root: Path) -> list[int]:
    """Live `git` processes working in this repository (cwd inside it) that may write it:
    not those that only read."""
    found = []
    for pid in procfs.pids():
        # argv[0] first, undecoded: this scans every process of the machine after each turn
        raw = procfs.cmdline_bytes(pid)
        if os.path.basename(raw.lstrip(b"\0").partition(b"\0")[0]) == b"git" \
                and git_command(procfs.decode_cmdline(raw)) not in READERS \
                and procfs.alive(pid) and procfs.in_tree(pid, root):
            found.append(pid)
    return found


def wait_for_git(root: Path, timeout: float) -> list[int]:
    """Let git commands still writing the repository finish; returns those still there
    after `timeout` (a human's long git command, most likely), which are left alone. One
    that is stopped (held with the agent that started it, or by a terminal's Ctrl-Z) cannot
    finish meanwhile, and is not waited for."""
    deadline = time.monotonic() + timeout
    while (found := git_processes(root)) and time.monotonic() < deadline \
            and not all(procfs.stopped(pid) for pid in found):
        time.sleep(0.05)
    return found


def clear_stale_locks(root: Path, git_dir: Path) -> list[str]:
    """Remove git's lock files when no git process works here; returns them, relative to
    the git directory. Call `wait_for_git` first. A worktree's git folder is the
    Developer's to write: its `refs` made a link to your checkout would have every `*.lock`
    there deleted, so a linked `refs` is not entered (nor are links below it)."""
    found = [git_dir / name for name in _TOP_LOCKS if (git_dir / name).exists()]
    if (refs := git_dir / "refs").is_dir() and not refs.is_symlink():
        found += sorted(refs.rglob("*.lock"))
    if not found or git_processes(root):
        return []
    for lock in found:
        if lock.is_dir() and not lock.is_symlink():  # made by hand: git never makes one
            shutil.rmtree(lock, ignore_errors=True)
        lock.unlink(missing_ok=True)
    return [str(lock.relative_to(git_dir)) for lock in found]


def worktree_git_dir(worktree: Path) -> Path:
    """The git folder a worktree's `.git` file names: the one a program started in the tree
    (an agent's CLI) reads. Anima's own git never uses it (`admin_dir`). OSError when there
    is none, or it is no regular file (a FIFO would hang the read), or names no folder as git
    reads it (`gitdir: <path>`)."""
    text = read_regular(worktree / ".git", 4096).decode(errors="replace").strip()
    if not text.startswith("gitdir:"):
        raise OSError(f"{worktree / '.git'} names no git folder")
    return Path(os.path.realpath(worktree / text.removeprefix("gitdir:").strip()))


def admin_dir(common_dir: Path, worktree: Path) -> Path:
    """A linked worktree's own git folder (`worktrees/<name>/`), found from the repository's
    side: the one whose `gitdir` names `worktree`. Never from the worktree's `.git` file,
    which whatever writes the tree could point at a repository of its own (refs, objects, a
    "reflog folder" that is your `.git/hooks`). FileNotFoundError when none does."""
    wanted = os.path.realpath(worktree)
    with contextlib.suppress(OSError):
        for admin in sorted((common_dir / "worktrees").iterdir()):
            with contextlib.suppress(OSError):
                named = (admin / "gitdir").read_text(encoding="utf-8").strip()
                # (relative to the admin folder with `worktree.useRelativePaths`)
                if os.path.realpath(admin / os.path.dirname(named)) == wanted:
                    return admin
    raise FileNotFoundError(f"{worktree} is not a worktree of {common_dir.parent}")


def worktree_common_dir(git_dir: Path) -> Path:
    """The repository's shared git folder, from a worktree's own (`worktree_git_dir`)."""
    text = (git_dir / "commondir").read_text(encoding="utf-8").strip()
    return Path(os.path.realpath(git_dir / text))


def remove_links(common_dir: Path, git_dir: Path | None, branch: str) -> list[str]:
    """Remove every symbolic link and special file in the parts of git's folder a confined
    Developer writes (its worktree's own `git_dir`, its branch's ref and reflog folders);
    returns them, relative to `common_dir`. Git makes neither there, and it writes some files
    by opening them: a commit's message (`COMMIT_EDITMSG`, truncated), the reflogs (appended
    to). Through a link, Anima's unconfined git would write the file it names, outside the
    sandbox (`~/.bashrc`); a FIFO would hang it."""
    parent = branch.rpartition("/")[0]
    folders = [common_dir / "refs" / "heads" / parent,
               common_dir / "logs" / "refs" / "heads" / parent]
    worktrees = Path(os.path.realpath(common_dir / "worktrees"))
    if git_dir is not None and Path(os.path.realpath(git_dir)).parent == worktrees:
        folders.append(git_dir)  # (where a forged `.git` file points, nothing is removed)
    found = []
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):  # a link to a folder: not entered
            for name in [*dirnames, *filenames]:
                path = Path(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    mode = path.lstat().st_mode
                    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                        path.unlink()
                        found.append(os.path.relpath(path, common_dir))
    return found


#: What git reads in each folder of the work tree it walks, opened unasked (`status`, `add`,
#: `checkout`, `stash`): a FIFO's open waits for a writer, so git would wait for ever.
READ_IN_EVERY_FOLDER = frozenset({".gitignore", ".gitattributes"})


def remove_special_rule_files(tree: Path, git_dir: Path) -> list[str]:
    """Remove every `.gitignore` and `.gitattributes` of the work tree that is neither a
    regular file nor a link (a FIFO, a socket, a device: git makes none, nor can one be
    committed), and what git would wait on, or read for ever, in a nested repository
    (`_clear_nested_git`); returns them, relative to `tree`. Links to rule files stay: git
    opens those without following them. `git_dir`: the worktree's own git folder, where a
    submodule's repository lives."""
    found: list[str] = []
    folders = [tree]
    while folders:
        folder = folders.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                if entry.name == ".git":
                    if folder != tree:  # (the worktree's own: Anima's git never reads it)
                        found += _clear_nested_git(tree, git_dir, Path(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.name in READ_IN_EVERY_FOLDER and not (
                        entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    found.append(os.path.relpath(entry.path, tree))
    return sorted(found)


def _clear_nested_git(tree: Path, git_dir: Path, dot_git: Path) -> list[str]:
    """git takes a folder holding `.git` for a nested repository once it has read that
    repository's `HEAD` and `commondir`, in every walk of the tree, and an `add` reads the ref
    `HEAD` names: a FIFO there waits for a writer, a link may lead to one or to /dev/zero.
    git makes neither in its folder (but a symbolic ref's link, `refs/…`): they go. A `.git`
    file or link leads git elsewhere: its folder is cleared the same way when it lies in the
    tree or in the worktree's git folder (a submodule's), else the `.git` itself goes."""
    where = dot_git
    if dot_git.is_symlink() or not dot_git.is_dir():
        try:
            text = read_regular(dot_git, 4096).decode() if not dot_git.is_symlink() else ""
        except (OSError, UnicodeDecodeError):
            text = ""
        target = text.strip().removeprefix("gitdir:").strip() if text.startswith("gitdir:") \
            else os.readlink(dot_git) if dot_git.is_symlink() else ""
        where = Path(os.path.realpath(dot_git.parent / target)) if target else dot_git
        if not (where.is_dir() and any(where.is_relative_to(os.path.realpath(root))
                                       for root in (tree, git_dir))):
            if target:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(dot_git)
                return [os.path.relpath(dot_git, tree)]
            return []
    found = []
    for folder, dirs, files in os.walk(where):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            if path.is_symlink():
                with contextlib.suppress(OSError):
                    if os.readlink(path).startswith("refs/"):
                        continue
            elif path.is_dir() or path.is_file():
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            found.append(os.path.relpath(path, tree))
    return found


@dataclass
class Mended:
    """What `mend_worktree_state` found and did in a worktree's own git folder."""

    #: What was mended, for the round's notes and the log.
    notes: list[str] = field(default_factory=list)
    #: What only a hand writes (git never does): the round that left it is rejected for it.
    forged: list[str] = field(default_factory=list)
    #: The index was set aside: make it again from HEAD (`git reset`: the files stay as they
    #: are, only what was staged is forgotten).
    reindex: bool = False


def mend_worktree_state(git_dir: Path, branch: str,
                        names_commit: Callable[[str], bool]) -> Mended:
    """A worktree's HEAD that is gone, or holds neither a branch nor a commit (which git
    takes for no repository at all), is pointed at `branch` again; an index git cannot read
    is set aside. Call once no git runs here (`wait_for_git`). `names_commit`: whether a
    hash is a commit's, asked only once HEAD reads as one."""
    mended = Mended()
    head = git_dir / "HEAD"
    if not head.is_file() or head.is_symlink():
        _point_head(head, branch)
        mended.notes.append(f"the worktree's HEAD was gone (git saw no repository there); "
                            f"Anima pointed it at {branch} again")
    elif not _head_git_writes(head, names_commit):
        _point_head(head, branch)
        mended.forged.append(f"the worktree's HEAD was written by hand, naming no branch or "
                             f"commit (git saw no repository there); Anima pointed it at "
                             f"{branch} again")
    index = git_dir / "index"
    if os.path.lexists(index) and not _readable_index(index):
        aside = set_index_aside(git_dir)
        mended.notes.append(f"the worktree's index could not be read (kept as {aside}); "
                            "Anima made it again from HEAD, the files are as they were")
        mended.reindex = True
    return mended


def set_index_aside(git_dir: Path) -> str:
    """Move a worktree's index out of git's way, kept; returns its new name."""
    index = git_dir / "index"
    aside = index.with_name(f"index.broken-{int(time.time())}")
    index.rename(aside)
    return aside.name


def _point_head(head: Path, branch: str) -> None:
    if head.is_dir() and not head.is_symlink():
        shutil.rmtree(head)
    head.unlink(missing_ok=True)
    head.write_text(f"ref: refs/heads/{branch}\n", encoding="utf-8")


_HEAD_FILE = re.compile(rb"ref: refs/heads/(\S+)\n?|([0-9a-f]{40}|[0-9a-f]{64})\n?")
#: What `git check-ref-format` refuses in a branch name.
_BAD_REF_NAME = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^/|/$|\.$|^@$|"
                           r"(^|/)\.|\.lock(/|$)")


def _head_git_writes(head: Path, names_commit: Callable[[str], bool]) -> bool:
    """Whether HEAD reads as git writes it: one of its branches, or a commit (detached)."""
    try:
        found = _HEAD_FILE.fullmatch(read_regular(head, 200))
    except OSError:
        return False
    if found is None:
        return False
    if found.group(1) is not None:
        return _BAD_REF_NAME.search(found.group(1).decode(errors="replace")) is None
    return names_commit(found.group(2).decode())


_REF_FILE = re.compile(rb"(?:[0-9a-f]{40}|[0-9a-f]{64})\n?|ref: (refs/\S+)\n?")


def mend_branch_ref(common_dir: Path, branch: str) -> str | None:
    """How the Developer left its branch's loose ref file, when not as a commit: "" when git
    could not read it (empty, say: a write stopped halfway, or garbage written by hand; a
    link there is none git makes), and it is removed (git then reads the branch from
    `packed-refs`, or as missing); the ref it names when it is a symbolic ref, for the
    caller to deal with. None: a commit, or no loose file. No git runs."""
    path = common_dir / "refs" / "heads" / branch
    if not (path.is_symlink() or path.is_file()):
        return None
    try:
        data = b"" if path.is_symlink() else read_regular(path, 200)
    except OSError:
        data = b""
    if (found := _REF_FILE.fullmatch(data)) is None:
        path.unlink()
        return ""
    return found.group(1).decode() if found.group(1) else None


#: Larger than any index git writes (one of millions of files is a few hundred MB). A bigger
#: one is made by hand, perhaps sparse: read whole, it would take all Anima's memory.
_MAX_INDEX_BYTES = 2 << 30


def _readable_index(path: Path) -> bool:
    """Whether git can read this index: its signature, a known version and its checksum
    (SHA-1 or SHA-256; all zeros where git was told to skip it), hashed as it is read."""
    try:
        fh = open_regular(path, follow=False)
    except OSError:
        return False
    with fh:
        st = os.fstat(fh.fileno())
        if not 32 <= st.st_size <= _MAX_INDEX_BYTES:
            return False
        header = fh.read(8)
        if header[:4] != b"DIRC" or int.from_bytes(header[4:8], "big") not in (2, 3, 4):
            return False
        for algorithm, width in (("sha1", 20), ("sha256", 32)):
            fh.seek(0)
            digest, left = hashlib.new(algorithm), st.st_size - width
            while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
                digest.update(chunk)
                left -= len(chunk)
            if fh.read(width) in (bytes(width), digest.digest()):
                return True
    return False
