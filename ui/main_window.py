"""The main window: one project, its milestones on a board, a page per milestone in tabs.

The first tab is the `Board` (every milestone as a card, in columns by state); a click on a
card opens that milestone's `MilestonePage` (its decision bar, monitor, changes and rounds) in
a tab of its own, and several can be open at once, each updating live. The title bar, the tray
and so the taskbar say how many milestones run and how many need you.

A project is opened through File → Open…, the recent-projects menu, the command line, or
automatically (the last one) on start; all remembered in `QSettings` (with the files the
reviewer marked viewed, `ui.viewed_marks`), whose organisation and application names the caller
chooses (tests pass a temporary ini file). Menus, tray, settings
and drops are `ui.window_chrome`'s. A folder without
`.anima/` gets an empty state offering to initialise it; a project without milestones gets one
offering the example milestone. Errors the engine reports — not a git repository, `claude`
missing, a malformed milestone — are listed in a banner at the top of the window until
dismissed. The engine is only ever called through `EngineBridge`, off the GUI thread.
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSettings, Qt, Signal, Slot
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QStackedWidget,
    QTabBar,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from anima import events as ev
from anima.engine import read_only
from anima.engine.project import example_milestone, git_problem, init_project
from anima.events import ROLES
from anima.phases import RUNNING
from ui.banner import EmptyState, ErrorBanner
from ui.board import Board
from ui.bridge import EngineBridge, EngineFactory, EngineLike, default_engine_factory
from ui.desktop_notify import DesktopNotifier
from ui.dialogs import confirm, confirm_close
from ui.diff_view import prepare_lexers
from ui.formatting import ElapsedClock
from ui.milestone_page import MilestonePage
from ui.read_only import ReadOnlyProject
from ui.review import RunControls
from ui.viewed_marks import ViewedMarks
from ui.window_chrome import app_icon

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord

log = logging.getLogger(__name__)

class MainWindow(ReadOnlyProject):
    """One project at a time: the board, a tab per opened milestone, the error banner."""

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
        self._phases: dict[str, ev.PhaseChanged] = {}
        #: What the `.md` of a milestone waiting for your review changed (`MilestoneRedefined`).
        self._redefined: dict[str, tuple[str, ...]] = {}
        self.milestone_pages: dict[str, MilestonePage] = {}
        #: The files marked viewed: they outlive a page closed and reopened, and a restart.
        self.viewed_marks = ViewedMarks(settings)
        self._max_rejections = 3  # until the engine says which limit it runs with
        self._roles: dict[str, Any] = {}  # and each role's config (agent CLI, model)
        self._closing = False
        self._ask_before_closing = True
        self._stopping = False
        self.setWindowTitle("Anima")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)

        self.errors = ErrorBanner(self)
        self.clock = ElapsedClock()
        self.board = Board(self.clock, self)
        self.no_milestones = EmptyState(
            "No milestones yet",
            "A milestone is a Markdown file: a title, its features and acceptance criteria. "
            "Drop .md files on this window (or File ▸ Add milestone…) and the Developer starts "
            "on the first one; or try the example milestone first.", self)
        self.example_button = self.no_milestones.add_button(
            "Add the example milestone", self._add_example, primary=True)
        self.no_milestones.add_button("Add milestone…", self.choose_milestone_file)
        self.no_milestones.finish()
        self.board_page = QStackedWidget(self)
        self.board_page.addWidget(self.no_milestones)
        self.board_page.addWidget(self.board)
        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("mainTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.setTabsClosable(True)
        self.tabs.setMovable(True)
        # A long title is elided when the tabs do not fit: the Board tab never scrolls away.
        self.tabs.setElideMode(Qt.TextElideMode.ElideRight)
        self.tabs.setUsesScrollButtons(False)
        self.tabs.addTab(self.board_page, "Board")
        self.tabs.tabBar().setTabButton(0, QTabBar.ButtonPosition.RightSide, None)
        self.tabs.tabBar().setTabButton(0, QTabBar.ButtonPosition.LeftSide, None)
        self.tabs.tabCloseRequested.connect(self._on_tab_close_requested)
        self.tabs.currentChanged.connect(self._on_tab_changed)

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
        for page in (self.no_project, self.no_anima, self.tabs):
            self.pages.addWidget(page)
        central = QWidget(self)
        central_layout = QVBoxLayout(central)
        central_layout.setContentsMargins(0, 0, 0, 0)
        central_layout.setSpacing(0)
        central_layout.addWidget(self.errors)
        central_layout.addWidget(self.pages, 1)
        self.setCentralWidget(central)
        self.central = central

        self.run_controls = RunControls(self)
        self._build_menus()
        self.wait_label = None
        self._usage_waits = {}
        self.tray = self._make_tray()
        # Without a tray (many Wayland and tiling desktops) notices go to the desktop's
        # notification service instead.
        self.desktop_notifier = DesktopNotifier() if self.tray is None else None
        self.board.milestone_opened.connect(self.open_page)
        self.board.action_requested.connect(self._on_card_action)
        self.board.counts_changed.connect(self._show_counts)
        self.run_controls.pause_requested.connect(self._on_pause_requested)
        self.run_controls.stop_requested.connect(self._on_stop_requested)
        self.statusBar().showMessage("Ready")
        self._restore_geometry()
        self._show_page()

    # --- opening a project -----------------------------------------------------------------
    def open_project(self, path: Path) -> None:
        """Show `path`: its board, or the offer to initialise it. Stops the previous one."""
        path = Path(path).expanduser().resolve()
        if self.engine is not None:
            self._stop_engine(then=lambda: self.open_project(path))
            return
        self.project = path
        self.leave_read_only()
        if path.is_dir():  # a mistyped or placeholder path is not "the last project"
            self._remember_project(path)
        self.errors.clear()
        self._records.clear()
        self._phases.clear()
        self._redefined.clear()
        self._show_running()
        for milestone_id in list(self.milestone_pages):
            self.close_page(milestone_id)
        self.board.set_records([])
        self._show_counts(0, 0)
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
            self.pages.setCurrentWidget(self.tabs)
        self.board_page.setCurrentWidget(self.board if self._records else self.no_milestones)
        has_engine = self.engine is not None
        for widget in (self.add_action, self.example_button):
            widget.setEnabled(has_engine)

    @Slot(int, int)
    def _show_counts(self, running: int, needs_you: int) -> None:
        """"Anima — project — 3 running · 1 needs you" in the title bar (so the taskbar) and
        the tray."""
        parts = [f"{running} running"] if running else []
        if needs_you:
            parts.append(f"{needs_you} needs you")
        counts = " · ".join(parts)
        name = self.project.name if self.project is not None else ""
        if self.read_only_holder is not None:
            name += " (read-only)"
        self.setWindowTitle(" — ".join(p for p in ("Anima", name, counts) if p))
        if self.tray is not None:
            self.tray.setToolTip(f"Anima — {counts}" if counts else "Anima")

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

    @Slot()
    def _add_example(self) -> None:
        """The newcomer's first milestone, in one click."""
        self.add_milestone_file(example_milestone())

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
        bridge.agent_events_received.connect(self._on_agent_events)
        bridge.phase_changed.connect(self._on_phase_changed)
        bridge.milestone_changed.connect(self._on_milestone_changed)
        bridge.milestones_scanned.connect(self._on_milestones_scanned)
        bridge.milestone_removed.connect(self._on_milestone_removed)
        bridge.milestone_redefined.connect(self._on_milestone_redefined)
        bridge.problem_reported.connect(lambda event: self.errors.add(event.text))
        bridge.problem_resolved.connect(lambda event: self.errors.dismiss(event.text))
        bridge.engine_ready.connect(self._on_engine_ready)
        bridge.verdict_reached.connect(self._on_anima_line)
        bridge.check_event.connect(self._on_anima_line)
        bridge.error_raised.connect(self._on_error)
        bridge.notice_posted.connect(self._on_notice)
        bridge.usage_limit_wait.connect(self._on_usage_limit_wait)
        # The engine's config is loaded in its worker; start() itself does not block. A page
        # opened later replays its milestone's transcript before the live output.
        engine.start(watch=True)
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
            self._phases.clear()  # nothing runs any more
            self._show_running()
            self.statusBar().showMessage("Stopped", 3000)
            self.engine_stopped.emit()
            if then is not None:
                then()

        def failed(error: BaseException) -> None:
            self.errors.add(f"Shutdown: {error}")
            finished()

        bridge.call("Stopping the engine", lambda: engine.shutdown(10.0), on_done=finished,
                    on_error=failed)

    # --- the milestone pages ---------------------------------------------------------------
    @Slot(str)
    def open_page(self, milestone_id: str) -> MilestonePage | None:
        """Show the milestone's page, opening it (and replaying its transcript) if needed."""
        page = self.milestone_pages.get(milestone_id)
        if page is not None:
            self.tabs.setCurrentWidget(page)
            return page
        record = self._records.get(milestone_id)
        if record is None:
            return None
        page = MilestonePage(milestone_id, self.clock, self)
        if self.project is not None:
            page.changes.files.viewed = self.viewed_marks.load(self.project, milestone_id)
        self.milestone_pages[milestone_id] = page
        self._connect_page(page)
        page.monitor.set_limits(self._max_rejections, self._roles)
        page.review.redefined = self._redefined.get(milestone_id, ())
        page.hold = self.board.hold_of(milestone_id)
        page.show_record(record)
        page.begin_replay()  # the phase's line too lands after the replayed history
        if (phase := self._phases.get(milestone_id)) is not None:
            page.on_phase_changed(phase)
        if self.read_only_holder is not None:
            page.review.setEnabled(False)
        index = self.tabs.addTab(page, record.title)
        self.tabs.setTabToolTip(index, f"{record.title} ({milestone_id})")
        self.tabs.setCurrentIndex(index)
        if self.bridge is not None:
            def replay(events: list[ev.TranscriptEvent], opened: MilestonePage = page) -> None:
                if self.milestone_pages.get(milestone_id) is opened:  # not closed meanwhile
                    opened.replay(events)
            self.bridge.transcript(milestone_id, on_done=replay)
        elif self.project is not None:  # read-only: the files are all there is
            page.replay(read_only.transcript(self.project, milestone_id))
        return page

    def close_page(self, milestone_id: str) -> None:
        page = self.milestone_pages.pop(milestone_id, None)
        if page is not None:
            self.tabs.removeTab(self.tabs.indexOf(page))
            page.deleteLater()

    @Slot(int)
    def _on_tab_close_requested(self, index: int) -> None:
        page = self.tabs.widget(index)
        if isinstance(page, MilestonePage):
            self.close_page(page.milestone_id)

    def current_page(self) -> MilestonePage | None:
        page = self.tabs.currentWidget()
        return page if isinstance(page, MilestonePage) else None

    def _connect_page(self, page: MilestonePage) -> None:
        mid = page.milestone_id
        send = self._send
        page.changes.load_requested.connect(self._load_changes)
        files = page.changes.files
        files.viewed_changed.connect(lambda *_: self._keep_viewed(mid, files.viewed))
        page.changes.comment_added.connect(
            lambda _m, path, line, text: send(lambda b: b.add_comment(mid, path, line, text)))
        page.changes.comment_edited.connect(
            lambda _m, cid, text: send(lambda b: b.edit_comment(mid, cid, text)))
        page.changes.comment_removed.connect(
            lambda _m, cid: send(lambda b: b.remove_comment(mid, cid)))
        review = page.review
        review.resume_requested.connect(lambda m, note: send(lambda b: b.resume(m, note)))
        review.abort_requested.connect(lambda m: send(lambda b: b.abort(m)))
        review.approve_requested.connect(lambda m: send(lambda b: b.approve(m)))
        review.changes_requested.connect(
            lambda m, note: send(lambda b: b.request_changes(m, note)))
        review.start_requested.connect(self._on_start_requested)
        review.continue_requested.connect(lambda m, n, note: send(lambda b: b.call(
            f"Continuing {m} from round {n}",
            lambda: b.engine.continue_from_round(m, n, note) if b.engine else None)))

    def _keep_viewed(self, milestone_id: str, viewed: dict[str, str]) -> None:
        if self.project is not None:
            self.viewed_marks.save(self.project, milestone_id, viewed)

    def _send(self, request: Callable[[EngineBridge], None]) -> None:
        """A decision goes to the engine through the bridge, if a project is open."""
        if self.bridge is not None:
            request(self.bridge)

    # --- engine events (GUI thread, via the bridge) -----------------------------------------
    @Slot(object)
    def _on_milestones_scanned(self, event: ev.MilestonesScanned) -> None:
        for problem in event.problems:
            self.errors.add(problem)
        self._records = {r.id: r for r in event.records}
        self.board.set_records(event.records)
        for milestone_id in list(self.milestone_pages):
            if milestone_id in self._records:
                self.milestone_pages[milestone_id].show_record(self._records[milestone_id])
            else:
                self.close_page(milestone_id)
        self._show_holds()
        self._show_page()

    @Slot(object)
    def _on_engine_ready(self, event: ev.EngineReady) -> None:
        self._max_rejections = event.config.max_consecutive_rejections
        self._roles = {role: getattr(event.config, role) for role in ROLES}
        self.board.set_engine_config(event.parallel, self._roles)
        for page in self.milestone_pages.values():
            page.monitor.set_limits(self._max_rejections, self._roles)
        self._show_holds()
        self.listen_for_raise()  # the lock is ours: a second window may ask us forward

    @Slot(object)
    def _on_milestone_removed(self, event: ev.MilestoneRemoved) -> None:
        self._records.pop(event.milestone_id, None)
        self._phases.pop(event.milestone_id, None)
        self._show_running()
        self.board.remove(event.milestone_id)
        self.close_page(event.milestone_id)
        self._show_holds()
        self._show_page()

    @Slot(object)
    def _on_milestone_redefined(self, event: ev.MilestoneRedefined) -> None:
        self._redefined[event.milestone_id] = event.changed
        page = self.milestone_pages.get(event.milestone_id)
        if page is not None and page.record is not None:
            page.review.redefined = event.changed
            page.show_record(page.record)

    @Slot(object)
    def _on_milestone_changed(self, event: ev.MilestoneChanged) -> None:
        record = event.record
        if record.pause_reason:  # said by its card and its decision bar: not the banner too
            for said in (record.pause_reason, f"{record.id}: {record.pause_reason}"):
                self.errors.dismiss(said)
        first = not self._records
        self._records[record.id] = record
        self.board.update_record(record)
        page = self.milestone_pages.get(record.id)
        if page is not None:
            page.show_record(record)
            self.tabs.setTabText(self.tabs.indexOf(page), record.title)
        self._show_holds()  # one it waited for may have been merged, or paused
        if first:
            self._show_page()

    def _show_holds(self) -> None:
        """Each open page of a pending milestone says why it does not start, as its card."""
        for milestone_id, page in self.milestone_pages.items():
            page.show_hold(self.board.hold_of(milestone_id))

    @Slot(object)
    def _on_phase_changed(self, event: ev.PhaseChanged) -> None:
        self._phases[event.milestone_id] = event
        self.board.on_phase_changed(event)
        page = self.milestone_pages.get(event.milestone_id)
        if page is not None:
            page.on_phase_changed(event)
        self._show_running()

    def _show_running(self) -> None:
        """Pause and Stop know which milestones run (and their titles, to say which)."""
        self.run_controls.show_running({
            milestone_id: self._title(milestone_id)
            for milestone_id, event in self._phases.items() if event.phase in RUNNING})

    def _title(self, milestone_id: str) -> str:
        record = self._records.get(milestone_id)
        return record.title if record is not None else milestone_id

    @Slot(int)
    def _on_tab_changed(self, _index: int) -> None:
        self.run_controls.show_milestone(self._shown_milestone())

    @Slot(object)
    def _on_agent_events(self, events: list[ev.AgentEvent]) -> None:
        """A run of agent output: the board keeps each agent's latest line; each open page
        gets its own milestone's events."""
        self.board.feed(events)
        if not self.milestone_pages:
            return
        by_milestone: dict[str | None, list[ev.AgentEvent]] = {}
        for event in events:
            by_milestone.setdefault(event.milestone_id, []).append(event)
        for milestone_id, mine in by_milestone.items():
            page = self.milestone_pages.get(milestone_id or "")
            if page is not None:
                page.feed(mine)

    @Slot(object)
    def _on_anima_line(self, event: ev.VerdictReached | ev.CheckStarted | ev.CheckFinished
                       ) -> None:
        """A verdict or a run of the checks: shown among its milestone's agent output."""
        if (page := self.milestone_pages.get(event.milestone_id)) is not None:
            page.feed([event])

    @Slot(str, object)
    def _load_changes(self, milestone_id: str, round_no: int | None) -> None:
        """Compute the diff off the GUI thread; the view drops an answer it no longer wants."""
        engine = self.engine
        page = self.milestone_pages.get(milestone_id)
        if self.bridge is not None and engine is not None and page is not None:
            changes = page.changes
            self.bridge.call(
                f"Reading the changes of {milestone_id}",
                lambda: prepare_lexers(engine.changes(milestone_id, round_no)),
                on_done=lambda cs: changes.show_changes(milestone_id, round_no, cs),
                on_error=lambda e: changes.show_error(milestone_id, round_no, e))

    @Slot(object)
    def _on_error(self, event: ev.EngineError) -> None:
        prefix = f"{event.milestone_id}: " if event.milestone_id and \
            event.milestone_id not in event.message else ""
        # A pause's reason is said by its card and its decision bar: not by the banner too.
        if not any(r.pause_reason == event.message for r in self._records.values()):
            self.errors.add(prefix + event.message)
        # A refused request re-enables the decision it came from, and no other.
        for milestone_id in self._failed_requests(event):
            if (page := self.milestone_pages.get(milestone_id)) is not None:
                page.review.setEnabled(True)
            self.board.request_failed(milestone_id)

    def _failed_requests(self, event: ev.EngineError) -> set[str]:
        """The milestones whose request in flight the error refuses: the one it is about, or
        the ones it names ("milestone 'x' is in_progress…", "Resuming x failed: …"), or the
        only one in flight."""
        if self.bridge is None:
            return set()
        asked = {i for i, page in self.milestone_pages.items() if not page.review.isEnabled()}
        asked.update(self.board.requests_in_flight())
        if event.milestone_id is not None:
            return {event.milestone_id} & asked
        named = {i for i in asked
                 if re.search(rf"(?<![\w.-]){re.escape(i)}(?![\w-])", event.message)}
        return named or (asked if len(asked) == 1 else set())

    # --- user requests ---------------------------------------------------------------------
    @Slot(str, str)
    def _on_card_action(self, milestone_id: str, action: str) -> None:
        """A card's main decision, made on the board."""
        if action != "review" and self.bridge is None:  # nothing to send it to
            self.board.request_failed(milestone_id)
            return
        if action == "review":
            page = self.open_page(milestone_id)
            if page is not None:
                page.tabs.setCurrentWidget(page.changes)
        elif action in ("resume", "retry") and self.bridge is not None:
            self.bridge.resume(milestone_id)
        elif action == "start":
            self._on_start_requested(milestone_id)

    @Slot(str)
    def _on_start_requested(self, milestone_id: str) -> None:
        if self.bridge is not None:
            self.bridge.start_milestone(milestone_id)
            self.statusBar().showMessage(f"{milestone_id} starts as soon as a slot is free",
                                         8000)

    @Slot()
    def _on_pause_requested(self) -> None:
        """Pause the milestone in front after its round (on the board: every running one)."""
        targets = self.run_controls.targets()
        bridge = self.bridge
        if bridge is None or not targets:
            return

        def failed(error: BaseException) -> None:
            self.run_controls.forget_pause(targets)
            self.errors.add(f"Pause after this round failed: {error}")

        bridge.pause_after_round(self._shown_milestone(), on_error=failed)
        self.statusBar().showMessage(
            f"“{self._title(targets[0])}” pauses after this round" if len(targets) == 1 else
            f"The {len(targets)} running milestones pause after their round", 8000)

    @Slot()
    def _on_stop_requested(self) -> None:
        """Stop the milestone in front now (on the board: every running one), once asked."""
        targets = self.run_controls.targets()
        if self.bridge is None or not targets or not confirm(
                self, "Stop now", self.run_controls.stop_question(), "Stop now",
                "The current round is interrupted and redone when you resume the milestone."
                if len(targets) == 1 else "Each one's current round is interrupted and redone "
                "when you resume it; pending milestones start in the slots this frees "
                "(with `auto_start` off, only those you started)."):
            return
        targets = self.run_controls.targets()  # what runs once the dialog is answered
        if self.bridge is not None and targets:
            self._note_stop_requested(targets)
            self.bridge.stop_now(self._shown_milestone())
            self.statusBar().showMessage(
                f"Stopping “{self._title(targets[0])}”…" if len(targets) == 1 else
                f"Stopping the {len(targets)} running milestones…", 8000)

    # --- closing ----------------------------------------------------------------------------
    def close_without_asking(self) -> None:
        """Ctrl+C in the terminal: the user already said to quit."""
        self._ask_before_closing = False
        self.close()

    def _may_close(self) -> bool:
        """Closing while agents work asks first; when idle, nothing to ask."""
        running = self.board.column_ids("running")
        if not self._ask_before_closing or not running:
            return True
        record = self._records.get(running[0]) if len(running) == 1 else None
        return confirm_close(self, record.title if record else None)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Ask while agents work; save the layout, stop the engine off the GUI thread, close."""
        if not self._closing:
            if not self._may_close():
                event.ignore()
                return
            self._closing = True
            self._save_geometry()
            # A closing window takes nothing over: were the project's other Anima to stop
            # now, the read-only watch would open it here and start agents nobody sees.
            self.leave_read_only()
        if self.engine is None:
            if self.tray is not None:
                self.tray.hide()
            if self.desktop_notifier is not None:
                self.desktop_notifier.close()
            event.accept()
            return
        event.ignore()
        self._note_stop_requested(list(self.milestone_pages))
        self._stop_engine(then=self.close)

    def _shown_milestone(self) -> str | None:
        """The milestone whose page is in front (None on the board: every running one)."""
        return next((milestone_id for milestone_id, page in self.milestone_pages.items()
                     if page is self.tabs.currentWidget()), None)

    def _note_stop_requested(self, milestone_ids: list[str]) -> None:
        """Their agents' next error result is the human's stop, not a failure."""
        for milestone_id in milestone_ids:
            if (page := self.milestone_pages.get(milestone_id)) is not None:
                for pane in page.monitor.panes.values():
                    pane.note_stop_requested()


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
