"""Find in a transcript or a diff: the bar shown on Edit ▸ Find (Ctrl+F)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import (
    QKeySequence,
    QShortcut,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QWidget,
)

from ui.widgets import tool_button


class SearchBar(QFrame):
    """Ctrl+F: find in the text view, Enter for next, Shift+Enter for previous, Esc to close."""

    def __init__(self, view: QPlainTextEdit, parent: QWidget | None = None,
                 placeholder: str = "Find in transcript") -> None:
        super().__init__(parent)
        self.setObjectName("searchBar")
        self._view = view
        self.edit = QLineEdit(self)
        self.edit.setPlaceholderText(placeholder)
        self.edit.setClearButtonEnabled(True)
        self.status = QLabel(self)
        self.status.setObjectName("searchStatus")
        previous = tool_button(self, "↑", "Previous match (Shift+Enter)")
        following = tool_button(self, "↓", "Next match (Enter)")
        close = tool_button(self, "✕", "Close (Esc)")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 3, 6, 3)
        layout.addWidget(self.edit, 1)
        layout.addWidget(self.status)
        layout.addWidget(previous)
        layout.addWidget(following)
        layout.addWidget(close)
        previous.clicked.connect(lambda: self.find_match(backward=True))
        following.clicked.connect(lambda: self.find_match())
        close.clicked.connect(self.close_bar)
        self.edit.returnPressed.connect(self._on_return_pressed)
        self.edit.textChanged.connect(self._on_text_changed)
        # Set apart: PySide6 ignores the constructor's `context=`, which left this window-wide,
        # the same key in both panes, so ambiguous and never fired.
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self.edit)
        escape.setContext(Qt.ShortcutContext.WidgetShortcut)
        escape.activated.connect(self.close_bar)
        self.hide()

    def set_view(self, view: QPlainTextEdit) -> None:
        """Search another view from now on (the diff shown side by side)."""
        self._view = view

    def open_bar(self) -> None:
        self.show()
        selected = self._view.textCursor().selectedText()
        if selected and "\u2029" not in selected:
            self.edit.setText(selected)
        self.edit.setFocus()
        self.edit.selectAll()

    def close_bar(self) -> None:
        self.hide()
        self._view.setFocus()

    @Slot()
    def _on_return_pressed(self) -> None:
        from PySide6.QtWidgets import QApplication

        backward = bool(QApplication.keyboardModifiers() & Qt.KeyboardModifier.ShiftModifier)
        self.find_match(backward=backward)

    @Slot(str)
    def _on_text_changed(self, text: str) -> None:
        # Search again from where the current match starts, so typing refines it in place.
        cursor = self._view.textCursor()
        cursor.setPosition(cursor.selectionStart())
        self._view.setTextCursor(cursor)
        if text:
            self.find_match()
        else:
            self.status.setText("")

    def find_match(self, *, backward: bool = False) -> bool:
        """Select the next (or previous) match, wrapping around; say when there is none."""
        text = self.edit.text()
        if not text:
            return False
        flags = QTextDocument.FindFlag(0)
        if backward:
            flags |= QTextDocument.FindFlag.FindBackward
        found = self._view.find(text, flags)
        if not found:
            cursor = self._view.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End if backward
                                else QTextCursor.MoveOperation.Start)
            self._view.setTextCursor(cursor)
            found = self._view.find(text, flags)
        self.status.setText("" if found else "No match")
        self.setProperty("failed", not found)
        self.style().unpolish(self.edit)
        self.style().polish(self.edit)
        return found
