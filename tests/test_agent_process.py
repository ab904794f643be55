"""AgentProcess against the scripted fake `claude`: real processes, real ptys, no mocks."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anima.agents.claude.backend import CLAUDE
from anima.agents.claude.discovery import INSTALL_HINT, find_claude
from anima.agents.claude.profiles import profile_for
from anima.agents.process import AgentProcess
from anima.config import Config
from anima.errors import AgentCrashed, AgentError, AgentNotFound, SessionLost, TurnTimeout
from anima.events import (
    ACCEPTOR,
    DEVELOPER,
    AgentExited,
    ApiRetry,
    AssistantText,
    ContextUsage,
    Event,
    EventBus,
    RawOutput,
    SessionStarted,
    ToolResult,
    ToolUse,
    TurnResult,
)
from anima.text.redact import add_known_secrets
from tests.conftest import FakeClaude, run_git

Factory = Callable[..., AgentProcess]


class Recorder:
    """Collects every event published on a bus (from the reader thread)."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        bus.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type) -> list:
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]

    def kinds(self) -> list[str]:
        with self._lock:
            return [type(e).__name__ for e in self.events]


@pytest.fixture
def bus() -> EventBus:
    return EventBus()


@pytest.fixture
def recorder(bus: EventBus) -> Recorder:
    return Recorder(bus)


@pytest.fixture
def make_agent(fake_claude: FakeClaude, git_repo: Path, bus: EventBus) -> Iterator[Factory]:
    """Build (and always stop) agents driven by the fake."""
    made: list[AgentProcess] = []
    binary = fake_claude.binary

    def make(role: str = DEVELOPER, *, start: bool = True, turn_timeout: float = 20.0,
             idle_timeout: float = 20.0, session_id: str | None = None, resume: bool = False,
             env: dict[str, str] | None = None, **kw: Any) -> AgentProcess:
        agent = AgentProcess(
            role, binary, profile_for(role, Config()), git_repo, bus,
            session_id=session_id or str(uuid.uuid4()), resume=resume,
            turn_timeout=turn_timeout, idle_timeout=idle_timeout, dialect=CLAUDE,
            env={**fake_claude.env, **(env or {})}, **kw,
        )
        made.append(agent)
        if start:
            agent.start()
        return agent

    yield make
    for agent in made:
        agent.stop(grace=2.0)


def _gone(pid: int) -> bool:
    """True when pid is neither running nor a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "X"


def _group_empty(pgid: int, wait: float = 3.0) -> bool:
    """True once the group has no member at all; killed orphans are reaped by init, which
    takes up to about a second on some machines, hence the wait."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


# --- discovery ----------------------------------------------------------------------------


