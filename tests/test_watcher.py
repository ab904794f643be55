"""MilestoneWatcher with real files and a real watchdog observer."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from anima.engine.watcher import MilestoneWatcher
from anima.store.names import is_milestone_name

DEBOUNCE = 0.3
TIMEOUT = 5.0


class Recorder:
    """Collects on_ready calls (path, content at call time, thread) and lets tests wait."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, str, str]] = []
        self._cond = threading.Condition()
        self.hook: Callable[[Path], None] | None = None

    def __call__(self, path: Path, _appeared: datetime) -> None:
        content = path.read_text(encoding="utf-8")
        with self._cond:
            self.calls.append((path, content, threading.current_thread().name))
            self._cond.notify_all()
        if self.hook is not None:
            self.hook(path)

    def clear(self) -> None:
        with self._cond:
            self.calls.clear()

    def names(self) -> list[str]:
        with self._cond:
            return [p.name for p, _, _ in self.calls]

    def wait_for(self, name: str, timeout: float = TIMEOUT) -> str:
        """Wait until `name` was reported; return the content it had then."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for path, content, _ in self.calls:
                    if path.name == name:
                        return content
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{name} not reported; calls: {self.calls}")
                self._cond.wait(left)

    def settle(self, folder: Path, tag: str = "zz-sentinel") -> None:
        """Prove earlier events were judged: a later sentinel file must be reported first."""
        (folder / f"{tag}.md").write_text("# sentinel\n", encoding="utf-8")
        self.wait_for(f"{tag}.md")
        time.sleep(DEBOUNCE / 2)  # anything due at the same tick has been judged by now


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "proj" / ".anima" / "milestones"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def watcher(folder: Path, recorder: Recorder) -> Iterator[MilestoneWatcher]:
    before = set(threading.enumerate())
    w = MilestoneWatcher(folder, recorder, debounce=DEBOUNCE)
    w.start()
    yield w
    w.stop()
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"threads left running: {left}"


def test_names() -> None:
    assert is_milestone_name("m1.md")
    for name in [".m1.md.swp", "m1.md~", ".#m1.md", "4913", "m1.tmp", "m1.md.tmp", ".m.md",
                 "m1.json", "m1.txt", ".md", "#m1.md#"]:  # fmt: skip
        assert not is_milestone_name(name), name


def test_created_file_is_reported_once_from_the_watcher_thread(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder
) -> None:
    (folder / "m1.md").write_text("# M1\n", encoding="utf-8")
    assert recorder.wait_for("m1.md") == "# M1\n"
    recorder.settle(folder)
    assert recorder.names().count("m1.md") == 1
    assert recorder.calls[0][0] == folder / "m1.md"
    assert recorder.calls[0][2] != threading.current_thread().name


def test_move_into_place_from_outside(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder, tmp_path: Path
) -> None:
    outside = tmp_path / "drafts" / "m2.md"
    outside.parent.mkdir()
    outside.write_text("# M2 from outside\n", encoding="utf-8")
    os.rename(outside, folder / "m2.md")
    assert recorder.wait_for("m2.md") == "# M2 from outside\n"


def test_atomic_save_via_temp_and_rename(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder
) -> None:
    for name, body in [("m3.md", "# first\n"), ("m3.md", "# second save\n")]:
        tmp = folder / f"{name}.tmp"
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, folder / name)
        recorder.wait_for(name)
        if body == "# first\n":
            recorder.clear()
    assert recorder.wait_for("m3.md") == "# second save\n"
    recorder.settle(folder)
    assert "m3.md.tmp" not in recorder.names()


@pytest.mark.parametrize("style", ["held_open", "reopened"])
def test_slow_partial_write_is_reported_once_complete(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder, style: str
) -> None:
    """~1.5 s of appends: one call, with everything. Held open, the pauses exceed the debounce:
    the writer's close (inotify) is what says it is done."""
    path = folder / "slow.md"
    chunks = [f"line {i}\n" for i in range(4 if style == "held_open" else 6)]
    if style == "held_open":
        with path.open("w", encoding="utf-8") as fh:
            for chunk in chunks:
                fh.write(chunk)
                fh.flush()
                time.sleep(DEBOUNCE + 0.1)
    else:
        for chunk in chunks:
            with path.open("a", encoding="utf-8") as fh:
                fh.write(chunk)
            time.sleep(DEBOUNCE / 2)
    assert recorder.wait_for("slow.md") == "".join(chunks)
    recorder.settle(folder)
    assert recorder.names().count("slow.md") == 1


