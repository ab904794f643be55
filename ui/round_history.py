"""The rounds table under the monitor: one row per round, a click shows its commit's changes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, Signal, Slot
from PySide6.QtGui import QBrush, QColor, QFont, QFontDatabase, QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QWidget

from ui.formatting import enum_text, format_duration, format_tokens, seconds_between
from ui.table_model import ColumnModel

if TYPE_CHECKING:
    from anima.engine.facade import Iteration


def check_text(check: Any) -> str:
    """A round's check in a table cell: "✓ 2.1 s", "✗ exit 1", "✗ timed out"."""
    if check.passed:
        return f"✓ {check.duration_seconds:.1f} s"
    if check.timed_out:
        return "✗ timed out"
    return f"✗ exit {check.exit_code}"


class RoundHistoryModel(ColumnModel):
    """The record's iterations as rows; rows are only appended while a milestone runs."""

    COLUMNS = ("Round", "Kind", "Feature", "Commit", "Checks", "Verdict", "Tokens", "Cost",
               "Duration")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Iteration] = []
        self.dropped: set[int] = set()

    def set_iterations(self, iterations: list[Iteration], dropped: set[int] | None = None
                       ) -> None:
        """The rounds; `dropped` ones (a rewind took them off the branch) are marked so."""
        old = self.rows
        if (dropped or set()) != self.dropped:
            self.beginResetModel()
            self.rows, self.dropped = list(iterations), set(dropped or ())
            self.endResetModel()
            return
        if len(iterations) >= len(old) and all(
                a.round == b.round and a.started_at == b.started_at
                for a, b in zip(old, iterations, strict=False)):
            # Unchanged rounds arrive as the very objects shown (the engine reuses its copy
            # of a round until it changes): only the changed rows are drawn again.
            changed = [i for i in range(len(old)) if iterations[i] is not old[i]
                       and iterations[i] != old[i]]
            self.rows[:len(old)] = iterations[:len(old)]
            if changed:
                self.dataChanged.emit(self.index(changed[0], 0),
                                      self.index(changed[-1], len(self.COLUMNS) - 1))
            if len(iterations) > len(old):
                self.beginInsertRows(QModelIndex(), len(old), len(iterations) - 1)
                self.rows = list(iterations)
                self.endInsertRows()
            return
        self.beginResetModel()
        self.rows = list(iterations)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        it = self.rows[index.row()]
        column = self.COLUMNS[index.column()]
        verdict = enum_text(it.verdict)
        dropped = it.round in self.dropped
        if role == Qt.ItemDataRole.DisplayRole:
            text = self._text(it, column, verdict)
            return f"dropped · {text}" if dropped and column == "Verdict" else text
        if dropped and role == Qt.ItemDataRole.ForegroundRole:
            return QBrush(QColor("#8c959f"))
        if dropped and role == Qt.ItemDataRole.FontRole:
            font = QFont()
            font.setStrikeOut(column in ("Commit", "Feature"))
            font.setItalic(True)
            return font
        if role == Qt.ItemDataRole.ForegroundRole and column == "Verdict":
            return QBrush(QColor("#1a7f37" if verdict == "accepted" else "#c5221f"))
        if role == Qt.ItemDataRole.ForegroundRole and column == "Checks" and it.check:
            return QBrush(QColor("#1a7f37" if it.check.passed else "#c5221f"))
        if role == Qt.ItemDataRole.FontRole and column == "Commit":
            return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        if role == Qt.ItemDataRole.ToolTipRole:
            lines = [f"Round {it.round} ({enum_text(it.kind)}) — {verdict.upper()}"
                     + (" — dropped by “Continue from round”: its commit left the branch"
                        if dropped else "")]
            if it.reason:
                lines.append(f"Reason: {it.reason}")
            if it.summary:
                lines.append(f"Summary: {it.summary}")
            if it.commit:
                lines.append(f"Commit {it.commit} — click to show its changes")
            if it.changed_files:
                lines.append("Changed: " + ", ".join(it.changed_files[:12]))
            if it.check is not None:
                lines.append(f"Checks: `{it.check.command}` — {check_text(it.check)}")
                lines += it.check.tail.splitlines()[-12:]
            return "\n".join(lines)
        if role == Qt.ItemDataRole.TextAlignmentRole and column in ("Round", "Tokens", "Cost",
                                                                     "Duration"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.UserRole:
            return it.commit
        return None

    @staticmethod
    def _text(it: Iteration, column: str, verdict: str) -> str:
        if column == "Round":
            return str(it.round)
        if column == "Kind":
            return enum_text(it.kind)
        if column == "Feature":
            return it.feature or "—"
        if column == "Commit":
            return (it.commit or "")[:7] or "—"
        if column == "Checks":
            return "—" if it.check is None else check_text(it.check)
        if column == "Verdict":
            return "ACCEPTED" if verdict == "accepted" else \
                f"REJECTED: {it.reason}" if it.reason else "REJECTED"
        if column == "Tokens":
            return format_tokens(it.tokens)
        if column == "Cost":
            return f"${it.cost_usd:.2f}"
        seconds = seconds_between(it.started_at, it.ended_at)
        return "—" if seconds is None else format_duration(seconds)


class RoundHistory(QTableView):
    """The rounds of a milestone; a click on a row with a commit shows its changes."""

    #: The user chose a round with a commit (its number). GUI thread.
    round_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("roundHistory")
        self.history = RoundHistoryModel(self)
        self.setModel(self.history)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setAlternatingRowColors(True)
        self.setShowGrid(False)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setWordWrap(False)
        self.verticalHeader().hide()
        self.verticalHeader().setDefaultSectionSize(24)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self._verdict = RoundHistoryModel.COLUMNS.index("Verdict")
        header.setSectionResizeMode(self._verdict, QHeaderView.ResizeMode.Interactive)
        header.sectionResized.connect(self._on_section_resized)
        self.clicked.connect(self._on_clicked)

    def _fit_verdict(self) -> None:
        """The Verdict column takes the room the others leave, never less than its verdict
        words ("dropped · REJECTED: …"): stretched, at 1000 px with the checks run it was cut
        to "REJ…". Short of room, the table scrolls sideways; the reason is in the tooltip."""
        header = self.horizontalHeader()
        others = sum(header.sectionSize(i) for i in range(header.count()) if i != self._verdict)
        fm = self.fontMetrics()
        texts = (self.history.data(self.history.index(row, self._verdict))
                 for row in range(self.history.rowCount()))
        words = max((fm.horizontalAdvance(text.split(":")[0] + ": …") + 16 for text in texts),
                    default=0)
        header.resizeSection(self._verdict, max(words, header.sectionSizeHint(self._verdict),
                                                self.viewport().width() - others))

    @Slot(int, int, int)
    def _on_section_resized(self, index: int, _old: int, _new: int) -> None:
        if index != self._verdict:  # a column sized to new contents
            self._fit_verdict()

    def minimumSizeHint(self) -> QSize:
        """Two whole rows under the header: at 1024×700 a paused page (its decision bar on
        top) left it one and a half."""
        hint = super().minimumSizeHint()
        rows = 2 * self.verticalHeader().defaultSectionSize()
        return QSize(hint.width(), self.horizontalHeader().sizeHint().height() + rows
                     + 2 * self.frameWidth())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_verdict()

    def show_iterations(self, iterations: list[Iteration], dropped: set[int] | None = None
                        ) -> None:
        at_end = self.verticalScrollBar().value() >= self.verticalScrollBar().maximum()
        self.history.set_iterations(iterations, dropped)
        self.resizeColumnsToContents()  # a row appended on screen left "feature" cut to "feat…"
        self._fit_verdict()
        if at_end:
            self.scrollToBottom()

    @Slot(QModelIndex)
    def _on_clicked(self, index: QModelIndex) -> None:
        if self.history.data(index, Qt.ItemDataRole.UserRole):
            self.round_selected.emit(self.history.rows[index.row()].round)
