"""The real `claude` CLI confined by bubblewrap to its milestone's worktree, offline against the
local Messages API stub: the whole CLI runs in `MilestoneSandbox(...).confine("developer")` on
a worktree made by `GitRepo.add_worktree`, as the engine runs it. A scripted Bash call commits
on `milestone/<id>`, the session resumes (`--resume`) inside the sandbox with its conversation,
and a write outside the worktree fails with the file left as it was."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anima import sandbox
from anima.agents.claude.backend import CLAUDE
from anima.agents.claude.discovery import find_claude
from anima.agents.claude.profiles import profile_for
from anima.agents.process import AgentProcess
from anima.config import Config
from anima.events import DEVELOPER, Event, EventBus, ToolResult
from anima.git import GitRepo
from anima.git.objects import take_objects
from anima.loop.confinement import MilestoneSandbox
from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from tests.conftest import run_git
from tests.fakes.api_stub import ApiStub, Reply, all_text
from tests.helpers import make_project, milestone_md, record
from tests.test_real_loop import ScriptedModel, run_headless

pytestmark = [pytest.mark.real_claude, pytest.mark.timeout(120)]

if sandbox.unavailable() == sandbox.NOT_INSTALLED:
    pytest.skip(f"{sandbox.NOT_INSTALLED}: the sandbox cannot be tested here",
                allow_module_level=True)

READ_ONLY = "Read-only file system"


@dataclass
class Milestone:
    """A project under `anima init` with milestone m1's worktree, and what the tests check."""

    paths: ProjectPaths
    worktree: Path
    main: str  # main's commit before the agent ran

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def agent_home(self) -> Path:
        return self.paths.agent_state("m1", DEVELOPER) / "home"

    def session_files(self, session_id: str) -> list[Path]:
        return sorted(self.agent_home.glob(f".claude/projects/*/{session_id}.jsonl"))


Factory = Callable[..., AgentProcess]


@pytest.fixture
def milestone(git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Milestone:
    # Each agent's private HOME gets a copy of the user's `~/.claude.json` and a bind of the
    # CLI's login: the test's own user, never the real one.
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    make_project(git_repo)
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "chore: anima init")
    paths = ProjectPaths(git_repo)
    GitRepo.open(git_repo).add_worktree(paths.worktree("m1"), "milestone/m1", "main")
    return Milestone(paths, paths.worktree("m1"), run_git(git_repo, "rev-parse", "main"))


@pytest.fixture
def events() -> list[Event]:
    return []


@pytest.fixture
def make_confined(real_claude_bin: str, real_env: dict[str, str], milestone: Milestone,
                  events: list[Event]) -> Iterator[Factory]:
    """The Developer of m1 as the engine makes it: its own sandbox (made again for each
    process, as the engine does), its worktree as its cwd; `cli` names the CLI otherwise."""
    bus = EventBus()
    bus.subscribe(events.append)
    made: list[AgentProcess] = []

    def make(*, session_id: str | None = None, resume: bool = False,
             cli: str = real_claude_bin) -> AgentProcess:
        binary = find_claude(cli)
        confinement = MilestoneSandbox(milestone.paths, "m1", active=True,
                                       common_dir=milestone.paths.root / ".git",
                                       visible=binary.install_paths())
        agent = AgentProcess(DEVELOPER, binary, profile_for(DEVELOPER, Config()),
                             milestone.worktree, bus, session_id=session_id or str(uuid.uuid4()),
                             resume=resume, turn_timeout=60.0, idle_timeout=30.0, env=real_env,
                             confine=confinement.confine(DEVELOPER, CLAUDE.prepare_home),
                             dialect=CLAUDE)
        made.append(agent)
        agent.start()
        return agent

    yield make
    for agent in made:
        agent.stop(grace=3.0)


def bash(command: str) -> dict[str, object]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "run"}}}


def tool_results(events: list[Event]) -> list[ToolResult]:
    return [e for e in events if isinstance(e, ToolResult)]


def test_the_confined_cli_commits_on_its_branch_and_resumes_its_session(
        make_confined: Factory, api_stub: ApiStub, milestone: Milestone,
        real_env: dict[str, str], events: list[Event]) -> None:
    commit = ('printf "x\\n" > feature.txt && git add feature.txt && '
              'git commit -q -m "feat: committed inside the sandbox" && git rev-parse HEAD')
    api_stub.push(bash(commit), "Committed. The word is BANANA.")
    agent = make_confined()
    result = agent.send("Commit a feature and remember the word BANANA")
    assert result.text == "Committed. The word is BANANA." and not result.is_error
    (committed,) = tool_results(events)
    assert not committed.is_error, committed.content
    head = run_git(milestone.root, "rev-parse", "milestone/m1")
    assert committed.content.strip() == head
    # Its objects went to its own store; Anima takes them in after the turn.
    assert take_objects(milestone.paths.agent_objects("m1"), milestone.root / ".git") == []
    assert run_git(milestone.root, "log", "-1", "--format=%s", "milestone/m1") == \
        "feat: committed inside the sandbox"
    assert run_git(milestone.root, "rev-parse", f"{head}~1") == milestone.main
    assert (milestone.worktree / "feature.txt").read_text() == "x\n"
    assert run_git(milestone.root, "rev-parse", "main") == milestone.main
    # The CLI kept its session in the sandbox's private HOME, not in the one it was given.
    assert milestone.session_files(agent.session_id)
    assert not list(Path(real_env["HOME"]).glob(f"**/{agent.session_id}.jsonl"))

    time.sleep(1.0)  # the CLI writes its session file shortly after the result
    assert agent.pid is not None
    os.killpg(agent.pid, signal.SIGKILL)  # a crash: the engine starts a new, resumed one
    config = milestone.paths.config.read_bytes()
    api_stub.push(bash(f"printf '{{}}' > {milestone.paths.config}; echo wrote"),
                  "The word was BANANA.")
    resumed = make_confined(session_id=agent.session_id, resume=True)
    again = resumed.send("Which word? Then reset the project's config.")
    assert again.text == "The word was BANANA." and not again.is_error
    assert again.session_id == agent.session_id
    last = api_stub.agent_requests()[-1]
    for earlier in ("Commit a feature and remember the word BANANA",
                    "Committed. The word is BANANA.", head):
        assert earlier in all_text(last)
    refused = tool_results(events)[-1]
    assert f"{milestone.paths.config}: {READ_ONLY}" in refused.content
    assert milestone.paths.config.read_bytes() == config


