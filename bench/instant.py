"""Instant in-process agents for the loop benchmarks: they do the agents' git work at once,
so what remains of a round's time is Anima's own (git checks, prompts, persistence)."""

from __future__ import annotations

import atexit
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anima.agents.claude.backend import CLAUDE  # noqa: E402
from anima.config import Config  # noqa: E402
from anima.engine.project import init_project  # noqa: E402
from anima.events import ROLES, EventBus, TurnResult  # noqa: E402
from anima.git import GitRepo  # noqa: E402
from anima.loop.run import MilestoneRun  # noqa: E402
from anima.loop.seats import RunControl  # noqa: E402
from anima.paths import ProjectPaths  # noqa: E402
from anima.store.store import Store  # noqa: E402
from anima.text.prompts import PromptBuilder  # noqa: E402
from anima.text.summarizer import Summarizer  # noqa: E402

UNCHECKED = re.compile(r"^\s*-?\s*\[( |/|!)\]\s+(F\d+)\b", re.MULTILINE)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclass
class Clock:
    """Time spent inside the agents' turns, to subtract from the rounds."""

    agent_seconds: float = 0.0
    prompts: list[str] = field(default_factory=list)


class InstantAgent:
    went_on = False
    held_still = True

    def __init__(self, role: str, repo: Path, clock: Clock, session_id: str) -> None:
        self.role, self.repo, self.clock, self.session_id = role, repo, clock, session_id

    def send(self, prompt: str, waiting: object = None) -> TurnResult:
        started = time.perf_counter()
        text = self._developer(prompt) if self.role == "developer" else "ACCEPTED"
        self.clock.agent_seconds += time.perf_counter() - started
        return TurnResult(role=self.role, text=text, is_error=False, session_id=self.session_id,
                          usage={"input_tokens": len(prompt) // 4, "output_tokens": 200})

    def _developer(self, prompt: str) -> str:
        self.clock.prompts.append(prompt)
        found = UNCHECKED.search(prompt)
        if found is None:
            return "## ALL_FEATURES_COMPLETE\n\n### Commits\n\n### Summary\nDone."
        feature = found.group(2)
        (self.repo / "features").mkdir(exist_ok=True)
        (self.repo / "features" / f"{feature}.txt").write_text(f"{feature}\n")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-qm", f"feat: {feature}")
        head = git(self.repo, "rev-parse", "HEAD")
        return (f"## Implementation Report — Round 1\n\n**Feature**: {feature} — implemented "
                f"with tests and docs\n**Commit**: {head}\n**Tests**: 12 passed, 0 failed\n"
                f"**Lint**: clean\n\n### Changes\n- features/{feature}.txt: the feature\n"
                f"- tests/test_{feature}.py: its tests\n\n### Notes\nNothing surprising.\n")

    def take_unclaimed(self) -> list[TurnResult]:
        return []  # every turn answers

    def stop(self) -> None:
        pass


def milestone(features: int) -> str:
    lines = ["# Benchmark milestone", "", "## Goal", "", "Measure Anima itself.", "",
             "## Features", ""]
    for i in range(1, features + 1):
        lines += [f"### Feature number {i}", "", f"Implement feature {i} with its tests.",
                  f"Acceptance: feature {i} works; its tests pass", ""]
    lines += ["## Acceptance Criteria", "", "- [ ] every feature works", "- [ ] lint is clean"]
    return "\n".join(lines) + "\n"


def new_project(repo: Path) -> ProjectPaths:
    """A new git repo at `repo` (one commit on main) under `anima init`, without the example
    milestone."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Bench")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / "README.md").write_text("# bench\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "chore: start")
    init_project(repo)
    paths = ProjectPaths(repo)
    return paths


def run_milestone(features: int, *, on_event=None) -> tuple[MilestoneRun, Clock, Path]:
    """A real temp repo, the real scheduler, store and git checks; instant agents."""
    repo = Path(tempfile.mkdtemp(prefix="anima-bench-")) / "repo"
    atexit.register(shutil.rmtree, repo.parent, ignore_errors=True)  # (callers read it till then)
    paths = new_project(repo)
    paths.milestone_md("bench").write_text(milestone(features))
    config = Config(max_iterations_per_milestone=features + 5)
    config.summarizer.enabled = False
    store = Store(paths)
    record = store.scan(max_iterations=config.max_iterations_per_milestone,
                        requires_human_review=False).records[0]
    bus = EventBus()
    if on_event is not None:
        bus.subscribe(on_event)
    clock = Clock()
    # The agents work in the milestone's own worktree, which the run makes when it starts.
    worktree = paths.worktree(record.id)
    run = MilestoneRun(
        record=record, store=store, repo=GitRepo.open(repo), config=config,
        prompts=PromptBuilder(paths, budget_tokens=config.context_budget_tokens,
                              recent_in_full=config.recent_rounds_in_full),
        agents=lambda role, sid, resume: InstantAgent(role, worktree, clock, sid),
        bus=bus, summarizer=Summarizer(config.summarizer, env={}), control=RunControl(),
        dialects={role: CLAUDE for role in ROLES})
    return run, clock, repo
