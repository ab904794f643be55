"""The Changes view: what the selected milestone changed, and the reviewer's line comments.

A range selector (the whole milestone, or one round's commit — also chosen by a single click in
the rounds table), a file table with per-file +/- counts, the selected file's diff
(`ui.diff_view.DiffView`) and, under it, the comments left on lines. Generated and
whitespace-only files are listed greyed and shown folded until asked. The view computes
nothing itself: it asks for a `ChangeSet` through `load_requested` (the window runs
`Engine.changes` off the GUI thread) and draws only the file on screen. Comments are saved
through the engine (`comment_added` / `_edited` / `_removed`) and come back with the record.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import (
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QColor, QShowEvent
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
    QTableView,
    QVBoxLayout,
    QWidget,
)

from anima.diffs import ChangeSet, DiffRow, FileDiff
from ui.diff_view import DiffView
from ui.formatting import enum_text
from ui.table_model import ColumnModel

COMMENTABLE = ("paused", "awaiting_review")

def fold_reason(diff: FileDiff) -> str:
    return "generated file" if diff.generated else "whitespace-only change"


class FileTableModel(ColumnModel):
    """One row per changed file: path (greyed when folded), lines added, lines removed."""

    COLUMNS = ("File", "+", "−")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.files: tuple[FileDiff, ...] = ()

    def set_files(self, files: tuple[FileDiff, ...]) -> None:
        self.beginResetModel()
        self.files = files
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.files)

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        f = self.files[index.row()]
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 0:
                return f"{f.old_path} → {f.path}" if f.old_path else f.path
            if f.binary:
                return "bin" if column == 1 else ""
            return f"+{f.added}" if column == 1 else f"−{f.removed}"
        if role == Qt.ItemDataRole.ForegroundRole:
            if column == 0:
                return QColor("#8c959f") if f.collapsed else None
            return QColor("#1a7f37" if column == 1 else "#cf222e")
        if role == Qt.ItemDataRole.ToolTipRole and f.collapsed:
            return f"{f.path}: {fold_reason(f)}, folded"
        if role == Qt.ItemDataRole.TextAlignmentRole and column:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class CommentBox(QFrame):
    """The small editor a click on a diff line opens: `path:line`, the text, Save / Cancel."""

    #: (path, line, comment id or "" for a new one, text). GUI thread.
    saved = Signal(str, int, str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("commentBox")
        self.path, self.line, self.comment_id = "", 0, ""
        self.caption = QLabel(self)
        self.caption.setObjectName("commentCaption")
        self.text = QPlainTextEdit(self)
        self.text.setObjectName("commentText")
        self.text.setFixedHeight(60)
        self.text.setPlaceholderText("What should the Developer change here?")
        self.save_button = QPushButton("Save comment", self)
        self.save_button.setObjectName("primaryButton")
        self.cancel_button = QPushButton("Cancel", self)
        buttons = QHBoxLayout()
        buttons.addWidget(self.caption, 1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.text)
        layout.addLayout(buttons)
        self.save_button.clicked.connect(self._on_save)
        self.cancel_button.clicked.connect(self.hide)
        self.hide()

    def open_for(self, path: str, line: int, text: str = "", comment_id: str = "") -> None:
        self.path, self.line, self.comment_id = path, line, comment_id
        self.caption.setText(f"{'Edit the comment on' if comment_id else 'Comment on'} "
                             f"{path}:{line}")
        self.text.setPlainText(text)
        self.show()
        self.text.setFocus()

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
        for column in (1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Fixed)
            header.resizeSection(column, 54)
        self.file_table.setTextElideMode(Qt.TextElideMode.ElideLeft)

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

        self.comment_box = CommentBox(self)
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
        comments_layout.addWidget(self.comment_box)
        comments_layout.addWidget(self.comments_title)
        comments_layout.addWidget(self.comment_list, 1)
        comments_layout.addLayout(comment_buttons)

        diff_area = QWidget(self)
        diff_layout = QVBoxLayout(diff_area)
        diff_layout.setContentsMargins(0, 0, 0, 0)
        diff_layout.setSpacing(0)
        diff_layout.addWidget(self.fold_bar)
        diff_layout.addWidget(self.diff, 1)
        self.right = QSplitter(Qt.Orientation.Vertical, self)
        self.right.addWidget(diff_area)
        self.right.addWidget(comments)
        self.right.setStretchFactor(0, 4)
        self.right.setStretchFactor(1, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(self.file_table)
        self.splitter.addWidget(self.right)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(top)
        layout.addWidget(self.splitter, 1)

        self.range.activated.connect(self._on_range_chosen)
        self.file_table.selectionModel().currentRowChanged.connect(self._on_file_changed)
        self.expand_button.clicked.connect(self._on_expand)
        self.diff.line_clicked.connect(self._on_line_clicked)
        self.comment_box.saved.connect(self._on_comment_saved)
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
        folded = sum(1 for f in changes.files if f.collapsed)
        self.summary.setText(
            f"{changes.label}: {len(changes.files)} files, +{changes.added} −{changes.removed}"
            + (f" · {folded} folded (generated or whitespace only)" if folded else "")
            + f" · {changes.old[:7]}..{changes.new[:7]}")
        if not changes.files:
            self._clear("No changes.", keep_summary=True)
            return
        paths = [f.path for f in changes.files]
        row = paths.index(keep) if keep in paths else next(
            (i for i, f in enumerate(changes.files) if not f.collapsed), 0)
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

    @Slot(QModelIndex, QModelIndex)
    def _on_file_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self._show_file(self.files.files[current.row()])

    def _show_file(self, diff: FileDiff) -> None:
        folded = diff.collapsed and diff.path not in self._expanded
        self.fold_bar.setVisible(folded)
        if folded:
            self.fold_label.setText(f"{diff.path}: {fold_reason(diff)} "
                                    f"(+{diff.added} −{diff.removed}), folded.")
            self.diff.show_file(None, "Folded: click “Show the diff” to read it.")
        else:
            self.diff.show_file(diff)

    @Slot()
    def _on_expand(self) -> None:
        index = self.file_table.currentIndex()
        if index.isValid():
            diff = self.files.files[index.row()]
            self._expanded.add(diff.path)
            self._show_file(diff)

    @property
    def current_file(self) -> FileDiff | None:
        return self.diff.file

    # --- comments -----------------------------------------------------------------------
    def _commentable(self) -> bool:
        return self.record is not None and enum_text(self.record.status) in COMMENTABLE

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
            self.comment_box.hide()
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
        line = row.new_line if row.new_line is not None else row.old_line
        if line is not None:
            self.comment_box.open_for(path, line)

    @Slot(str, int, str, str)
    def _on_comment_saved(self, path: str, line: int, comment_id: str, text: str) -> None:
        if self.record is None:
            return
        if comment_id:
            self.comment_edited.emit(self.record.id, comment_id, text)
        else:
            self.comment_added.emit(self.record.id, path, line, text)

    @Slot(QListWidgetItem)
    def _edit_item(self, item: QListWidgetItem | None) -> None:
        if item is None or not self._commentable():
            return
        path, line, text = item.data(Qt.ItemDataRole.UserRole + 1)
        self.comment_box.open_for(path, line, text, item.data(Qt.ItemDataRole.UserRole))

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
