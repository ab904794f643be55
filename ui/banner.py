"""The error banner at the top of the window and the empty states shown instead of a project."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import (
    Qt,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ui.widgets import tool_button


class ErrorBanner(QFrame):
    """Errors the user must see, newest last, each dismissible; identical ones are counted."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("errorBanner")
        self._rows: dict[str, tuple[QWidget, QLabel, list[int]]] = {}
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(12, 8, 12, 8)
        self._layout.setSpacing(4)
        self.hide()

    @property
    def messages(self) -> list[str]:
        return list(self._rows)

    def add(self, message: str) -> None:
        message = message.strip()
        if not message:
            return
        if message in self._rows:
            _, label, count = self._rows[message]
            count[0] += 1
            label.setText(f"{message}  (×{count[0]})")
            return
        row = QWidget(self)
        label = QLabel(message, row)
        label.setObjectName("errorText")
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = tool_button(row, "✕", "Dismiss")
        close.setObjectName("dismissButton")
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        icon = QLabel("⚠", row)
        icon.setObjectName("errorIcon")
        layout.addWidget(icon, 0, Qt.AlignmentFlag.AlignTop)
        layout.addWidget(label, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        close.clicked.connect(lambda: self.dismiss(message))
        self._rows[message] = (row, label, [1])
        self._layout.addWidget(row)
        # Keep the banner bounded: the oldest go first.
        while len(self._rows) > 6:
            self.dismiss(next(iter(self._rows)))
        self.show()

    def dismiss(self, message: str) -> None:
        entry = self._rows.pop(message, None)
        if entry is not None:
            entry[0].deleteLater()
        if not self._rows:
            self.hide()

    def clear(self) -> None:
        for message in list(self._rows):
            self.dismiss(message)


class EmptyState(QWidget):
    """A centred heading, an explanation and one or two actions."""

    def __init__(self, heading: str, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("emptyState")
        self.heading = QLabel(heading, self)
        self.heading.setObjectName("emptyHeading")
        self.heading.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.text = QLabel(text, self)
        self.text.setObjectName("emptyText")
        self.text.setWordWrap(True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.buttons = QHBoxLayout()
        self.buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addStretch(2)
        layout.addWidget(self.heading)
        layout.addWidget(self.text)
        layout.addSpacing(12)
        layout.addLayout(self.buttons)
        layout.addStretch(3)

    def add_button(self, text: str, slot: Callable[[], None], primary: bool = False
                   ) -> QPushButton:
        button = QPushButton(text, self)
        if primary:
            button.setObjectName("primaryButton")
        button.clicked.connect(slot)
        self.buttons.insertWidget(self.buttons.count(), button)
        return button

    def finish(self) -> None:
        self.buttons.addStretch(1)
