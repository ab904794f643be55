"""How fast the Changes view opens a large change, and whether the window stalls after.

Builds a git repository whose milestone changes 500 Python files (+20 −10 lines each: 10,000
added lines, 15,000 changed), then opens it the way the window does: `ChangesView` asks, the
diff is computed on the bridge's worker thread (`anima.diffs.milestone_changes`), the view
fills its file table and renders the first file. Measured: the time from the request to the
first paint of that file's diff, then the worst event-loop stall (a 1 ms timer measuring its
own gaps) while the reviewer clicks through 100 files, scrolls a diff and the file table.

    python bench/diff_view.py [--files N]

Targets: first paint < 500 ms, no stall over 100 ms after it. Pygments' one-off plugin scan
(which the app starts in the background at start-up) is timed on its own, before.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from PySide6.QtCore import QElapsedTimer, QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication

from anima import events as ev
from anima.diffs import milestone_changes
from anima.git import GitRepo
from anima.store.models import MilestoneRecord, MilestoneStatus
from ui.bridge import EngineBridge
from ui.changes_view import ChangesView
from ui.diff_view import prepare_lexers, warm_up_lexers

TARGET_OPEN_MS = 500.0
TARGET_STALL_MS = 100.0
BRANCH = "milestone/big"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def source(i: int, changed: bool) -> str:
    """40 lines of Python; the changed version edits 10 of them and adds 10."""
    lines = [f"def function_{i}_{n}(value: int) -> int:\n    return value + {n}\n"
             for n in range(20)]
    if changed:
        for n in range(0, 20, 2):
            lines[n] = (f"def function_{i}_{n}(value: int) -> int:\n"
                        f"    return value * {n}  # changed\n")
        lines += [f"class Added{i}_{n}:\n    size = {n}\n" for n in range(5)]
    return "".join(lines)


def make_repo(base: Path, files: int) -> tuple[Path, str, str]:
    repo = base / "big"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Bench")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    for i in range(files):
        (repo / "src" / f"module_{i:03d}.py").write_text(source(i, False))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base_commit = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-q", "-c", BRANCH)
    for i in range(files):
        (repo / "src" / f"module_{i:03d}.py").write_text(source(i, True))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "feat: everything")
    return repo, base_commit, git(repo, "rev-parse", "HEAD")


class PaintWatch(QObject):
    """Notes the first paint of a widget after `arm()`."""

    def __init__(self, clock: QElapsedTimer) -> None:
        super().__init__()
        self.clock = clock
        self.armed = False
        self.painted_at: float | None = None

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if self.armed and event.type() == QEvent.Type.Paint and self.painted_at is None:
            self.painted_at = self.clock.nsecsElapsed() / 1e6
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    # The app starts Pygments' one-off plugin scan in the background at start-up; a user opens
    # a diff later. Timed here on its own, not charged to opening the diff.
    warm = time.perf_counter()
    warm_up_lexers().join()
    warm_ms = (time.perf_counter() - warm) * 1000

    with tempfile.TemporaryDirectory(prefix="anima-bench-diff-") as tmp:
        repo_path, base_commit, _head = make_repo(Path(tmp), args.files)
        repo = GitRepo.open(repo_path)
        record = MilestoneRecord(id="big", title="Big change", created_at=datetime.now(UTC),
                                 status=MilestoneStatus.PAUSED, base_commit=base_commit,
                                 branch_name=BRANCH, main_branch="main")
        bridge = EngineBridge(ev.EventBus())
        view = ChangesView()
        view.resize(1280, 800)
        clock = QElapsedTimer()
        watch = PaintWatch(clock)
        view.diff.viewport().installEventFilter(watch)

        def load(milestone_id: str, round_no: int | None) -> None:
            bridge.call("changes",
                        lambda: prepare_lexers(milestone_changes(repo, record, round_no)),
                        on_done=lambda cs: (setattr(watch, "armed", True),
                                            view.show_changes(milestone_id, round_no, cs)))

        view.load_requested.connect(load)
        gaps: list[float] = []
        last = [0.0]
        ticker = QTimer()
        ticker.setTimerType(Qt.TimerType.PreciseTimer)
        ticker.setInterval(1)

        def on_tick() -> None:
            now = clock.nsecsElapsed() / 1e6
            if watch.painted_at is not None and last[0] >= watch.painted_at:
                gaps.append(now - last[0])
            last[0] = now

        ticker.timeout.connect(on_tick)
        script: list[tuple[str, int]] = [("file", n) for n in range(1, min(101, args.files))]
        script += [("scroll", 0), ("table_end", 0), ("file", args.files - 1), ("scroll", 0)]

        def step() -> None:
            if watch.painted_at is None:
                return
            if not script:
                app.quit()
                return
            what, n = script.pop(0)
            if what == "file":
                view.file_table.selectRow(n)
            elif what == "scroll":
                bar = view.diff.verticalScrollBar()
                bar.setValue(bar.maximum())
            else:
                view.file_table.scrollToBottom()

        stepper = QTimer()
        stepper.setInterval(15)
        stepper.timeout.connect(step)
        for _ in range(3):
            app.processEvents()
        clock.start()
        ticker.start()
        stepper.start()
        view.show()
        view.show_record(record)  # asks for the change set (the window's path)
        started = time.perf_counter()
        QTimer.singleShot(110_000, app.quit)
        app.exec()
        elapsed = time.perf_counter() - started
        ticker.stop()
        stepper.stop()
        bridge.close()
        changes = view.changes

    if watch.painted_at is None or changes is None:
        print("the diff was never painted", file=sys.stderr)
        return 1
    open_ms = watch.painted_at
    worst = max(0.0, max(gaps, default=0.0) - 1.0)
    lines = sum(len(f.patch.splitlines()) for f in changes.files)
    ok = (open_ms < TARGET_OPEN_MS, worst < TARGET_STALL_MS)
    mark = ["ok" if good else "MISSED" for good in ok]
    print(f"change             {len(changes.files):>10,}  files, +{changes.added:,} "
          f"−{changes.removed:,}, {lines:,} diff lines")
    print(f"pygments warm-up   {warm_ms:>10.1f}  ms        once per process, at start-up, "
          "off the GUI thread")
    print(f"first paint        {open_ms:>10.1f}  ms        target < {TARGET_OPEN_MS:.0f}   "
          f"{mark[0]}")
    print(f"worst stall after  {worst:>10.1f}  ms        target < {TARGET_STALL_MS:.0f}   "
          f"{mark[1]}   ({len(gaps):,} ticks over {elapsed:.1f} s, 100 files clicked through)")
    print(f"BENCH diff_open_ms={open_ms:.1f}")
    print(f"BENCH diff_worst_stall_ms={worst:.1f}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
