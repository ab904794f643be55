"""`anima run PROJECT --headless --watch`: milestones dropped into `.anima/milestones/` while
it runs are started once their file is complete; editors' files are ignored; a malformed file
is reported once and skipped while the others run; SIGTERM ends it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.events import Event, MilestoneChanged, MilestoneRemoved
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record
from tests.test_recovery import (
    Runner,
    assert_consistent,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    wait_until,
)


def completed(repo: Path, milestone_id: str) -> bool:
    path = repo / ".anima" / "milestones" / f"{milestone_id}.json"
    return path.exists() and record(repo, milestone_id).status is MilestoneStatus.COMPLETED


@pytest.fixture
def watched(git_repo: Path, fake_claude: FakeClaude) -> Path:
    # The first milestone's Developer turn is slow, so a file dropped meanwhile waits for it.
    fake_claude.write_script({"developer": [{"auto": True, "delay": 1.5}]})
    return make_project(git_repo, {"m0-first": milestone_md("First", ["Alpha"])},
                        config={"max_parallel_milestones": 1})  # one after another


def test_dropped_milestones_are_started_as_they_arrive(
        watched: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]]) -> None:
    folder = watched / ".anima" / "milestones"
    runner = Runner(watched, fake_claude, "--watch")
    wait_until(lambda: fake_claude.entries("developer"), what="the first milestone to start")

    # Dropped while m0-first runs: picked up after it.
    (folder / "m1-created.md").write_text(milestone_md("Created", ["Beta"]), encoding="utf-8")
    # Written elsewhere, then moved into place (an atomic save).
    staged = tmp_path / "staged.md"
    staged.write_text(milestone_md("Moved", ["Gamma"]), encoding="utf-8")
    os.replace(staged, folder / "m2-moved.md")
    # Editors' files next to them: never parsed, never reported.
    (folder / ".m3-slow.md.swp").write_bytes(b"\x00binary swap")
    (folder / ".#m3-slow.md").write_text("lock", encoding="utf-8")
    # A malformed file: reported, skipped, the others go on.
    (folder / "bad.md").write_text("no title, no features\n", encoding="utf-8")
    # A slow writer: the first half alone would parse as a one-feature milestone.
    text = milestone_md("Slow", ["Delta", "Epsilon"])
    cut = text.index("### Epsilon")
    with (folder / "m3-slow.md").open("w", encoding="utf-8") as fh:
        fh.write(text[:cut])
        fh.flush()
        time.sleep(1.2)
        fh.write(text[cut:])

    for milestone_id in ("m0-first", "m1-created", "m2-moved", "m3-slow"):
        wait_until(lambda m=milestone_id: completed(watched, m), timeout=60,
                   what=f"{milestone_id} completed\n{runner.stdout[-3000:]}")
    assert len(record(watched, "m3-slow").features) == 2  # never registered half-written
    for milestone_id in ("m0-first", "m1-created", "m2-moved", "m3-slow"):
        assert_consistent(record(watched, milestone_id))
    # Dropped while m0-first ran, started only after it completed.
    first, created = record(watched, "m0-first"), record(watched, "m1-created")
    assert first.completed_at is not None and created.started_at is not None
    assert created.started_at >= first.completed_at

    out = runner.stdout
    skipped = [line for line in out.splitlines() if line.startswith("[anima] skipped:")]
    assert len(skipped) == 1 and "bad.md" in skipped[0], skipped
    assert "swp" not in out and ".#m3-slow" not in out
    assert not (folder / "bad.json").exists() and (folder / "bad.md").exists()

    runner.signal(signal.SIGTERM)
    # Nothing was in progress; bad.md still never starts as it is written (README, exit codes).
    assert runner.wait(15) == 2, runner.stdout[-2000:] + runner.stderr
    assert our_processes() == []
    assert not (watched / ".anima" / "anima.lock").exists()


def test_dropped_milestones_are_registered_at_once_and_start_in_arrival_order(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m0-first": milestone_md("First", ["Alpha"])},
                 config={"max_parallel_milestones": 1})  # one after another
    fake_claude.write_script({"developer": [{"auto": True, "delay": 6}]})
    folder = git_repo / ".anima" / "milestones"
    runner = Runner(git_repo, fake_claude, "--watch")
    try:
        wait_until(lambda: fake_claude.entries("developer"), what="the first milestone to start")
        # Dropped in this order while m0-first runs; their names sort the other way.
        for name in ("zz-early", "aa-late"):
            dropped = time.time()
            (folder / f"{name}.md").write_text(milestone_md(name, ["Beta"]), encoding="utf-8")
            wait_until(lambda n=name: (folder / f"{n}.json").exists(), timeout=1.0,
                       what=f"{name} registered within a second of its drop")
            rec = record(git_repo, name)
            assert rec.status is MilestoneStatus.PENDING
            assert dropped - 0.1 <= rec.created_at.timestamp() <= dropped + 0.5  # its arrival
            wait_until(lambda n=name: f"registered milestone {n} (pending)" in runner.stdout,
                       what=f"{name}'s registration logged")
        assert record(git_repo, "m0-first").status is MilestoneStatus.IN_PROGRESS

        for milestone_id in ("m0-first", "zz-early", "aa-late"):
            wait_until(lambda m=milestone_id: completed(git_repo, m), timeout=60,
                       what=f"{milestone_id} completed\n{runner.stdout[-3000:]}")
        early, late = record(git_repo, "zz-early"), record(git_repo, "aa-late")
        assert early.created_at < late.created_at
        assert early.completed_at is not None and late.started_at is not None
        assert late.started_at >= early.completed_at  # earliest first, whatever the names
    finally:
        runner.signal(signal.SIGTERM)
        code = runner.wait(15)
    assert code == 0, runner.stdout[-2000:] + runner.stderr
    assert our_processes() == []


def test_the_window_is_told_of_a_dropped_milestone_at_once_while_another_runs(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"developer": [{"hang": True}]})
    make_project(git_repo, {"m0-first": milestone_md("First", ["Alpha"])})
    published: list[Event] = []
    engine = Engine(git_repo)
    engine.bus.subscribe(published.append)
    engine.start()
    try:
        wait_until(lambda: fake_claude.entries("developer"), what="the first milestone to start")
        (git_repo / ".anima" / "milestones" / "m1-next.md").write_text(
            milestone_md("Next", ["Beta"]), encoding="utf-8")
        wait_until(lambda: any(isinstance(e, MilestoneChanged) and e.record.id == "m1-next"
                               for e in published), timeout=1.5,
                   what="m1-next published within a second of its drop")
        shown = next(e.record for e in published
                     if isinstance(e, MilestoneChanged) and e.record.id == "m1-next")
        assert shown.status is MilestoneStatus.PENDING
        time.sleep(1.5)  # the engine's rescans do not take it back
        assert not [e for e in published if isinstance(e, MilestoneRemoved)]
        assert record(git_repo, "m0-first").status is MilestoneStatus.IN_PROGRESS
    finally:
        engine.shutdown()


def test_sigterm_while_a_dropped_milestone_runs_leaves_it_to_resume(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo)
    fake_claude.write_script({"developer": [{"hang": True}]})
    runner = Runner(git_repo, fake_claude, "--watch")
    wait_until(lambda: "[anima]" in runner.stdout or (git_repo / ".anima" / "anima.lock")
               .exists(), what="the runner to start")
    (git_repo / ".anima" / "milestones" / "late.md").write_text(
        milestone_md("Late", ["Alpha"]), encoding="utf-8")
    wait_until(lambda: fake_claude.entries("developer"), what="the dropped milestone to start")
    runner.signal(signal.SIGTERM)
    assert runner.wait(15) == 143
    assert record(git_repo, "late").status is MilestoneStatus.IN_PROGRESS
    assert our_processes() == []


def test_a_folder_named_like_a_milestone_file_is_reported_without_using_up_files(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """A folder `b.json` (or `c.md`) where a file goes is read again on every scan of a
    `--watch` run: each failed read used to keep the folder open, one descriptor a scan, until
    Anima could open no file at all after a quarter of an hour."""
    make_project(git_repo, {"b": milestone_md("Bee", ["Alpha"])})
    folder = git_repo / ".anima" / "milestones"
    (folder / "b.json").mkdir()
    (folder / "c.md").mkdir()
    runner = Runner(git_repo, fake_claude, "--watch")
    wait_until(lambda: "b.json" in runner.stdout and "c.md" in runner.stdout,
               what="both folders to be reported")
    time.sleep(3)  # several scans
    fds = Path(f"/proc/{runner.pid}/fd")

    def under_folder() -> set[tuple[str, str]]:
        found = set()
        for fd in fds.iterdir():
            with contextlib.suppress(FileNotFoundError):  # closed as it was listed
                if (link := os.readlink(fd)).startswith(str(folder)):
                    found.add((fd.name, link))
        return found

    # A scan under way holds the folder for a moment: a leak is still there scans later.
    held = under_folder()
    for _ in range(3):
        time.sleep(0.4)
        held &= under_folder()
    runner.signal(signal.SIGTERM)
    assert runner.wait(15) == 2  # the folders, as at the end of any run
    assert held == set()


@pytest.mark.parametrize(("config", "says"), [
    ({"max_parallel_milestones": "lots"}, "max_parallel_milestones"),
    ({"sandbox": "required"}, 'sandbox is "required" but bubblewrap'),
], ids=["malformed", "required-without-bubblewrap"])
def test_sigterm_while_the_config_keeps_anything_from_starting_exits_2_naming_it(
        git_repo: Path, fake_claude: FakeClaude, tmp_path: Path, config: dict[str, object],
        says: str) -> None:
    """A `--watch` run waits for you to fix `.anima/config.json`; stopped first, it is a
    configuration error, as `anima run` without --watch says at once (README, exit codes).
    A malformed file ended "nothing left to do", exit 0, with m1 never started."""
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])}, config=config)
    runner = Runner(git_repo, fake_claude, "--watch",
                    env={"ANIMA_BWRAP": str(tmp_path / "no-such-bwrap")})
    try:
        wait_until(lambda: "Anima reads it again when you save it" in runner.stderr,
                   what="the config error to be said")
    finally:
        runner.signal(signal.SIGTERM)
        code = runner.wait(15)
    assert code == 2, runner.stdout[-2000:] + runner.stderr
    assert says in runner.stderr and "config.json" in runner.stderr, runner.stderr
    assert "nothing left to do" not in runner.stdout, runner.stdout
    assert fake_claude.entries() == []


def test_a_depends_on_cycle_you_break_while_it_watches_lets_them_start(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """a depends on itself, b on a: a is said to be on a cycle, b to wait; once you take
    the cycle out of a.md, a runs, then b, and the run stopped after them has nothing left
    to do."""
    front = "---\ndepends_on: [{}]\n---\n"
    make_project(git_repo, {"a": front.format("a") + milestone_md("A", ["Alpha"]),
                            "b": front.format("a") + milestone_md("B", ["Beta"])})
    runner = Runner(git_repo, fake_claude, "--watch")
    try:
        wait_until(lambda: "depends_on makes a cycle: a → a" in runner.stdout,
                   what=f"the cycle to be said\n{runner.stdout[-2000:]}")
        assert fake_claude.entries() == []
        (git_repo / ".anima" / "milestones" / "a.md").write_text(
            milestone_md("A", ["Alpha"]), encoding="utf-8")
        for milestone_id in ("a", "b"):
            wait_until(lambda m=milestone_id: completed(git_repo, m), timeout=90,
                       what=f"{milestone_id} completed\n{runner.stdout[-3000:]}")
    finally:
        runner.signal(signal.SIGTERM)
        code = runner.wait(15)
    assert code == 0, runner.stdout[-2000:] + runner.stderr
    assert our_processes() == []
