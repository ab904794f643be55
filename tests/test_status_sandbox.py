"""`anima status` says whether agents are confined: one plain line, and a top-level `"sandbox"`
key in `--json` beside the existing ones, from the project's config `sandbox` and whether
bubblewrap can make a sandbox here (`ANIMA_BWRAP` pointed at a missing binary says it
cannot). Through the real entry point, in a subprocess, as users' scripts call it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anima import landlock, sandbox
from tests.helpers import milestone_md, setuid_like_bwrap
from tests.test_cli import anima

MISSING = {sandbox.BWRAP_VAR: "/nonexistent/bwrap"}
needs_bwrap = pytest.mark.skipif(sandbox.unavailable() is not None,
                                 reason=f"bubblewrap cannot run here: {sandbox.unavailable()}")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with one milestone; its own status cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    repo.mkdir()
    assert anima("init", "--git-init", str(repo)).returncode == 0
    md = tmp_path / "greeter.md"
    md.write_text(milestone_md("Greeter", ["Greet", "Version"]), encoding="utf-8")
    assert anima("add", str(repo), str(md)).returncode == 0
    return repo


def set_mode(project: Path, mode: str) -> None:
    config = project / ".anima" / "config.json"
    data = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**data, "sandbox": mode}, indent=2), encoding="utf-8")


def status_text(project: Path, env: dict[str, str] | None = None) -> list[str]:
    done = anima("status", str(project), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def status_json(project: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = anima("status", str(project), "--json", env=env)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def agents_line(lines: list[str]) -> str:
    (line,) = [line for line in lines if line.startswith("agents:")]
    return line


@needs_bwrap
def test_confined_agents_are_said_so(project: Path) -> None:
    lines = status_text(project)
    assert lines[0].startswith("state: sleeping")
    assert lines[1] == agents_line(lines) == "agents: confined by bubblewrap (sandbox auto)"
    data = status_json(project)
    assert data["sandbox"] == {"mode": "auto", "confined": True, "problem": None}


def test_without_bubblewrap_auto_says_why_agents_are_not_confined(project: Path) -> None:
    assert agents_line(status_text(project, MISSING)) == (
        f"agents: NOT confined — {sandbox.NOT_INSTALLED}; sandbox is auto")
    data = status_json(project, MISSING)
    assert data["sandbox"] == {"mode": "auto", "confined": False,
                               "problem": sandbox.NOT_INSTALLED}
    # Additive: the keys scripts read are all still there, as they were.
    assert set(data) == {"state", "milestones", "sandbox", "dependencies"}
    assert data["state"]["status"] == "sleeping"
    assert [(m["id"], m["status"]) for m in data["milestones"]] == [("greeter", "pending")]


def test_sandbox_off_is_not_confined_and_no_problem(project: Path) -> None:
    set_mode(project, "off")
    for env in (None, MISSING):  # off never asks bubblewrap
        assert agents_line(status_text(project, env)) == "agents: not confined (sandbox off)"
        assert status_json(project, env)["sandbox"] == {
            "mode": "off", "confined": False, "problem": None}


def test_required_without_bubblewrap_is_reported_not_refused(project: Path) -> None:
    """`anima run` refuses to start; `anima status` still answers, and says so."""
    set_mode(project, "required")
    assert agents_line(status_text(project, MISSING)) == (
        f"agents: NOT confined — {sandbox.NOT_INSTALLED}; sandbox is required, so none will "
        "start")
    assert status_json(project, MISSING)["sandbox"] == {
        "mode": "required", "confined": False, "problem": sandbox.NOT_INSTALLED}


def test_a_poll_from_the_cache_is_never_stale_and_never_loads_pydantic(
        project: Path) -> None:
    """The records come from the status cache on a second poll; whether agents are confined
    is asked again each time (bubblewrap installed or removed between two polls shows), and
    costs neither pydantic nor the loop."""
    probe = ("import sys; from anima.cli import main; code = main(['status', sys.argv[1], "
             "'--json']); print(sorted(m for m in sys.modules if m in ('pydantic', "
             "'anima.loop', 'anima.engine', 'anima.git')), file=sys.stderr); sys.exit(code)")

    def poll(env: dict[str, str]) -> tuple[dict[str, Any], str]:
        done = subprocess.run([sys.executable, "-c", probe, str(project)], capture_output=True,
                              text=True, timeout=60, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr.strip()

    first, loaded = poll(MISSING)
    assert first["sandbox"]["confined"] is False and loaded == "['pydantic']"
    second, loaded = poll({sandbox.BWRAP_VAR: sys.executable})  # exists, is no bubblewrap
    assert loaded == "[]"
    assert second["milestones"] == first["milestones"]
    assert second["sandbox"]["mode"] == "auto" and second["sandbox"]["confined"] is False
    assert second["sandbox"]["problem"].startswith("bubblewrap cannot create a sandbox here")
    if sandbox.unavailable() is None:
        third, loaded = poll({})
        assert loaded == "[]" and third["sandbox"] == {
            "mode": "auto", "confined": True, "problem": None}


@needs_bwrap
@pytest.mark.skipif(landlock.unavailable() is not None, reason=str(landlock.unavailable()))
def test_agents_confined_without_landlock_are_said_to_reach_sockets_outside(
        project: Path, tmp_path: Path) -> None:
    env = {sandbox.BWRAP_VAR: str(setuid_like_bwrap(tmp_path))}
    line = agents_line(status_text(project, env))
    assert line.startswith("agents: confined by bubblewrap (sandbox auto); abstract Unix "
                           "sockets outside the sandbox"), line
    assert "bubblewrap does not start under Landlock here" in line
    assert status_json(project, env)["sandbox"] == {
        "mode": "auto", "confined": True, "problem": None}
