"""The whole loop with the real `claude` CLI: `anima run --headless` on a 2-feature milestone,
the model scripted by the local Messages API stub (it makes the CLI really run git)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import run_git
from tests.fakes.api_stub import (
    ApiStub,
    Reply,
    is_tool_result,
    message_text,
    system_text,
    user_prompts,
)
from tests.fakes.pair_model import ALL_DONE, HASH, UNCHECKED, report
from tests.helpers import make_project, milestone_md, record

pytestmark = [pytest.mark.real_claude, pytest.mark.timeout(240)]

class ScriptedModel:
    """Plays both roles like a diligent but imperfect pair: the first review is a rejection."""

    def __call__(self, request: dict[str, Any]) -> Reply:
        if "You are the Acceptor agent" in system_text(request):
            return self.acceptor(request)
        return self.developer(request)

    def developer(self, request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        prompt = user_prompts(request)[-1]
        found = UNCHECKED.search(prompt)
        if is_tool_result(messages[-1]):
            commit = HASH.findall(message_text(messages[-1]))[-1]
            feature = found.group(2) if found else "F1"
            return Reply(text=report(feature, commit))
        if found is None:
            return Reply(text=ALL_DONE)
        feature = found.group(2)
        fix = "REJECTED" in prompt
        name = f"features/{feature}{'-test' if fix else ''}.txt"
        command = (f"mkdir -p features && echo {feature} > {name} && git add -A && "
                   f"git commit -q -m 'feat: {feature}{' tests' if fix else ''}' && "
                   "git rev-parse HEAD")
        return Reply(tool_uses=[("Bash", {"command": command, "description": "commit"})])

    def acceptor(self, request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        prompts = user_prompts(request)
        if not is_tool_result(messages[-1]):
            return Reply(tool_uses=[("Bash", {"command": "git show --stat HEAD",
                                              "description": "inspect"})])
        reviews = [p for p in prompts if "Review round" in p]
        if "final acceptance" not in prompts[-1] and len(reviews) == 1:
            return Reply(text="REJECTED: F1 has no test file")
        return Reply(text="ACCEPTED")


def run_headless(project: Path, model: ScriptedModel, claude: str,
                 real_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`anima run --headless` to the end with the real CLI, `model` answering its requests."""
    with ApiStub(default=model) as stub:
        env = {**os.environ, **real_env, "ANTHROPIC_BASE_URL": stub.url,
               "ANIMA_CLAUDE_COMMAND": claude}
        env.pop("CLAUDECODE", None)
        result = subprocess.run([sys.executable, "-m", "anima", "run", str(project),
                                 "--headless"], env=env, capture_output=True, text=True,
                                timeout=220, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_anima_run_headless_with_the_real_cli(real_claude_bin: str, real_env: dict[str, str],
                                              git_repo: Path, tmp_path: Path) -> None:
    make_project(git_repo, {"greeter": milestone_md("Greeter", ["Greet", "Version"])},
                 config={"agent_timeout_seconds": 90})
    result = run_headless(git_repo, ScriptedModel(), real_claude_bin, real_env)
    rec = record(git_repo, "greeter")
    assert rec.status is MilestoneStatus.COMPLETED
    verdicts = [(i.kind.value, i.feature, i.verdict) for i in rec.iterations]
    assert verdicts[0] == ("feature", "F1", Verdict.REJECTED)
    assert rec.iterations[0].reason == "F1 has no test file"
    assert ("fix", "F1", Verdict.ACCEPTED) in verdicts
    assert verdicts[-1] == ("final", None, Verdict.ACCEPTED)
    assert rec.sessions.developer and rec.sessions.acceptor
    log = run_git(git_repo, "log", "--format=%s", "main")
    assert "feat: F1 tests" in log and "feat: F2" in log
    assert "[developer]" in result.stdout and "[acceptor] ▸ Bash: git show" in result.stdout


class ParallelModel(ScriptedModel):
    """Each milestone's Developer writes in a folder named for its branch (no conflict), and
    every review accepts."""

    def developer(self, request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        prompt = user_prompts(request)[-1]
        found = UNCHECKED.search(prompt)
        if is_tool_result(messages[-1]) or found is None:
            return super().developer(request)
        branch = re.search(r"milestone/([a-z0-9_-]+)", "\n".join(user_prompts(request)))
        folder = branch.group(1) if branch else "unknown"
        feature = found.group(2)
        command = (f"mkdir -p {folder} && echo {feature} > {folder}/{feature}.txt && "
                   f"git add -A && git commit -q -m 'feat({folder}): {feature}' && "
                   "git rev-parse HEAD")
        return Reply(tool_uses=[("Bash", {"command": command, "description": "commit"})])

    def acceptor(self, request: dict[str, Any]) -> Reply:
        if not is_tool_result(request["messages"][-1]):
            return super().acceptor(request)
        return Reply(text="ACCEPTED")


def test_two_confined_milestones_run_side_by_side_and_both_merge(
        newest_claude_bin: str, real_env: dict[str, str], git_repo: Path) -> None:
    """Several at once with the real CLI: each pair in its own worktree and sandbox, both
    finally accepted and merged into main one after the other; the human's checkout stays
    on main throughout."""
    make_project(git_repo, {"north": milestone_md("North", ["One", "Two"]),
                            "south": milestone_md("South", ["One", "Two"])},
                 config={"agent_timeout_seconds": 90, "sandbox": "required"})
    result = run_headless(git_repo, ParallelModel(), newest_claude_bin, real_env)
    for name in ("north", "south"):
        rec = record(git_repo, name)
        assert rec.status is MilestoneStatus.COMPLETED, (name, rec.pause_reason)
        assert rec.merge is not None and rec.merge.merged
        assert (git_repo / name / "F2.txt").read_text(encoding="utf-8").strip() == "F2"
    assert "[north] " in result.stdout and "[south] " in result.stdout  # both ran at once
    assert run_git(git_repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert run_git(git_repo, "worktree", "list", "--porcelain").count("worktree ") == 1
