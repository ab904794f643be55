"""Stopping Anima: politely (SIGTERM, Ctrl+C, the window closed) and the single-instance lock.

A polite stop interrupts the turn, stops both agents within seconds and leaves the milestone
in_progress; the next run resumes it. A second Anima on a driven project refuses (exit 2,
naming the holder); a lock left by a dead Anima is taken over and said so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anima import procfs
from anima.engine.facade import Engine
from anima.events import Event, PhaseChanged
from anima.store.models import MilestoneStatus, RoundKind
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record
from tests.test_control_socket import anima
from tests.test_recovery import (
    RECOVERY_MARK,
    Runner,
    alive,
    assert_consistent,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    processes_with_env,
    run_to_end,
    wait_until,
)

TWO = milestone_md("Greeter", ["Greet command", "Version flag"])


def fake_agents(fake: FakeClaude) -> set[int]:
    """The real pids of this test's live fake `claude` processes (not the bubblewrap around
    them). The `pid` an entry logs is the one the agent saw: inside the sandbox, a pid of its
    own namespace (the same small number for every agent), meaningless outside it."""
    return {pid for pid in processes_with_env(f"FAKE_CLAUDE_STATE={fake.state_dir}")
            if procfs.cmdline(pid)[1:len(fake.argv)] == fake.argv[1:]}


@pytest.fixture
def project(git_repo: Path) -> Path:
    return make_project(git_repo, {"m1": TWO})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_app_stops_its_agents_politely_on_a_logout_or_a_closed_terminal(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]], sig: int) -> None:
    """A session logout sends SIGTERM, a closed terminal SIGHUP: the window closes as on
    Ctrl+C, the agents stop, the lock goes and the milestone resumes next time."""
    fake_claude.write_script({"developer": [{"auto": True}, {"hang": True}]})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
           "ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env,
           "QT_QPA_PLATFORM": "offscreen"}
    app = subprocess.Popen([sys.executable, "-m", "anima", str(project), "--settings",
                            str(tmp_path / "settings.ini")], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len(fake_claude.entries("developer")) >= 2, what="round 2 started",
                   timeout=30)
        agents = fake_agents(fake_claude)
        assert len(agents) == 2  # the Developer and the Acceptor
        app.send_signal(sig)
        app.wait(15)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert not any(alive(p) for p in agents) and our_processes() == []
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.rounds == 1
    assert not (project / ".anima" / "anima.lock").exists()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                           (signal.SIGHUP, 129)])
def test_a_signal_stops_both_agents_within_seconds_and_the_next_run_resumes(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]],
        sig: int, code: int) -> None:
    fake_claude.write_script({"developer": [{"auto": True}, {"hang": True}]})
    runner = Runner(project, fake_claude)
    wait_until(lambda: len(fake_claude.entries("developer")) >= 2, what="round 2 started")
    agents = fake_agents(fake_claude)
    first_run = {e["started"] for e in fake_claude.entries()}
    assert len(agents) == 2 and all(alive(p) for p in agents)
    started = time.monotonic()
    runner.signal(sig)
    assert runner.wait(15) == code, runner.stdout[-2000:] + runner.stderr
    assert time.monotonic() - started < 5.0
    assert not any(alive(p) for p in agents) and our_processes() == []
    assert f"stopped by {signal.Signals(sig).name}" in runner.stdout
    # The interrupted turn is a stop, not a failure.
    assert "[developer] — turn stopped" in runner.stdout and "(error)" not in runner.stdout
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.rounds == 1
    assert not (project / ".anima" / "anima.lock").exists()
    assert json.loads((project / ".anima" / "agents.json").read_text()) == {"agents": []}

    again = run_to_end(project, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:]
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert_consistent(rec)
    assert rec.iterations[1].kind is RoundKind.RECOVERY
    resumed = next(e for e in fake_claude.entries("developer")
                   if e["started"] not in first_run)
    assert resumed["resume"] and RECOVERY_MARK in resumed["prompt"]


def git_shim(tmp_path: Path, fake: FakeClaude, words: str, then: str
             ) -> tuple[Path, dict[str, str]]:
    """A `git` first on PATH that, for a command holding `words`, touches `git.busy` beside
    it and runs `then` before the real git; and the environment of a run that uses it."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *"{words}"*) touch "$0.busy"; {then};; esac\n'
        f'exec {shutil.which("git")} "$@"\n', encoding="utf-8")
    (shim / "git").chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
           "ANIMA_CLAUDE_COMMAND": fake.command, **fake.env,
           "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    return shim, env


