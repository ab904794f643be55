"""The human's controls on a running engine: pause after this round, stop now, resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.events import EngineError, Event, Notice, PhaseChanged
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


@pytest.fixture
def phases() -> list[str]:
    return []


@pytest.fixture
def engine(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
           phases: list[str]) -> Iterator[Engine]:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha", "Beta"])})
    engine = Engine(git_repo)

    def on_event(event: Event) -> None:
        if isinstance(event, PhaseChanged):
            phases.append(event.phase)

    engine.bus.subscribe(on_event)
    yield engine
    engine.shutdown()


def test_pause_after_this_round(engine: Engine, fake_claude: FakeClaude,
                                phases: list[str]) -> None:
    fake_claude.write_script({"developer": [{"auto": True, "delay": 1.0}]})
    engine.start()
    wait_for(lambda: "developer" in phases)
    engine.pause_after_round()
    wait_for(lambda: record(engine.root, "m1").status is MilestoneStatus.PAUSED)
    rec = record(engine.root, "m1")
    assert rec.rounds == 1 and rec.iterations[0].verdict.value == "accepted"
    assert rec.pause_reason == "paused by you after the round"


def test_stop_now_interrupts_then_resume_finishes(engine: Engine,
                                                  fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"hang": True}]})
    engine.start()
    wait_for(lambda: len(fake_claude.prompts("developer")) == 1)
    started = time.monotonic()
    engine.stop_now()
    wait_for(lambda: record(engine.root, "m1").status is MilestoneStatus.PAUSED, timeout=15)
    assert time.monotonic() - started < 10
    rec = record(engine.root, "m1")
    assert rec.pause_reason == "stopped by you" and rec.rounds == 0  # the round is redone
    log = (engine.root / ".anima" / "logs" / "m1.log").read_text()
    assert "stopped by you during developer; the round is redone on resume" in log
    engine.resume("m1", "carry on")
    wait_for(lambda: record(engine.root, "m1").status is MilestoneStatus.COMPLETED, timeout=30)
    assert "carry on" in fake_claude.prompts("developer")[1]


def test_a_start_that_failed_is_retried_on_request(git_repo: Path, fake_claude: FakeClaude,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """In the app (watching), a start that cannot begin stops with an error and the milestone
    stays pending, not retried on its own; once the cause is fixed, Start retries it. (The
    cause used to be an uncommitted edit in the checkout, which no longer stops a start: each
    milestone has its own worktree. A configured main branch that does not exist yet does.)"""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])},
                 config={"main_branch": "trunk"})
    errors: list[str] = []
    engine = Engine(git_repo)
    engine.bus.subscribe(lambda e: errors.append(e.message) if isinstance(e, EngineError)
                         else None)
    engine.start(watch=True)
    try:
        wait_for(lambda: any("'trunk' does not exist" in m for m in errors))
        assert record(git_repo, "m1").status is MilestoneStatus.PENDING
        run_git(git_repo, "branch", "trunk", "main")
        time.sleep(0.5)  # the fix alone starts nothing: the milestone waits for Start
        assert record(git_repo, "m1").status is MilestoneStatus.PENDING
        assert len([m for m in errors if "'trunk' does not exist" in m]) == 1
        engine.start_milestone("m1")
        wait_for(lambda: (r := record(git_repo, "m1")).status is MilestoneStatus.COMPLETED
                 and r.merge is not None and r.merge.merged, timeout=30)
        assert record(git_repo, "m1").main_branch == "trunk"
        assert run_git(git_repo, "merge-base", "--is-ancestor", "milestone/m1", "trunk") == ""
    finally:
        engine.shutdown()


@pytest.mark.parametrize("through", ["window", "socket"])
def test_an_abort_as_the_milestone_starts_is_not_undone_by_its_start(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        through: str) -> None:
    """Abort (the window offers it for pending milestones; `anima abort` takes them too)
    just after the queue picked the milestone, before its run wrote in_progress: it was
    cancelled, then the run saved its own copy over it, made the worktree again and started
    the Developer. The start is held here at the run's first step to make the instant
    reliable."""
    import threading

    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])})
    engine = Engine(git_repo)
    picked, go = threading.Event(), threading.Event()
    runs = engine.agents.runs

    def held_runs() -> object:
        if threading.current_thread().name.startswith("anima-m1"):
            picked.set()
            go.wait(10)
        return runs()

    monkeypatch.setattr(engine.agents, "runs", held_runs)
    engine.start(watch=True)
    try:
        assert picked.wait(20)
        threading.Timer(0.5, go.set).start()
        if through == "window":
            engine.abort("m1")
        else:  # answered once it is done
            assert engine.control("abort", "m1") == "abort: m1 is cancelled"
        wait_for(lambda: record(git_repo, "m1").status is MilestoneStatus.CANCELLED)
        time.sleep(2)
        assert record(git_repo, "m1").status is MilestoneStatus.CANCELLED
    finally:
        go.set()
        engine.shutdown()
    assert fake_claude.prompts("developer") == []
    assert not (git_repo / ".anima" / "worktrees" / "m1").exists()


def test_an_approval_as_the_milestone_goes_to_review_is_not_undone_by_its_run(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Approve in the window the moment the milestone shows awaiting review: main got the
    merge and the record said completed, then the run, still stopping its agents, saved its
    own copy over it (the final round's summary folded in): awaiting review again, no merge
    on record, while main held it. The human's approve lands here while the run still has
    its agents, as it announces the review."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": "---\nrequires_human_review: true\n---\n"
                                  + milestone_md("M", ["Alpha"])})
    engine = Engine(git_repo)
    approved = threading.Event()

    def approve_at_once(event: Event) -> None:
        if isinstance(event, Notice) and event.kind == "awaiting_review":
            engine.approve("m1")
            assert approved.wait(30)  # merged, and said so
        elif isinstance(event, Notice) and event.kind == "completed":
            approved.set()

    engine.bus.subscribe(approve_at_once)
    engine.start(watch=True)
    try:
        assert approved.wait(30)
        wait_for(lambda: not any(t.name == "anima-m1" for t in threading.enumerate()))
    finally:
        engine.shutdown()
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.phase == "completed"
    assert rec.merge is not None and rec.merge.merged
    assert "feat: F1" in run_git(git_repo, "log", "--format=%s", "main")
    assert all(it.summary for it in rec.iterations)


def test_a_stop_as_the_milestone_fails_leaves_it_failed_without_an_error_of_anima(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop now at the instant a milestone failed: its run then paused it "as stopped by
    you", which the transition table forbids from failed, so the window showed "illegal
    scheduler transition failed → paused" as an error of Anima and the milestone was set
    aside as one that could not be driven. It stays failed, as its record says."""
    fake_claude.use_env(monkeypatch)
    # Its branch deleted and a branch in the way of making it again: an unexpected error
    # (outside the sandbox, which refuses the deletion).
    fake_claude.write_script({"developer": [{"shell": [
        "git checkout -q --detach && git branch -q -D milestone/m1 && "
        "git branch milestone/m1/blocker"], "auto": True}]})
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])}, config={"sandbox": "off"})
    engine = Engine(git_repo)
    errors: list[str] = []

    def stop_as_it_fails(event: Event) -> None:
        if isinstance(event, EngineError):
            errors.append(event.message)
        elif isinstance(event, Notice) and event.kind == "failed":
            engine.stop_now("m1")

    engine.bus.subscribe(stop_as_it_fails)
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.FAILED and rec.phase == "failed"
    assert rec.error is not None and rec.pause_reason is None
    assert errors == []


