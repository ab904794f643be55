"""No pushes behind the human's back: the tool rules refuse `git push`, a push that slips
past them pauses the milestone, and `allow_push` lifts both — with a real bare `origin`."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima.agents.claude.profiles import DEVELOPER, PUSH_RULES, profile_for
from anima.agents.claude.protocol import build_argv
from anima.config import Config
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine

ONE = milestone_md("Greeter", ["Greet command"])


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


def test_a_push_that_slips_past_the_rules_pauses_the_milestone(
        git_repo: Path, origin: Path, fake_claude: FakeClaude) -> None:
    make_project(git_repo, {"m1": ONE})
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


def test_allow_push_lets_the_developer_push(git_repo: Path, origin: Path,
                                           fake_claude: FakeClaude) -> None:
    make_project(git_repo, {"m1": ONE}, config={"allow_push": True})
    fake_claude.write_script({"developer": [{
        "shell": ["git push -q origin HEAD:refs/heads/shared"], "auto": True}]})
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert "refs/heads/shared" in refs(origin)
    assert not any("push" in n for it in rec.iterations for n in it.notes)
    argv = fake_claude.entries("developer")[0]["argv"]
    assert not any("git push" in a for a in argv)
