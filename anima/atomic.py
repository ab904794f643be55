"""Files Anima keeps: atomic writes (a reader sees the old file or the new one, never half of
either), and reads that never block on (nor write through) what an agent put in a file's
place."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # `anima status`'s fast path reads files without loading pydantic
    from pydantic import BaseModel


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Write via a temp file in the same directory, fsync it, rename over, fsync the dir.
    Not `durable`: no fsync (a file derived from others, rebuilt at start after a power cut);
    a reader still sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def create_atomic(path: Path, data: bytes) -> None:
    """Make `path` a new file holding `data`, or raise FileExistsError: a reader sees no file
    or all of it, and of two writers making the same name at once exactly one does (a
    rename would let the second replace the first's)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_model_atomic(path: Path, model: BaseModel) -> None:
    write_text_atomic(path, model.model_dump_json(indent=2) + "\n")


def no_link_above(root: Path, rel: str) -> bool:
    """Whether the folders between `root` and `rel` are real folders, no link among them. An
    agent writes its worktree: a folder there that it made a link to your checkout would
    have Anima, unconfined, delete or write your file through it."""
    parent = os.path.realpath((root / rel).parent)
    return Path(parent) == Path(os.path.realpath(root)) / Path(rel).parent


def open_regular(path: str | Path, dir_fd: int | None = None, *, follow: bool = True
                 ) -> BinaryIO:
    """A regular file, opened to read (`path` in the folder `dir_fd`, if given). The agents
    share the tree: a FIFO where Anima expects a file would hang the read, a link to
    /dev/zero would never end it; both are an OSError here, like a missing file (and so is
    a link, unless `follow`). A folder opens too: it is refused before a file object would
    take the descriptor (which fails, and leaves it open)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int = -1) -> bytes:
    """A regular file's bytes (the first `limit`), opened as `open_regular` does."""
    with open_regular(path) as fh:
        return fh.read(limit)
