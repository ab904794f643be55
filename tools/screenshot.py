"""Screenshot the app mid-run: a demo milestone driven by the fake `claude`, offscreen.

    python tools/screenshot.py [--out docs/screenshot.png] [--rounds 3] [--size 1440x900]

Builds a throwaway git repo, runs `anima init` on it and adds the example milestone "Hello CLI",
points Anima at tests/fakes/fake_claude.py with a short delay per turn (so the capture lands
while an agent is working), opens the real MainWindow on it, waits until a few rounds (one of
them rejected, to show both verdict colours) are done and an agent is mid-turn, and saves the
window to a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_CLAUDE = REPO / "tests" / "fakes" / "fake_claude.py"

DEVELOPER_TURN = {"auto": True, "delay": 1.2, "context_tokens": 58_400,
                  "shell": ["ls -1", "python -c \"print('4 passed in 0.12s')\""]}
ACCEPTOR_OK = {"delay": 0.8, "context_tokens": 23_900,
               "shell": ["git show --stat HEAD | head -n 12"],
               "text": "## Review\n\nThe change does what the feature asks, with a test.\n\n"
                       "**Checked**: `git show` of the commit, the tests.\n\nACCEPTED"}
ACCEPTOR_NO = {"delay": 0.8, "context_tokens": 21_700,
               "shell": ["git show --stat HEAD | head -n 12"],
               "text": "## Review\n\nThe greeting works, but nothing tests the no-name case.\n\n"
                       "REJECTED: make_greeting(None) is not unit-tested"}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_demo_project(base: Path) -> Path:
    from anima.engine.project import example_milestone, init_project

    repo = base / "greet"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Anima Demo")
    git(repo, "config", "user.email", "demo@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / "README.md").write_text("# greet\n\nA tiny CLI that greets people.\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "chore: initial commit")
    init_project(repo)
    shutil.copy(example_milestone(), repo / ".anima" / "milestones")
    git(repo, "add", ".anima")
    git(repo, "commit", "-q", "-m", "chore: anima init")
    return repo


def use_fake_claude(base: Path) -> None:
    fake = base / "fake_claude"
    fake.mkdir()
    script = {"developer_default": DEVELOPER_TURN,
              "acceptor": [ACCEPTOR_OK, ACCEPTOR_NO, ACCEPTOR_OK],
              "acceptor_default": ACCEPTOR_OK}
    (fake / "script.json").write_text(json.dumps(script))
    os.environ["ANIMA_CLAUDE_COMMAND"] = f"{sys.executable} {FAKE_CLAUDE}"
    os.environ["FAKE_CLAUDE_SCRIPT"] = str(fake / "script.json")
    os.environ["FAKE_CLAUDE_STATE"] = str(fake / "state")
    os.environ["FAKE_CLAUDE_LOG"] = str(fake / "prompts.jsonl")
    # The sandbox gives the agents a private /tmp: the script must stay visible to the fake.
    os.environ["ANIMA_SANDBOX_WRITABLE"] = str(fake)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshot.png")
    parser.add_argument("--rounds", type=int, default=3, help="rounds done before the capture")
    parser.add_argument("--size", default="1440x900")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--check", default="sleep 0.3; echo '4 passed in 0.12s'",
                        help="the demo project's check_command ('' for none)")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QSettings

    from anima import events as ev
    from anima.engine.facade import Engine
    from ui.app import styled_application
    from ui.main_window import MainWindow

    app = styled_application()
    with tempfile.TemporaryDirectory(prefix="anima-shot-") as tmp:
        base = Path(tmp)
        repo = make_demo_project(base)
        use_fake_claude(base)
        settings = QSettings(str(base / "settings.ini"), QSettings.Format.IniFormat)
        overrides = {"summarizer": {"enabled": False}, "check_command": args.check or None}
        window = MainWindow(settings, engine_factory=lambda root: Engine(
            root, config_overrides=overrides))
        width, height = (int(x) for x in args.size.lower().split("x"))
        window.resize(width, height)
        window.show()
        window.open_project(repo)
        page = None

        verdicts: list[ev.VerdictReached] = []
        phase: list[str] = ["idle"]
        entered = [time.monotonic()]
        assert window.bridge is not None
        window.bridge.verdict_reached.connect(verdicts.append)

        def on_phase(event: ev.PhaseChanged) -> None:
            phase[0] = event.phase
            entered[0] = time.monotonic()

        window.bridge.phase_changed.connect(on_phase)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            app.processEvents()
            if page is None and window._records:  # opened from its card, watched live
                page = window.open_page(next(iter(window._records)))
            mid_turn = phase[0] == "developer" and time.monotonic() - entered[0] > 0.7
            if len(verdicts) >= args.rounds and mid_turn:
                break
            time.sleep(0.01)
        else:
            print(f"gave up after {args.timeout:.0f} s: {len(verdicts)} verdicts, "
                  f"phase {phase[0]}; errors: {window.errors.messages}", file=sys.stderr)
        for pane in page.monitor.panes.values() if page is not None else ():
            pane.flush()
        for _ in range(5):
            app.processEvents()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        ok = window.grab().save(str(args.out))
        window.close_without_asking()
        stop_by = time.monotonic() + 20
        while window.engine is not None and time.monotonic() < stop_by:
            app.processEvents()
            time.sleep(0.01)
    print(f"{'saved' if ok else 'FAILED to save'} {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
