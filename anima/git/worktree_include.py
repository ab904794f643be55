"""Copy the files a project lists in `.worktreeinclude` into a new worktree.

`git worktree add` checks out what git tracks; the files git ignores but a project needs in
every tree (`.env`, local config) are not there. `.worktreeinclude` at the repository root
lists them in `.gitignore` syntax (the convention Claude Code, Conductor, Codex and
git-worktreeinclude share). A path is copied when it matches the list AND git ignores it in
the source checkout, so a tracked file, or an untracked one git does not ignore, is never
duplicated.

One git call finds the candidates: `git ls-files --others --ignored --exclude-standard -z`.
Without `--directory` git names every ignored file on its own (an ignored folder is not
collapsed to `config/local/`, which would leave its files to a walk of our own), does not
follow symlinks, does not descend into nested repositories (those come back as one `dir/`
entry, skipped here) and leaves FIFOs out. Everything is then opened without following a
symlink at any step, on both sides: only regular files are copied (with their permission
bits), and an existing file in the target is never overwritten.

What is copied is often a secret: nothing of a file's content is ever logged, only its path.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import BinaryIO

from anima.atomic import open_regular
from anima.errors import GitError
from anima.git_options import NO_AGENT_CODE
from anima.paths import WORKTREE_INCLUDE, is_under_anima

log = logging.getLogger(__name__)


#: Every untracked file git ignores, one by one (see the module's docstring).
LS_IGNORED = ("ls-files", "--others", "--ignored", "--exclude-standard", "-z")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NEVER_PARTS = frozenset({"", ".", "..", ".git"})
# A step of the target path that is a symlink, a file, or already the file itself.
_IN_THE_WAY = frozenset({errno.EEXIST, errno.ELOOP, errno.ENOTDIR, errno.EISDIR})


def included_paths(source: Path) -> list[str]:
    """The repository-relative paths, sorted, of the files of `source` (the top folder of a
    checkout) that `.worktreeinclude` lists and git ignores: what a new worktree gets, and
    what no commit may hold. Nothing without a `.worktreeinclude` (or one that is not a regular
    file); nothing under `.git`, `.anima/` or a nested repository. GitError when git cannot
    list the ignored files."""
    if not Path(source).is_dir():
        raise GitError(f"{source} does not exist or is not a folder")
    data = _read_list(source)
    if not data:
        return []
    with tempfile.NamedTemporaryFile(prefix="anima-include-") as listed:
        listed.write(data)
        listed.flush()
        wanted = _ignored_files(source, f"--exclude-from={listed.name}")
    return sorted(p for p in wanted & _ignored_files(source) if _copyable(p))


def copy_included(source: Path, target: Path, wanted: list[str]) -> list[str]:
    """Copy into `target` (a new worktree) the files of `source` (a checkout of the same
    repository) that `.worktreeinclude` lists and git ignores (`wanted`: `included_paths`);
    return the paths copied, sorted.

    Not a symlink, a FIFO or a device, nor a file reached through a symlinked folder; a file
    that already exists in `target` is kept. A path that cannot be read is skipped; an
    OSError writing into `target` (a full disk) is raised, nothing half-written left.
    """
    if not target.is_dir():
        raise GitError(f"{target} does not exist or is not a folder")
    if not wanted:
        return []
    copied: list[str] = []
    src, dst = _Folders(source), _Folders(target)
    try:
        for rel in wanted:
            if _copy_one(src, dst, rel):
                copied.append(rel)
    finally:
        src.close()
        dst.close()
    if copied:
        log.info("Copied %d file(s) listed in %s into %s: %s", len(copied), WORKTREE_INCLUDE,
                 target, ", ".join(copied))
    return copied


def _read_list(source: Path) -> bytes | None:
    """`.worktreeinclude`'s bytes, None when there is none or it is no regular file (a link,
    a FIFO: git would follow or wait on it)."""
    path = source / WORKTREE_INCLUDE
    try:
        with open_regular(path, follow=False) as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link (ELOOP), a FIFO or a folder too
        log.info("Cannot read %s (%s); nothing is copied into worktrees", path, exc.strerror)
        return None


def _ignored_files(source: Path, *exclude: str) -> set[str]:
    """Every untracked file of `source` (relative to it) that git ignores, or (`exclude`:
    `--exclude-from=<file>`) that those patterns list, git parsing them as it parses a
    `.gitignore` (comments, escapes, negations, a BOM, CRLF)."""
    try:
        done = subprocess.run(["git", *NO_AGENT_CODE, *LS_IGNORED[:3],
                               *(exclude or ("--exclude-standard",)), "-z"], cwd=source,
                              stdin=subprocess.DEVNULL, capture_output=True, check=False,
                              start_new_session=True)
    except FileNotFoundError:
        raise GitError("git is not installed or not on PATH") from None
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise GitError(f"Cannot list the files git ignores in {source}: {detail}")
    return {os.fsdecode(p) for p in done.stdout.split(b"\0") if p}


def _copyable(rel: str) -> bool:
    """Not a nested repository (`dir/`), nothing of Anima's, nothing inside a `.git`."""
    if rel.endswith("/") or is_under_anima(rel):
        return False
    return not any(part in _NEVER_PARTS for part in rel.split("/"))


