"""No pushes behind the human's back: the tool rules refuse `git push`, a push that slips
past them pauses the milestone, and `allow_push` lifts both — with a real bare `origin`.

The sandbox refuses a push to a remote on this machine (its folder is read-only inside); one
over the network it cannot refuse, only the detection catches it. To stand for such a remote
the tests make `origin` writable to the agents (`as_network_remote`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from anima.agents.claude.profiles import PUSH_RULES, profile_for
from anima.agents.claude.protocol import build_argv
from anima.config import Config
from anima.events import DEVELOPER
from anima.loop.confinement import WRITABLE_VAR, sandbox_problem
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine

ONE = milestone_md("Greeter", ["Greet command"])
NO_BWRAP = sandbox_problem("auto")
needs_sandbox = pytest.mark.skipif(NO_BWRAP is not None,
                                   reason=f"the sandbox cannot run here: {NO_BWRAP}")
SANDBOXES = [pytest.param("auto", marks=needs_sandbox), "off"]


@pytest.fixture
def origin(git_repo: Path, tmp_path: Path, fake_claude: FakeClaude,
           monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bare repository on this machine as the project's `origin`, main pushed to it."""
    fake_claude.use_env(monkeypatch)
    bare = tmp_path / "origin.git"
    run_git(tmp_path, "init", "-q", "--bare", str(bare))
    run_git(git_repo, "remote", "add", "origin", str(bare))
    run_git(git_repo, "push", "-q", "origin", "main")
    return bare


def as_network_remote(origin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Let confined agents write `origin`, as they can reach a remote over the network."""
    monkeypatch.setenv(WRITABLE_VAR, os.pathsep.join(
        [p for p in (os.environ.get(WRITABLE_VAR, ""), str(origin)) if p]))


def refs(bare: Path) -> str:
    return run_git(bare, "for-each-ref", "--format=%(refname) %(objectname)")


def test_the_developer_argv_blocks_push_unless_allowed() -> None:
    def disallowed(config: Config) -> str:
        argv = build_argv(["claude"], profile_for(DEVELOPER, config).config, session_id="s",
                          resume=False, system_prompt="p")
        return argv[argv.index("--disallowedTools") + 1] if "--disallowedTools" in argv else ""
    assert PUSH_RULES[0] == "Bash(git push:*)" and PUSH_RULES[0] in disallowed(Config())
    mine = Config.model_validate({"developer": {"disallowed_tools": ["WebFetch"]}})
    assert disallowed(mine) == "WebFetch Bash(git push:*)"  # added to the user's own rules
    assert "git push" not in disallowed(Config(allow_push=True))


def test_git_push_is_refused_and_the_refusal_is_in_the_round_notes(
        git_repo: Path, origin: Path, fake_claude: FakeClaude) -> None:
    make_project(git_repo, {"m1": ONE})
    before = refs(origin)
    fake_claude.write_script({"developer": [{
        "shell": ["git push -q origin HEAD", "cd . && git push --force origin HEAD:main"],
        "auto": True}]})
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert refs(origin) == before
    notes = "\n".join(rec.iterations[0].notes)
    assert "tool rules refused" in notes
    assert "Bash: git push -q origin HEAD" in notes and "git push --force origin HEAD:main" in notes
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text()
    assert "refused: Bash: git push -q origin HEAD" in log


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_push_that_slips_past_the_rules_pauses_the_milestone(
        git_repo: Path, origin: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        sandbox: str) -> None:
    as_network_remote(origin, monkeypatch)
    make_project(git_repo, {"m1": ONE}, config={"sandbox": sandbox})
    fake_claude.write_script({"developer": [{
        "shell": ["sh -c 'git push -q origin HEAD:refs/heads/sneaky'"], "auto": True}]})
    _, outcome = run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert outcome.paused == ("m1",) and rec.status is MilestoneStatus.PAUSED
    assert "refs/heads/sneaky" in refs(origin)  # it happened; Anima says so and stops
    reason = rec.pause_reason or ""
    assert "the developer pushed although pushing is not allowed" in reason
    assert "origin:refs/heads/sneaky: none →" in reason
    assert reason.split(": ", 1)[1] in "\n".join(rec.iterations[0].notes)
    assert rec.rounds == 1  # paused before another round


@needs_sandbox
def test_in_the_sandbox_a_push_to_a_remote_on_this_machine_fails(
        git_repo: Path, origin: Path, fake_claude: FakeClaude) -> None:
    """The same push, confined, with `origin` a folder on this machine: out of the agent's
    reach (read-only, here even hidden under the sandbox's own /tmp), so nothing reaches it
    and there is nothing to pause for."""
    make_project(git_repo, {"m1": ONE}, config={"sandbox": "required"})
    before = refs(origin)
    fake_claude.write_script({"developer": [{
        "shell": ["sh -c 'git push -q origin HEAD:refs/heads/sneaky'"], "auto": True}]})
    _, outcome = run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert outcome.paused == () and rec.status is MilestoneStatus.COMPLETED
    assert refs(origin) == before
    # The push ran (no rule refused it) and failed: the remote is out of the agent's reach.
    events = [json.loads(line) for line in
              (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
              .splitlines()]
    push = next(e["tool_use_id"] for e in events if e["type"] == "ToolUse"
                and "git push" in e["input"].get("command", ""))
    result = next(e for e in events if e["type"] == "ToolResult" and e["tool_use_id"] == push)
    assert result["is_error"] and "fatal:" in result["content"]
    assert not any("push" in n for it in rec.iterations for n in it.notes)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_allow_push_lets_the_developer_push(git_repo: Path, origin: Path,
                                           fake_claude: FakeClaude,
                                           monkeypatch: pytest.MonkeyPatch,
                                           sandbox: str) -> None:
    as_network_remote(origin, monkeypatch)
    make_project(git_repo, {"m1": ONE}, config={"allow_push": True, "sandbox": sandbox})
    fake_claude.write_script({"developer": [{
        "shell": ["git push -q origin HEAD:refs/heads/shared"], "auto": True}]})
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert "refs/heads/shared" in refs(origin)
    assert not any("push" in n for it in rec.iterations for n in it.notes)
    argv = fake_claude.entries("developer")[0]["argv"]
    assert not any("git push" in a for a in argv)
