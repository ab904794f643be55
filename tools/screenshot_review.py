"""Screenshot the reviewer's views: a paused milestone's page, and its changes with comments
shown inline under their lines and the editor open under a third.

    python tools/screenshot_review.py [--out-dir docs]

Runs the demo project of tools/screenshot.py with the fake `claude`: the Developer writes a
small Python module, the Acceptor rejects three rounds in a row with a long reason, the
milestone pauses. Saves `paused_view.png` (the page at 1024×700, Monitor tab),
`changes_view.png` (the Changes tab at 1600×1000) and `changes_view_1024.png` (at 1024×700).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.screenshot import REPO, make_demo_project, use_fake_claude

MODULE = [
    '"""Greetings for the command line."""\n\n\ndef make_greeting(name: str) -> str:\n'
    '    return f"Hello, {name}!"\n',
    '"""Greetings for the command line."""\n\nimport argparse\n\n\n'
    'def make_greeting(name: str | None) -> str:\n    if not name:\n'
    '        raise ValueError("a name is required")\n    return f"Hello, {name}!"\n\n\n'
    'def main(argv: list[str] | None = None) -> int:\n'
    '    parser = argparse.ArgumentParser(prog="greet")\n'
    '    parser.add_argument("--name", default="")\n    args = parser.parse_args(argv)\n'
    '    print(make_greeting(args.name))\n    return 0\n',
]
REASON = ("REJECTED: make_greeting(None) returns 'Hello, None!' instead of raising ValueError, "
          "and the CLI prints a traceback for an empty --name; add tests for both edge cases")


def write_script(base: Path) -> None:
    developer = [{"auto": True, "edit_file": {"path": "greet.py", "content": MODULE[min(i, 1)]}}
                 for i in range(3)]
    no = {"delay": 0.2, "text": f"## Review\n\nThe edge cases are not handled.\n\n{REASON}"}
    script = {"developer": developer, "acceptor": [no, no, no]}
    (base / "fake_claude" / "script.json").write_text(json.dumps(script))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs")
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QSettings, Qt

    from anima.engine.facade import Engine
    from ui.app import styled_application
    from ui.main_window import MainWindow

    app = styled_application()

    def wait(condition: object, what: str) -> None:
        deadline = time.monotonic() + args.timeout
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise SystemExit(f"gave up waiting for {what}: {window.errors.messages} "
                                 f"{[(r.id, str(r.status)) for r in window._records.values()]}")
            app.processEvents()
            time.sleep(0.01)

    with tempfile.TemporaryDirectory(prefix="anima-shot-") as tmp:
        base = Path(tmp)
        repo = make_demo_project(base)
        use_fake_claude(base)
        write_script(base)
        settings = QSettings(str(base / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings, engine_factory=lambda root: Engine(
            root, config_overrides={"summarizer": {"enabled": False}}))
        window.resize(1024, 700)
        window.show()
        window.open_project(repo)
        wait(lambda: any(str(r.status) == "paused" for r in window._records.values()),
             "the milestone to pause")
        page = window.open_page(next(iter(window._records)))
        assert page is not None
        wait(lambda: not page.replaying, "the transcript")
        wait(page.review.isVisible, "the decision bar")
        for pane in page.monitor.panes.values():
            pane.flush()
        for _ in range(10):
            app.processEvents()
        args.out_dir.mkdir(parents=True, exist_ok=True)
        saved = [window.grab().save(str(args.out_dir / "paused_view.png"))]

        changes = page.changes
        window.resize(1600, 1000)
        page.tabs.setCurrentWidget(changes)
        wait(lambda: changes.current_file is not None, "the Changes tab")
        paths = [f.path if f else "" for f in changes.files.files]
        changes.file_table.selectRow(paths.index("greet.py"))
        for text, match in (("Raise for None too, not only for an empty string", "if not name"),
                            ("Print the error and exit 2 instead of a traceback",
                             "print(make_greeting")):
            row = next(r for r in changes.diff.rows if match in r.text and r.kind in "+- ")
            changes.diff.line_clicked.emit("greet.py", row)
            changes.comment_box.text.setPlainText(text)
            changes.comment_box.save_button.click()
            wait(lambda t=text: any(t in c for c in changes.comment_lines), "the comment")
        row = next(r for r in changes.diff.rows if "argparse.ArgumentParser" in r.text)
        changes.diff.line_clicked.emit("greet.py", row)
        changes.comment_box.text.setPlainText("Add a description= for --help")
        changes.comment_list.setCurrentRow(0)
        for name, size in (("changes_view.png", (1600, 1000)),
                           ("changes_view_1024.png", (1024, 700))):
            window.resize(*size)
            for _ in range(20):
                app.processEvents()
            n = next(i for i, r in enumerate(changes.diff.rows) if r.kind == "_")
            changes.diff.verticalScrollBar().setValue(max(0, n - 12))
            for _ in range(10):
                app.processEvents()
            changes.comment_box.text.setFocus(Qt.FocusReason.OtherFocusReason)
            saved.append(window.grab().save(str(args.out_dir / name)))
        window.close_without_asking()
        wait(lambda: window.engine is None, "the engine to stop")
    print(f"saved paused_view.png, changes_view.png, changes_view_1024.png in {args.out_dir}"
          if all(saved) else "FAILED to save")
    return 0 if all(saved) else 1


if __name__ == "__main__":
    sys.exit(main())
