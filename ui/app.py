"""`anima [PROJECT]`: the desktop app.

Creates the QApplication, applies `resources/style.qss`, opens PROJECT (or the last project),
and on exit shuts the engine down so no agent outlives the window.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication

from anima.paths import resource
from ui.diff_view import warm_up_lexers
from ui.main_window import MainWindow
from ui.platform_check import platform_problem
from ui.window_chrome import app_icon

ORGANIZATION = "Anima"
APPLICATION = "Anima"


def load_style_sheet() -> str:
    """The app's style sheet; an empty one (Qt's defaults) if it is missing."""
    try:
        return resource("style.qss").read_text(encoding="utf-8")
    except OSError:
        return ""


def styled_application() -> QApplication:
    """The QApplication (made if there is none yet), drawing as `anima` does: its style
    sheet on. For the tools, benchmarks and tests that show the window."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setStyleSheet(load_style_sheet())
    return app


def make_settings(organization: str = ORGANIZATION, application: str = APPLICATION,
                  path: Path | None = None) -> QSettings:
    """Native settings for users; an ini file at `path` for tests and portable runs."""
    if path is not None:
        return QSettings(str(path), QSettings.Format.IniFormat)
    return QSettings(organization, application)


def main(argv: list[str] | None = None) -> int:
    """Run the app until its window closes; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="anima", description="Open the Anima desktop app.")
    parser.add_argument("project", nargs="?", type=Path,
                        help="the project folder (default: the last one opened)")
    parser.add_argument("--settings", type=Path, default=None,
                        help="keep settings in this ini file instead of the user's settings")
    args = parser.parse_args(argv)

    if QApplication.instance() is None:
        problem = platform_problem(os.environ)
        if problem is not None:
            print(f"anima: {problem}", file=sys.stderr)
            return 2
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    assert isinstance(app, QApplication)
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setWindowIcon(app_icon())
    app.setStyleSheet(load_style_sheet())

    window = MainWindow(make_settings(path=args.settings))
    project = args.project or window.last_project()
    if project is not None:
        window.open_project(project)
    window.show()
    warm_up_lexers()

    # Ctrl+C in the terminal, SIGTERM (a logout, `kill`) and SIGHUP (the terminal closed)
    # close the window and so stop the agents politely, instead of being swallowed while
    # Qt's event loop holds the interpreter or killing Anima mid-write.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: window.close_without_asking())
    heartbeat = QTimer()
    heartbeat.start(250)
    heartbeat.timeout.connect(lambda: None)
    code = app.exec()
    if window.engine is not None:  # the loop ended some other way: still stop the agents
        window.engine.shutdown(10.0)
    return code


if __name__ == "__main__":
    sys.exit(main())
