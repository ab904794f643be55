"""Confirmation dialogs for the decisions that cannot be taken back."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget


def confirm(parent: QWidget | None, title: str, text: str, action: str,
            detail: str = "") -> bool:
    """A modal question with `action` and Cancel (the default, so Enter does no harm)."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
    box.setObjectName("confirmDialog")
    if detail:
        box.setInformativeText(detail)
    accept = box.addButton(action, QMessageBox.ButtonRole.AcceptRole)
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(cancel)
    box.setEscapeButton(cancel)
    box.exec()
    return box.clickedButton() is accept


def confirm_close(parent: QWidget | None, working_on: str | None) -> bool:
    """Closing while agents work: say that they stop and that the milestone is not lost."""
    return confirm(parent, "Close Anima", f"Agents are working on {working_on or 'a milestone'}.",
                   "Stop and close",
                   "Closing stops them now. Nothing is lost: the milestone resumes where it "
                   "stopped the next time you open this project (the interrupted round is "
                   "redone).")