def test_a_stop_from_another_terminal_answers_once_paused_so_a_resume_may_follow_at_once(
        engine: Engine, fake_claude: FakeClaude) -> None:
    """`anima stop P m1 && anima resume P m1`: the stop answered "it pauses" at once, while
    m1 was still in progress, so the resume right after it was refused ("m1 is running:
    stop it first", or "is in_progress, not paused")."""
    fake_claude.write_script({"developer": [{"hang": True}]})
    engine.start()
    wait_for(lambda: len(fake_claude.prompts("developer")) == 1)
    assert engine.control("stop", "m1") == \
        "stop: m1 is paused (stopped by you); the round is redone on resume"
    assert record(engine.root, "m1").status is MilestoneStatus.PAUSED
    assert engine.control("resume", "m1", "go on") == "resume: m1 is in_progress"
    wait_for(lambda: record(engine.root, "m1").status is MilestoneStatus.COMPLETED, timeout=30)
    assert "go on" in fake_claude.prompts("developer")[1]


def test_a_stop_as_the_milestone_completes_says_it_completed(
        engine: Engine, fake_claude: FakeClaude) -> None:
    """`anima stop` while the milestone merged into main: it said "stopping m1: it pauses as
    stopped by you", and m1 completed."""
    answers: list[str] = []
    asking: list[threading.Thread] = []

    def stop_as_it_merges(event: Event) -> None:
        if isinstance(event, PhaseChanged) and event.phase == "completed" and not asking:
            asking.append(threading.Thread(
                target=lambda: answers.append(engine.control("stop", "m1"))))
            asking[0].start()
            wait_for(lambda: all(s.control.stop.is_set() for s in engine._sessions.values()))

    engine.bus.subscribe(stop_as_it_merges)
    engine.start()
    wait_for(lambda: bool(answers), timeout=30)
    assert answers == ["stop: m1 is completed: it got there before the stop"]
    rec = record(engine.root, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge is not None and rec.merge.merged


def test_a_stop_while_the_agent_starts_pauses_before_its_first_prompt(
        engine: Engine, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """"Stop now" came while the Developer's CLI was starting (a slow disk, codex's
    handshake): no agent was running to interrupt, so nothing was stopped, the prompt went
    out after the stop, and the milestone worked on (here: hung) instead of pausing."""
    fake_claude.write_script({"developer": [{"hang": True}]})
    make = engine.agents.make
    stopping: list[threading.Thread] = []

    def make_while_stopped(*args: object, **kwargs: object) -> object:
        agent = make(*args, **kwargs)  # type: ignore[arg-type]
        if not stopping:  # the human presses Stop now while it starts
            stopping.append(threading.Thread(target=engine.stop_now))
            stopping[0].start()
            wait_for(lambda: all(s.control.stop.is_set() for s in engine._sessions.values()))
        return agent

    monkeypatch.setattr(engine.agents, "make", make_while_stopped)
    engine.start()
    wait_for(lambda: bool(stopping))
    wait_for(lambda: record(engine.root, "m1").status is MilestoneStatus.PAUSED, timeout=15)
    rec = record(engine.root, "m1")
    assert rec.pause_reason == "stopped by you" and rec.rounds == 0
    assert fake_claude.prompts("developer") == []  # no turn began after the stop
    stopping[0].join(10)


def test_stop_now_ends_a_git_command_of_anima_that_waits_for_good(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the sandbox the Developer can make the repository's `.git/info/exclude` a
    FIFO, and every `git status` then waits for a writer for ever. Anima's own waited
    silently, and Stop now did not stop the milestone (its worker was inside git): the log
    names the command once, a stop ends it, and the milestone pauses as stopped by you,
    leaving no lock behind."""
    fake_claude.use_env(monkeypatch)
    monkeypatch.setattr("anima.git.watch.SLOW_GIT_SECONDS", 1.0)
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])}, config={"sandbox": "off"})
    fake_claude.write_script({"developer": [{"shell": [  # (its own `git status` would wait)
        'x="$(git rev-parse --git-common-dir)/info/exclude"; mkdir -p "${x%/*}"; rm -f "$x"; '
        'mkfifo "$x"'], "text": "Working on it."}]})
    log = git_repo / ".anima" / "logs" / "m1.log"
    engine = Engine(git_repo)
    engine.start()
    try:
        wait_for(lambda: log.exists() and "Anima waits for it" in log.read_text(), timeout=30)
        time.sleep(1.5)  # said once, however long it waits
        waits = [line for line in log.read_text().splitlines() if "Anima waits for it" in line]
        assert len(waits) == 1, waits
        assert f"git status in {git_repo / '.anima' / 'worktrees' / 'm1'} has run for 1 s; " \
               "Anima waits for it (a stop ends it)" in waits[0]
        engine.stop_now()
        wait_for(lambda: record(git_repo, "m1").status is MilestoneStatus.PAUSED, timeout=15)
    finally:
        (git_repo / ".git" / "info" / "exclude").unlink(missing_ok=True)
        engine.shutdown()
    assert record(git_repo, "m1").pause_reason == "stopped by you"
    assert not list((git_repo / ".git").rglob("*.lock"))
