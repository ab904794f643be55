"""An API error is not a reply: the loop against the scripted fake `claude`, whose error turns
replay lines the real CLIs printed (tests/fixtures/cli_lines)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from anima.config import Config
from anima.engine.facade import Engine
from anima.events import Event, Notice, UsageLimitWait, clock
from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude
from tests.helpers import hold, make_project, milestone_md, record, run_engine, state
from tests.test_recovery import Runner

ONE = milestone_md("Greeter", ["Greet command"])
FAST = {"api_retry_max_wait_seconds": 0.05, "usage_limit_margin_seconds": 0.3}


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": ONE}, config=FAST)


def log_text(project: Path) -> str:
    return (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("version", ["2.1.197", "2.1.330"])
def test_an_overloaded_api_is_retried_with_the_same_prompt(project: Path, fake_claude: FakeClaude,
                                                           version: str) -> None:
    fake_claude.write_script({"developer": [{"replay": f"529-{version}"}],
                              "acceptor": [{"replay": f"529-{version}"}, {"text": "ACCEPTED"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert [(i.kind.value, i.verdict) for i in rec.iterations] == [
        ("feature", Verdict.ACCEPTED), ("final", Verdict.ACCEPTED)]
    developer, acceptor = fake_claude.prompts("developer"), fake_claude.prompts("acceptor")
    assert developer[0] == developer[1] and acceptor[0] == acceptor[1]
    assert not any("restate" in p.lower() for p in developer + acceptor)
    log = log_text(project)
    assert "developer: API retry 1/2: 529 overloaded, next in 1 s" in log
    assert "sending the prompt again" in log


def test_transient_errors_past_the_attempts_pause_without_a_rejection(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer_default": {"replay": "529-2.1.197"}})
    _, outcome = run_engine(project, api_retry_attempts=2)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.status is MilestoneStatus.PAUSED
    assert rec.iterations == [] and rec.consecutive_rejections == 0
    assert rec.pause_reason is not None and "Repeated 529 Overloaded" in rec.pause_reason
    assert "3 attempts" in rec.pause_reason
    assert len(fake_claude.prompts("developer")) == 3


@pytest.mark.parametrize("case", ["nologin-2.1.197", "nologin-2.1.330", "401-2.1.330"])
def test_a_login_problem_pauses_at_once_with_the_cli_words(project: Path,
                                                            fake_claude: FakeClaude,
                                                            case: str) -> None:
    fake_claude.write_script({"developer_default": {"replay": case}})
    _, outcome = run_engine(project)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.iterations == []
    assert rec.consecutive_rejections == 0
    reason = rec.pause_reason or ""
    if case.startswith("nologin"):
        assert reason == ("claude is not logged in: run `claude` once and log in, or set "
                          "ANTHROPIC_API_KEY; then resume")
    else:  # a key the API refuses: its words, and what to check
        assert "Invalid API key" in reason and "check ANTHROPIC_API_KEY" in reason
    assert len(fake_claude.prompts("developer")) == 1


def test_an_acceptor_without_login_is_not_counted_as_a_review(project: Path,
                                                              fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor_default": {"replay": "401-2.1.197"}})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and rec.iterations == []
    assert len(fake_claude.prompts("acceptor")) == 1


def test_a_usage_limit_is_waited_out_then_the_same_prompt_goes_to_the_same_process(
        project: Path, fake_claude: FakeClaude) -> None:
    """Neither the turn timeout (1 s here, the wait is longer) nor the rejection counter runs
    while waiting; state.json, the log and a notification say what is happening."""
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330", "resets_in": 3}]})
    engine = Engine(project, config_overrides={"agent_timeout_seconds": 1.0})
    events: list[Event] = []
    engine.bus.subscribe(events.append)
    seen: list[dict[str, Any]] = []
    status: list[str] = []

    def watch_state() -> None:
        while not done.is_set():
            try:
                current = state(project)
            except (OSError, json.JSONDecodeError):
                continue
            if current.get("waiting_reason"):
                seen.append(current)
                status.append(subprocess.run(
                    [sys.executable, "-m", "anima", "status", str(project)],
                    capture_output=True, text=True, timeout=30).stdout)
                return
            time.sleep(0.02)

    done = threading.Event()
    watcher = threading.Thread(target=watch_state)
    watcher.start()
    started = time.monotonic()
    try:
        engine.run(watch=False, start_all=True)
    finally:
        done.set()
        watcher.join()
        engine.shutdown()
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.consecutive_rejections == 0
    assert time.monotonic() - started > 3.0
    (waits,) = [e for e in events if isinstance(e, UsageLimitWait) and e.until is not None]
    expected = f"waiting for the usage limit to reset at {clock(waits.until - 0.3)}"
    assert waits.message.startswith(expected)
    assert seen and seen[0]["waiting_reason"].startswith(expected) and seen[0]["waiting_until"]
    assert expected in status[0]
    assert state(project).get("waiting_reason") is None
    assert any(isinstance(e, Notice) and e.kind == "waiting" for e in events)
    assert expected in log_text(project)
    first, second = fake_claude.entries("developer")[:2]
    assert first["prompt"] == second["prompt"] and first["pid"] == second["pid"]


def test_a_usage_limit_further_away_than_allowed_pauses_naming_it(project: Path,
                                                                  fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.197", "resets_in": 7200}]})
    started = time.time()
    _, outcome = run_engine(project, max_usage_limit_wait_hours=1)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.iterations == []
    reason = rec.pause_reason or ""
    assert "5-hour limit reached" in reason and "max_usage_limit_wait_hours" in reason
    # The reset the CLI said (plus the margin Anima waits beyond it), whichever minute the
    # clock was in while the test ran.
    margin = Config().usage_limit_margin_seconds
    shown = {clock(t) for t in range(int(started) + 7200, int(time.time() + 7200 + margin) + 2)}
    assert any(f"resets at {hhmm}" in reason for hhmm in shown), reason


def test_a_prompt_too_long_gets_one_fresh_session(project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"replay": "toolong-2.1.330"}, {"text": "ACCEPTED"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    first, second = fake_claude.entries("acceptor")[:2]
    assert first["prompt"] == second["prompt"]
    assert second["session_id"] != first["session_id"] and not second["resume"]
    assert any("too long" in n and "fresh" in n for n in rec.notes)


def test_a_prompt_too_long_twice_pauses(project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor_default": {"replay": "toolong-2.1.197"}})
    _, outcome = run_engine(project)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.iterations == []
    assert "too long even for a fresh session" in (rec.pause_reason or "")
    assert len(fake_claude.prompts("acceptor")) == 2


def test_the_session_model_is_kept_on_the_record(project: Path, fake_claude: FakeClaude) -> None:
    run_engine(project)
    rec = record(project, "m1")
    assert rec.sessions.developer_model == rec.sessions.acceptor_model == "claude-fake-1"


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def stopped_while_waiting(repo: Path, milestone_id: str, *, watch: bool) -> Engine:
    """A running engine whose `milestone_id` met the usage limit and was stopped (paused)
    while it waited."""
    engine = Engine(repo)
    engine.start(watch=watch)
    try:
        wait_for(lambda: bool(state(repo).get("waiting_reason")))
        engine.stop_now(milestone_id)
        wait_for(lambda: record(repo, milestone_id).status is MilestoneStatus.PAUSED)
    except BaseException:
        engine.shutdown()
        raise
    return engine


def test_a_reset_already_past_is_waited_for_not_hammered(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI keeps meeting the limit with a reset already past (a clock ahead of the
    server's, a stale event): with no margin Anima sent the prompt again at once, 225 times
    in 4 s, each with a notification."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])},
                 config={"usage_limit_margin_seconds": 0})
    fake_claude.write_script({"developer_default": {"replay": "usage-2.1.330",
                                                    "resets_in": -120}})
    notices: list[Event] = []
    engine = Engine(git_repo)
    engine.bus.subscribe(lambda e: notices.append(e) if isinstance(e, Notice) else None)
    engine.start(watch=False)
    try:
        time.sleep(4.0)
        assert state(git_repo).get("waiting_reason")  # it says it waits
    finally:
        engine.shutdown()
    assert len(fake_claude.prompts("developer")) == 1
    assert len([n for n in notices if n.kind == "waiting"]) == 1


@pytest.mark.parametrize(("resets_in", "says"), [
    (3 * 86400 + 600, "%a %d %b"),  # a weekly limit: the day, not just the time
    (1.8e12, "an unreadable time")])  # milliseconds: it used to fail the milestone
def test_a_limit_far_away_pauses_naming_when_it_resets(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        resets_in: float, says: str) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330",
                                             "resets_in": resets_in}]})
    run_engine(git_repo)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.PAUSED, rec.error
    expected = time.strftime(says, time.localtime(time.time() + resets_in)) \
        if "%" in says else says
    assert f"it resets at {expected}" in (rec.pause_reason or ""), rec.pause_reason


def test_a_reset_no_calendar_holds_pauses_however_long_you_allow_to_wait(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI that sends milliseconds, with a wait allowed as long: the milestone failed
    ("ValueError: year 59066 is out of range") when Anima wrote down when to send again."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])},
                 config={"max_usage_limit_wait_hours": 1e9})
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330", "resets_in": 1.8e12}]})
    _, outcome = run_engine(git_repo)
    rec = record(git_repo, "m")
    assert outcome.paused == ("m",) and rec.error is None, rec.error
    assert "it resets at an unreadable time" in (rec.pause_reason or ""), rec.pause_reason


def test_stopping_the_pair_that_met_the_limit_leaves_the_others_waiting_visible(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hit` meets the account's limit, `other` is held by it too; you stop `hit`: its log
    said the limit had reset (it had not) and state.json lost the wait `other` still has."""
    ids = ["hit", "other"]
    make_project(git_repo, {i: milestone_md("Two", ["Alpha", "Beta"]) for i in ids},
                 config={"usage_limit_margin_seconds": 0})
    fake_claude.write_script({"milestones": {
        "hit": {"feature_dir": "features/hit",
                "developer": [{"replay": "usage-2.1.330", "resets_in": 20}]},
        "other": {"feature_dir": "features/other",
                  "developer_default": {"auto": True, "delay": 0.3}}}})
    fake_claude.use_env(monkeypatch)
    engine = stopped_while_waiting(git_repo, "hit", watch=False)
    try:
        # `other` waits from its next turn on (its turn in flight goes on meanwhile).
        wait_for(lambda: [(r["id"], bool(r["waiting_reason"])) for r in state(git_repo)["running"]]
                 == [("other", True)], timeout=15)
        assert record(git_repo, "other").status is MilestoneStatus.IN_PROGRESS
        assert state(git_repo).get("waiting_reason")
    finally:
        engine.shutdown()
    hit_log = (git_repo / ".anima" / "logs" / "hit.log").read_text(encoding="utf-8")
    assert "has reset" not in hit_log and "stopped while waiting for the usage limit" in hit_log


