"""One Anima per project: a kernel `flock` on the permanent `.anima/anima.flock`.

The kernel drops a flock when its holder dies, even on SIGKILL, and the file is never replaced,
so every process flocks the same inode: no stale lock, no takeover race. The record beside it,
`.anima/anima.lock` (pid, host, started_at, command; written atomically), only names the holder
for humans. The descriptor is close-on-exec: `claude` and git never inherit the lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from anima import procfs
from anima.atomic import read_regular, write_text_atomic
from anima.errors import LockError, ProjectError

log = logging.getLogger(__name__)
_BUSY_SECONDS = 0.5  # a busy lock naming no live holder: a holder writing its record, a probe


@dataclass(frozen=True)
class LockInfo:
    """Who holds (or held) a project's lock, as recorded beside it."""

    pid: int
    host: str
    started_at: str
    command: str

    @classmethod
    def from_json(cls, text: str) -> LockInfo | None:
        """The record, or None for anything that is not a complete one (garbage, empty)."""
        with contextlib.suppress(ValueError, TypeError, KeyError):
            data, fields = json.loads(text), ("host", "started_at", "command")
            if type(data["pid"]) is int and data["pid"] > 0:
                return cls(data["pid"], *(str(data.get(k, "")) for k in fields))
        return None

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    def describe(self) -> str:
        """`pid 123 on host, since …, `anima run …``, for messages."""
        return f"pid {self.pid} on {self.host or 'an unknown host'}" + \
            (f", since {self.started_at}" if self.started_at else "") + \
            (f", `{self.command}`" if self.command else "")

    def alive(self) -> bool:  # on another host we cannot tell: assume so
        return self.host != socket.gethostname() or procfs.alive(self.pid)


class ProjectLock:
    """Exclusive right to drive one project, held until `release()` (or this process dies).
    `acquire()` refuses a live holder (even another `ProjectLock` here), naming it."""

    def __init__(self, path: Path, command: str = "anima") -> None:
        self.path = Path(path)
        self.flock_path = self.path.with_suffix(".flock")
        self.command = command
        self.taken_over_from: LockInfo | None = None
        self._fd: int | None = None
        self._owner_pid: int | None = None
        self._since = ""

    @property
    def held(self) -> bool:
        """True while this object holds the lock (in the process that acquired it)."""
        return self._fd is not None and self._owner_pid == os.getpid()

    def acquire(self) -> None:
        """Take the lock, or raise LockError naming the live holder. No-op if already held."""
        if self.held:
            return
        if not self.path.parent.is_dir():
            raise ProjectError(f"{self.path.parent} does not exist; is {self.path.parent.parent} "
                               "an Anima project (`anima init`)?")
        fd = os.open(self.flock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + _BUSY_SECONDS
        while not _flock(fd, fcntl.LOCK_EX):
            holder = self._record()
            if (holder is not None and holder.alive()) or time.monotonic() > deadline:
                os.close(fd)
                raise self._refuse(holder)
            time.sleep(0.02)
        self._fd, self._owner_pid = fd, os.getpid()
        self._since = datetime.now(UTC).astimezone().isoformat(timespec="seconds")
        self.taken_over_from = old = self._record()
        if self.path.exists():
            log.warning("taking over the stale lock %s (%s is gone)", self.path,
                        old.describe() if old else "it held no valid record")
        self._write_record()

    def ensure_held(self) -> bool:
        """An agent has a shell in the project (`git clean -fdx`, `rm -rf .anima`): if the
        lock file was deleted or replaced, a second Anima could flock a new one. Take the file
        at the path again at once; True if it had to be. Raises LockError naming the holder
        if another process took it meanwhile."""
        if not self.held:
            return False
        assert self._fd is not None
        mine = os.fstat(self._fd)
        try:
            there = os.stat(self.flock_path)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            if not self.path.exists():
                self._write_record()
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.flock_path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _flock(fd, fcntl.LOCK_EX):
            os.close(fd)
            raise self._refuse(self._record())
        os.close(self._fd)
        self._fd = fd
        self._write_record()
        return True

    def _write_record(self) -> None:
        write_text_atomic(self.path, LockInfo(os.getpid(), socket.gethostname(),
                                              self._since, self.command).to_json())

    def release(self) -> None:
        """Give the lock up; in a child forked from the holder only close the shared file."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._owner_pid == os.getpid():
                self.path.unlink(missing_ok=True)  # before the unlock: never the next holder's
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._owner_pid = None

    def holder(self) -> LockInfo | None:
        """The live holder (maybe us), None if free; pid 0 if its record is unreadable."""
        try:
            fd = os.open(self.flock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if _flock(fd, fcntl.LOCK_SH):
                return None
            return self._record() or LockInfo(0, "", "", "")
        finally:
            os.close(fd)  # drops the shared flock a free lock gave us

    def _record(self) -> LockInfo | None:
        try:
            return LockInfo.from_json(read_regular(self.path).decode("utf-8", "replace"))
        except FileNotFoundError:
            return None

    def _refuse(self, holder: LockInfo | None) -> LockError:
        project = self.path.parent.parent
        if holder is None:
            return LockError(f"{project} is locked by another process ({self.path} names no "
                             "holder); stop it first")
        who = holder.describe() + (", this very process" if holder.pid == os.getpid() else "")
        return LockError(f"{project} is being driven by Anima ({who}); stop it first")

    def __enter__(self) -> ProjectLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _flock(fd: int, mode: int) -> bool:
    """Try the flock without waiting: False while another open file holds a conflicting one."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:  # ENOLCK and the like: a file system without flock
        os.close(fd)
        raise LockError(f"cannot lock this project: flock failed ({exc})") from exc
    return True
