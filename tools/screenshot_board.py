"""Screenshot the board and a running milestone's page, at 1600×1000 and 1024×700.

    python tools/screenshot_board.py [--out-dir docs]

Stages the nine milestones of bench/board.py on the real window (through the bench's
stand-in for the engine: one completed and one cancelled, one paused, one awaiting review,
two pending — one waiting for another —, three running), lets the three running ones stream
both agents for a few seconds, then saves `board.png`, `board_1024.png`, `milestone_page.png`
and `milestone_page_1024.png`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from board import (  # noqa: E402
    MILESTONES,
    Streamer,
    close_window,
    make_project,
    open_window,
    start_running,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from ui.app import styled_application

    app = styled_application()

    def settle(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            app.processEvents()
            time.sleep(0.005)

    saved = []
    with tempfile.TemporaryDirectory(prefix="anima-shot-") as tmp:
        base = Path(tmp)
        repo = make_project(base, len(MILESTONES))
        window = open_window(app, repo, (1600, 1000), len(MILESTONES))
        running = start_running(window, len(MILESTONES))
        streamers = [Streamer(window.engine.bus, m) for m in running]
        for streamer in streamers:
            streamer.start()
        page = window.open_page("greeter")
        assert page is not None
        window.tabs.setCurrentIndex(0)
        settle(2.0)
        for name, size in (("board.png", (1600, 1000)), ("board_1024.png", (1024, 700))):
            window.resize(*size)
            settle(0.6)
            saved.append(window.grab().save(str(args.out_dir / name)))
        window.tabs.setCurrentWidget(page)
        for name, size in (("milestone_page.png", (1600, 1000)),
                           ("milestone_page_1024.png", (1024, 700))):
            window.resize(*size)
            settle(0.8)
            saved.append(window.grab().save(str(args.out_dir / name)))
        close_window(app, window, streamers)
    print("saved board.png, board_1024.png, milestone_page.png, milestone_page_1024.png"
          if all(saved) else "FAILED to save")
    return 0 if all(saved) else 1


if __name__ == "__main__":
    sys.exit(main())
