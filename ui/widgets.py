"""Small widget helpers shared by the panes, the banner and the search bar."""

from __future__ import annotations

import math

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QLabel, QToolButton, QWidget


def tool_button(parent: QWidget, text: str, tooltip: str = "") -> QToolButton:
    """A small text button (PySide's keyword properties are not in its type stubs)."""
    button = QToolButton(parent)
    button.setText(text)
    button.setToolTip(tooltip)
    return button


def set_style_state(widget: QWidget, name: str, value: str) -> None:
    """Set a dynamic property the style sheet keys on, and re-polish."""
    if widget.property(name) == value:
        return
    widget.setProperty(name, value)
    widget.style().unpolish(widget)
    widget.style().polish(widget)


class ElidedLabel(QLabel):
    """One line whatever its text: elided where it does not fit (lines joined by " · "),
    the whole text in the tooltip. `text()` is the whole text. `keep`: what it never shrinks
    below (a pane's role name)."""

    def __init__(self, parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight, keep: str = "") -> None:
        super().__init__(parent)
        self.mode = mode
        self.keep = keep

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def one_line(self) -> str:
        """The whole text as it is drawn: its lines joined by " · "."""
        return " · ".join(line for line in self.text().splitlines() if line.strip())

    def shown_text(self) -> str:
        """What is drawn at the current width."""
        return self.fontMetrics().elidedText(self.one_line(), self.mode,
                                             self.contentsRect().width())

    def minimumSizeHint(self) -> QSize:
        # `keep` whole, then the ellipsis of the rest
        keep = self.fontMetrics().horizontalAdvance(f"{self.keep} …") if self.keep else 0
        return QSize(keep + self.contentsMargins().left() + self.contentsMargins().right(),
                     self.fontMetrics().height())

    def sizeHint(self) -> QSize:
        # Rounded up: `shown_text` elides a text that is a fraction of a pixel too wide.
        width = math.ceil(QFontMetricsF(self.font()).horizontalAdvance(self.one_line()))
        margins = self.contentsMargins()
        return QSize(width + margins.left() + margins.right(), self.fontMetrics().height())

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        painter.drawText(self.contentsRect(), int(Qt.AlignmentFlag.AlignLeft
                                                  | Qt.AlignmentFlag.AlignVCenter),
                         self.shown_text())
        painter.end()