def test_a_pair_held_by_anothers_limit_still_waits_after_a_kill(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """`hit` meets the account's limit and `other` is held by it; you stop `hit`, and Anima
    is killed before the reset: only `hit`'s record kept the wait, so the next start sent
    `other`'s prompt at once, to meet the limit again (a wasted request, a second
    notification). `other`'s record keeps the wait it is held for: nothing of it reaches
    the CLI before the reset."""
    resets_in = 15
    make_project(git_repo, {i: milestone_md("Two", ["Alpha"]) for i in ("hit", "other")},
                 config={"usage_limit_margin_seconds": 0})
    fake_claude.write_script({"milestones": {
        "hit": {"feature_dir": "features/hit",
                "developer": [{"replay": "usage-2.1.330", "resets_in": resets_in}]},
        "other": {"feature_dir": "features/other",
                  "developer_default": {"auto": True, "delay": 0.3}}}})

    def others() -> list[float]:
        return [e["time"] for e in fake_claude.entries() if Path(e["cwd"]).name == "other"]

    runner = Runner(git_repo, fake_claude)
    try:
        wait_for(lambda: any(r["id"] == "other" and r["waiting_reason"]
                             for r in state(git_repo).get("running", [])), timeout=20)
        subprocess.run([sys.executable, "-m", "anima", "stop", str(git_repo), "hit"],
                       check=True, capture_output=True)
        wait_for(lambda: record(git_repo, "hit").status is MilestoneStatus.PAUSED)
        assert record(git_repo, "other").status is MilestoneStatus.IN_PROGRESS
    finally:
        runner.kill()
    met = min(e["time"] for e in fake_claude.entries() if Path(e["cwd"]).name == "hit")
    reset, sent = math.ceil(met + resets_in), len(others())
    assert time.time() < reset - 3, "too slow: the reset came before the restart"

    again = Runner(git_repo, fake_claude)
    try:
        wait_for(lambda: len(others()) > sent, timeout=resets_in + 20)
    finally:
        again.kill()
    assert min(others()[sent:]) >= reset


def test_a_stopped_wait_does_not_haunt_state_json_after_the_resume(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """The only pair meets the limit; you stop it while it waits; after the reset you resume
    it in the same app: state.json said it waited for a reset long past while it worked."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])},
                 config={"usage_limit_margin_seconds": 0})
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330", "resets_in": 2},
                                            {"shell": [hold(fake_claude.root)], "auto": True}]})
    engine = stopped_while_waiting(git_repo, "m", watch=True)
    try:
        time.sleep(3)  # the reset is past
        engine.resume("m")
        wait_for(lambda: (fake_claude.root / "held").exists())
        time.sleep(0.5)
        st = state(git_repo)
        assert st["status"] == "awake"
        assert not st.get("waiting_reason"), st
    finally:
        (fake_claude.root / "go").touch()
        engine.shutdown()


@pytest.mark.parametrize("odd", [
    {"usage": {"input_tokens": "lots", "output_tokens": 1e400}},  # failed the milestone
    {"usage": {"input_tokens": [100], "output_tokens": 50}},
    {"cost_usd": -5},  # "unexpected error": the whole run raised
    {"cost_usd": "nan"},
    {"cost_usd": "inf"},  # written as null: the record no start could read again
    {"noise": [json.dumps({"type": "system", "subtype": "api_retry", "attempt": "two",
                           "retry_delay_ms": "soon", "error_status": 529})]},  # a "crash"
])
def test_odd_numbers_from_the_cli_neither_fail_the_milestone_nor_spoil_its_record(
        project: Path, fake_claude: FakeClaude, odd: dict[str, Any]) -> None:
    """A figure that is text, a list, NaN, infinite or negative counts as 0; the rest of
    the turn, and what the other turns spent, count as usual."""
    fake_claude.write_script({"developer": [{"auto": True, **odd}]})
    _, outcome = run_engine(project, max_budget_usd=5.0)
    assert outcome.problems == () and outcome.failed == ()
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert rec.cost_usd == pytest.approx(sum(i.cost_usd for i in rec.iterations))
    assert 0 < rec.cost_usd < 1  # the acceptor's turns and the developer's second
    assert rec.usage.output_tokens >= 150
    assert "crashed" not in log_text(project)
    status = subprocess.run([sys.executable, "-m", "anima", "status", "--json", str(project)],
                            capture_output=True, text=True, check=True)
    assert json.loads(status.stdout)


def test_a_kill_while_waiting_for_a_usage_limit_waits_out_the_same_reset_after_the_restart(
        project: Path, fake_claude: FakeClaude) -> None:
    """`anima run` killed during the wait: the next start sent the prompt again at once (and
    met the limit again) instead of waiting until the reset the record knew."""
    fake_claude.write_script({"developer": [{"replay": "usage-2.1.330", "resets_in": 5}]})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
           "ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env}
    first = subprocess.Popen([sys.executable, "-m", "anima", "run", str(project), "--headless"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: bool(state(project).get("waiting_reason")))
        resets = fake_claude.entries("developer")[0]["time"] + 5
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    again = fake_claude.entries("developer")[1]
    assert again["time"] >= resets, again["time"] - resets
    assert "waiting for the usage limit to reset" in log_text(project)


def test_a_held_pair_keeps_the_reset_the_account_waits_for_when_it_is_extended(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """`hit` meets the account's limit and `other` is held by it; then `late`, whose turn was
    already under way, meets a limit that resets later, and every pair waits for that one.
    `other`'s record (what a start after a kill waits for) and its line in state.json kept
    the earlier reset: they follow the account's wait."""
    make_project(git_repo, {i: milestone_md("Three", ["Alpha"]) for i in ("hit", "other", "late")},
                 config={"usage_limit_margin_seconds": 0, "max_parallel_milestones": 3})
    fake_claude.write_script({"milestones": {
        # Each first turn starts before `hit` meets its limit (all three start together).
        "hit": {"feature_dir": "features/hit",
                "developer": [{"replay": "usage-2.1.330", "replay_after": 4,
                               "resets_in": 40}]},
        "other": {"feature_dir": "features/other",
                  "developer_default": {"auto": True, "delay": 6}},
        "late": {"feature_dir": "features/late",
                 "developer": [{"replay": "usage-2.1.330", "replay_after": 12,
                                "resets_in": 80}]}}})
    runner = Runner(git_repo, fake_claude)
    try:
        wait_for(lambda: kept(git_repo, "hit") is not None
                 and waits(git_repo, "other") == (kept(git_repo, "hit"),) * 2, timeout=30)
        assert kept(git_repo, "late") is None, \
            "too slow: late met its limit before other was held"
        wait_for(lambda: kept(git_repo, "late") is not None, timeout=30)
        wait_for(lambda: waits(git_repo, "other") == (kept(git_repo, "late"),) * 2, timeout=5)
    finally:
        runner.kill()


def kept(repo: Path, milestone_id: str) -> float | None:
    """Until when its record says its next turn waits."""
    path = repo / ".anima" / "milestones" / f"{milestone_id}.json"
    wait = record(repo, milestone_id).limit_wait if path.exists() else None
    return None if wait is None else wait.until.timestamp()


def waits(repo: Path, milestone_id: str) -> tuple[float | None, float | None]:
    """Until when its record and its line in state.json say it waits."""
    line = next((r for r in state(repo).get("running", []) if r["id"] == milestone_id), {})
    shown = line.get("waiting_until")
    return kept(repo, milestone_id), None if shown is None else \
        datetime.fromisoformat(shown).timestamp()


def test_the_pair_that_met_the_limit_follows_a_later_reset_and_a_restart_waits_for_it(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """`hit` meets the account's limit; then `late`, whose turn was already under way, meets
    one that resets later, and both pairs wait for that one. `hit`'s own record and line in
    state.json kept its own reset until it came: killed in between, the next start (one at
    a time now, `hit` first) sent its prompt at that reset, into the limit."""
    make_project(git_repo, {i: milestone_md("Two", ["Alpha"]) for i in ("hit", "late")},
                 config={"usage_limit_margin_seconds": 0, "max_parallel_milestones": 2})
    fake_claude.write_script({"milestones": {
        "hit": {"feature_dir": "features/hit",
                "developer": [{"replay": "usage-2.1.330", "replay_after": 4,
                               "resets_in": 12}]},
        "late": {"feature_dir": "features/late",
                 "developer": [{"replay": "usage-2.1.330", "replay_after": 8,
                                "resets_in": 30}]}}})
    runner = Runner(git_repo, fake_claude)
    try:
        wait_for(lambda: kept(git_repo, "hit") is not None, timeout=30)
        first = kept(git_repo, "hit")
        assert first is not None and kept(git_repo, "late") is None, "too slow: late was held"
        wait_for(lambda: kept(git_repo, "late") is not None, timeout=30)
        later = kept(git_repo, "late")
        assert later is not None and later > first + 5
        wait_for(lambda: waits(git_repo, "hit") == (later, later), timeout=5)
        assert time.time() < first - 1, "too slow: hit's own reset came before the kill"
    finally:
        runner.kill()
    config = git_repo / ".anima" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text(encoding="utf-8")),
                                  "max_parallel_milestones": 1}), encoding="utf-8")

    def hit_developer() -> list[dict[str, Any]]:
        return [e for e in fake_claude.entries("developer") if Path(e["cwd"]).name == "hit"]

    runner = Runner(git_repo, fake_claude)
    try:
        wait_for(lambda: len(hit_developer()) == 2, timeout=60)
        assert hit_developer()[1]["time"] >= later, later - hit_developer()[1]["time"]
    finally:
        runner.kill()
