"""Start milestones the user drops into `.anima/milestones/`, once the file is complete.

Why a debounce: editors and copies write a file in several steps (create, partial writes,
temp file + rename), and a half-written milestone must never be parsed. A candidate is reported
when its (inode, size, mtime) has not changed for `debounce` seconds. On inotify we also see
when a writer closes the file: a file modified since its last close is still being written, so
it is held back (up to `_MAX_WRITER_WAIT` of silence) even if the writer pauses longer than the
debounce.

What is reported: regular, non-empty `*.md` files whose name is not hidden (so `.x.md.swp`,
`.#x.md`, `x.md~`, `4913`, `*.tmp`, and Anima's own `.json` records are ignored), created,
saved, or moved into the folder (atomic saves via rename included). A file deleted or renamed
away before it settles is not reported; a file whose (inode, size, mtime) equals what was last
reported (a chmod, an identical replay) is not reported twice. Files already present at
`start()` are not reported: the engine scans the folder itself when it starts. Each report
carries when the file appeared (its first event), not when it settled: the queue keeps the
order in which files arrived.

If the folder does not exist yet, the nearest existing ancestor is watched until it appears;
the `.md` files found in it then are reported like new ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from anima.store.names import is_milestone_name

log = logging.getLogger(__name__)

# A file still open for writing but silent this long is reported anyway (a stuck writer).
_MAX_WRITER_WAIT = 30.0

Signature = tuple[int, int, int]  # (st_ino, st_size, st_mtime_ns)


def _signature(path: str) -> Signature | None:
    """(inode, size, mtime) of a regular file, or None if it is gone or not a file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _tracks_close(observer: BaseObserver) -> bool:
    """Only inotify reports IN_CLOSE_WRITE; elsewhere a "being written" flag would never clear."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # pragma: no cover - not Linux
        return False
    return isinstance(observer, InotifyObserver)


@dataclass
class _Pending:
    """A candidate waiting to settle."""

    sig: Signature | None
    deadline: float
    changed_at: float
    appeared: datetime
    writing: bool = False


@dataclass
class _State:
    pending: dict[str, _Pending] = field(default_factory=dict)
    reported: dict[str, Signature] = field(default_factory=dict)
    rewatch: bool = False
    rewatch_force: bool = False
    stopping: bool = False


class _Handler(FileSystemEventHandler):
    """Runs on the observer thread: only records what happened; the timer thread decides."""

    def __init__(self, watcher: MilestoneWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            self._watcher._on_event(event)
        except Exception:  # a watcher bug must not kill the observer thread
            log.exception("milestone watcher: failed to handle %r", event)


class MilestoneWatcher:
    """Watches one milestones folder and calls `on_ready(path, appeared)` for each settled
    `.md` file (`appeared`: the wall-clock time of its first event).

    `on_ready` runs on the watcher's own timer thread (never the caller's); its exceptions are
    logged and the watcher carries on. `stop()` joins every thread the watcher started.
    """

    def __init__(
        self,
        milestones_dir: Path,
        on_ready: Callable[[Path, datetime], None],
        *,
        debounce: float = 0.4,
    ) -> None:
        self._dir = os.path.abspath(milestones_dir)
        self._on_ready = on_ready
        self._debounce = debounce
        self._cond = threading.Condition()
        self._state = _State()
        self._observer: BaseObserver | None = None
        self._timer: threading.Thread | None = None
        self._watch: ObservedWatch | None = None
        self._watched_path: str | None = None
        self._track_close = False
        self._handler = _Handler(self)

    @property
    def milestones_dir(self) -> Path:
        return Path(self._dir)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Begin watching; files already in the folder are not reported."""
        if self._observer is not None:
            raise RuntimeError("MilestoneWatcher already started")
        self._state = _State()
        observer = Observer()
        observer.daemon = True
        self._observer = observer
        self._track_close = _tracks_close(observer)
        self._update_watch(report_existing=False)
        observer.start()
        self._timer = threading.Thread(
            target=self._run_timer, name="anima-milestone-watcher", daemon=True
        )
        self._timer.start()

    def stop(self) -> None:
        """Stop watching and join the observer and timer threads; pending files are dropped.

        Safe to call twice, and from inside `on_ready` (the timer thread then ends by itself).
        """
        observer, timer = self._observer, self._timer
        self._observer, self._timer = None, None
        with self._cond:
            self._state.stopping = True
            self._state.pending.clear()
            self._cond.notify_all()
        if observer is not None:
            observer.stop()
            if observer.is_alive():
                observer.join()
        if timer is not None and timer is not threading.current_thread():
            timer.join()
        self._watch = None
        self._watched_path = None

    # -- events (observer thread) -------------------------------------------------------------

    def _on_event(self, event: FileSystemEvent) -> None:
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if isinstance(event, DirDeletedEvent) and src == self._watched_path:
            # The watched directory itself is gone and its watch with it, even if a directory
            # of the same name is back by the time the timer thread looks.
            self._request_rewatch(force=True)
            return
        if self._watched_path != self._dir:
            # Waiting for the folder to appear: any directory change on the way down to it
            # means "look again".
            if isinstance(event, DirCreatedEvent | DirMovedEvent | DirDeletedEvent):
                self._request_rewatch()
            return
        if isinstance(event, FileMovedEvent):
            self._forget(src)
            if self._is_candidate(dest):
                self._touch(dest, writing=False, new_file=True)
        elif isinstance(event, FileDeletedEvent):
            self._forget(src)
        elif isinstance(event, FileCreatedEvent):
            if self._is_candidate(src):
                self._touch(src, writing=False, new_file=True)
        elif isinstance(event, FileModifiedEvent):
            if self._is_candidate(src):
                self._touch(src, writing=self._track_close)
        elif isinstance(event, FileClosedEvent) and self._is_candidate(src):
            self._touch(src, writing=False, closed=True)

    def _is_candidate(self, path: str) -> bool:
        return os.path.dirname(path) == self._dir and is_milestone_name(os.path.basename(path))

    def _touch(
        self, path: str, *, writing: bool, new_file: bool = False, closed: bool = False
    ) -> None:
        """(Re)start the settle timer of a candidate."""
        now = time.monotonic()
        sig = _signature(path)
        with self._cond:
            if self._state.stopping:
                return
            entry = self._state.pending.get(path)
            if entry is None:
                if closed and sig is not None and sig == self._state.reported.get(path):
                    return  # closed without a change since we reported it
                entry = _Pending(sig=sig, deadline=now + self._debounce, changed_at=now,
                                 appeared=datetime.now(UTC))
                self._state.pending[path] = entry
            entry.sig = sig
            entry.deadline = now + self._debounce
            entry.changed_at = now
            if new_file or closed:
                entry.writing = False
            entry.writing = entry.writing or writing
            self._cond.notify_all()

    def _forget(self, path: str) -> None:
        with self._cond:
            self._state.pending.pop(path, None)
            self._state.reported.pop(path, None)

    def _request_rewatch(self, *, force: bool = False) -> None:
        with self._cond:
            self._state.rewatch = True
            self._state.rewatch_force = self._state.rewatch_force or force
            self._cond.notify_all()

    # -- the timer thread ---------------------------------------------------------------------

    def _run_timer(self) -> None:
        """The timer thread: move the watch when asked, settle candidates when due."""
        while (work := self._next_work()) is not None:
            force_rewatch, due = work  # None: no rewatch asked; True/False: rewatch (forced?)
            if force_rewatch is not None:
                self._safe(self._update_watch, True, force_rewatch)
            for path in due:
                self._settle(path)

    def _next_work(self) -> tuple[bool | None, list[str]] | None:
        """Block until a rewatch request (its `force`) or due candidates; None once stopping.

        No polling: the wait ends at the earliest deadline or when an event notifies.
        """
        with self._cond:
            while not self._state.stopping:
                if self._state.rewatch:
                    force = self._state.rewatch_force
                    self._state.rewatch = self._state.rewatch_force = False
                    return force, []
                now = time.monotonic()
                due = [p for p, e in self._state.pending.items() if e.deadline <= now]
                if due:
                    return None, due
                deadline = min((e.deadline for e in self._state.pending.values()), default=None)
                self._cond.wait(None if deadline is None else deadline - now)
            return None

    def _settle(self, path: str) -> None:
        """Report a due candidate if it is unchanged, complete and new; else wait or drop it."""
        now = time.monotonic()
        sig = _signature(path)
        with self._cond:
            entry = self._state.pending.get(path)
            if entry is None or self._state.stopping:
                return
            if sig is None:  # deleted (or replaced by a non-file) before it settled
                del self._state.pending[path]
                self._state.reported.pop(path, None)
                return
            if sig != entry.sig:  # changed without an event reaching us yet: wait again
                entry.sig, entry.changed_at = sig, now
                entry.deadline = now + self._debounce
                return
            if entry.writing and now - entry.changed_at < _MAX_WRITER_WAIT:
                entry.deadline = now + self._debounce  # still open for writing: keep waiting
                return
            del self._state.pending[path]
            if sig[1] == 0 or self._state.reported.get(path) == sig:
                return  # empty (created, not written yet) or already reported as is
            self._state.reported[path] = sig
        self._safe(self._on_ready, Path(path), entry.appeared)

    @staticmethod
    def _safe(func: Callable[..., object], *args: object) -> None:
        try:
            func(*args)
        except Exception:
            log.exception("milestone watcher: %s(%s) failed", getattr(func, "__name__", func), args)

    # -- which directory is watched -----------------------------------------------------------

    def _target(self) -> str:
        """The milestones folder if it exists, else its nearest existing ancestor."""
        path = self._dir
        while not os.path.isdir(path):
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        return path

    def _update_watch(self, report_existing: bool, force: bool = False) -> None:
        """Point the (non-recursive) watch at the folder, or at the ancestor to wait on.

        Loops because a deeper level may appear while the watch is being moved; when the
        folder itself appears, the files already in it are queued like new ones.
        """
        observer = self._observer
        if observer is None:
            return
        while True:
            target = self._target()
            if target == self._watched_path and not force:
                return
            force = False
            if self._watch is not None:
                # The emitter may already have stopped (its directory was deleted).
                with contextlib.suppress(KeyError, OSError):
                    observer.unschedule(self._watch)
            self._watch = observer.schedule(self._handler, target, recursive=False)
            self._watched_path = target
            if target == self._dir:
                log.debug("watching %s", target)
                if report_existing:
                    for name in sorted(os.listdir(target)):
                        path = os.path.join(target, name)
                        if is_milestone_name(name):
                            self._touch(path, writing=False, new_file=True)
            else:
                log.info("%s does not exist yet; watching %s until it does", self._dir, target)