def test_find_claude_uses_config_then_env(fake_claude: FakeClaude,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    binary = find_claude(fake_claude.command)
    assert binary.version == "9.9.9 (Fake Claude)"
    assert binary.argv[-1] == str(fake_claude.path)
    monkeypatch.setenv("ANIMA_CLAUDE_COMMAND", fake_claude.command)
    assert find_claude(None).version == "9.9.9 (Fake Claude)"


def test_missing_binary_raises_agent_not_found_with_install_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANIMA_CLAUDE_COMMAND", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no claude anywhere
    with pytest.raises(AgentNotFound) as err:
        find_claude(None)
    assert INSTALL_HINT in str(err.value) and "PATH" in str(err.value)
    with pytest.raises(AgentNotFound) as err:
        find_claude("/nonexistent/claude --flag")
    assert "/nonexistent/claude" in str(err.value) and INSTALL_HINT in str(err.value)


def test_broken_binary_raises_agent_not_found(tmp_path: Path) -> None:
    broken = tmp_path / "claude"
    broken.write_text("#!/bin/sh\necho 'boom' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(AgentNotFound, match="exited 3"):
        find_claude(str(broken))


# --- turns --------------------------------------------------------------------------------


def test_text_turn_publishes_events_in_order(make_agent: Factory, fake_claude: FakeClaude,
                                             recorder: Recorder) -> None:
    fake_claude.write_script({"developer": [
        {"noise": ["warning: not json"], "shell": ["echo hi"], "text": "Hello {head_short}"}]})
    agent = make_agent()
    result = agent.send("Say hello")
    assert isinstance(result, TurnResult)
    assert result.text.startswith("Hello ") and len(result.text) == len("Hello ") + 7
    assert not result.is_error and result.session_id == agent.session_id
    assert result.cost_usd == pytest.approx(0.01) and result.num_turns == 2
    # each model call's usage, as it comes (what the turn spent so far)
    assert recorder.kinds() == ["SessionStarted", "RawOutput", "SpendSoFar", "ToolUse",
                                "ToolResult", "SpendSoFar", "AssistantText", "ContextUsage",
                                "TurnResult"]
    (context,) = recorder.of(ContextUsage)  # known before whoever waits for the result wakes
    assert (context.tokens, context.window, context.session_id) == (10, 200_000,
                                                                    agent.session_id)
    (started,) = recorder.of(SessionStarted)
    assert started.session_id == agent.session_id and "Bash" in started.tools
    assert recorder.of(RawOutput)[0].text == "warning: not json"
    assert recorder.of(ToolUse)[0].input["command"] == "echo hi"
    assert recorder.of(ToolResult)[0].content == "hi"
    assert recorder.of(AssistantText)[0].text == result.text
    entry = fake_claude.entries("developer")[0]
    assert entry["prompt"] == "Say hello" and entry["session_id"] == agent.session_id
    assert entry["pid"] == agent.pid and not entry["resume"]


def test_several_turns_on_one_process(make_agent: Factory, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"text": "REJECTED: no tests"}],
                              "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.5}})
    agent = make_agent(ACCEPTOR)
    texts = [agent.send(f"review {i}").text for i in range(5)]
    assert texts == ["REJECTED: no tests"] + ["ACCEPTED"] * 4
    assert {e["pid"] for e in fake_claude.entries("acceptor")} == {agent.pid}


def test_prompt_of_300kb_arrives_intact(make_agent: Factory, fake_claude: FakeClaude) -> None:
    prompt = "".join(f"line {i}: ünïcode \"quotes\" \\ tab\t{'x' * 40}\n" for i in range(6000))
    assert len(prompt.encode()) > 300_000
    agent = make_agent()
    agent.send(prompt)
    assert fake_claude.prompts("developer") == [prompt]


def test_several_mb_output_line(make_agent: Factory, fake_claude: FakeClaude,
                                recorder: Recorder) -> None:
    size = 4 * 1024 * 1024
    fake_claude.write_script({"developer": [{"huge_line_bytes": size, "text": "after"}]})
    agent = make_agent()
    assert agent.send("big").text == "after"
    texts = [e.text for e in recorder.of(AssistantText)]
    assert len(texts[0]) == size and set(texts[0]) == {"x"} and texts[1] == "after"


def test_error_result_is_returned_not_raised(make_agent: Factory,
                                             fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"text": "API error", "is_error": True,
                                             "subtype": "error_max_turns"}]})
    result = make_agent().send("x")
    assert result.is_error and result.subtype == "error_max_turns"


def test_concurrent_send_is_refused(make_agent: Factory, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"delay": 1.0, "text": "slow"}]})
    agent = make_agent()
    results: list[TurnResult] = []
    worker = threading.Thread(target=lambda: results.append(agent.send("first")))
    worker.start()
    time.sleep(0.3)
    with pytest.raises(AgentError, match="already in flight"):
        agent.send("second")
    worker.join(10)
    assert results[0].text == "slow"


# --- timeouts, crashes, interrupts --------------------------------------------------------


def test_turn_timeout_interrupts_and_process_stays_usable(
        make_agent: Factory, fake_claude: FakeClaude) -> None:
    """The CLI honours the interrupt: TurnTimeout, and the same process takes the next turn."""
    fake_claude.write_script({"developer": [{"delay": 30, "text": "late"}, {"text": "next"}]})
    agent = make_agent(turn_timeout=0.5, idle_timeout=10)
    pid = agent.pid
    started = time.monotonic()
    with pytest.raises(TurnTimeout) as err:
        agent.send("slow")
    assert time.monotonic() - started < 5
    assert not err.value.idle
    assert agent.alive and agent.pid == pid
    assert agent.send("again").text == "next"


def test_idle_timeout_on_a_deaf_process_stops_it(make_agent: Factory, fake_claude: FakeClaude,
                                                 recorder: Recorder) -> None:
    """The CLI ignores the interrupt too: TurnTimeout(idle) and the process is stopped."""
    fake_claude.write_script({"developer": [{"hang": True, "ignore_interrupt": True}]})
    agent = make_agent(turn_timeout=30, idle_timeout=0.5, interrupt_grace=0.5)
    pid = agent.pid
    assert pid is not None
    started = time.monotonic()
    with pytest.raises(TurnTimeout) as err:
        agent.send("hang")
    assert time.monotonic() - started < 8
    assert err.value.idle
    assert not agent.alive and _gone(pid) and _group_empty(pid)
    assert len(recorder.of(AgentExited)) == 1


