"""A second window on a project another Anima drives: the project shown read-only from its
files, with who holds it, until that Anima stops; then the window opens it for real.

The other process may be on another machine (a shared folder) or be a headless `anima run`,
so the window does not try to raise it: it says who it is and follows the files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer, Slot

from anima import events as ev
from anima.engine.read_only import driven_elsewhere, last_transcript, read_records
from anima.errors import AnimaError
from anima.lock import LockInfo
from ui.review import ReviewPanel
from ui.window_chrome import WindowChrome

#: How often the records are read again and the lock looked at, in ms.
REFRESH_MS = 2000


class ReadOnlyProject(WindowChrome):
    """The read-only mode of the main window (a mixin of it)."""

    review: ReviewPanel
    _read_only_timer: QTimer | None = None
    #: Who drives the project while this window only shows it.
    read_only_holder: LockInfo | None = None

    _on_milestones_scanned: Callable[[ev.MilestonesScanned], None]

    def open_read_only(self, path: Path) -> bool:
        """Show `path` read-only if another live Anima drives it; False if none does."""
        holder = driven_elsewhere(path)
        if holder is None:
            return False
        self.read_only_holder = holder
        self.setWindowTitle(f"Anima — {path.name} (read-only)")
        self.errors.add(self.read_only_notice(path, holder))
        _, events = last_transcript(path)
        if events:
            self.monitor.replay(events)
        self._refresh_read_only(first=True)
        if self._read_only_timer is None:
            self._read_only_timer = QTimer(self)
            self._read_only_timer.setInterval(REFRESH_MS)
            self._read_only_timer.timeout.connect(self._refresh_read_only)
        self._read_only_timer.start()
        return True

    @staticmethod
    def read_only_notice(path: Path, holder: LockInfo) -> str:
        return (f"Opened read-only: {path} is being run by another Anima ({holder.describe()}). "
                "Nothing can be changed from this window; it opens the project for real as "
                "soon as that one stops.")

    def leave_read_only(self) -> None:
        if self._read_only_timer is not None:
            self._read_only_timer.stop()
        self.read_only_holder = None

    @Slot()
    def _refresh_read_only(self, first: bool = False) -> None:
        path = self.project
        if path is None or self.read_only_holder is None:
            self.leave_read_only()
            return
        if driven_elsewhere(path) is None:  # the other Anima stopped: take the project over
            self.leave_read_only()
            self.open_project(path)
            return
        try:
            scan = read_records(path)
        except AnimaError as e:
            if first:
                self.errors.add(str(e))
            return
        # Problems once: the banner would count a repeated one every refresh.
        problems = tuple(str(p) for p in scan.problems) if first else ()
        self._on_milestones_scanned(ev.MilestonesScanned(tuple(scan.records), problems))
        self.review.setEnabled(False)
