"""Nothing the agents start outlives them: what a Developer sends to the background in a
session of its own (`setsid`, `nohup`, `(cmd &)`, as the real CLI runs every Bash call) is
stopped when the agent stops, when the milestone ends and when a killed run is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from anima import procfs
from anima.agents.claude.backend import CLAUDE
from anima.agents.claude.discovery import find_claude
from anima.agents.claude.profiles import profile_for
from anima.agents.process import AgentProcess
from anima.config import Config
from anima.events import DEVELOPER, EventBus
from anima.loop.confinement import sandbox_problem
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude
from tests.fakes.api_stub import ApiStub
from tests.helpers import make_project, milestone_md, record
from tests.test_crash import fake_agents
from tests.test_recovery import (
    Runner,
    alive,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    run_to_end,
    wait_until,
)

NO_BWRAP = sandbox_problem("auto")
#: A Developer turn that leaves three sleepers behind, each escaping its shell differently.
ESCAPES = ["setsid sleep 600 &", "nohup sleep 601 &", "(sleep 602 &)"]
#: The pause lets each become `sleep` before the turn ends: what is held between turns (all
#: of them) stays as it was, a shell that had not yet run its `sleep`.
SPAWN = {"own_session": True, "shell": [*ESCAPES, "sleep 0.5"], "auto": True}


def sleepers(our_processes: Callable[[], list[int]]) -> list[int]:
    """This test's fake's processes that run `sleep 60x`."""
    return [p for p in our_processes()
            if (argv := procfs.cmdline(p)) and argv[0].endswith("sleep") and argv[1:2] in
            (["600"], ["601"], ["602"])]


def test_stopping_an_agent_stops_what_it_started_in_other_sessions(
        fake_claude: FakeClaude, git_repo: Path,
        our_processes: Callable[[], list[int]]) -> None:
    fake_claude.write_script({"developer": [{**SPAWN, "auto": False, "text": "started"}]})
    agent = AgentProcess(DEVELOPER, fake_claude.binary, profile_for(DEVELOPER, Config()),
                         git_repo, EventBus(), session_id=str(uuid.uuid4()), turn_timeout=20,
                         idle_timeout=20, env=fake_claude.env, dialect=CLAUDE,
                         marker=procfs.agent_marker(git_repo, "m1", DEVELOPER))
    agent.start()
    try:
        assert agent.send("start three servers").text == "started"
        left = wait_until(lambda: len(sleepers(our_processes)) == 3 and sleepers(our_processes),
                          what="three sleepers")
        # None of them is in the agent's process group: a group kill would miss them all.
        assert all(procfs.pgid(p) != agent.pid for p in left)
    finally:
        agent.stop(grace=2.0)
    wait_until(lambda: not any(alive(p) for p in left), timeout=5, what="the sleepers gone")


@pytest.mark.real_claude
@pytest.mark.timeout(90)
def test_the_real_cli_runs_bash_outside_the_agents_group_and_stopping_it_stops_all(
        real_claude_bin: str, real_env: dict[str, str], api_stub: ApiStub,
        git_repo: Path) -> None:
    """The fact behind the marker: the real CLI starts each Bash call in a session of its
    own, so only the inherited environment ties what it starts to the agent."""
    marker = procfs.agent_marker(git_repo, "m1", DEVELOPER)
    command = ("setsid sleep 600 >/dev/null 2>&1 & nohup sleep 601 >/dev/null 2>&1 & "
               "(sleep 602 >/dev/null 2>&1 &)")
    api_stub.push({"tool_use": {"name": "Bash", "input": {"command": command,
                                                          "description": "start servers"}}},
                  "Started.")
    agent = AgentProcess(DEVELOPER, find_claude(real_claude_bin),
                         profile_for(DEVELOPER, Config()), git_repo, EventBus(),
                         session_id=str(uuid.uuid4()), turn_timeout=60, idle_timeout=30,
                         env=real_env, marker=marker, dialect=CLAUDE)
    agent.start()
    try:
        assert agent.send("start three servers").text == "Started."
        # (held since the turn ended, one may not have become `sleep` yet)
        left = wait_until(lambda: len(s := [p for p in procfs.marked(marker)
                                           if p != agent.pid]) >= 3 and s,
                          what="three sleepers carrying the agent's marker")
        assert all(procfs.pgid(p) != agent.pid for p in left)
    finally:
        agent.stop(grace=3.0)
        leaked = procfs.stop_marked(marker)
    assert leaked == []


def test_nothing_the_developer_started_outlives_the_milestone(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m1": milestone_md("Solo", ["Greet command"])})
    fake_claude.write_script({"developer": [SPAWN]})
    runner = run_to_end(git_repo, fake_claude)
    assert runner.proc.returncode == 0, runner.stdout[-2000:] + runner.stderr
    assert record(git_repo, "m1").status is MilestoneStatus.COMPLETED
    assert sleepers(our_processes) == []


@pytest.mark.parametrize("sandbox", [pytest.param("auto", marks=pytest.mark.skipif(
    NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")), "off"])
def test_a_restart_after_a_kill_stops_what_the_dead_runs_agents_left(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]], sandbox: str) -> None:
    """Unconfined, what the agents started outlives a killed Anima and the next start stops
    it; confined, nothing does (bubblewrap dies with Anima and takes its whole PID namespace,
    background sleepers included), so the next start finds nothing to stop."""
    make_project(git_repo, {"m1": milestone_md("Pair", ["Greet command", "Version flag"])},
                 config={"sandbox": sandbox})
    fake_claude.write_script({"developer": [SPAWN, {"hang": True}]})
    runner = Runner(git_repo, fake_claude)
    wait_until(lambda: len(fake_claude.entries("developer")) >= 2, what="round 2 started")
    agents = fake_agents(fake_claude)
    assert len(agents) == 2
    assert len(sleepers(our_processes)) == 3
    runner.signal(signal.SIGKILL)
    runner.wait(10)
    wait_until(lambda: not any(alive(p) for p in agents), timeout=5, what="the agents gone")
    if sandbox == "off":
        left = sleepers(our_processes)
        assert len(left) == 3  # the agents died with Anima; what they started did not
    else:
        wait_until(lambda: sleepers(our_processes) == [], timeout=5,
                   what="the sleepers gone with the sandbox")
        left = []

    again = run_to_end(git_repo, fake_claude)
    assert again.proc.returncode == 0, again.stdout[-2000:] + again.stderr
    assert not any(alive(p) for p in left)
    assert sleepers(our_processes) == []
    if sandbox == "off":
        assert "stopped 3 leftover tool process(es) of the agents of a previous run" \
            in again.stdout
    else:
        assert "leftover tool process" not in again.stdout
    assert record(git_repo, "m1").status is MilestoneStatus.COMPLETED


def test_a_process_held_between_turns_still_ends_as_asked(tmp_path: Path) -> None:
    """What an agent left running is held (stopped) between its turns; a stop asked then, by
    this run or by the next start after a kill, lets it end as asked (its SIGTERM handler
    runs, a server closes its files), not only by SIGKILL."""
    marker = procfs.agent_marker(tmp_path, "m1", DEVELOPER)
    ready, ended = tmp_path / "ready", tmp_path / "ended"
    script = ("import pathlib, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[2]).touch(),"
              " sys.exit(0)))\n"
              "pathlib.Path(sys.argv[1]).touch()\n"
              "while True: time.sleep(0.05)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(ready), str(ended)],
                             env={**os.environ, procfs.AGENT_VAR: marker})
    try:
        wait_until(ready.exists, what="the server's handler")
        os.kill(child.pid, signal.SIGSTOP)
        assert procfs.stop_marked(marker, grace=2.0) == [child.pid]
        assert ended.exists()
    finally:
        child.kill()
        child.wait()