def test_crash_mid_turn_raises_agent_crashed_with_stderr_tail(
        make_agent: Factory, fake_claude: FakeClaude, recorder: Recorder) -> None:
    fake_claude.write_script({"developer": [{"crash": 7}]})
    agent = make_agent()
    with pytest.raises(AgentCrashed) as err:
        agent.send("crash please")
    assert err.value.exit_code == 7
    assert "RuntimeError: fake claude crashed on purpose" in err.value.stderr_tail
    assert not agent.alive
    (exited,) = recorder.of(AgentExited)
    assert exited.exit_code == 7 and not exited.expected
    assert "developer agent exited with code 7 during a turn" in str(err.value)
    assert agent.outcome is not None and agent.outcome.exit_code == 7
    assert "fake claude crashed on purpose" in agent.outcome.stderr_tail
    assert any("Traceback" in e.text for e in recorder.of(RawOutput))


def test_a_line_held_for_the_rest_of_a_known_value_is_never_lost(
        make_agent: Factory, fake_claude: FakeClaude, recorder: Recorder) -> None:
    """A raw line that ends in the first part of a known value waits for the next line of its
    stream, which may hold the rest (tests/test_redaction_e2e.py). When none comes it goes
    out as it is: a moment later while the agent works on, and before its crash is told."""
    value = "kq/9f3a9c2e51b84d06e5"
    add_known_secrets([value])
    fake_claude.write_script({"developer": [
        {"stderr": [f"working {value[:6]}"], "delay": 3, "text": "done"},
        {"noise": [f"dying {value[:6]}"], "crash": 3}]})
    agent = make_agent()
    turn = threading.Thread(target=agent.send, args=("one",))
    turn.start()
    deadline = time.monotonic() + 2.5
    while not recorder.of(RawOutput) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e.text for e in recorder.of(RawOutput)] == [f"working {value[:6]}"]
    assert recorder.of(TurnResult) == []  # the turn still runs
    turn.join()
    with pytest.raises(AgentCrashed) as err:
        agent.send("two")
    assert f"dying {value[:6]}" in err.value.stderr_tail
    assert f"dying {value[:6]}" in [e.text for e in recorder.of(RawOutput)]


def test_death_between_turns_is_published_and_send_raises(make_agent: Factory,
                                                          recorder: Recorder) -> None:
    agent = make_agent()
    assert agent.pid is not None
    os.killpg(agent.pid, 9)
    deadline = time.monotonic() + 5
    while not recorder.of(AgentExited) and time.monotonic() < deadline:
        time.sleep(0.02)
    (exited,) = recorder.of(AgentExited)
    assert exited.exit_code == -9 and not exited.expected
    # The outcome says how it ended in words, not as a negative exit code.
    with pytest.raises(AgentCrashed, match="developer agent killed by signal 9 during a turn"):
        agent.send("anyone?")
    assert agent.outcome is not None and agent.outcome.reason == "killed by signal 9"
    assert len(recorder.of(AgentExited)) == 1


def test_interrupt_ends_a_hanging_turn(make_agent: Factory, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"hang": True}, {"text": "fine"}]})
    agent = make_agent()
    results: list[TurnResult] = []
    worker = threading.Thread(target=lambda: results.append(agent.send("hang")))
    worker.start()
    time.sleep(0.5)
    agent.interrupt()
    worker.join(5)
    assert not worker.is_alive()
    assert results[0].subtype == "error_during_execution" and results[0].is_error
    agent.interrupt()  # no turn in flight: a no-op
    assert agent.send("go on").text == "fine"


# --- stop, restart, resume ----------------------------------------------------------------


def test_stop_leaves_no_process_or_zombie(make_agent: Factory, fake_claude: FakeClaude,
                                          recorder: Recorder) -> None:
    # A tool that outlives its turn (a dev server…) must go with the agent.
    fake_claude.write_script({"developer": [{"shell": ["sleep 60 >/dev/null 2>&1 &"],
                                             "text": "started"}]})
    agent = make_agent()
    agent.send("start a server")
    pid = agent.pid
    assert pid is not None and not _group_empty(pid, wait=0)
    agent.stop()
    assert _gone(pid) and _group_empty(pid)
    assert not agent.alive
    (exited,) = recorder.of(AgentExited)
    assert exited.expected and exited.exit_code == 0
    agent.stop()  # idempotent