def test_ctrl_c_while_anima_runs_git_is_a_stop_not_a_failure(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]]) -> None:
    """A terminal's Ctrl+C reaches its whole foreground process group: a git Anima was
    running died of it, and the milestone ended `failed` ("Cannot add a worktree")."""
    shim, env = git_shim(tmp_path, fake_claude, " worktree add ", "sleep 2")
    anima = subprocess.Popen([sys.executable, "-m", "anima", "run", str(project), "--headless"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)  # as a terminal's foreground job
    try:
        wait_until(lambda: (shim / "git.busy").exists(), what="git worktree add running")
        os.killpg(anima.pid, signal.SIGINT)  # what Ctrl+C does
        out, _ = anima.communicate(timeout=30)
    finally:
        if anima.poll() is None:
            anima.kill()
            anima.wait()
    assert anima.returncode == 130, out[-2000:]
    assert "failed" not in out and "continues on the next" in out
    assert record(project, "m1").status is MilestoneStatus.IN_PROGRESS
    assert our_processes() == []
    again = run_to_end(project, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED


def test_a_stop_while_the_merge_waits_on_git_leaves_the_merge_owed_not_failed(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        our_processes: Callable[[], list[int]]) -> None:
    """A stop ends a git command of Anima's that only reads (anima.git.watch): one the merge
    into main waited for made the merge "failed" (main never got the milestone by itself);
    it stays owed, and the next run merges it."""
    shim, env = git_shim(tmp_path, fake_claude, " --diff-filter=A ",
                         "sleep 60 >/dev/null 2>&1 & trap 'kill $!; exit 143' TERM; wait $!")
    anima = subprocess.Popen([sys.executable, "-m", "anima", "run", str(project), "--headless"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        wait_until(lambda: (shim / "git.busy").exists(), what="the merge's git diff running",
                   timeout=60)
        anima.send_signal(signal.SIGTERM)
        out, _ = anima.communicate(timeout=30)
    finally:
        if anima.poll() is None:
            anima.kill()
            anima.wait()
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge is not None, out[-2000:]
    assert rec.merge.state.value == "pending", rec.merge
    assert our_processes() == []
    again = run_to_end(project, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:]
    merged = record(project, "m1").merge
    assert merged is not None and merged.merged


def merge_diff_held_once(tmp_path: Path, fake_claude: FakeClaude,
                         monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's git, with the merge's first read-only `diff --diff-filter=A` held
    until a stop ends it (exit 143); returns the shim's folder."""
    shim, env = git_shim(tmp_path, fake_claude, " --diff-filter=A ",
                         '[ -e "$0.once" ] || { touch "$0.once"; sleep 60 >/dev/null 2>&1 & '
                         "trap 'kill $!; exit 143' TERM; wait $!; }")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return shim


def test_a_stop_that_ends_a_git_command_of_the_merge_names_no_round_to_redo(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop now as the merge into main waits on a git command that only reads: the log said
    "stopped by you during completed; the round is redone on resume", when no round was left
    to redo and nothing waited for a resume: the merge is owed, and the running Anima merges
    it."""
    shim = merge_diff_held_once(tmp_path, fake_claude, monkeypatch)
    engine = Engine(project)
    engine.start()
    try:
        wait_until(lambda: (shim / "git.busy").exists(), what="the merge's git diff running",
                   timeout=60)
        engine.stop_now("m1")
        wait_until(lambda: (merge := record(project, "m1").merge) is not None and merge.merged,
                   what="the owed merge, tried again")
    finally:
        engine.shutdown()
    log = (project / ".anima" / "logs" / "m1.log").read_text()
    assert "the round is redone" not in log, log[-2000:]
    assert "stopped by you during completed; the merge into main is still owed: the " \
           "running Anima tries it again" in log, log[-2000:]


def test_a_stop_while_the_merge_queue_waits_names_no_round_to_redo(
        git_repo: Path, fake_claude: FakeClaude, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`anima stop` while a finally accepted milestone waits its turn in the merge queue (the
    one accepted first is merging): the log, and the answer, said "the round is redone on
    resume" when no round was in flight."""
    make_project(git_repo, {"m1": TWO, "m2": milestone_md("Other", ["Other command"])},
                 config={"max_parallel_milestones": 2})
    shim = merge_diff_held_once(tmp_path, fake_claude, monkeypatch)
    engine = Engine(git_repo)
    engine.start()
    try:
        def waiting() -> str | None:
            """The milestone in the queue while the other merges."""
            if not (shim / "git.busy").exists():
                return None
            records = [record(git_repo, m) for m in ("m1", "m2")]
            merging = [r.id for r in records if r.phase.value == "merging"]
            done = [r for r in records if r.status is MilestoneStatus.COMPLETED]
            return merging[0] if len(merging) == 1 and done else None
        wait_until(lambda: waiting() is not None, what="one merging, the other waiting",
                   timeout=60)
        queued = waiting()
        assert queued is not None
        stopped = anima("stop", str(git_repo), queued)  # answered once it has paused
        assert stopped.returncode == 0, stopped.stderr
        assert record(git_repo, queued).status is MilestoneStatus.PAUSED
        assert stopped.stdout.strip() == (
            f"stop: {queued} is paused (stopped by you); no round was in flight: its merge "
            "into main is tried again on resume"), stopped.stdout
        log = (git_repo / ".anima" / "logs" / f"{queued}.log").read_text()
        assert "the round is redone" not in log, log[-2000:]
        assert "stopped by you during merging; no round was in flight: its merge into main " \
               "is tried again on resume" in log, log[-2000:]
    finally:
        engine.shutdown()


def test_an_agent_that_ignores_the_interrupt_is_stopped_anyway(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    fake_claude.write_script({"developer": [{"hang": True, "ignore_interrupt": True}]})
    runner = Runner(project, fake_claude)
    wait_until(lambda: fake_claude.entries("developer"), what="the first turn")
    started = time.monotonic()
    runner.signal(signal.SIGTERM)
    assert runner.wait(20) == 143, runner.stdout[-2000:] + runner.stderr
    assert time.monotonic() - started < 12.0
    assert our_processes() == []
    assert record(project, "m1").status is MilestoneStatus.IN_PROGRESS


def test_closing_the_app_engine_shutdown_stops_the_agents(
        project: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        our_processes: Callable[[], list[int]]) -> None:
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"acceptor": [{"hang": True}]})
    engine = Engine(project)
    reviewing = threading.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, PhaseChanged) and event.phase == "acceptor":
            reviewing.set()

    engine.bus.subscribe(on_event)
    engine.start(watch=True)
    assert reviewing.wait(20)
    wait_until(lambda: fake_claude.entries("acceptor"), what="the review turn")
    started = time.monotonic()
    engine.shutdown(timeout=10)
    assert time.monotonic() - started < 5.0
    assert our_processes() == []
    assert not (project / ".anima" / "anima.lock").exists()
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.interrupted and rec.rounds == 0


def test_a_second_anima_refuses_and_names_the_holder(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    fake_claude.write_script({"developer": [{"hang": True}]})
    first = Runner(project, fake_claude)
    wait_until(lambda: fake_claude.entries("developer"), what="the first run to drive")
    second = run_to_end(project, fake_claude, timeout=20)
    if second.proc.returncode != 2:
        first.kill()
    assert second.proc.returncode == 2, second.stdout + second.stderr
    assert f"pid {first.pid}" in second.stderr and "--headless" in second.stderr
    assert len(fake_claude.entries()) == 1  # the second one started no agent
    first.signal(signal.SIGTERM)
    assert first.wait(15) == 143
    assert our_processes() == []


def test_a_lock_left_by_a_dead_anima_is_taken_over(
        project: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = project / ".anima" / "anima.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                "started_at": "2026-01-01T00:00:00+00:00",
                                "command": "anima run old --headless"}) + "\n")
    runner = run_to_end(project, fake_claude)
    assert runner.proc.returncode == 0, runner.stdout[-2000:] + runner.stderr
    assert f"[anima] took over the lock of an Anima that is gone (pid {dead.pid}" \
        in runner.stdout
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert not lock.exists()
    assert our_processes() == []


def test_agents_die_with_a_killed_anima(project: Path, fake_claude: FakeClaude,
                                        our_processes: Callable[[], list[int]]) -> None:
    """SIGKILL leaves Anima no chance to stop its agents: the kernel does it (Linux)."""
    fake_claude.write_script({"developer": [{"auto": True}, {"hang": True}]})
    runner = Runner(project, fake_claude)
    wait_until(lambda: len(fake_claude.entries("developer")) >= 2, what="round 2 started")
    agents = fake_agents(fake_claude)
    assert len(agents) == 2 and all(alive(p) for p in agents)
    runner.signal(signal.SIGKILL)
    runner.wait(10)
    wait_until(lambda: not any(alive(p) for p in agents), what="the agents gone", timeout=5)
    # What they started goes the same way, a moment after them (each dies with its parent)
    wait_until(lambda: our_processes() == [], what="everything they started gone", timeout=5)
