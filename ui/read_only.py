"""A second window on a project another Anima drives: the project shown read-only from its
files, with who holds it, until that Anima stops; then the window opens it for real.

When the holder is an Anima window of this user on this machine, it is also brought to the
front: each window that drives a project listens on a local socket named for the project.
A headless `anima run`, or an Anima on another machine (a shared folder), has no window to
raise: the notice says who it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QCryptographicHash, QTimer, Slot
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from anima import events as ev
from anima.engine.read_only import (
    driven_elsewhere,
    files_stamp,
    read_records,
)
from anima.errors import AnimaError
from anima.lock import LockInfo
from ui.milestone_page import MilestonePage
from ui.window_chrome import WindowChrome

#: How often the records are read again and the lock looked at, in ms.
REFRESH_MS = 2000
_RAISE = b"raise\n"
_RAISED = b"raised\n"


def raise_server_name(path: Path) -> str:
    """One name per project and user (the socket lives in the user's runtime folder)."""
    digest = QCryptographicHash.hash(QByteArray(str(path.resolve()).encode()),
                                     QCryptographicHash.Algorithm.Sha1)
    return f"anima-window-{bytes(digest.toHex().data()).decode()[:20]}"


def ask_to_raise(path: Path, timeout_ms: int = 1000) -> bool:
    """Ask the window driving `path` to come to the front; True if it said it did."""
    socket = QLocalSocket()
    socket.connectToServer(raise_server_name(path))
    if not socket.waitForConnected(timeout_ms):
        return False
    socket.write(_RAISE)
    socket.waitForBytesWritten(timeout_ms)
    answered = socket.waitForReadyRead(timeout_ms) and bytes(socket.readAll().data()) == _RAISED
    socket.disconnectFromServer()
    return answered


class ReadOnlyProject(WindowChrome):
    """The read-only mode of the main window (a mixin of it)."""

    milestone_pages: dict[str, MilestonePage]
    _read_only_timer: QTimer | None = None
    _raise_server: QLocalServer | None = None
    _read_stamp: tuple[tuple[str, int, int], ...] = ()
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
        raised = ask_to_raise(path)
        self.errors.add(self.read_only_notice(path, holder) + (
            " Its window has been brought to the front." if raised else ""))
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

    def listen_for_raise(self) -> None:
        """This window drives its project now: a second window on it may ask it forward."""
        self.stop_listening()
        if self.project is None:
            return
        name = raise_server_name(self.project)
        server = QLocalServer(self)
        if not server.listen(name):  # a socket left by a killed window: ours to replace
            QLocalServer.removeServer(name)
            if not server.listen(name):
                return
        server.newConnection.connect(lambda: self._on_raise_request(server))
        self._raise_server = server

    def stop_listening(self) -> None:
        if self._raise_server is not None:
            self._raise_server.close()
            self._raise_server.deleteLater()
            self._raise_server = None

    def _on_raise_request(self, server: QLocalServer) -> None:
        while (socket := server.nextPendingConnection()) is not None:
            socket.readyRead.connect(lambda s=socket: self._answer_raise(s))
            socket.disconnected.connect(socket.deleteLater)

    def _answer_raise(self, socket: QLocalSocket) -> None:
        if bytes(socket.readAll().data()).startswith(_RAISE):
            self._bring_to_front()
            socket.write(_RAISED)
            socket.flush()

    def leave_read_only(self) -> None:
        """The window turns to another project (or opens this one afresh)."""
        self.stop_listening()
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
        stamp = files_stamp(path)
        if not first and stamp == self._read_stamp:
            return  # nothing changed on disk: no need to validate every record again
        self._read_stamp = stamp
        try:
            scan = read_records(path)
        except AnimaError as e:
            if first:
                self.errors.add(str(e))
            return
        # Problems once: the banner would count a repeated one every refresh.
        problems = tuple(str(p) for p in scan.problems) if first else ()
        self._on_milestones_scanned(ev.MilestonesScanned(tuple(scan.records), problems))
        for page in self.milestone_pages.values():
            page.review.setEnabled(False)