def test_stop_kills_a_process_that_ignores_eof_and_sigterm(tmp_path: Path, git_repo: Path,
                                                           bus: EventBus) -> None:
    stubborn = tmp_path / "stubborn"
    stubborn.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 1.0; exit 0; }\n"
                        "trap '' TERM\nexec 0</dev/null\nwhile :; do sleep 0.1; done\n")
    stubborn.chmod(0o755)
    agent = AgentProcess(DEVELOPER, find_claude(str(stubborn)), profile_for(DEVELOPER, Config()),
                         git_repo, bus, session_id="s", turn_timeout=5, idle_timeout=5,
                         dialect=CLAUDE)
    agent.start()
    pid = agent.pid
    assert pid is not None
    started = time.monotonic()
    agent.stop(grace=0.3)
    assert time.monotonic() - started < 5
    assert _gone(pid) and _group_empty(pid)


def test_restart_resumes_the_same_session(make_agent: Factory, fake_claude: FakeClaude,
                                          git_repo: Path) -> None:
    fake_claude.write_script({"developer": [{"text": "one"}, {"text": "two"}]})
    agent = make_agent()
    session = agent.session_id
    first_pid = agent.pid
    assert agent.send("a").text == "one"
    agent.restart()
    assert agent.pid != first_pid and agent.alive and agent.session_id == session
    assert agent.send("b").text == "two"  # turn counters survive the restart
    first, second = fake_claude.entries("developer")
    assert (first["session_id"], first["resume"]) == (session, False)
    assert (second["session_id"], second["resume"]) == (session, True)
    assert "--resume" in second["argv"] and second["cwd"] == str(git_repo)


def test_resume_of_a_lost_session_raises_session_lost(make_agent: Factory,
                                                      fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"lose_sessions": True})
    agent = make_agent(session_id=str(uuid.uuid4()), resume=True)
    with pytest.raises(SessionLost):
        agent.send("continue")


def test_error_during_execution_after_the_first_turn_is_not_session_lost(
        make_agent: Factory, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [
        {"text": "ok"}, {"subtype": "error_during_execution", "is_error": True}]})
    agent = make_agent(resume=True)
    agent.send("one")
    assert agent.send("two").subtype == "error_during_execution"


# --- environment --------------------------------------------------------------------------


def test_claudecode_is_not_passed_and_env_is_inherited(
        make_agent: Factory, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDECODE", "1")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    fake_claude.write_script({"developer": [
        {"shell": ["echo CC=${CLAUDECODE:-unset} URL=$ANTHROPIC_BASE_URL X=$EXTRA"],
         "text": "{feature}"}]})
    agent = make_agent(env={"EXTRA": "yes", "CLAUDECODE": "1"})
    agent.send("- [ ] F3 something")
    assert "CLAUDECODE" not in agent.child_env()
    out = subprocess.run(["cat", f"/proc/{agent.pid}/environ"], capture_output=True).stdout
    assert b"CLAUDECODE=" not in out and b"EXTRA=yes" in out


@pytest.mark.parametrize("bedrock", ["1", "0"])
def test_a_claude_agent_gets_cloud_keys_only_when_it_logs_in_through_that_cloud(
        make_agent: Factory, monkeypatch: pytest.MonkeyPatch, bedrock: str) -> None:
    """Its own variables always reach the CLI; AWS's only with `CLAUDE_CODE_USE_BEDROCK` on
    (else a Developer that never needs AWS could deploy with your key); no one's GH_TOKEN."""
    for name, value in {"CLAUDE_CODE_USE_BEDROCK": bedrock, "GH_TOKEN": "ghp_" + "g" * 36,
                        "AWS_SECRET_ACCESS_KEY": "aws-secret-0123456789",
                        "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-0123456789"}.items():
        monkeypatch.setenv(name, value)
    agent = make_agent(keep=CLAUDE.credentials(os.environ))
    environ = Path(f"/proc/{agent.pid}/environ").read_bytes().split(b"\0")
    assert b"CLAUDE_CODE_OAUTH_TOKEN=sk-ant-oat01-0123456789" in environ
    assert (b"AWS_SECRET_ACCESS_KEY=aws-secret-0123456789" in environ) is (bedrock == "1")
    assert not any(line.startswith(b"GH_TOKEN=") for line in environ)


