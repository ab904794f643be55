"""Small widget helpers shared by the panes, the banner and the search bar."""

from __future__ import annotations

import math

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPaintEvent, QPalette, QTextLayout, QTextOption
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


def joined(text: str) -> str:
    """A text's lines joined by " · ", blank ones left out: what a label of few lines draws."""
    return " · ".join(line for line in text.splitlines() if line.strip())


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
        return joined(self.text())

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


class ClampedLabel(QLabel):
    """Wrapped at words, `max_lines` lines at most whatever its text: the last elided where
    the text goes on (its lines joined by " · "), the whole text in the tooltip. `text()` is
    the whole text. A long reason (git's two paragraphs) must not make its card taller than
    half the board."""

    def __init__(self, parent: QWidget | None = None, max_lines: int = 3) -> None:
        super().__init__(parent)
        self.max_lines = max_lines
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)
        self.updateGeometry()

    def shown_lines(self, width: int | None = None) -> list[str]:
        """The lines drawn at `width` (the current one by default)."""
        width = self.contentsRect().width() if width is None else width
        text = joined(self.text())
        if not text or width <= 0:
            return []
        layout = QTextLayout(text, self.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        layout.setTextOption(option)
        layout.beginLayout()
        starts: list[tuple[int, int]] = []
        while len(starts) < self.max_lines:
            line = layout.createLine()
            if not line.isValid():
                break
            line.setLineWidth(width)
            starts.append((line.textStart(), line.textLength()))
        layout.endLayout()
        lines = [text[start:start + length].rstrip() for start, length in starts]
        last, length = starts[-1]
        if last + length < len(text):  # it goes on: the last line says so
            lines[-1] = self.fontMetrics().elidedText(text[last:], Qt.TextElideMode.ElideRight,
                                                      width)
        return lines

    def _height(self, lines: int) -> int:
        margins = self.contentsMargins()
        return max(1, lines) * self.fontMetrics().lineSpacing() + margins.top() + \
            margins.bottom()

    def heightForWidth(self, width: int) -> int:
        margins = self.contentsMargins()
        return self._height(len(self.shown_lines(width - margins.left() - margins.right())))

    def sizeHint(self) -> QSize:
        width = super().sizeHint().width()
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance("…") * 4, self._height(1))

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        area = self.contentsRect()
        step = self.fontMetrics().lineSpacing()
        for n, line in enumerate(self.shown_lines()):
            painter.drawText(QRect(area.left(), area.top() + n * step, area.width(), step),
                             int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                             line)
        painter.end()
