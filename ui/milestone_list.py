"""The sidebar: the project's milestones, two lines each (title; status, progress, cost)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QPersistentModelIndex,
    QRect,
    QSize,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QColor, QFont, QPainter
from PySide6.QtWidgets import (
    QListView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from ui.formatting import enum_text
from ui.monitor import STATUS_COLORS

if TYPE_CHECKING:
    from anima.engine.facade import MilestoneRecord


class MilestoneListModel(QAbstractListModel):
    """Milestone records in scheduling order; one row each."""

    RecordRole = Qt.ItemDataRole.UserRole + 1

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.records: list[MilestoneRecord] = []

    def set_records(self, records: list[MilestoneRecord]) -> None:
        if [r.id for r in records] == [r.id for r in self.records]:
            self.records = list(records)
            if records:
                self.dataChanged.emit(self.index(0), self.index(len(records) - 1))
            return
        self.beginResetModel()
        self.records = list(records)
        self.endResetModel()

    def remove_record(self, milestone_id: str) -> None:
        row = self.row_of(milestone_id)
        if row >= 0:
            self.beginRemoveRows(QModelIndex(), row, row)
            del self.records[row]
            self.endRemoveRows()

    def update_record(self, record: MilestoneRecord) -> None:
        for row, old in enumerate(self.records):
            if old.id == record.id:
                self.records[row] = record
                self.dataChanged.emit(self.index(row), self.index(row))
                return
        self.beginInsertRows(QModelIndex(), len(self.records), len(self.records))
        self.records.append(record)
        self.endInsertRows()

    def row_of(self, milestone_id: str) -> int:
        return next((i for i, r in enumerate(self.records) if r.id == milestone_id), -1)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.records)

    def data(self, index: QModelIndex | QPersistentModelIndex,
             role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        record = self.records[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return record.title
        if role == self.RecordRole:
            return record
        if role == Qt.ItemDataRole.ToolTipRole:
            details = [record.pause_reason, record.error,
                       f"merge: {enum_text(record.merge.state)} — {record.merge.detail}"
                       if record.merge else None]
            reason = "".join(f"\n{d}" for d in details if d)
            return f"{record.id} — {enum_text(record.status).replace('_', ' ')}{reason}"
        return None


def milestone_summary(record: MilestoneRecord) -> str:
    """'in progress · 3/9 · $1.24' — the sidebar's second line."""
    status = enum_text(record.status).replace("_", " ")
    if record.merge is not None and enum_text(record.merge.state) != "merged":
        status += f" (merge {enum_text(record.merge.state)})"
    return f"{status} · {record.features_done}/{len(record.features)} · ${record.cost_usd:.2f}"


class MilestoneDelegate(QStyledItemDelegate):
    """Two lines per milestone: its title, then status (coloured), progress and cost."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
                 ) -> QSize:
        height = option.fontMetrics.height()
        return QSize(200, height * 2 + 18)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        record = index.data(MilestoneListModel.RecordRole)
        if record is None:
            return
        painter.save()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        rect: QRect = option.rect
        if selected:
            painter.fillRect(rect, QColor("#e7eefc"))
            painter.fillRect(QRect(rect.left(), rect.top(), 3, rect.height()), QColor("#2f6feb"))
        elif option.state & QStyle.StateFlag.State_MouseOver:
            painter.fillRect(rect, QColor("#f3f4f6"))
        status = enum_text(record.status)
        color = QColor(STATUS_COLORS.get(status, "#6e7781"))
        metrics = option.fontMetrics
        line = metrics.height()
        x = rect.left() + 14
        width = rect.width() - 24
        title_font = QFont(option.font)
        title_font.setBold(True)
        painter.setFont(title_font)
        painter.setPen(QColor("#1f2328"))
        title = painter.fontMetrics().elidedText(record.title, Qt.TextElideMode.ElideRight,
                                                 width)
        painter.drawText(QRect(x, rect.top() + 6, width, line), Qt.AlignmentFlag.AlignLeft
                         | Qt.AlignmentFlag.AlignVCenter, title)
        painter.setFont(option.font)
        # A status dot, then the summary in the status colour.
        dot_y = rect.top() + 8 + line + line // 2
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setBrush(color)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawEllipse(x, dot_y - 4, 8, 8)
        painter.setPen(color)
        summary = metrics.elidedText(milestone_summary(record), Qt.TextElideMode.ElideRight,
                                     width - 14)
        painter.drawText(QRect(x + 14, rect.top() + 8 + line, width - 14, line),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, summary)
        painter.restore()


class MilestoneList(QListView):
    """The project's milestones; selecting one shows it in the monitor."""

    #: A milestone was selected (by the user or programmatically). GUI thread.
    milestone_selected = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("milestoneList")
        self.milestones = MilestoneListModel(self)
        self.setModel(self.milestones)
        self.setItemDelegate(MilestoneDelegate(self))
        self.setMouseTracking(True)
        self.setUniformItemSizes(True)
        self.selectionModel().currentChanged.connect(self._on_current_changed)

    def select(self, milestone_id: str) -> None:
        row = self.milestones.row_of(milestone_id)
        if row >= 0:
            self.setCurrentIndex(self.milestones.index(row))

    @property
    def selected_id(self) -> str | None:
        index = self.currentIndex()
        if not index.isValid():
            return None
        return self.milestones.records[index.row()].id

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self.milestone_selected.emit(self.milestones.records[current.row()].id)

    def summaries(self) -> list[str]:
        """Each row as text (title — summary), for tests and accessibility."""
        return [f"{r.title} — {milestone_summary(r)}" for r in self.milestones.records]