def test_stdout_is_a_socket_no_tool_reopens_and_stdin_a_pipe(make_agent: Factory) -> None:
    """A tool the agent runs could reopen a terminal or a pipe through `/proc/<cli>/fd/1` and
    write lines as its CLI; a socket cannot be opened again."""
    agent = make_agent()
    pid = agent.pid
    assert os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    for fd in (1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        with pytest.raises(OSError, match="No such device or address"):
            open(f"/proc/{pid}/fd/{fd}", "w")  # noqa: SIM115
    assert os.getsid(pid) == pid  # its own session and process group


def test_runs_as_root_or_not(make_agent: Factory, fake_claude: FakeClaude) -> None:
    """CI runs as root: nothing in the process layer depends on the user."""
    fake_claude.write_script({"developer": [{"shell": ["id -u"], "text": "{head}"}]})
    agent = make_agent()
    result = agent.send("who am I")
    assert len(result.text) == 40


def test_auto_developer_commits_and_reports(make_agent: Factory, fake_claude: FakeClaude,
                                            git_repo: Path) -> None:
    base = run_git(git_repo, "rev-parse", "HEAD")
    agent = make_agent()
    report = agent.send("Round: 2\nFeatures:\n- [x] F1 done\n- [ ] F2 next\n").text
    head = run_git(git_repo, "rev-parse", "HEAD")
    assert report.startswith("## Implementation Report — Round 2\n")
    assert f"**Feature**: F2\n**Commit**: {head}\n" in report
    assert (git_repo / "features" / "F2.txt").exists()
    assert run_git(git_repo, "log", "-1", "--format=%s") == "feat: F2"
    done = agent.send(f"Base commit: {base}\n- [x] F1\n- [x] F2\n").text
    assert done.startswith("## ALL_FEATURES_COMPLETE")
    assert f"- {head} feat: F2" in done and "### Summary" in done
    acceptor = make_agent(ACCEPTOR)
    assert acceptor.send("review").text == "ACCEPTED"


# --- API faults, stops and both CLI versions ------------------------------------------------


def test_cli_retries_are_published_and_keep_the_turn_alive(make_agent: Factory,
                                                           fake_claude: FakeClaude,
                                                           recorder: Recorder) -> None:
    """A CLI retry sequence can outlast the idle timeout; each `api_retry` line is activity."""
    fake_claude.write_script({"developer": [{"replay": "529-2.1.330", "retry_delay": 0.7}]})
    agent = make_agent(idle_timeout=1.0)
    result = agent.send("go")
    assert result.is_error and result.api_error_status == 529
    assert [r.describe() for r in recorder.of(ApiRetry)] == [
        "API retry 1/2: 529 overloaded, next in 1 s", "API retry 2/2: 529 overloaded, next in 1 s"]


def test_a_late_interrupted_result_never_closes_the_next_turn(make_agent: Factory,
                                                              fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"text": "one", "late_interrupted_result": 0.2},
                                            {"text": "two", "delay": 0.8}]})
    agent = make_agent()
    assert agent.send("first").text == "one"
    second = agent.send("second")
    assert (second.text, second.is_error, second.stopped) == ("two", False, False)


def test_a_resume_passes_the_model_the_session_started_with(make_agent: Factory,
                                                            fake_claude: FakeClaude) -> None:
    """Without --model 2.1.197 resumes on a smaller context window (measured on 2.1.197)."""
    fake_claude.write_script({"developer": [{"text": "one"}, {"text": "two"}]})
    fresh = make_agent()
    fresh.send("a")
    fresh.restart()  # after a crash: resumed with the model its system/init reported
    fresh.send("b")
    first, second = fake_claude.entries("developer")
    assert "--model" not in first["argv"]
    assert second["argv"][second["argv"].index("--model") + 1] == "claude-fake-1"
    later = make_agent(session_id=fresh.session_id, resume=True, session_model="opus[1m]")
    assert later.argv()[later.argv().index("--model") + 1] == "opus[1m]"


@pytest.mark.parametrize(("flag", "error"), [("false", False), ("true", True),
                                             ("False", False), ("TRUE", True)])
def test_is_error_sent_as_text_reads_as_what_it_says(
        make_agent: Factory, fake_claude: FakeClaude, flag: str, error: bool) -> None:
    """`"is_error":"false"` (a string) is a reply, not an error to retry and pause on."""
    fake_claude.write_script({"developer": [{"text": "done", "is_error": flag}]})
    result = make_agent().send("x")
    assert (result.is_error, result.text) == (error, "done")
