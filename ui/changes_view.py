"""The Changes view: what the selected milestone changed, and the reviewer's line comments.

A range selector (the whole milestone, or one round's commit — also chosen by a single click in
the rounds table), a file table with per-file +/- counts and "viewed" marks, and the selected
file's diff (`ui.diff_view.DiffView`), unified or side by side. Comments open under the clicked
line and stay there, inline, as a pull-request review shows them (Ctrl+Enter saves, Esc
cancels), in either view; the list under the diff is their overview. Generated and
whitespace-only files are listed greyed and shown folded until asked; Anima's own files
(`.anima/…`) are listed apart and never counted in the totals. Keys: F7 / Shift+F7 next /
previous hunk (on to the next file at the end of one), Alt+Down / Alt+Up next / previous file,
Ctrl+F find in the diff.

The view computes nothing itself: it asks for a `ChangeSet` through `load_requested` (the
window runs `Engine.changes` off the GUI thread) and draws only the file on screen. Comments
are saved through the engine (`comment_added` / `_edited` / `_removed`) and come back with the
record.
"""

from __future__ import annotations

import hashlib
from typing import Any

from PySide6.QtCore import (
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QColor, QKeySequence, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from anima.diffs import ChangeSet, DiffRow, FileDiff
from ui.diff_view import PREFIX, DiffView, SideBySideView, comment_line
from ui.formatting import enum_text
from ui.search_bar import SearchBar
from ui.table_model import ColumnModel

COMMENTABLE = ("paused", "awaiting_review")

def fold_reason(diff: FileDiff) -> str:
    return "generated file" if diff.generated else "whitespace-only change"


#: The heading row above Anima's own files in the file table.
ANIMA_SECTION = "Anima's files — not counted"


def _name(diff: FileDiff) -> str:
    """A file's name in the list; a name that is not UTF-8 has its odd bytes as `\\xNN`
    (`FileDiff.path`)."""
    return f"{diff.old_path} → {diff.path}" if diff.old_path else diff.path


def fingerprint(diff: FileDiff) -> str:
    """What a "viewed" mark is for: this version of the file's change. A digest, not `hash`:
    marks outlive the process (`ui.viewed_marks`), and `hash` of a str changes with each one."""
    return hashlib.blake2b(diff.patch.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class FileTableModel(ColumnModel):
    """One row per changed file: path (greyed when folded), lines added, lines removed, and
    whether the reviewer marked it viewed. The milestone's files come first; Anima's own
    follow under a heading row of their own."""

    COLUMNS = ("File", "+", "−", "✓")
    VIEWED = 3

    #: (path, viewed) — the reviewer ticked or unticked a file. GUI thread.
    viewed_changed = Signal(str, bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.files: tuple[FileDiff | None, ...] = ()  # None: the "Anima's files" heading
        #: path → the fingerprint of the change the reviewer marked viewed
        self.viewed: dict[str, str] = {}

    def set_files(self, files: tuple[FileDiff, ...]) -> None:
        work = tuple(f for f in files if not f.anima_file)
        own = tuple(f for f in files if f.anima_file)
        self.beginResetModel()
        self.files = work + ((None, *own) if own else ())
        self.endResetModel()

    def is_viewed(self, diff: FileDiff) -> bool:
        """Viewed, and not changed since (a mark resets when the file changes again)."""
        return self.viewed.get(diff.path) == fingerprint(diff)

    def file_rows(self) -> list[int]:
        return [i for i, f in enumerate(self.files) if f is not None]

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.files)

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        f = self.files[index.row()] if index.isValid() else None
        if f is None:
            return Qt.ItemFlag.NoItemFlags
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == self.VIEWED:
            flags |= Qt.ItemFlag.ItemIsUserCheckable
        return flags

    def setData(self, index: QModelIndex | QPersistentModelIndex, value: Any,
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        f = self.files[index.row()] if index.isValid() else None
        if f is None or role != Qt.ItemDataRole.CheckStateRole:
            return False
        viewed = Qt.CheckState(value) == Qt.CheckState.Checked
        if viewed:
            self.viewed[f.path] = fingerprint(f)
        else:
            self.viewed.pop(f.path, None)
        self.dataChanged.emit(self.index(index.row(), 0), self.index(index.row(),
                                                                       self.VIEWED))
        self.viewed_changed.emit(f.path, viewed)
        return True

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        f = self.files[index.row()]
        column = index.column()
        if f is None:  # the heading over Anima's files
            if role == Qt.ItemDataRole.DisplayRole and column == 0:
                return ANIMA_SECTION
            if role == Qt.ItemDataRole.ForegroundRole:
                return QColor("#57606a")
            if role == Qt.ItemDataRole.ToolTipRole:
                return ("Anima's own files (config, soul.md, milestone definitions, memory): "
                        "shown so you see a commit touched them, never counted in the totals")
            return None
        viewed = self.is_viewed(f)
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 0:
                return _name(f)
            if column == self.VIEWED:
                return None
            if f.binary:
                return "bin" if column == 1 else ""
            return f"+{f.added}" if column == 1 else f"−{f.removed}"
        if role == Qt.ItemDataRole.CheckStateRole and column == self.VIEWED:
            return Qt.CheckState.Checked if viewed else Qt.CheckState.Unchecked
        if role == Qt.ItemDataRole.ForegroundRole:
            if column == 0:
                return QColor("#8c959f") if f.collapsed or viewed else None
            return QColor("#1a7f37" if column == 1 else "#cf222e")
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == self.VIEWED:
                return "Viewed (the mark goes when the file changes again)"
            folded = f": {fold_reason(f)}, folded" if f.collapsed else ""
            return f"{_name(f)}{folded}"
        if role == Qt.ItemDataRole.TextAlignmentRole and column:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class CommentBox(QFrame):
    """The editor a click on a diff line opens under that line: `path:line`, the text,
    Save (Ctrl+Enter) / Cancel (Esc)."""

    #: (path, line, comment id or "" for a new one, text). GUI thread.
    saved = Signal(str, int, str, str)
    #: The box was closed without saving. GUI thread.
    cancelled = Signal()

    HEIGHT = 104

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("commentBox")
        self.path, self.line, self.comment_id = "", 0, ""
        self.caption = QLabel(self)
        self.caption.setObjectName("commentCaption")
        self.text = QPlainTextEdit(self)
        self.text.setObjectName("commentText")
        self.text.setPlaceholderText("What should the Developer change here? (Ctrl+Enter saves)")
        self.save_button = QPushButton("Save comment", self)
        self.save_button.setObjectName("primaryButton")
        self.cancel_button = QPushButton("Cancel", self)
        buttons = QHBoxLayout()
        buttons.addWidget(self.caption, 1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(4)
        layout.addWidget(self.text, 1)
        layout.addLayout(buttons)
        self.save_button.clicked.connect(self._on_save)
        self.cancel_button.clicked.connect(self.cancel)
        for keys, slot in (("Ctrl+Return", self._on_save), ("Ctrl+Enter", self._on_save),
                           ("Escape", self.cancel)):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(slot)
        self.hide()

    def open_for(self, path: str, line: int, text: str = "", comment_id: str = "") -> None:
        self.path, self.line, self.comment_id = path, line, comment_id
        self.caption.setText(f"{'Edit the comment on' if comment_id else 'Comment on'} "
                             f"{path}:{line}")
        self.text.setPlainText(text)
        self.show()
        self.raise_()
        self.text.setFocus()

    @Slot()
    def cancel(self) -> None:
        if self.isVisible():
            self.hide()
            self.cancelled.emit()

    @Slot()
    def _on_save(self) -> None:
        text = self.text.toPlainText().strip()
        if text:
            self.saved.emit(self.path, self.line, self.comment_id, text)
            self.hide()


class ChangesView(QWidget):
    """Range selector, file table, one file's diff, and the unsent line comments."""

    #: (milestone id, round number or None for the whole milestone). GUI thread.
    load_requested = Signal(str, object)
    #: (milestone id, path, line, text). GUI thread.
    comment_added = Signal(str, str, int, str)
    #: (milestone id, comment id, text). GUI thread.
    comment_edited = Signal(str, str, str)
    #: (milestone id, comment id). GUI thread.
    comment_removed = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("changesView")
        self.record: Any = None
        self.changes: ChangeSet | None = None
        self._wanted: tuple[str, int | None, int, str] | None = None  # to show
        self._loaded: tuple[str, int | None, int, str] | None = None  # requested
        self._expanded: set[str] = set()

        self.range = QComboBox(self)
        self.range.setObjectName("changesRange")
        self.range.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.summary = QLabel(self)
        self.summary.setObjectName("changesSummary")
        top = QHBoxLayout()
        top.setContentsMargins(8, 6, 8, 2)
        top.addWidget(self.range)
        top.addWidget(self.summary, 1)

        self.files = FileTableModel(self)
        self.file_table = QTableView(self)
        self.file_table.setObjectName("changedFiles")
        self.file_table.setModel(self.files)
        self.file_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.file_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.file_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.file_table.setShowGrid(False)
        self.file_table.setWordWrap(False)
        self.file_table.verticalHeader().hide()
        self.file_table.verticalHeader().setDefaultSectionSize(22)
        header = self.file_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column, width in ((1, 42), (2, 42), (FileTableModel.VIEWED, 26)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Fixed)
            header.resizeSection(column, width)
        # "src/…/greet.py": the file's name and where it starts stay readable.
        self.file_table.setTextElideMode(Qt.TextElideMode.ElideMiddle)

        self.fold_bar = QFrame(self)
        self.fold_bar.setObjectName("foldBar")
        self.fold_label = QLabel(self.fold_bar)
        self.expand_button = QPushButton("Show the diff", self.fold_bar)
        fold_layout = QHBoxLayout(self.fold_bar)
        fold_layout.setContentsMargins(8, 4, 8, 4)
        fold_layout.addWidget(self.fold_label, 1)
        fold_layout.addWidget(self.expand_button)
        self.fold_bar.hide()
        self.diff = DiffView(self)
        self.sides = SideBySideView(self)
        self.diff_stack = QStackedWidget(self)
        self.diff_stack.addWidget(self.diff)
        self.diff_stack.addWidget(self.sides)
        self.search = SearchBar(self.diff, self, "Find in the diff")
        # The editor lives in the diff, in a gap made under the line it is about (side by
        # side, in the side the comment shows on).
        self.comment_box = CommentBox(self.diff.viewport())
        self._editing: DiffView = self.diff
        self.side_by_side = QToolButton(self)
        self.side_by_side.setObjectName("sideBySide")
        self.side_by_side.setText("Side by side")
        self.side_by_side.setCheckable(True)
        # A comment has a line number, not a side: said here, where the two sides are.
        self.side_by_side.setToolTip(
            "Old and new side by side (else one unified column). Click a line on either side "
            "to comment on it. A comment is kept by line number, the new file's first: on a "
            "removed line whose number the new file has too, it goes with that new line, on "
            "the right.")
        top.addWidget(self.side_by_side)
        self.comments_title = QLabel("Comments", self)
        self.comments_title.setObjectName("sectionTitle")
        self.comment_list = QListWidget(self)
        self.comment_list.setObjectName("commentList")
        self.comment_list.setWordWrap(True)
        self.edit_button = QPushButton("Edit", self)
        self.remove_button = QPushButton("Remove", self)
        self.comments_hint = QLabel(self)
        self.comments_hint.setObjectName("commentsHint")
        self.comments_hint.setWordWrap(True)
        comment_buttons = QHBoxLayout()
        comment_buttons.addWidget(self.comments_hint, 1)
        comment_buttons.addWidget(self.edit_button)
        comment_buttons.addWidget(self.remove_button)
        comments = QWidget(self)
        comments_layout = QVBoxLayout(comments)
        comments_layout.setContentsMargins(8, 4, 8, 4)
        comments_layout.setSpacing(4)
        comments_layout.addWidget(self.comments_title)
        comments_layout.addWidget(self.comment_list, 1)
        comments_layout.addLayout(comment_buttons)

        diff_area = QWidget(self)
        diff_layout = QVBoxLayout(diff_area)
        diff_layout.setContentsMargins(0, 0, 0, 0)
        diff_layout.setSpacing(0)
        diff_layout.addWidget(self.fold_bar)
        diff_layout.addWidget(self.search)
        diff_layout.addWidget(self.diff_stack, 1)
        self.right = QSplitter(Qt.Orientation.Vertical, self)
        self.right.addWidget(diff_area)
        self.right.addWidget(comments)
        self.right.setStretchFactor(0, 6)
        self.right.setStretchFactor(1, 1)
        self.right.setSizes([600, 100])  # the diff gets the height; the list is an overview
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(self.file_table)
        self.splitter.addWidget(self.right)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 3)
        self.file_table.setMinimumWidth(200)  # a path stays readable, even at 1024 px
        self.splitter.setSizes([280, 900])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(top)
        layout.addWidget(self.splitter, 1)

        self.range.activated.connect(self._on_range_chosen)
        self.file_table.selectionModel().currentRowChanged.connect(self._on_file_changed)
        self.expand_button.clicked.connect(self._on_expand)
        for view in self._views():
            view.line_clicked.connect(self._on_line_clicked)
            view.comment_clicked.connect(self._on_comment_clicked)
            view.verticalScrollBar().valueChanged.connect(self._place_comment_box)
        self.side_by_side.toggled.connect(self._on_side_by_side)
        self.comment_box.saved.connect(self._on_comment_saved)
        self.comment_box.cancelled.connect(self._close_gap)
        self.files.viewed_changed.connect(self._on_viewed_changed)
        for keys, slot in (("F7", lambda: self.go_to_hunk(1)),
                           ("Shift+F7", lambda: self.go_to_hunk(-1)),
                           ("Alt+Down", lambda: self.go_to_file(1)),
                           ("Alt+Up", lambda: self.go_to_file(-1))):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(slot)
        self.comment_list.itemDoubleClicked.connect(self._edit_item)
        self.comment_list.currentItemChanged.connect(self._on_comment_selected)
        self.edit_button.clicked.connect(lambda: self._edit_item(self.comment_list.currentItem()))
        self.remove_button.clicked.connect(self._on_remove)
        self._on_comment_selected(None)

    # --- what to show -------------------------------------------------------------------
    def show_record(self, record: Any) -> None:
        """Follow the selected milestone: its rounds in the selector, its comments below."""
        same = record is not None and self.record is not None and record.id == self.record.id
        self.record = record
        chosen = self.range.currentData() if same else None
        self.range.clear()
        if record is None:
            self._wanted = None
            self._clear("No milestone selected.")
            self._show_comments()
            return
        self.range.addItem("Whole milestone", None)
        for it in record.iterations:
            if it.commit:
                verdict = "✔" if enum_text(it.verdict) == "accepted" else "✘"
                self.range.addItem(f"Round {it.round} {verdict} · {it.commit[:7]}", it.round)
        found = self.range.findData(chosen)
        self.range.setCurrentIndex(max(found, 0))
        self._show_comments()
        self._want(record.id, self.range.currentData())

    def show_round(self, round_no: int) -> None:
        """Show one round's commit (a click in the rounds table)."""
        found = self.range.findData(round_no)
        if found >= 0 and self.record is not None:
            self.range.setCurrentIndex(found)
            self._want(self.record.id, round_no)

    def _want(self, milestone_id: str, round_no: int | None) -> None:
        # A new round moves the milestone's head, a merge its range: both are in the key.
        key = (milestone_id, round_no, len(self.record.iterations), enum_text(self.record.status))
        if key == self._wanted:
            return
        self._wanted = key
        if self.isVisible():
            self._request()

    def _request(self) -> None:
        if self._wanted is None or self._wanted == self._loaded:
            return
        self._loaded = self._wanted
        if self.changes is None:
            self.summary.setText("Reading the changes…")
        self.load_requested.emit(self._wanted[0], self._wanted[1])

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._request()

    def show_changes(self, milestone_id: str, round_no: int | None, changes: ChangeSet) -> None:
        """A requested change set arrived (GUI thread); a stale one is dropped."""
        if self._loaded is None or self._loaded[:2] != (milestone_id, round_no):
            return
        keep = self.diff.file.path if self.diff.file is not None else None
        self.changes = changes
        self.files.set_files(changes.files)
        self._show_summary()
        if not changes.files:
            self._clear("No changes.", keep_summary=True)
            return
        rows = self.files.files
        row = next((i for i, f in enumerate(rows) if f is not None and f.path == keep), None)
        if row is None:  # the first file a reviewer reads: the milestone's, not folded
            row = next((i for i, f in enumerate(rows) if f is not None and not f.collapsed),
                       self.files.file_rows()[0])
        self.file_table.selectionModel().setCurrentIndex(
            self.files.index(row, 0), QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)

    def show_error(self, milestone_id: str, round_no: int | None, error: BaseException) -> None:
        if self._loaded is not None and self._loaded[:2] == (milestone_id, round_no):
            self._loaded = None  # asking again (another click) retries
            self._clear(f"Could not read the changes: {error}")

    def _clear(self, message: str, keep_summary: bool = False) -> None:
        if not keep_summary:
            self.changes = None
            self.summary.setText(message)
            self.files.set_files(())
        self.fold_bar.hide()
        self.diff.show_file(None, message)

    @Slot(int)
    def _on_range_chosen(self, index: int) -> None:
        if self.record is not None:
            self._want(self.record.id, self.range.itemData(index))

    def _show_summary(self) -> None:
        changes = self.changes
        if changes is None:
            return
        work = changes.work_files
        folded = sum(1 for f in work if f.collapsed)
        viewed = sum(1 for f in work if self.files.is_viewed(f))
        own = len(changes.anima_files)
        self.summary.setText(
            f"{changes.label}: {len(work)} files, +{changes.added} −{changes.removed}"
            + (f" · {viewed}/{len(work)} viewed" if viewed else "")
            + (f" · {folded} folded (generated or whitespace only)" if folded else "")
            + (f" · {own} of Anima's files, not counted" if own else "")
            + f" · {changes.old[:7]}..{changes.new[:7]}")

    @Slot(QModelIndex, QModelIndex)
    def _on_file_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        diff = self.files.files[current.row()] if current.isValid() else None
        if diff is not None:
            self._show_file(diff)

    def _file_comments(self, path: str) -> list[Any]:
        return [] if self.record is None else [c for c in self.record.comments
                                               if c.path == path]

    def _views(self) -> tuple[DiffView, DiffView, DiffView]:
        return self.diff, self.sides.left, self.sides.right

    def _on_screen(self) -> DiffView | SideBySideView:
        return self.sides if self.side_by_side.isChecked() else self.diff

    def _show_file(self, diff: FileDiff) -> None:
        self.comment_box.hide()
        folded = diff.collapsed and diff.path not in self._expanded
        self.fold_bar.setVisible(folded)
        self._set_commentable()
        view = self._on_screen()
        if folded:
            self.fold_label.setText(f"{diff.path}: {fold_reason(diff)} "
                                    f"(+{diff.added} −{diff.removed}), folded.")
            view.show_file(None, "Folded: click “Show the diff” to read it.")
        else:
            view.show_file(diff, comments=self._file_comments(diff.path))

    @Slot(bool)
    def _on_side_by_side(self, on: bool) -> None:
        """Unified or side by side; the file's comments show in either."""
        self.comment_box.cancel()
        self.diff_stack.setCurrentWidget(self.sides if on else self.diff)
        self.search.set_view(self.sides.right if on else self.diff)
        diff = self.current_row_file()
        if diff is not None:
            self._show_file(diff)

    @Slot()
    def _on_expand(self) -> None:
        diff = self.current_row_file()
        if diff is not None:
            self._expanded.add(diff.path)
            self._show_file(diff)

    def current_row_file(self) -> FileDiff | None:
        index = self.file_table.currentIndex()
        return self.files.files[index.row()] if index.isValid() else None

    @Slot(str, bool)
    def _on_viewed_changed(self, _path: str, viewed: bool) -> None:
        self._show_summary()
        if viewed:  # done with this one: on to the next file not viewed yet
            self.go_to_file(1, unviewed=True)

    # --- moving around ------------------------------------------------------------------
    def go_to_file(self, step: int, *, unviewed: bool = False) -> bool:
        """Select the next (1) or previous (-1) file; False at either end."""
        rows = self.files.file_rows()
        here = self.file_table.currentIndex().row()
        ahead = [r for r in rows if (r > here if step > 0 else r < here)]
        if unviewed:
            ahead = [r for r in ahead if (f := self.files.files[r]) is not None
                     and not self.files.is_viewed(f)]
        if not ahead:
            return False
        row = ahead[0] if step > 0 else ahead[-1]
        self.file_table.selectionModel().setCurrentIndex(
            self.files.index(row, 0), QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        return True

    def go_to_hunk(self, step: int) -> bool:
        """The next (1) or previous (-1) hunk, on into the next or previous file."""
        if self.diff.go_to_hunk(step):
            return True
        if not self.go_to_file(step):
            return False
        hunks = self.diff.hunk_rows()
        if hunks:
            self.diff.scroll_to_row(hunks[0] if step > 0 else hunks[-1])
        return True

    @property
    def current_file(self) -> FileDiff | None:
        return self.diff.file

    # --- comments -----------------------------------------------------------------------
    def _commentable(self) -> bool:
        return self.record is not None and enum_text(self.record.status) in COMMENTABLE

    def _set_commentable(self) -> None:
        """The "+" on the hovered line, in every view, where comments can be left."""
        for view in self._views():
            view.commentable = self._commentable()

    def _show_comments(self) -> None:
        comments = [] if self.record is None else list(self.record.comments)
        current = self.comment_list.currentItem()
        keep = current.data(Qt.ItemDataRole.UserRole) if current is not None else None
        self.comment_list.clear()
        for c in comments:
            item = QListWidgetItem(f"{c.path}:{c.line} — {c.text}")
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            item.setData(Qt.ItemDataRole.UserRole + 1, (c.path, c.line, c.text))
            self.comment_list.addItem(item)
            if c.id == keep:
                self.comment_list.setCurrentItem(item)
        self.comments_title.setText(f"Comments ({len(comments)})" if comments else "Comments")
        if self._commentable():
            self.comments_hint.setText("Click a line of the diff to comment on it. Comments "
                                       "go to the Developer with Resume or Request changes.")
        else:
            self.comments_hint.setText("Comments can be left while the milestone is paused or "
                                       "awaiting your review.")
            self.comment_box.cancel()
        self._set_commentable()
        for shown in (self.diff, self.sides):  # whichever is on screen, both kept true
            if shown.file is not None and not self.comment_box.isVisible():
                shown.show_comments(self._file_comments(shown.file.path))
        self._on_comment_selected(self.comment_list.currentItem())

    @property
    def comment_lines(self) -> list[str]:
        return [self.comment_list.item(i).text() for i in range(self.comment_list.count())]

    @Slot(str, object)
    def _on_line_clicked(self, path: str, row: DiffRow) -> None:
        if not self._commentable():
            self.comments_hint.setText("Comments can be left while the milestone is paused or "
                                       "awaiting your review.")
            return
        shown = self._on_screen().file
        line = comment_line(shown.rows, row) if shown is not None else None
        if line is not None:
            self._open_editor(path, line)

    def _open_editor(self, path: str, line: int, text: str = "", comment_id: str = "") -> None:
        """The editor opens under the line (and its comments), pushing the lines below down;
        side by side, on the side the comment shows on, the other side making the same room."""
        shown = self._on_screen()
        if shown.file is None or shown.file.path != path:
            found = next((r for r, f in enumerate(self.files.files)
                          if f is not None and f.path == path), None)
            if found is None:
                return
            self.file_table.selectRow(found)
        view = shown.view_of(line)
        at = view.row_of(line)
        if at is None:
            return
        shown.open_gap(at, CommentBox.HEIGHT)
        if self.comment_box.parentWidget() is not view.viewport():
            self.comment_box.setParent(view.viewport())
        self._editing = view
        self.comment_box.open_for(path, line, text, comment_id)
        self._place_comment_box()
        gap = view.gap_rect()
        if gap.bottom() > view.viewport().height():  # keep it on screen
            view.verticalScrollBar().setValue(
                view.verticalScrollBar().value()
                + (gap.bottom() - view.viewport().height()) // max(
                    view.fontMetrics().lineSpacing(), 1) + 1)

    @Slot()
    def _place_comment_box(self) -> None:
        if not self.comment_box.isVisible():
            return
        view = self._editing
        gap = view.gap_rect()
        left = view.fontMetrics().horizontalAdvance(" ") * PREFIX
        self.comment_box.setGeometry(left, gap.top(), max(gap.width() - left - 12, 240),
                                     max(gap.height(), CommentBox.HEIGHT))

    @Slot()
    def _close_gap(self) -> None:
        self.diff.close_gap()
        self.sides.close_gap()

    @Slot(object)
    def _on_comment_clicked(self, comment: Any) -> None:
        if self._commentable():
            self._open_editor(comment.path, comment.line, comment.text, comment.id)

    @Slot(str, int, str, str)
    def _on_comment_saved(self, path: str, line: int, comment_id: str, text: str) -> None:
        if self.record is None:
            return
        self._close_gap()  # the comment itself shows there once saved
        if comment_id:
            self.comment_edited.emit(self.record.id, comment_id, text)
        else:
            self.comment_added.emit(self.record.id, path, line, text)

    @Slot(QListWidgetItem)
    def _edit_item(self, item: QListWidgetItem | None) -> None:
        if item is None or not self._commentable():
            return
        path, line, text = item.data(Qt.ItemDataRole.UserRole + 1)
        self._open_editor(path, line, text, item.data(Qt.ItemDataRole.UserRole))

    @Slot()
    def _on_remove(self) -> None:
        item = self.comment_list.currentItem()
        if item is not None and self.record is not None and self._commentable():
            self.comment_removed.emit(self.record.id, item.data(Qt.ItemDataRole.UserRole))

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_comment_selected(self, item: QListWidgetItem | None,
                             _previous: QListWidgetItem | None = None) -> None:
        enabled = item is not None and self._commentable()
        self.edit_button.setEnabled(enabled)
        self.remove_button.setEnabled(enabled)
