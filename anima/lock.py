"""One Anima per project: `.anima/anima.lock`, guarded by a kernel `flock`.

Why both a flock and a pid record: the flock is the truth (the kernel drops it when the holder
dies, even on SIGKILL, so a stale file never blocks anyone), and the JSON record
`{"pid", "host", "started_at", "command"}` tells a human *who* holds it.

How the file is written: the path never shows half a record. A new lock is written into a temp
file, flocked, then hard-linked into place (atomic create-if-absent); a stale lock is taken over
by flocking the old file first (so only one taker wins), then renaming a fresh, already-flocked
temp file over it. Anyone who opened an inode that is no longer the one at the path re-checks
(inode comparison) before believing its flock.

The lock file descriptor is close-on-exec (Python's default), so `claude` and git children never
inherit it; a child forked *without* exec shares it and keeps the lock alive while it lives, and
its `release()` leaves the parent's lock alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from anima.errors import LockError, ProjectError

log = logging.getLogger(__name__)

# How long acquire() keeps retrying while the flock is busy but no live holder is recorded
# (another Anima mid-takeover, or a `holder()` probe): long enough for those, short for a user.
_BUSY_RETRY_SECONDS = 0.5
_RETRY_STEP = 0.02
_MAX_RACE_RETRIES = 50


@dataclass(frozen=True)
class LockInfo:
    """Who holds (or held) a project's lock, as recorded in the lock file."""

    pid: int
    host: str
    started_at: str
    command: str

    @classmethod
    def from_json(cls, text: str) -> LockInfo | None:
        """Parse a lock record; None for anything that is not a complete one (garbage, empty)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        pid = data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        return cls(
            pid=pid,
            host=str(data.get("host", "")),
            started_at=str(data.get("started_at", "")),
            command=str(data.get("command", "")),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    def describe(self) -> str:
        """`pid 123 on host, since …, `anima run …``, for messages."""
        parts = f"pid {self.pid} on {self.host or 'an unknown host'}"
        if self.started_at:
            parts += f", since {self.started_at}"
        if self.command:
            parts += f", `{self.command}`"
        return parts


def _pid_alive(pid: int) -> bool:
    """True if a process with this pid exists on this host (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_local(info: LockInfo) -> bool:
    return info.host == socket.gethostname()


def _try_flock(fd: int, mode: int) -> bool | None:
    """True: got it; False: someone holds a conflicting lock; None: flock unsupported here."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    return True


def _read_fd(fd: int) -> str:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _same_file(fd: int, path: Path) -> bool:
    """Is the inode behind fd still the one at path? (False if the path is gone.)"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _project_of(path: Path) -> Path:
    return path.parent.parent if path.parent.name == ".anima" else path


class ProjectLock:
    """Exclusive right to drive one project, held for the life of this process.

    `acquire()` raises `LockError` while a live Anima holds the lock and takes over a lock left
    by a dead one (logged, and kept in `taken_over_from`). One holder per process: a second
    `ProjectLock` on the same path in the same process is refused like any other holder.
    """

    def __init__(self, path: Path, command: str = "anima") -> None:
        self.path = Path(path)
        self.command = command
        self.taken_over_from: LockInfo | None = None
        self._fd: int | None = None
        self._owner_pid: int | None = None
        self._mutex = threading.Lock()

    # -- public API ---------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        """True while this object holds the lock (in the process that acquired it)."""
        return self._fd is not None and self._owner_pid == os.getpid()

    def acquire(self) -> None:
        """Take the lock, or raise LockError naming the live holder. No-op if already held."""
        with self._mutex:
            if self.held:
                return
            if not self.path.parent.is_dir():
                raise ProjectError(
                    f"{self.path.parent} does not exist; is {_project_of(self.path)} an Anima "
                    "project (`anima init`)?"
                )
            info = LockInfo(
                pid=os.getpid(),
                host=socket.gethostname(),
                started_at=datetime.now(UTC).astimezone().isoformat(timespec="seconds"),
                command=self.command,
            )
            self._fd = self._take(info)
            self._owner_pid = os.getpid()

    def release(self) -> None:
        """Give the lock up; the file is removed only if it is still ours.

        In a child forked from the holder this only closes the child's copy of the descriptor:
        unlocking there would drop the parent's lock (flock belongs to the shared open file).
        """
        with self._mutex:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            try:
                if self._owner_pid == os.getpid():
                    # Nobody can replace the file while we hold its flock, so check-then-unlink
                    # is safe; if someone deleted and re-created it, it is theirs: leave it.
                    if _same_file(fd, self.path):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.path)
                    else:
                        log.warning("%s is no longer our lock file; leaving it alone", self.path)
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
                self._owner_pid = None

    def holder(self) -> LockInfo | None:
        """The live holder (possibly this process), or None if the project is free.

        A lock whose flock is held but whose record cannot be read yields a LockInfo with
        pid 0 ("held by an unidentified process").
        """
        for _ in range(_MAX_RACE_RETRIES):
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                got = _try_flock(fd, fcntl.LOCK_SH)
                if got is None:  # no flock on this file system: trust the pid record
                    info = LockInfo.from_json(_read_fd(fd))
                    return info if info is not None and self._record_alive(info) else None
                if got:
                    if _same_file(fd, self.path):
                        return None
                    continue  # replaced under us: look again
                info = self._read_busy(fd)
                if info is None:
                    if not _same_file(fd, self.path):
                        continue
                    return LockInfo(pid=0, host="", started_at="", command="")
                return info
            finally:
                os.close(fd)
        return None

    def __enter__(self) -> ProjectLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _record_alive(info: LockInfo) -> bool:
        """Without a flock to ask, a record is alive if its pid lives here (or is elsewhere)."""
        return not _is_local(info) or _pid_alive(info.pid)

    @staticmethod
    def _read_busy(fd: int) -> LockInfo | None:
        """Read the record of a flocked file, allowing a moment for a writer in flight."""
        deadline = time.monotonic() + _BUSY_RETRY_SECONDS
        while True:
            info = LockInfo.from_json(_read_fd(fd))
            if info is not None or time.monotonic() >= deadline:
                return info
            time.sleep(_RETRY_STEP)

    def _refuse(self, info: LockInfo | None) -> LockError:
        project = _project_of(self.path)
        if info is None:
            return LockError(
                f"{project} is locked by another process ({self.path} is held but unreadable); "
                "stop it first"
            )
        who = info.describe()
        if info.pid == os.getpid() and _is_local(info):
            who += ", this very process"
        return LockError(f"{project} is being driven by Anima ({who}); stop it first")

    def _take(self, info: LockInfo) -> int:
        """Loop until we own the inode at the path, or a live holder is found."""
        busy_since: float | None = None
        for _ in range(_MAX_RACE_RETRIES * 10):
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                fd_new = self._create(info)
                if fd_new is not None:
                    return fd_new
                continue  # someone created it first: look at theirs
            try:
                got = _try_flock(fd, fcntl.LOCK_EX)
                if got is None:
                    old = LockInfo.from_json(_read_fd(fd))
                    if old is not None and self._record_alive(old):
                        raise self._refuse(old)
                elif not got:
                    old = LockInfo.from_json(_read_fd(fd))
                    if old is not None and self._record_alive(old):
                        raise self._refuse(old)
                    # Busy but no live holder on record: a taker mid-swap or a probe. Wait a bit.
                    now = time.monotonic()
                    busy_since = busy_since if busy_since is not None else now
                    if now - busy_since >= _BUSY_RETRY_SECONDS:
                        raise self._refuse(old)
                    time.sleep(_RETRY_STEP)
                    continue
                if not _same_file(fd, self.path):
                    continue  # released or replaced between our open and our flock
                old = LockInfo.from_json(_read_fd(fd))
                new_fd = self._replace(info)  # old fd closes below, after the swap
                self._log_takeover(old)
                return new_fd
            finally:
                os.close(fd)
        raise LockError(f"could not lock {self.path}: it keeps changing under us")

    def _log_takeover(self, old: LockInfo | None) -> None:
        self.taken_over_from = old
        if old is None:
            log.warning("%s held no valid record; taking it over", self.path)
        else:
            log.warning("taking over the stale lock %s (%s is gone)", self.path, old.describe())

    def _temp_locked(self, info: LockInfo) -> tuple[int, str]:
        """A temp file next to the lock, holding the full record, flocked, fsynced."""
        fd, tmp = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        try:
            os.fchmod(fd, 0o644)  # readable like any other file; mkstemp makes it 0600
            os.write(fd, info.to_json().encode("utf-8"))
            os.fsync(fd)
            if _try_flock(fd, fcntl.LOCK_EX) is False:  # cannot happen: nobody knows the name
                raise LockError(f"could not lock a fresh temp file {tmp}")
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return fd, tmp

    def _create(self, info: LockInfo) -> int | None:
        """Publish a new lock atomically if none exists; None if someone beat us to it."""
        fd, tmp = self._temp_locked(info)
        try:
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                os.close(fd)
                return None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOTSUP):
                    os.close(fd)
                    raise
                os.close(fd)
                return self._create_exclusive(info)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._fsync_dir()
        return fd

    def _create_exclusive(self, info: LockInfo) -> int | None:
        """Fallback for file systems without hard links: O_EXCL create, then write in place."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        _try_flock(fd, fcntl.LOCK_EX)
        os.write(fd, info.to_json().encode("utf-8"))
        os.fsync(fd)
        self._fsync_dir()
        return fd

    def _replace(self, info: LockInfo) -> int:
        """Swap our record in over a stale lock whose flock we hold (rename is atomic)."""
        fd, tmp = self._temp_locked(info)
        try:
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_dir()
        return fd

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