class _Folders:
    """The folders of one tree, each opened from its parent without following a symlink, so
    nothing is ever read or written through a symlinked folder."""

    def __init__(self, root: Path) -> None:
        self._fds = {"": os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def get(self, rel: str, like: _Folders | None = None) -> int:
        """The descriptor of folder `rel` ("" for the root). With `like`, a missing folder
        is made with the permission bits of `like`'s folder at the same path (a private
        `secrets/` stays private). OSError when a step is missing, a symlink or a file."""
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        parent_rel, _, name = rel.rpartition("/")
        parent = self.get(parent_rel, like)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if like is None:
                raise
            mode = (stat.S_IMODE(os.fstat(like.get(rel)).st_mode) & 0o777) | 0o700
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        self._fds[rel] = fd
        return fd


def _copy_one(src: _Folders, dst: _Folders, rel: str) -> bool:
    """Copy one regular file; False when it is not one, cannot be read, or the target
    already has something at its path."""
    folder, _, name = rel.rpartition("/")
    try:
        fin = open_regular(name, src.get(folder), follow=False)
    except OSError as exc:  # not a regular file (a link, a FIFO), or unreadable
        log.info("%s is not copied: %s", rel, exc.strerror)
        return False
    st = os.fstat(fin.fileno())
    with fin:
        try:
            dst_dir = dst.get(folder, like=src)
            os.stat(name, dir_fd=dst_dir, follow_symlinks=False)
        except FileNotFoundError:
            return _write_new(fin, st, dst_dir, name, rel)
        except OSError as exc:
            if exc.errno not in _IN_THE_WAY:
                raise
        log.info("%s is already in the worktree (or something is in its way); kept", rel)
        return False


def _write_new(fin: BinaryIO, st: os.stat_result, folder: int, name: str, rel: str) -> bool:
    """Write `fin` as `name` in `folder`, never over anything. The file has no name until it
    is whole (`O_TMPFILE`, where the file system has it): a kill halfway leaves nothing, and
    the next start copies it again (a short one would be kept for good)."""
    named = False
    try:
        try:
            out = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=folder)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            out = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=folder)
            named = True
        with os.fdopen(out, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fchmod(fout.fileno(), stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(fout.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
            if not named:
                os.link(f"/proc/self/fd/{fout.fileno()}", name, dst_dir_fd=folder)
    except BaseException as exc:
        if named:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        if not isinstance(exc, OSError) or exc.errno not in _IN_THE_WAY:
            raise
        log.info("%s is already in the worktree (or something is in its way); kept", rel)
        return False
    return True
