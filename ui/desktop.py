"""What a desktop user expects of the window: a Help menu with About, saving a transcript.

`install_help_menu` adds Help → About Anima (Anima's version and each role's agent CLI
version, probed off the GUI thread) and Help → Read the README (the one beside the sources).
`save_transcript` writes a pane's text to a file the user picks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMessageBox, QWidget

import anima
from anima.atomic import write_text_atomic
from anima.config import Config


def anima_version() -> str:
    try:
        return version("anima")
    except PackageNotFoundError:
        return "unknown (not installed)"


def readme_path() -> Path | None:
    """The README beside the sources (a checkout or an editable install), if there is one."""
    path = Path(anima.__file__).resolve().parent.parent / "README.md"
    return path if path.is_file() else None


class _CliProbe(QObject):
    """Runs `<cli> --version` on a thread; `found` (agent, text) arrives on the GUI thread."""

    found = Signal(str, str)

    def start(self, agent: str, command: str | None) -> None:
        def probe() -> None:
            from anima.engine.agents import find_cli
            from anima.errors import AnimaError

            try:
                self.found.emit(agent, find_cli(agent, command).version)
            except AnimaError as e:
                self.found.emit(agent, f"not found ({str(e).splitlines()[0]})")

        threading.Thread(target=probe, name=f"{agent}-version", daemon=True).start()


class AboutBox(QMessageBox):
    """Anima's version and, per role, the agent CLI it would run; versions filled in when
    known."""

    def __init__(self, parent: QWidget | None, config: Config | None) -> None:
        from anima.engine.agents import cli_of
        from anima.events import ROLES

        super().__init__(parent)
        self.setObjectName("aboutBox")
        self.setWindowTitle("About Anima")
        self.setIcon(QMessageBox.Icon.Information)
        config = config or Config()
        self._roles = {role: cli_of(role, config)[0] for role in ROLES}
        self.versions = {agent: "checking…" for agent in self._roles.values()}
        self._probe = _CliProbe(self)
        self._probe.found.connect(self._on_found)
        self._show_text()
        for agent, command in dict.fromkeys(cli_of(role, config) for role in ROLES):
            self._probe.start(agent, command)

    def _on_found(self, agent: str, text: str) -> None:
        self.versions[agent] = text
        self._show_text()

    def _show_text(self) -> None:
        lines = "<br>".join(f"{role}: {agent} --version: {self.versions[agent]}"
                            for role, agent in self._roles.items())
        self.setText(f"<b>Anima {anima_version()}</b><br>Runs a project milestone by milestone "
                     f"with a Developer and an Acceptor coding agent.<br><br>{lines}")


def install_help_menu(window: QMainWindow, config: Callable[[], Config | None]) -> None:
    """Help → About Anima, Help → Read the README. `config()`: the settings whose agent
    CLIs the About box names."""
    menu = window.menuBar().addMenu("&Help")
    about = QAction("&About Anima", window)
    about.triggered.connect(lambda: AboutBox(window, config()).open())
    readme = QAction("Read the &README", window)
    path = readme_path()
    readme.setEnabled(path is not None)
    if path is not None:
        readme.triggered.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))))
    menu.addAction(about)
    menu.addAction(readme)


def save_transcript(parent: QWidget, role: str, text: str, folder: Path | None) -> Path | None:
    """Ask where, then write `text` atomically; the chosen path, or None if cancelled."""
    start = str((folder or Path.home()) / f"{role}-transcript.txt")
    name, _ = QFileDialog.getSaveFileName(parent, f"Save the {role}'s transcript", start,
                                          "Text files (*.txt);;All files (*)")
    if not name:
        return None
    write_text_atomic(Path(name), text)
    return Path(name)