def test_writes_outside_the_worktree_fail_and_change_nothing(
        make_confined: Factory, api_stub: ApiStub, milestone: Milestone,
        events: list[Event]) -> None:
    root, config = milestone.root, milestone.paths.config
    before = {path: path.read_bytes() for path in (root / "README.md", config)}
    outside = [root / "README.md", config, root / "planted.txt",
               milestone.paths.milestones / "planted.md"]
    command = "; ".join([*(f"printf 'agent was here\\n' > {p}" for p in outside),
                         f"git -C {root} update-ref refs/heads/main HEAD",
                         "printf 'inside\\n' > inside.txt", "echo finished"])
    api_stub.push(bash(command), "Done.")
    agent = make_confined()
    assert agent.send("Write everywhere").text == "Done."
    (result,) = tool_results(events)
    for path in outside:
        assert f"{path}: {READ_ONLY}" in result.content, result.content
    assert f"{root}/.git/refs/heads/main.lock': {READ_ONLY}" in result.content
    assert result.content.rstrip().endswith("finished")
    assert (milestone.worktree / "inside.txt").read_text() == "inside\n"  # it did run
    assert {path: path.read_bytes() for path in before} == before
    assert not (root / "planted.txt").exists()
    assert not (milestone.paths.milestones / "planted.md").exists()
    assert run_git(root, "rev-parse", "main") == milestone.main


def test_what_the_confined_cli_left_running_is_held_between_its_turns(
        make_confined: Factory, api_stub: ApiStub, milestone: Milestone) -> None:
    """The real CLI's Bash tools and what they leave in the background are held between the
    agent's turns, the CLI itself is not (it answers the next turn in the same session)."""
    ticks = milestone.worktree / "ticks.txt"
    job = f"(while :; do echo . >> {ticks}; sleep 0.02; done) > /dev/null 2>&1 & echo started"
    api_stub.push(bash(job), "Started.")
    agent = make_confined()
    assert agent.send("Start the ticker").text == "Started."
    held = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size == held
    api_stub.push(bash("sleep 0.5; echo waited"), "Waited.")
    assert agent.send("Wait a little").text == "Waited."
    assert ticks.stat().st_size > held


def test_a_cli_whose_folder_is_linked_under_tmp_answers_confined(
        make_confined: Factory, api_stub: ApiStub, real_claude_bin: str, tmp_path: Path,
        events: list[Event]) -> None:
    """The CLI's install folder reached through a symlink under /tmp, outside the project:
    the private /tmp covers the link, and every confined turn failed with "execvp
    …/node_modules/.bin/claude: No such file or directory"."""
    cli = Path(real_claude_bin)
    (tmp_path / "linked-cli").symlink_to(cli.parent)
    api_stub.push(bash("echo ran inside"), "Ran.")
    agent = make_confined(cli=str(tmp_path / "linked-cli" / cli.name))
    result = agent.send("Run it")
    assert result.text == "Ran." and not result.is_error
    assert tool_results(events)[0].content.strip() == "ran inside"


class OutsideWriter(ScriptedModel):
    """A Developer that first has the CLI's Write tool write `written` in the human's
    checkout, then a command also write `target` there (the sandbox refuses both; the command
    goes on and commits), and an Acceptor that accepts."""

    def __init__(self, target: Path, written: Path) -> None:
        self.target = target
        self.written = written

    def developer(self, request: dict[str, Any]) -> Reply:
        reply = super().developer(request)
        if reply.tool_uses:
            name, tool_input = reply.tool_uses[0]
            command = f"echo planted > {self.target}; {tool_input['command']}"
            reply.tool_uses = [("Write", {"file_path": str(self.written), "content": "x\n"}),
                               (name, {**tool_input, "command": command})]
        return reply

    def acceptor(self, request: dict[str, Any]) -> Reply:
        return Reply(text="ACCEPTED")


def test_a_write_the_sandbox_refused_is_in_the_rounds_notes(
        real_claude_bin: str, real_env: dict[str, str], git_repo: Path) -> None:
    """The model alone read the "Read-only file system" of a write outside the worktree (the
    command still succeeded, so nothing showed it): the round's notes and the log say it, for
    the CLI's Write tool (node's "EROFS: …") as for a command."""
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                 config={"agent_timeout_seconds": 90, "sandbox": "required",
                         "summarizer": {"enabled": False}})
    planted, written = git_repo / "planted.txt", git_repo / "written.txt"
    run_headless(git_repo, OutsideWriter(planted, written), real_claude_bin, real_env)
    assert not planted.exists() and not written.exists()
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    notes = rec.iterations[0].notes
    assert [n for n in notes if "refused a write" in n] == [
        n for n in notes if n.startswith("developer: the sandbox refused a write: ")]
    assert any(f"{planted}: {READ_ONLY}" in n for n in notes), notes
    assert any(f"EROFS: read-only file system, open '{written}" in n for n in notes), notes
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    assert all(n in log for n in notes)
