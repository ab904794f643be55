"""The main window: one project, its milestones in a sidebar, the Iteration Monitor beside.

A project is opened through File → Open…, the recent-projects menu, the command line, or
automatically (the last one) on start; all remembered in `QSettings`, whose organisation and
application names the caller chooses (tests pass a temporary ini file). Menus, tray, settings
and drops are `ui.window_chrome`'s. A folder without
`.anima/` gets an empty state offering to initialise it. Errors the engine reports — not a
git repository, `claude` missing, a malformed milestone — are listed in a banner at the top of
the window until dismissed. The engine is only ever called through `EngineBridge`, off the GUI
thread.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSettings, Qt, Signal, Slot
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from anima import events as ev
from anima.engine.project import git_problem, init_project
from anima.phases import RUNNING, Phase
from ui.banner import EmptyState, ErrorBanner
from ui.bridge import EngineBridge, EngineFactory, EngineLike, default_engine_factory
from ui.changes_view import ChangesView
from ui.desktop_notify import DesktopNotifier
from ui.dialogs import confirm, confirm_close
from ui.diff_view import prepare_lexers
from ui.formatting import enum_text
from ui.milestone_list import MilestoneList
from ui.monitor import IterationMonitor
from ui.read_only import ReadOnlyProject
from ui.review import ReviewPanel, RunControls
from ui.window_chrome import app_icon

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord

log = logging.getLogger(__name__)

class MainWindow(ReadOnlyProject):
    """One project at a time: sidebar of milestones, monitor, review panel, error banner."""

    #: The engine of the open project was shut down (window closing or project switch).
    engine_stopped = Signal()

    def __init__(self, settings: QSettings, *, engine_factory: EngineFactory | None = None,
                 init_project: Callable[[Path], Any] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.engine_factory = engine_factory or default_engine_factory
        self._init_project = init_project
        self.project: Path | None = None
        self.engine: EngineLike | None = None
        self.bridge: EngineBridge | None = None
        self._records: dict[str, MilestoneRecord] = {}
        self._closing = False
        self._ask_before_closing = True
        self._stopping = False
        self.setWindowTitle("Anima")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)

        self.errors = ErrorBanner(self)
        self.milestone_list = MilestoneList(self)
        self.add_button = QPushButton("Add milestone…", self)
        self.add_button.setObjectName("addButton")
        sidebar = QFrame(self)
        sidebar.setObjectName("sidebar")
        sidebar_title = QLabel("Milestones", sidebar)
        sidebar_title.setObjectName("sectionTitle")
        sidebar_layout = QVBoxLayout(sidebar)
        sidebar_layout.setContentsMargins(8, 10, 8, 8)
        sidebar_layout.addWidget(sidebar_title)
        sidebar_layout.addWidget(self.milestone_list, 1)
        sidebar_layout.addWidget(self.add_button)

        self.monitor = IterationMonitor(self)
        self.review = ReviewPanel(self)
        monitor_page = QWidget(self)
        monitor_layout = QVBoxLayout(monitor_page)
        monitor_layout.setContentsMargins(0, 0, 0, 0)
        monitor_layout.setSpacing(0)
        monitor_layout.addWidget(self.review)
        self.changes = ChangesView(self)
        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("mainTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.monitor, "Monitor")
        self.tabs.addTab(self.changes, "Changes")
        monitor_layout.addWidget(self.tabs, 1)

        self.no_project = EmptyState(
            "No project open",
            "Open a folder that holds your software project (a git repository). "
            "Anima keeps its milestones in the project's .anima/ folder.", self)
        self.no_project.add_button("Open project…", self.choose_project, primary=True)
        self.no_project.finish()
        self.no_anima = EmptyState(
            "This folder is not managed by Anima yet",
            "", self)
        self.init_button = self.no_anima.add_button("Initialise Anima here",
                                                    self._on_init_clicked, primary=True)
        self.no_anima.add_button("Open another folder…", self.choose_project)
        self.no_anima.finish()

        self.pages = QStackedWidget(self)
        for page in (self.no_project, self.no_anima, monitor_page):
            self.pages.addWidget(page)
        self.monitor_page = monitor_page

        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(sidebar)
        self.splitter.addWidget(self.pages)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 1100])
        central = QWidget(self)
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.setSpacing(0)
        central_layout.addWidget(self.errors)
        central_layout.addWidget(self.splitter, 1)
        self.setCentralWidget(central)
        self.central = central

        self.run_controls = RunControls(self)
        self._build_menus()
        self.wait_label: QLabel | None = None
        self.tray = self._make_tray()
        # Without a tray (many Wayland and tiling desktops) notices go to the desktop's
        # notification service instead.
        self.desktop_notifier = DesktopNotifier() if self.tray is None else None
        self.milestone_list.milestone_selected.connect(self._on_milestone_selected)
        self.add_button.clicked.connect(self.choose_milestone_file)
        self.monitor.history.round_selected.connect(self._on_round_selected)
        self.changes.load_requested.connect(self._load_changes)
        self.changes.comment_added.connect(
            lambda mid, path, line, text: self.bridge and self.bridge.add_comment(mid, path, line,
                                                                                   text))
        self.changes.comment_edited.connect(
            lambda mid, cid, text: self.bridge and self.bridge.edit_comment(mid, cid, text))
        self.changes.comment_removed.connect(
            lambda mid, cid: self.bridge and self.bridge.remove_comment(mid, cid))
        self.review.resume_requested.connect(
            lambda mid, note: self.bridge and self.bridge.resume(mid, note))
        self.review.abort_requested.connect(lambda mid: self.bridge and self.bridge.abort(mid))
        self.review.approve_requested.connect(lambda mid: self.bridge and self.bridge.approve(mid))
        self.review.changes_requested.connect(
            lambda mid, note: self.bridge and self.bridge.request_changes(mid, note))
        self.review.start_requested.connect(self._on_start_requested)
        self.review.continue_requested.connect(
            lambda mid, n, note: self.bridge and self.bridge.call(
                f"Continuing {mid} from round {n}",
                lambda: self.engine and self.engine.continue_from_round(mid, n, note)))
        self.run_controls.pause_requested.connect(self._on_pause_requested)
        self.run_controls.stop_requested.connect(self._on_stop_requested)
        self.statusBar().showMessage("Ready")
        self._restore_geometry()
        self._show_page()

    # --- opening a project -----------------------------------------------------------------
    def open_project(self, path: Path) -> None:
        """Show `path`: its monitor, or the offer to initialise it. Stops the previous one."""
        path = Path(path).expanduser().resolve()
        if self.engine is not None:
            self._stop_engine(then=lambda: self.open_project(path))
            return
        self.project = path
        self.leave_read_only()
        if path.is_dir():  # a mistyped or placeholder path is not "the last project"
            self._remember_project(path)
        self.setWindowTitle(f"Anima — {path.name}")
        self.errors.clear()
        self._records.clear()
        self.milestone_list.milestones.set_records([])
        self.monitor.reset()
        self.review.show_record(None)
        if not path.is_dir():
            self.errors.add(f"{path} does not exist or is not a folder")
            self.project = None
        elif (path / ".anima").is_dir() and not self.open_read_only(path):
            self._start_engine(path)
        self._show_page()

    def _show_page(self) -> None:
        if self.project is None:
            self.pages.setCurrentWidget(self.no_project)
        elif self.engine is None and self.read_only_holder is None:
            problem = git_problem(self.project)
            self.init_button.setEnabled(problem is None)
            self.no_anima.text.setText(
                f"Anima needs a git repository with a first commit: {problem}. Nothing was "
                "written." if problem else
                f"{self.project} has no .anima/ folder. Initialising creates it with a "
                "commented example configuration and a soul.md for your quality standards, "
                "without a milestone (nothing starts until you add one); nothing else in the "
                "folder is touched.")
            self.pages.setCurrentWidget(self.no_anima)
        else:
            self.pages.setCurrentWidget(self.monitor_page)
        has_engine = self.engine is not None
        for widget in (self.add_action, self.add_button, self.find_action):
            widget.setEnabled(has_engine)

    @Slot()
    def _on_init_clicked(self) -> None:
        if self.project is None:
            return
        problem = git_problem(self.project)
        if problem is not None:  # refused before anything is written
            self.errors.add(f"Cannot initialise Anima in {self.project}: {problem}")
            return
        init = self._init_project or init_project
        try:
            init(self.project)
        except Exception as e:  # shown, never swallowed: the folder may be read-only
            self.errors.add(f"Could not initialise {self.project}: {e}")
            return
        self.statusBar().showMessage(f"Initialised {self.project / '.anima'}", 8000)
        self.open_project(self.project)

    def _start_engine(self, path: Path) -> None:
        _freeze_startup_heap()
        try:
            engine = self.engine_factory(path)
        except Exception as e:
            self.errors.add(f"Cannot open {path}: {e}")
            return
        self.engine = engine
        bridge = EngineBridge(engine.bus, engine, self)
        self.bridge = bridge
        bridge.agent_events_received.connect(self.monitor.feed_agent_events)
        bridge.phase_changed.connect(self._on_phase_changed)
        bridge.milestone_changed.connect(self._on_milestone_changed)
        bridge.milestones_scanned.connect(self._on_milestones_scanned)
        bridge.milestone_removed.connect(self._on_milestone_removed)
        bridge.problem_reported.connect(lambda event: self.errors.add(event.text))
        bridge.problem_resolved.connect(lambda event: self.errors.dismiss(event.text))
        bridge.engine_ready.connect(self._on_engine_ready)
        bridge.verdict_reached.connect(self.monitor.on_verdict)
        bridge.check_event.connect(self.monitor.on_check)
        bridge.log_line_received.connect(self._on_log_line)
        bridge.error_raised.connect(self._on_error)
        bridge.notice_posted.connect(self._on_notice)
        bridge.usage_limit_wait.connect(self._on_usage_limit_wait)
        # Replay what the agents said before a restart, then start: in this order, the
        # replayed transcript always comes before the live output.
        bridge.call("Reading the last transcript", engine.last_transcript,
                    on_done=self._on_transcript_read,
                    on_error=lambda e: self._start_running(None, e))

    def _on_transcript_read(self, result: tuple[str | None, list[ev.AgentEvent]] | None) -> None:
        self._start_running(result, None)

    def _start_running(self, result: tuple[str | None, list[ev.AgentEvent]] | None,
                       error: BaseException | None) -> None:
        if self.engine is None or self._stopping:
            return
        if error is not None:
            log.warning("could not replay the transcript: %s", error)
        if result is not None and result[1]:
            milestone_id, events = result
            # Fed a slice per event-loop turn; the engine starts once all of it is queued, so
            # the live output comes after it.
            self.monitor.replay(events, then=lambda: self._run_engine(
                f"Replayed {len(events)} events of {milestone_id}"))
            return
        self._run_engine(None)

    def _run_engine(self, replayed: str | None) -> None:
        if self.engine is None or self._stopping:
            return
        if replayed:
            self.statusBar().showMessage(replayed, 6000)
        # The engine's config is loaded in its worker; start() itself does not block.
        self.engine.start(watch=True)
        self.statusBar().showMessage(f"Watching {self.project}", 4000)

    def _stop_engine(self, then: Callable[[], object] | None = None) -> None:
        """Shut the engine down off the GUI thread (agents stop within seconds), then `then`."""
        engine, bridge = self.engine, self.bridge
        if engine is None or bridge is None:
            if then is not None:
                then()
            return
        if self._stopping:
            return
        self._stopping = True
        self.statusBar().showMessage("Stopping the agents…")
        self.central.setEnabled(False)

        def finished(_result: object = None) -> None:
            bridge.close()
            bridge.deleteLater()
            self.engine = self.bridge = None
            self._stopping = False
            self.central.setEnabled(True)
            self.run_controls.show_phase(Phase.IDLE)
            self.statusBar().showMessage("Stopped", 3000)
            self.engine_stopped.emit()
            if then is not None:
                then()

        def failed(error: BaseException) -> None:
            self.errors.add(f"Shutdown: {error}")
            finished()

        bridge.call("Stopping the engine", lambda: engine.shutdown(10.0), on_done=finished,
                    on_error=failed)

    # --- engine events (GUI thread, via the bridge) -----------------------------------------
    @Slot(object)
    def _on_milestones_scanned(self, event: ev.MilestonesScanned) -> None:
        for problem in event.problems:
            self.errors.add(problem)
        self._records = {r.id: r for r in event.records}
        self.milestone_list.milestones.set_records(list(event.records))
        selected = self.milestone_list.selected_id
        if selected is None or selected not in self._records:
            preferred = next((r for r in event.records if enum_text(r.status) == "in_progress"),
                             None) or next(
                (r for r in event.records
                 if enum_text(r.status) in ("paused", "awaiting_review")), None)
            if preferred is None and event.records:
                preferred = event.records[-1]
            if preferred is not None:
                self.milestone_list.select(preferred.id)
        elif selected in self._records:
            self._show_selected(self._records[selected])

    @Slot(object)
    def _on_engine_ready(self, event: ev.EngineReady) -> None:
        self.monitor.set_limits(event.config.max_consecutive_rejections)
        self.listen_for_raise()  # the lock is ours: a second window may ask us forward

    @Slot(object)
    def _on_milestone_removed(self, event: ev.MilestoneRemoved) -> None:
        self._records.pop(event.milestone_id, None)
        was_shown = self.monitor.milestone_id == event.milestone_id
        self.milestone_list.milestones.remove_record(event.milestone_id)
        if was_shown:
            self._show_selected(self._records.get(self.milestone_list.selected_id or ""))

    @Slot(object)
    def _on_milestone_changed(self, event: ev.MilestoneChanged) -> None:
        record = event.record
        self._records[record.id] = record
        self.milestone_list.milestones.update_record(record)
        if self.milestone_list.selected_id is None:
            self.milestone_list.select(record.id)
        elif record.id == self.milestone_list.selected_id:
            self._show_selected(record)

    @Slot(object)
    def _on_phase_changed(self, event: ev.PhaseChanged) -> None:
        before = self.monitor.live_milestone
        self.monitor.on_phase_changed(event)
        if self.monitor.live_milestone != event.milestone_id:
            return  # another milestone's: the monitor stays with the one it follows
        self.run_controls.show_phase(event.phase)
        if before != event.milestone_id and event.milestone_id in self._records:
            # A milestone started: follow it in the sidebar and the monitor.
            self.milestone_list.select(event.milestone_id)

    @Slot(str)
    def _on_milestone_selected(self, milestone_id: str) -> None:
        record = self._records.get(milestone_id)
        if record is not None:
            self._show_selected(record)

    def _show_selected(self, record: MilestoneRecord | None) -> None:
        self.monitor.show_record(record)
        self.review.show_record(record)
        self.changes.show_record(record)

    @Slot(int)
    def _on_round_selected(self, round_no: int) -> None:
        self.changes.show_round(round_no)
        self.tabs.setCurrentWidget(self.changes)

    @Slot(str, object)
    def _load_changes(self, milestone_id: str, round_no: int | None) -> None:
        """Compute the diff off the GUI thread; the view drops an answer it no longer wants."""
        engine = self.engine
        if self.bridge is not None and engine is not None:
            self.bridge.call(
                f"Reading the changes of {milestone_id}",
                lambda: prepare_lexers(engine.changes(milestone_id, round_no)),
                on_done=lambda cs: self.changes.show_changes(milestone_id, round_no, cs),
                on_error=lambda e: self.changes.show_error(milestone_id, round_no, e))

    @Slot(object)
    def _on_log_line(self, event: ev.LogLine) -> None:
        self.statusBar().showMessage(event.text.splitlines()[0] if event.text else "")

    @Slot(object)
    def _on_error(self, event: ev.EngineError) -> None:
        prefix = f"{event.milestone_id}: " if event.milestone_id and \
            event.milestone_id not in event.message else ""
        self.errors.add(prefix + event.message)
        # A refused request re-enables the decision it came from.
        self.review.setEnabled(True)

    # --- user requests ---------------------------------------------------------------------
    @Slot(str)
    def _on_start_requested(self, milestone_id: str) -> None:
        if self.bridge is not None:
            self.bridge.start_milestone(milestone_id)
            self.statusBar().showMessage(f"{milestone_id} starts as soon as it may",
                                         8000)

    @Slot()
    def _on_pause_requested(self) -> None:
        if self.bridge is not None:
            self.bridge.pause_after_round(self.monitor.milestone_id)
            self.statusBar().showMessage("Will pause after this round", 8000)

    @Slot()
    def _on_stop_requested(self) -> None:
        if self.bridge is None or not confirm(
                self, "Stop now", "Stop both agents now?", "Stop now",
                "The current round is interrupted and redone when you resume the milestone."):
            return
        for pane in self.monitor.panes.values():
            pane.note_stop_requested()
        if self.bridge is not None:
            self.bridge.stop_now(self.monitor.milestone_id)
            self.statusBar().showMessage("Stopping the agents…", 8000)

    # --- closing ----------------------------------------------------------------------------
    def close_without_asking(self) -> None:
        """Ctrl+C in the terminal: the user already said to quit."""
        self._ask_before_closing = False
        self.close()

    def _may_close(self) -> bool:
        """Closing while agents work asks first; when idle, nothing to ask."""
        if not self._ask_before_closing or self.monitor.phase_bar.phase not in RUNNING:
            return True
        record = self._records.get(self.monitor.live_milestone or "")
        return confirm_close(self, record.title if record else None)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Ask while agents work; save the layout, stop the engine off the GUI thread, close."""
        if not self._closing:
            if not self._may_close():
                event.ignore()
                return
            self._closing = True
            self._save_geometry()
        if self.engine is None:
            if self.tray is not None:
                self.tray.hide()
            if self.desktop_notifier is not None:
                self.desktop_notifier.close()
            event.accept()
            return
        event.ignore()
        for pane in self.monitor.panes.values():
            pane.note_stop_requested()
        self._stop_engine(then=self.close)


def _freeze_startup_heap() -> None:
    """Exempt what start-up built (modules, Qt wrappers, models; alive as long as the app) from
    the cyclic collector, once. Otherwise each full collection while a long transcript is read
    and replayed rescans all of it with the GIL held: 40-100 ms in which the window cannot
    paint, whichever thread triggered it. Frozen objects are still freed by reference count."""
    global _heap_frozen
    if not _heap_frozen:
        gc.freeze()
        _heap_frozen = True


_heap_frozen = False
