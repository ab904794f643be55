"""Editing `.anima/config.json` while Anima watches takes effect before the next start."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.events import EngineError, Event
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def save_config(repo: Path, text: str) -> None:
    """Save like an editor does, with a stamp that differs from the previous save."""
    path = repo / ".anima" / "config.json"
    time.sleep(0.05)
    path.write_text(text, encoding="utf-8")


def set_keys(repo: Path, **keys: object) -> str:
    data = json.loads((repo / ".anima" / "config.json").read_text(encoding="utf-8"))
    data.update(keys)
    return json.dumps(data, indent=2)


@pytest.fixture
def errors() -> list[str]:
    return []


def watching(repo: Path, errors: list[str]) -> Engine:
    engine = Engine(repo, config_overrides={"summarizer": {"enabled": False}})

    def collect(event: Event) -> None:
        if isinstance(event, EngineError):
            errors.append(event.message)

    engine.bus.subscribe(collect)
    engine.start(watch=True)
    return engine


def test_a_changed_config_is_reloaded_and_an_invalid_one_keeps_the_old(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        errors: list[str]) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])}, {"auto_start": False})
    engine = watching(git_repo, errors)
    try:
        wait_until(lambda: (git_repo / ".anima" / "milestones" / "m1.json").exists(),
                   "m1 registered")
        save_config(git_repo, '{"auto_start": tru')  # a typo: reported, the old settings kept
        wait_until(lambda: any("config.json" in e for e in errors), "the config error")
        assert "the settings read before stay in use" in errors[-1]
        time.sleep(1.5)
        assert record(git_repo, "m1").status is MilestoneStatus.PENDING
        save_config(git_repo, json.dumps({"auto_start": True}))
        wait_until(lambda: record(git_repo, "m1").status is MilestoneStatus.COMPLETED,
                   "m1 started by the reloaded auto_start and completed")
    finally:
        engine.shutdown()
    assert len([e for e in errors if "config.json" in e]) == 1  # said once, not every second


def test_an_invalid_config_at_start_is_read_again_once_fixed(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        errors: list[str]) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])})
    good = (git_repo / ".anima" / "config.json").read_text(encoding="utf-8")
    save_config(git_repo, set_keys(git_repo, max_iterations_per_milstone=5))
    engine = watching(git_repo, errors)
    try:
        wait_until(lambda: any("max_iterations_per_milstone" in e for e in errors),
                   "the config error")
        assert "Anima reads it again when you save it" in errors[-1]
        save_config(git_repo, good)
        wait_until(lambda: (git_repo / ".anima" / "milestones" / "m1.json").exists()
                   and record(git_repo, "m1").status is MilestoneStatus.COMPLETED,
                   "m1 completed once the config was fixed")
    finally:
        engine.shutdown()


def test_a_summarizer_change_saved_mid_run_leaves_the_running_milestones_theirs(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saving a new `summarizer.model` closed the summarizer the running milestone used:
    its later rounds got the report's text, "summarizer closed", instead of a summary."""
    from tests.fakes.api_stub import ApiStub

    fake_claude.use_env(monkeypatch)
    began, done = fake_claude.root / "began", fake_claude.root / "done"
    fake_claude.write_script({"developer": [
        {"auto": True},
        {"shell": [f"touch {began}; i=0; while [ ! -e {done} ] && [ $i -lt 600 ]; do "
                   "sleep 0.05; i=$((i+1)); done"], "auto": True}]})
    make_project(git_repo, {"m1": milestone_md("M", ["A", "B"])})
    with ApiStub(side_reply="Summary: what the model said") as stub:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-dummy")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", stub.url)
        engine = Engine(git_repo)
        engine.start(watch=True)
        try:
            wait_until(began.exists, "the second round's Developer turn")
            save_config(git_repo, set_keys(git_repo, summarizer={"model": "claude-other"}))
            wait_until(lambda: "settings reloaded" in (
                git_repo / ".anima" / "logs" / "anima.log").read_text(encoding="utf-8"),
                "the reload")
            done.touch()
            wait_until(lambda: record(git_repo, "m1").status is MilestoneStatus.COMPLETED,
                       "m1 completed")
        finally:
            done.touch()
            engine.shutdown()
    summaries = [it.summary for it in record(git_repo, "m1").iterations]
    assert summaries and all(s == "what the model said" for s in summaries), summaries


def test_a_resume_right_after_you_raise_the_round_limit_grants_the_new_one(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        errors: list[str]) -> None:
    """Paused at its round limit: you raise `max_iterations_per_milestone`, save, resume at
    once. The resume ran before the loop read the file again, and granted the old limit."""
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"acceptor": [{"text": "REJECTED: not yet"}]})
    make_project(git_repo, {"m1": milestone_md("M", ["A"])},
                 config={"max_iterations_per_milestone": 1})
    engine = watching(git_repo, errors)
    try:
        rec = git_repo / ".anima" / "milestones" / "m1.json"
        wait_until(lambda: rec.exists() and record(git_repo, "m1").status
                   is MilestoneStatus.PAUSED, "the pause")
        save_config(git_repo, set_keys(git_repo, max_iterations_per_milestone=7))
        engine.resume("m1")
        wait_until(lambda: record(git_repo, "m1").max_iterations > 1, "the resume")
    finally:
        engine.shutdown()
    assert record(git_repo, "m1").max_iterations == 1 + 7
