"""API faults with the real `claude` CLI: `anima run --headless` against the Messages API stub
answering 429 (a subscriber's usage limit), 529 then recovering, and 401."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from anima.events import clock
from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import run_git
from tests.fakes.api_stub import (
    ApiStub,
    Reply,
    overloaded,
    system_text,
    unauthorized,
    usage_limit_reached,
    user_prompts,
)
from tests.helpers import make_project, milestone_md, record
from tests.test_real_loop import ScriptedModel

pytestmark = [pytest.mark.real_claude, pytest.mark.timeout(240)]


class AcceptingModel(ScriptedModel):
    """The Developer as in test_real_loop; the Acceptor accepts at once."""

    def acceptor(self, request: dict[str, Any]) -> Reply:
        return Reply(text="ACCEPTED")


def run_headless(repo: Path, stub: ApiStub, claude: str, env: dict[str, str],
                 **extra: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env, "ANTHROPIC_BASE_URL": stub.url,
            "ANIMA_CLAUDE_COMMAND": claude, "CLAUDE_CODE_MAX_RETRIES": "1", **extra}
    for name in ("CLAUDECODE", "IS_SANDBOX"):  # IS_SANDBOX changes how 529s are retried
        full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "anima", "run", str(repo), "--headless"],
                          env=full, capture_output=True, text=True, timeout=200,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def project(git_repo: Path) -> Path:
    return make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                        config={"agent_timeout_seconds": 90, "usage_limit_margin_seconds": 1,
                                "api_retry_max_wait_seconds": 0.5,
                                "summarizer": {"enabled": False}})


def test_a_subscriber_usage_limit_is_waited_out(real_claude_bin: str, real_env: dict[str, str],
                                                project: Path) -> None:
    env = {k: v for k, v in real_env.items() if k != "ANTHROPIC_API_KEY"}
    with ApiStub(default=AcceptingModel()) as stub:
        resets = time.time() + 4
        stub.push(usage_limit_reached(resets))
        started = time.monotonic()
        result = run_headless(project, stub, real_claude_bin, env,
                              CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat-test", ANTHROPIC_API_KEY="")
        requests = stub.agent_requests()
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert len(requests) >= 2, out[-3000:]
    first, second = requests[:2]
    assert time.monotonic() - started > 4
    assert f"waiting for the usage limit to reset at {clock(resets)}" in out
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.consecutive_rejections == 0
    task = user_prompts(first)[-1]
    task = task[task.index("You are working on milestone"):]
    # The same prompt, sent again in the same session (the request carries both).
    assert sum(p.count(task) for p in user_prompts(second)) == 2, user_prompts(second)


def test_529s_past_the_cli_retries_are_sent_again(real_claude_bin: str, real_env: dict[str, str],
                                                  project: Path) -> None:
    with ApiStub(default=AcceptingModel()) as stub:
        stub.push(overloaded(), overloaded(), overloaded())
        result = run_headless(project, stub, real_claude_bin, real_env)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "developer: API retry 1/1: 529 overloaded, next in" in out
    assert "sending the prompt again" in out
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert [i.verdict for i in rec.iterations] == [Verdict.ACCEPTED, Verdict.ACCEPTED]


def test_an_invalid_key_pauses_at_once(real_claude_bin: str, real_env: dict[str, str],
                                       project: Path) -> None:
    with ApiStub(default=unauthorized()) as stub:
        result = run_headless(project, stub, real_claude_bin, real_env)
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED
    assert rec.iterations == [] and rec.consecutive_rejections == 0
    assert "Invalid API key" in (rec.pause_reason or "")
    assert "ANTHROPIC_API_KEY" in (rec.pause_reason or "")


def test_a_claude_that_is_not_logged_in_pauses_with_what_to_do(
        real_claude_bin: str, real_env: dict[str, str], project: Path) -> None:
    """Installed but never logged in (no key, no login in its HOME): one pause that says so
    and how to fix it, on stderr as an error too; no rejection, no Acceptor turn."""
    env = {k: v for k, v in real_env.items() if k != "ANTHROPIC_API_KEY"}
    with ApiStub(default=AcceptingModel()) as stub:
        result = run_headless(project, stub, real_claude_bin, env, ANTHROPIC_API_KEY="")
        assert stub.agent_requests() == []
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    words = ("claude is not logged in: run `claude` once and log in, or set ANTHROPIC_API_KEY; "
             "then resume")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and rec.pause_reason == words
    assert rec.iterations == [] and rec.consecutive_rejections == 0
    assert f"error: {words}" in result.stderr
    assert "[acceptor]" not in result.stdout


class ReviewKilledModel(AcceptingModel):
    """The Acceptor's first review never answers (Anima is killed during it)."""

    def __init__(self) -> None:
        self.reviewing = threading.Event()

    def acceptor(self, request: dict[str, Any]) -> Reply:
        if not self.reviewing.is_set():
            self.reviewing.set()
            return Reply(text="ACCEPTED", delay=60)
        return Reply(text="ACCEPTED")


def test_a_kill_during_the_review_is_not_taken_for_a_missing_report(
        real_claude_bin: str, real_env: dict[str, str], project: Path) -> None:
    """`kill -9` of `anima run` while the Acceptor reviewed a reported round: the rerun
    reviews that work again; neither the Acceptor nor the record is told the Developer never
    reported, and it is not asked to redo the feature."""
    model = ReviewKilledModel()
    with ApiStub(default=model) as stub:
        env = {**os.environ, **real_env, "ANTHROPIC_BASE_URL": stub.url,
               "ANIMA_CLAUDE_COMMAND": real_claude_bin}
        env.pop("CLAUDECODE", None)
        command = [sys.executable, "-m", "anima", "run", str(project), "--headless"]
        killed = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert model.reviewing.wait(60)
        time.sleep(1.0)
        killed.kill()
        killed.wait(10)
        before = len(stub.agent_requests())
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
        review = next(r for r in stub.agent_requests()[before:]
                      if "You are the Acceptor agent" in system_text(r))
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert run_git(project, "log", "--format=%s", "main").count("feat: F1") == 1
    recovered = rec.iterations[0]
    assert recovered.kind.value == "recovery" and recovered.verdict is Verdict.ACCEPTED
    said = user_prompts(review)[-1]
    for text in (said, recovered.summary or ""):
        assert "No report" not in text and "before it reported" not in text, text
        assert "during its review" in text, text


def test_an_expired_login_pauses_asking_to_log_in_again(
        real_claude_bin: str, real_env: dict[str, str], project: Path) -> None:
    """A subscriber (no API key) whose login expired: the pause says to log in again, not
    to check an ANTHROPIC_API_KEY that was never set."""
    env = {k: v for k, v in real_env.items() if k != "ANTHROPIC_API_KEY"}
    expired = Reply(status=401, error_type="authentication_error",
                    error_message="OAuth token has expired. Please obtain a new token or "
                                  "refresh your existing token.")
    with ApiStub(default=expired) as stub:
        result = run_headless(project, stub, real_claude_bin, env,
                              CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat-test", ANTHROPIC_API_KEY="")
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and rec.iterations == []
    reason = rec.pause_reason or ""
    assert "OAuth token has expired" in reason
    assert reason.endswith("run `claude` once and log in again; then resume"), reason
    assert "ANTHROPIC_API_KEY" not in reason