def test_editor_droppings_and_foreign_files_are_ignored(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder
) -> None:
    for name in [".m4.md.swp", "m4.md~", ".#m4.md", "4913", "m4.tmp", "m4.md.tmp", ".hidden.md",
                 "notes.txt", "m4.json", "#m4.md#"]:  # fmt: skip
        (folder / name).write_text("x\n", encoding="utf-8")
    (folder / "dir.md").mkdir()
    (folder / "empty.md").touch()  # created, never written: not a milestone yet
    recorder.settle(folder)
    assert recorder.names() == ["zz-sentinel.md"]


def test_modifying_an_existing_md_is_reported(
    folder: Path, recorder: Recorder, tmp_path: Path
) -> None:
    path = folder / "m5.md"
    path.write_text("# v1\n", encoding="utf-8")
    w = MilestoneWatcher(folder, recorder, debounce=DEBOUNCE)
    w.start()
    try:
        recorder.settle(folder, "zz-a")
        assert recorder.names() == ["zz-a.md"]  # present before start: the engine scans those
        path.chmod(0o600)  # metadata only: nothing to report
        with path.open("a", encoding="utf-8") as fh:
            fh.write("more\n")
        assert recorder.wait_for("m5.md") == "# v1\nmore\n"
        recorder.settle(folder, "zz-b")
        assert recorder.names().count("m5.md") == 1
    finally:
        w.stop()


def test_deleted_before_settled_is_not_reported(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder
) -> None:
    path = folder / "gone.md"
    path.write_text("# half\n", encoding="utf-8")
    path.unlink()
    moved = folder / "moved.md"
    moved.write_text("# moved away\n", encoding="utf-8")
    os.rename(moved, folder.parent / "moved.md")
    recorder.settle(folder)
    assert recorder.names() == ["zz-sentinel.md"]


def test_on_ready_errors_are_logged_and_watching_goes_on(
    watcher: MilestoneWatcher,
    folder: Path,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom(path: Path) -> None:
        if path.name == "bad.md":
            raise RuntimeError("engine exploded")

    recorder.hook = boom
    (folder / "bad.md").write_text("# bad\n", encoding="utf-8")
    recorder.wait_for("bad.md")
    (folder / "good.md").write_text("# good\n", encoding="utf-8")
    assert recorder.wait_for("good.md") == "# good\n"
    assert "engine exploded" in caplog.text


def test_missing_folder_is_picked_up_when_created(tmp_path: Path, recorder: Recorder) -> None:
    before = set(threading.enumerate())
    folder = tmp_path / "proj" / ".anima" / "milestones"
    (tmp_path / "proj").mkdir()
    w = MilestoneWatcher(folder, recorder, debounce=DEBOUNCE)
    w.start()
    try:
        folder.mkdir(parents=True)
        (folder / "early.md").write_text("# written right after mkdir\n", encoding="utf-8")
        assert recorder.wait_for("early.md") == "# written right after mkdir\n"
        (folder / "later.md").write_text("# later\n", encoding="utf-8")
        assert recorder.wait_for("later.md") == "# later\n"
    finally:
        w.stop()
    assert [t for t in threading.enumerate() if t not in before] == []


def test_stop_joins_threads_and_is_idempotent(folder: Path, recorder: Recorder) -> None:
    before = set(threading.enumerate())
    w = MilestoneWatcher(folder, recorder, debounce=DEBOUNCE)
    w.start()
    assert len(set(threading.enumerate()) - before) >= 2  # observer (+ emitter) and timer
    (folder / "pending.md").write_text("# never settles\n", encoding="utf-8")
    w.stop()
    w.stop()
    assert [t for t in threading.enumerate() if t not in before] == []
    time.sleep(DEBOUNCE * 1.5)
    assert recorder.calls == []  # pending work is dropped on stop


def test_stop_from_inside_on_ready(folder: Path, recorder: Recorder) -> None:
    before = set(threading.enumerate())
    w = MilestoneWatcher(folder, recorder, debounce=DEBOUNCE)
    recorder.hook = lambda _path: w.stop()
    w.start()
    (folder / "last.md").write_text("# last\n", encoding="utf-8")
    recorder.wait_for("last.md")
    deadline = time.monotonic() + TIMEOUT
    while [t for t in threading.enumerate() if t not in before] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [t for t in threading.enumerate() if t not in before] == []


def test_folder_deleted_and_recreated_is_watched_again(
    watcher: MilestoneWatcher, folder: Path, recorder: Recorder
) -> None:
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.mkdir()
    (folder / "again.md").write_text("# again\n", encoding="utf-8")
    assert recorder.wait_for("again.md") == "# again\n"
