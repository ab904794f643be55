"""Small builders shared by the engine-level tests (no fakes of our own code here)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anima.engine.facade import Engine
from anima.engine.project import init_project
from anima.paths import ProjectPaths
from anima.store.models import MilestoneRecord
from anima.store.store import Store


def milestone_md(title: str, features: list[str], criteria: list[str] | None = None) -> str:
    body = [f"# {title}", "", "## Goal", "", f"Deliver {title}.", "", "## Features", ""]
    for i, feature in enumerate(features, 1):
        body += [f"### {feature}", "", f"Implement {feature}.", "",
                 f"Acceptance: {feature} works; test {i} passes", ""]
    body += ["## Acceptance Criteria", ""]
    body += [f"- [ ] {c}" for c in (criteria or ["everything works"])]
    return "\n".join(body) + "\n"


def make_project(repo: Path, milestones: dict[str, str] | None = None,
                 config: dict[str, Any] | None = None) -> Path:
    """`anima init` a repo, add milestones, write config overrides."""
    init_project(repo)
    paths = ProjectPaths(repo)
    for name, text in (milestones or {}).items():
        paths.milestone_md(name).write_text(text, encoding="utf-8")
    if config:
        data = json.loads(paths.config.read_text(encoding="utf-8"))
        data.update(config)
        paths.config.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return repo


def record(repo: Path, milestone_id: str) -> MilestoneRecord:
    return Store(ProjectPaths(repo)).load_record(milestone_id)


def state(repo: Path) -> dict[str, Any]:
    return json.loads((repo / ".anima" / "state.json").read_text(encoding="utf-8"))


def run_engine(repo: Path, **overrides: Any) -> tuple[Engine, Any]:
    engine = Engine(repo, config_overrides=overrides or None)
    try:
        outcome = engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    return engine, outcome


def hold(markers: Path) -> str:
    """A shell command that ends an agent's tool calls by waiting for `engine_held`'s block
    to end (the turn is still running meanwhile)."""
    return f"touch {markers / 'held'}; while [ ! -e {markers / 'go'} ]; do sleep 0.05; done"


@contextlib.contextmanager
def engine_held(repo: Path, markers: Path, timeout: float = 30) -> Iterator[Engine]:
    """The real engine running on a thread, for the block, from the moment a turn reached
    `hold(markers)`; the turn then goes on, and the run ends."""
    engine = Engine(repo)
    runner = threading.Thread(target=engine.run, kwargs={"watch": False, "start_all": True})
    runner.start()
    try:
        deadline = time.monotonic() + timeout
        while not (markers / "held").exists():
            assert time.monotonic() < deadline, "no turn reached the hold"
            time.sleep(0.05)
        yield engine
    finally:
        (markers / "go").touch()
        runner.join(60)
        engine.shutdown()


def ignored_dotenv(repo: Path, content: str) -> None:
    """A `.env` the repository ignores and `.worktreeinclude` lists, as projects keep one."""
    (repo / ".gitignore").write_text(".env\n", encoding="utf-8")
    (repo / ".worktreeinclude").write_text(".env\n", encoding="utf-8")
    for args in (["add", ".gitignore", ".worktreeinclude"], ["commit", "-qm", "chore: .env"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    (repo / ".env").write_text(content, encoding="utf-8")


def setuid_like_bwrap(folder: Path) -> Path:
    """A bubblewrap that, like a set-uid build, cannot start once no_new_privs is set (which
    Landlock needs)."""
    path = folder / "setuid-bwrap"
    path.write_text("#!/bin/sh\n"
                    "if grep -q 'NoNewPrivs:[[:space:]]*1' /proc/self/status; then\n"
                    "  echo 'bwrap: Creating new namespace failed: Operation not permitted' >&2\n"
                    "  exit 1\nfi\n"
                    f"exec {shutil.which('bwrap')} \"$@\"\n", encoding="utf-8")
    path.chmod(0o755)
    return path
