"""Where the human steps in: a paused or awaiting-review milestone, and the run controls.

`ReviewPanel` is a compact bar over the milestone's page (two lines at most, so the diff below
keeps the height): it says why a milestone stopped (its pause reason and the last rejection reasons)
and offers the decisions that make sense: Resume (with a note to the Developer) or Abort for a
paused milestone (Retry for a failed one); Approve, Request changes or Abort for one awaiting
review; Start or Abort for a pending one (Abort always after a confirmation dialog); a
completed one says whether it was merged. Line comments left in the Changes view go with Resume
and Request changes. It only emits requests; `MainWindow` sends them to the
engine through the bridge. `RunControls` holds the
toolbar's "Pause after this round" and "Stop now".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ui.dialogs import confirm
from ui.formatting import enum_text
from ui.record_facts import (
    MAIN_ACTION,
    current_rejections,
    dropped_rounds,
    merge_waits_text,
    no_new_commit,
)
from ui.widgets import ElidedLabel, set_style_state

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord


class ReviewPanel(QFrame):
    """The decision a paused or finished-but-unreviewed milestone waits for."""

    #: (milestone id, note) — resume a paused milestone. GUI thread.
    resume_requested = Signal(str, str)
    #: milestone id — cancel it for good (confirmed in a dialog). GUI thread.
    abort_requested = Signal(str)
    #: milestone id — accept an awaiting_review milestone. GUI thread.
    approve_requested = Signal(str)
    #: (milestone id, note) — send an awaiting_review milestone back to the Developer.
    changes_requested = Signal(str, str)
    #: (milestone id, round, note) — put the branch back to that accepted round and resume.
    continue_requested = Signal(str, int, str)
    #: milestone id — start a pending milestone (needed when `auto_start` is off). GUI thread.
    start_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("reviewPanel")
        self.milestone_id: str | None = None
        self.title = ""
        self.mode = "hidden"
        self.comment_count = 0
        #: What its `.md` changed since its final acceptance (`MilestoneRedefined`), if it
        #: waits for your review: approving then sends it back to the Developer.
        self.redefined: tuple[str, ...] = ()
        self.heading = QLabel(self)
        self.heading.setObjectName("reviewHeading")
        # One line each, elided; the whole text is in the tooltip.
        self.reason = ElidedLabel(self)
        self.reason.setObjectName("reviewReason")
        self.rejections = ElidedLabel(self)
        self.rejections.setObjectName("reviewRejections")
        # What to do about a failure, on a line of its own: after a long error it is elided.
        self.advice = ElidedLabel(self)
        self.advice.setObjectName("reviewAdvice")
        self.note = QPlainTextEdit(self)
        self.note.setObjectName("reviewNote")
        self.note.setFixedHeight(30)
        self.note.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.resume_button = QPushButton("Resume", self)
        self.resume_button.setObjectName("primaryButton")
        self.abort_button = QPushButton("Abort milestone", self)
        self.abort_button.setObjectName("dangerButton")
        self.approve_button = QPushButton("Approve", self)
        self.approve_button.setObjectName("primaryButton")
        self.changes_button = QPushButton("Request changes", self)
        self.continue_button = QPushButton("Continue from round…", self)
        self.continue_button.setToolTip("Put the branch back to an accepted round (the later "
                                        "commits are kept under a ref) and resume from there")
        self.continue_menu = QMenu(self.continue_button)
        self.continue_button.setMenu(self.continue_menu)
        self.start_button = QPushButton("Start", self)
        self.start_button.setObjectName("primaryButton")
        self.start_button.setToolTip("Start this milestone as soon as no other one is running")
        top = QHBoxLayout()
        top.setSpacing(10)
        top.addWidget(self.heading)
        top.addWidget(self.reason, 1)
        for button in (self.abort_button, self.continue_button, self.changes_button,
                       self.approve_button, self.resume_button, self.start_button):
            top.addWidget(button)
        second = QHBoxLayout()
        second.setSpacing(10)
        second.addWidget(self.advice)
        second.addWidget(self.rejections, 2)
        second.addWidget(self.note, 3)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 4, 12, 4)
        layout.setSpacing(4)
        layout.addLayout(top)
        layout.addLayout(second)

        self.resume_button.clicked.connect(self._on_resume_clicked)
        self.abort_button.clicked.connect(self._on_abort_clicked)
        self.approve_button.clicked.connect(self._on_approve_clicked)
        self.changes_button.clicked.connect(self._on_changes_clicked)
        self.start_button.clicked.connect(self._on_start_clicked)
        self.note.textChanged.connect(self._on_note_changed)
        self.hide()

    def show_record(self, record: MilestoneRecord | None, hold: str = "") -> None:
        """Show the panel for a paused / failed / awaiting_review / pending milestone, else
        hide it. `hold`: why a pending one does not start, as its card says it."""
        status = "" if record is None else enum_text(record.status)
        if record is not None and status == "pending":
            self._show_pending(record, hold)
            return
        if record is not None and status == "completed":
            self._show_completed(record)
            return
        if record is None or status not in ("paused", "awaiting_review", "failed"):
            self.milestone_id, self.mode = None, "hidden"
            self.hide()
            return
        # The same decision, updated (a rescan, a new cost figure): a request in flight and the
        # note stay as they are.
        new_decision = record.id != self.milestone_id or status != self.mode
        if new_decision:
            self.note.clear()  # a new decision: don't carry an old note over
        self.milestone_id, self.mode, self.title = record.id, status, record.title
        self.comment_count = len(record.comments)
        set_style_state(self, "mode", status)
        paused = status in ("paused", "failed")
        if status == "failed":
            self.heading.setText("Failed —")
            self.reason.setText(record.error or "Unknown error.")
            self.note.setPlaceholderText("A note for the Developer (optional)")
        elif paused:
            self.heading.setText("Paused —")
            self.reason.setText(record.pause_reason or "Paused.")
            self.note.setPlaceholderText("A note for the Developer (optional): what to change, "
                                         "where to look…")
        else:
            self.heading.setText("Awaiting your review —")
            self.reason.setText(self._redefined_text(record) or no_new_commit(record) or (
                f"{record.features_done}/{len(record.features)} features, "
                f"{len(record.iterations)} rounds, ${record.spent_usd:.2f}. Approve to complete "
                "it (and merge), or request changes."))
            self.note.setPlaceholderText("What should change? (or comment on lines in the "
                                         "Changes tab)")
        # What is true now: the rejections no later accepted round answered.
        reasons = current_rejections(record, limit=3)
        self.rejections.setText("\n".join(f"✘ Round {r}: {why}" for r, why in reasons)
                                if reasons else "")
        self.rejections.setVisible(bool(reasons))
        self.advice.setText("Retry runs it again; the traceback is in .anima/logs/anima.log."
                            if status == "failed" else "")
        self.advice.setVisible(status == "failed")
        self.note.show()
        if paused:
            self.resume_button.setText(MAIN_ACTION[status][1])  # as the board's card says
            self._fill_continue_menu(record)
            self._show_buttons(self.resume_button, self.abort_button,
                               *([self.continue_button] if self.continue_menu.actions() else []))
        else:
            self.approve_button.setText("Approve and go on" if self.redefined else "Approve")
            self.approve_button.setToolTip(self._redefined_text(record))
            self._show_buttons(self.approve_button, self.changes_button, self.abort_button)
        self._on_note_changed()
        if new_decision:
            self.setEnabled(True)
        self.show()

    def _redefined_text(self, record: MilestoneRecord) -> str:
        """Approving a milestone whose `.md` changed since its final acceptance does not
        complete it (`anima approve`): said before you press it."""
        if not self.redefined:
            return ""
        return (f"Its {' and '.join(self.redefined)} changed in {record.id}.md since its final "
                "acceptance: Approve sends it back to the Developer to build it as it is now, "
                "and a final acceptance judges it again before it waits for you.")

    def _show_completed(self, record: MilestoneRecord) -> None:
        """The merge result of a completed milestone: merged, or why not."""
        self.milestone_id, self.mode = record.id, "completed"
        set_style_state(self, "mode", "completed")
        self.heading.setText("Completed —")
        merge = record.merge
        if merge is None:
            self.reason.setText("Not merged (merge_on_complete is off): its branch "
                                f"{record.branch_name} is kept for you to merge.")
        elif merge.waits_for_you:
            self.reason.setText(merge_waits_text(merge))
        else:
            words = {"merged": "Merged: ", "pending": "Merging into main… "}.get(
                enum_text(merge.state), "Not merged: ")
            self.reason.setText(words + merge.detail)
        self.rejections.hide()
        self.advice.hide()
        self.note.hide()
        self._show_buttons()
        self.setEnabled(True)
        self.show()

    def _show_pending(self, record: MilestoneRecord, hold: str) -> None:
        """Start, or why there is none: it never starts, or waits (`hold`)."""
        if (record.id, "pending") != (self.milestone_id, self.mode):
            self.setEnabled(True)
            self.start_button.setEnabled(True)  # a Start asked for stays disabled
        self.milestone_id, self.mode, self.title = record.id, "pending", record.title
        set_style_state(self, "mode", "pending")
        self.heading.setText("Not started —")
        self.reason.setText(hold or f"{len(record.features)} features, "
                            f"{len(record.acceptance_criteria)} acceptance criteria. It starts "
                            "by itself when a slot is free (config `auto_start`), or when you "
                            "click Start.")
        self.rejections.hide()
        self.advice.hide()
        self.note.hide()
        self._show_buttons(*([] if hold else [self.start_button]), self.abort_button)
        self.show()

    def _show_buttons(self, *visible: QPushButton) -> None:
        for button in (self.resume_button, self.abort_button, self.approve_button,
                       self.changes_button, self.start_button, self.continue_button):
            button.setVisible(button in visible)

    def _fill_continue_menu(self, record: MilestoneRecord) -> None:
        self.continue_menu.clear()
        last = record.iterations[-1].round if record.iterations else 0
        dropped = dropped_rounds(record)
        for it in record.iterations:
            if enum_text(it.verdict) == "accepted" and it.commit and it.round != last \
                    and it.round not in dropped:
                action = self.continue_menu.addAction(
                    f"Round {it.round} · {it.feature or ''} · {it.commit[:7]}")
                action.triggered.connect(lambda _c=False, n=it.round: self._on_continue(n))

    def _on_continue(self, round_no: int) -> None:
        milestone_id = self.milestone_id
        if not milestone_id or not confirm(
                self.window(), "Continue from an earlier round",
                f"Put the branch back to round {round_no} and resume from there?",
                f"Continue from round {round_no}",
                "The later commits leave the branch but stay reachable under "
                f"refs/anima/dropped/{milestone_id}/; features they implemented are done "
                "again. Your note goes to the Developer."):
            return
        if milestone_id == self.milestone_id:
            self.setEnabled(False)
            self.continue_requested.emit(milestone_id, round_no, self.note_text)

    @property
    def note_text(self) -> str:
        return self.note.toPlainText().strip()

    @Slot()
    def _on_note_changed(self) -> None:
        self.changes_button.setEnabled(bool(self.note_text) or self.comment_count > 0)

    @Slot()
    def _on_resume_clicked(self) -> None:
        if self.milestone_id:
            self.setEnabled(False)  # until the record changes
            self.resume_requested.emit(self.milestone_id, self.note_text)

    @Slot()
    def _on_abort_clicked(self) -> None:
        milestone_id = self.milestone_id
        if not milestone_id:
            return
        detail = ("It has not started: it never will." if self.mode == "pending" else
                  "Its branch and commits are kept; its worktree is removed (work left "
                  "uncommitted there goes to a stash). Unsent comments are dropped.")
        if not confirm(self.window(), "Abort milestone",
                       f"Abort “{self.title}”? It is cancelled for good.",
                       "Abort milestone", detail):
            return
        if milestone_id == self.milestone_id:  # still the one shown after the dialog
            self.setEnabled(False)
            self.abort_requested.emit(milestone_id)

    @Slot()
    def _on_start_clicked(self) -> None:
        if self.milestone_id:
            # Only Start: it may wait long for a slot, and Abort stays yours meanwhile.
            self.start_button.setEnabled(False)
            self.start_requested.emit(self.milestone_id)

    @Slot()
    def _on_approve_clicked(self) -> None:
        if self.milestone_id:
            self.setEnabled(False)
            self.approve_requested.emit(self.milestone_id)

    @Slot()
    def _on_changes_clicked(self) -> None:
        if self.milestone_id and (self.note_text or self.comment_count):
            self.setEnabled(False)
            self.changes_requested.emit(self.milestone_id, self.note_text)


class RunControls(QObject):
    """"Pause after this round" and "Stop now" for the milestone whose page is in front,
    enabled only while it runs; on the board (no page in front), for every running one, and
    worded so."""

    #: Finish the current round, then pause. GUI thread.
    pause_requested = Signal()
    #: Interrupt both agents now; the milestone pauses ("stopped by you"). GUI thread.
    stop_requested = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pause_action = QAction("Pause after this round", self)
        self.pause_action.setShortcut(QKeySequence("Ctrl+Shift+P"))
        self.stop_action = QAction("Stop now", self)
        self.stop_action.setShortcut(QKeySequence("Ctrl+Shift+S"))
        self.pause_action.triggered.connect(self._on_pause_triggered)
        self.stop_action.triggered.connect(self.stop_requested)
        #: The running milestones (id → title), the one in front (None: the board), and the
        #: ones asked to pause after their round.
        self.running: dict[str, str] = {}
        self.shown: str | None = None
        self.pausing: set[str] = set()
        self._refresh()

    def show_running(self, running: dict[str, str]) -> None:
        """The milestones that run now (id → title)."""
        self.running = dict(running)
        self.pausing &= set(running)  # one that stopped is asked nothing any more
        self._refresh()

    def show_milestone(self, milestone_id: str | None) -> None:
        """The milestone whose page is in front (None: the board)."""
        self.shown = milestone_id
        self._refresh()

    def targets(self) -> list[str]:
        """What Pause and Stop act on now: the milestone in front if it runs, nothing if it
        does not; on the board, every running milestone."""
        if self.shown is not None:
            return [self.shown] if self.shown in self.running else []
        return list(self.running)

    def stop_question(self) -> str:
        """What Stop asks before it acts, naming what it stops."""
        targets = self.targets()
        if self.shown is None and len(targets) > 1:
            return f"Stop all {len(targets)} running milestones now?"
        title = self.running.get(targets[0], targets[0]) if targets else ""
        return f"Stop both agents of “{title}” now?"

    def _refresh(self) -> None:
        targets = self.targets()
        board = self.shown is None
        many = board and len(targets) > 1
        pausing = bool(targets) and all(t in self.pausing for t in targets)
        self.stop_action.setEnabled(bool(targets))
        self.pause_action.setEnabled(bool(targets) and not pausing)
        if pausing:
            self.pause_action.setText("Pausing after this round…")
        else:
            self.pause_action.setText(f"Pause all {len(targets)} after this round" if many
                                      else "Pause after this round")
        self.stop_action.setText(f"Stop all {len(targets)} now" if many else "Stop now")
        which = "every running milestone" if board else "this milestone"
        self.pause_action.setToolTip(f"Let the current round of {which} finish, then pause it")
        self.stop_action.setToolTip(f"Interrupt the agents of {which} now; the round is redone "
                                    "on resume")

    def forget_pause(self, milestone_ids: list[str] | None = None) -> None:
        """A pause request that failed: the milestones are not pausing after all."""
        self.pausing -= set(self.running if milestone_ids is None else milestone_ids)
        self._refresh()

    @Slot()
    def _on_pause_triggered(self) -> None:
        self.pausing.update(self.targets())
        self._refresh()
        self.pause_requested.emit()
