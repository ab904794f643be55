"""A milestone's worker waiting on one of Anima's own git commands is never silent, and a stop
reaches it there.

Git can block for good in a command of Anima's: a FIFO where it opens a file (an agent's
`.git/info/exclude`), a stuck filesystem. While a milestone's loop runs (`watching`), each git
command its thread runs is watched (`watched`): one still running after `SLOW_GIT_SECONDS` is
named once in the milestone's log, and a stop (the human's Stop now, `anima stop`, a shutdown)
ends it when it only reads. Git removes its own lock files when it is terminated (SIGTERM, and
SIGKILL only if it has not gone `_TERM_GRACE` later: that one can leave a lock, which the next
round's `clear_stale_locks` removes), so ending `status` or `diff`, which hold `index.lock` to
refresh the index, leaves the repository as it was. **Choice:** a command that writes (commit,
merge, switch, reset, stash, update-ref…) is waited for, stop or not: ended half way it could
leave a tree half switched or a merge half written, which is worse than a stop that waits; the
log says so when it runs long.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anima.errors import GitStopped
from anima.git.locks import READERS, git_command

#: How long one of Anima's git commands runs before the milestone's log names it.
SLOW_GIT_SECONDS = 60.0
#: Commands a stop ends: they only read, but for the index git refreshes under its own lock.
_STOPPABLE = READERS | {"status", "diff-files", "diff-index", "diff-tree"}
#: A stop ends a command once it has run this long: the worker's clean-up after a stop runs
#: git too, and must not be cut short (a blocked one is still ended).
_STOP_GRACE = 2.0
#: A git that a stop terminated and that still runs this much later is killed.
_TERM_GRACE = 2.0
_POLL = 0.1

_local = threading.local()


@dataclass(frozen=True)
class _Watch:
    stop: threading.Event
    log: Callable[[str], None]


@contextlib.contextmanager
def watching(stop: threading.Event, log: Callable[[str], None]) -> Iterator[None]:
    """Watch the calling thread's git commands (a milestone's worker) for the block: `log`
    says which runs long, `stop` ends one that only reads."""
    previous = getattr(_local, "watch", None)
    _local.watch = _Watch(stop, log)
    try:
        yield
    finally:
        _local.watch = previous


@contextlib.contextmanager
def watched(proc: subprocess.Popen[Any], args: Sequence[str], where: Path) -> Iterator[None]:
    """The block waits for `proc`, Anima's `git args` in `where`; GitStopped after it when a
    stop ended the command. Outside `watching`, nothing is watched."""
    watch: _Watch | None = getattr(_local, "watch", None)
    if watch is None:
        yield
        return
    monitor = _Monitor(proc, git_command(["git", *args]), where, watch)
    thread = threading.Thread(target=monitor.run, name="git-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        monitor.done.set()
        thread.join()
        if monitor.ended:
            raise GitStopped(f"the stop ended git {monitor.command} in {where}")


class _Monitor:
    """One git command's watch, on a thread of its own while the worker waits for it."""

    def __init__(self, proc: subprocess.Popen[Any], command: str, where: Path,
                 watch: _Watch) -> None:
        self.proc, self.command, self.where, self.watch = proc, command, where, watch
        self.done = threading.Event()  # the worker has its result
        self.ended = False  # a stop ended it

    def run(self) -> None:
        stoppable = self.command in _STOPPABLE
        started = time.monotonic()
        said = False
        while not self.done.wait(_POLL):
            ran = time.monotonic() - started
            if not said and ran >= SLOW_GIT_SECONDS:
                said = True
                self.watch.log(
                    f"git {self.command} in {self.where} has run for {SLOW_GIT_SECONDS:g} s; "
                    "Anima waits for it" + (" (a stop ends it)" if stoppable else
                                            " (a stop waits for it too: ended half way, it "
                                            "could leave the repository half changed)"))
            if stoppable and ran >= _STOP_GRACE and self.watch.stop.is_set():
                self.ended = True
                self._end()
                return

    def _end(self) -> None:
        """SIGTERM, on which git removes its lock files; SIGKILL if it is still there later."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        if not self.done.wait(_TERM_GRACE):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
