"""The window's chrome around the project: menus and toolbar, the tray, remembered settings
(recent projects, layout), choosing files and dropping them, notices in the status bar.

`MainWindow` adds the project itself (engine, board, milestone pages); this base only reads
the attributes declared below, which `MainWindow.__init__` sets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QDragEnterEvent,
    QDragMoveEvent,
    QDropEvent,
    QIcon,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMainWindow,
    QSystemTrayIcon,
    QTabWidget,
)

from anima import events as ev
from anima.paths import resource
from ui.banner import ErrorBanner
from ui.bridge import EngineBridge, EngineLike
from ui.desktop import install_help_menu, save_transcript
from ui.desktop_notify import DesktopNotifier
from ui.milestone_page import MilestonePage
from ui.review import RunControls
from ui.widgets import ElidedLabel

MAX_RECENT = 8
NOTICE_TITLES = {"paused": "Anima paused", "completed": "Milestone completed",
                 "awaiting_review": "Ready for your review", "failed": "Milestone failed",
                 "waiting": "Waiting for a usage limit", "held": "Milestone held"}
#: The longest a Qt timer waits (ms, a 32-bit int): a longer usage-limit wait re-arms it.
_LONGEST_TIMER_MS = 2**31 - 1

def app_icon() -> QIcon:
    icon = resource("icons", "anima.svg")
    return QIcon(str(icon)) if icon.is_file() else QIcon()


# --- the window --------------------------------------------------------------------------------

class WindowChrome(QMainWindow):
    """Menus, tray, settings, file choosing and drops, status-bar notices of the main window."""

    settings: QSettings
    project: Path | None
    engine: EngineLike | None
    bridge: EngineBridge | None
    errors: ErrorBanner
    tabs: QTabWidget
    run_controls: RunControls
    tray: QSystemTrayIcon | None
    desktop_notifier: DesktopNotifier | None
    wait_label: QLabel | None
    #: per milestone that met a usage limit: until when (epoch s), and what the label says
    _usage_waits: dict[str, tuple[float, str]]
    open_project: Callable[[Path], None]
    current_page: Callable[[], MilestonePage | None]

    # --- menus, tray, settings -------------------------------------------------------------
    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.open_action = QAction("&Open project…", self)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.open_action.triggered.connect(self.choose_project)
        file_menu.addAction(self.open_action)
        self.recent_menu = file_menu.addMenu("Open &recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self._fill_recent_menu()
        file_menu.addSeparator()
        self.add_action = QAction("&Add milestone…", self)
        self.add_action.setShortcut(QKeySequence("Ctrl+M"))
        self.add_action.triggered.connect(self.choose_milestone_file)
        file_menu.addAction(self.add_action)
        self.save_transcript_action = QAction("&Save transcript…", self)
        self.save_transcript_action.setToolTip("Save the focused agent pane's transcript")
        self.save_transcript_action.triggered.connect(self._save_transcript)
        file_menu.addAction(self.save_transcript_action)
        file_menu.addSeparator()
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)
        edit_menu = self.menuBar().addMenu("&Edit")
        self.find_action = QAction("&Find…", self)
        self.find_action.setShortcut(QKeySequence.StandardKey.Find)
        self.find_action.setToolTip("Find in the diff on a Changes tab, else in the focused "
                                    "agent pane")
        self.find_action.triggered.connect(self._find_in_pane)
        edit_menu.addAction(self.find_action)
        run_menu = self.menuBar().addMenu("&Run")
        run_menu.addAction(self.run_controls.pause_action)
        run_menu.addAction(self.run_controls.stop_action)
        toolbar = self.addToolBar("Run")
        toolbar.setObjectName("runToolbar")
        toolbar.setMovable(False)
        toolbar.addAction(self.add_action)
        toolbar.addSeparator()
        toolbar.addAction(self.run_controls.pause_action)
        toolbar.addAction(self.run_controls.stop_action)
        install_help_menu(self, lambda: getattr(self.engine, "config", None))

    @Slot()
    def _find_in_pane(self) -> None:
        """One Ctrl+F for the window: in the diff when a Changes tab shows, else in the agent
        pane in use, wherever the focus is (a button, the tab bar)."""
        page = self.current_page()
        if page is None:
            return
        if page.tabs.currentWidget() is page.changes:
            page.changes.search.open_bar()
        else:
            page.monitor.pane_in_use().search.open_bar()

    @Slot()
    def _save_transcript(self) -> None:
        page = self.current_page()
        if page is None:
            self.statusBar().showMessage("Open a milestone to save its agents' transcript", 6000)
            return
        pane = page.monitor.pane_in_use()
        # Proposed in the home folder, never in the project, where a Developer's
        # `git add -A` would commit it.
        saved = save_transcript(self, pane.role, pane.plain_text(), None)
        if saved is not None:
            self.statusBar().showMessage(f"Saved the {pane.role}'s transcript to {saved}", 8000)

    def _make_tray(self) -> QSystemTrayIcon | None:
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return None
        tray = QSystemTrayIcon(app_icon(), self)
        tray.setToolTip("Anima")
        tray.activated.connect(self._bring_to_front)
        tray.show()
        return tray

    @Slot()
    def _bring_to_front(self) -> None:
        self.showNormal()
        self.raise_()
        self.activateWindow()

    def recent_projects(self) -> list[str]:
        value = self.settings.value("projects/recent", [])
        if isinstance(value, str):  # QSettings returns a lone entry as a string
            value = [value]
        return [str(v) for v in value] if isinstance(value, list) else []

    def _remember_project(self, path: Path) -> None:
        recent = [str(path), *(p for p in self.recent_projects() if p != str(path))]
        self.settings.setValue("projects/recent", recent[:MAX_RECENT])
        self.settings.setValue("projects/last", str(path))
        self.settings.sync()

    def last_project(self) -> Path | None:
        value = self.settings.value("projects/last", "")
        return Path(str(value)) if value else None

    @Slot()
    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_projects()
        for path in recent:
            action = self.recent_menu.addAction(path)
            action.triggered.connect(lambda _checked=False, p=path: self.open_project(Path(p)))
        if not recent:
            self.recent_menu.addAction("(none)").setEnabled(False)
            return
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear recent projects", self._clear_recent)

    def _clear_recent(self) -> None:
        self.settings.remove("projects/recent")

    def _restore_geometry(self) -> None:
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, QByteArray | bytes) and self.restoreGeometry(geometry):
            pass
        else:
            self.resize(1360, 860)

    def _save_geometry(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.sync()

    @Slot()
    def choose_project(self) -> None:
        start = str(self.project or self.last_project() or Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Open project", start)
        if folder:
            self.open_project(Path(folder))

    @Slot()
    def choose_milestone_file(self) -> None:
        if self.bridge is None:
            self.errors.add("Open a project first, then add milestones to it.")
            return
        files, _ = QFileDialog.getOpenFileNames(self, "Add milestone", str(self.project or ""),
                                                "Milestones (*.md)")
        for name in files:
            self.add_milestone_file(Path(name))

    def add_milestone_file(self, path: Path) -> None:
        """Validate and copy a milestone in (engine.add_milestone), off the GUI thread."""
        if self.bridge is None:
            self.errors.add(f"Cannot add {path.name}: open a project first.")
            return
        self.bridge.add_milestone(
            path, on_done=lambda mid: self.statusBar().showMessage(f"Added milestone {mid}", 6000))

    @Slot(object)
    def _on_usage_limit_wait(self, event: ev.UsageLimitWait) -> None:
        """A permanent status-bar label while a pair waits for a usage limit to reset, one
        line per milestone that met one (pairs on different CLIs wait for different resets:
        one's end is not the other's), each gone at its reset at the latest: the pairs that
        waited for it at the account go on without a word, and so does everything once the
        pair that met it was stopped meanwhile."""
        if self.wait_label is None:
            # Elided, whole in its tooltip: three waits are wider than a 1024-px window,
            # and the last one's reset was cut off unseen.
            self.wait_label = ElidedLabel()
            self.wait_label.setObjectName("usageLimitWait")
            self.statusBar().addPermanentWidget(self.wait_label)
        if event.until is None:
            self._usage_waits.pop(event.milestone_id, None)
        else:
            self._usage_waits[event.milestone_id] = (event.until, event.message.split(" (")[0])
        self._show_usage_waits()

    def _show_usage_waits(self) -> None:
        """The label says the waits not over yet, and looks again at the next reset."""
        label = self.wait_label
        if label is None:
            return
        now = time.time()
        waits = {m: w for m, w in self._usage_waits.items() if w[0] > now}
        self._usage_waits = waits
        texts = [text if len(waits) == 1 else f"{m}: {text}" for m, (_, text) in waits.items()]
        label.setText("\n".join(texts))  # one line, " · " between; one a line in the tooltip
        label.setVisible(bool(waits))
        if waits:
            left_ms = (min(until for until, _ in waits.values()) - now) * 1000
            QTimer.singleShot(min(int(left_ms) + 1, _LONGEST_TIMER_MS), label,
                              self._show_usage_waits)

    @Slot(object)
    def _on_notice(self, event: ev.Notice) -> None:
        """A notice is for when nobody looks at the window: the tray or the desktop says it.
        In the window, the milestone's card and page already do (once)."""
        title = NOTICE_TITLES.get(event.kind, "Anima")
        if self.tray is not None:
            self.tray.showMessage(title, event.message, app_icon(), 10000)
        elif self.desktop_notifier is not None:
            self.desktop_notifier.notify(title, event.message)

    # --- drag and drop ----------------------------------------------------------------------
    @staticmethod
    def _dropped_milestones(event: QDragEnterEvent | QDropEvent) -> list[Path]:
        mime = event.mimeData()
        if not mime.hasUrls():
            return []
        return [Path(url.toLocalFile()) for url in mime.urls()
                if url.isLocalFile() and url.toLocalFile().lower().endswith(".md")]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._dropped_milestones(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        files = self._dropped_milestones(event)
        if not files:
            event.ignore()
            return
        event.acceptProposedAction()
        for path in files:
            self.add_milestone_file(path)
