"""Small builders shared by the engine-level tests (no fakes of our own code here)."""

from __future__ import annotations

import json
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
