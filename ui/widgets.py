"""Small widget helpers shared by the panes, the banner and the search bar."""

from __future__ import annotations

from PySide6.QtWidgets import QToolButton, QWidget


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
