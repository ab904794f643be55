"""`notify_command` gets each notice as JSON on stdin, so users can forward it anywhere."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, run_engine


def test_notify_command_gets_the_completion_as_json(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    fake_claude.use_env(monkeypatch)
    out = tmp_path / "notices.jsonl"
    script = tmp_path / "forward.py"
    script.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n"
                      "    f.write(sys.stdin.read() + '\\n')\n")
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                 {"notify_command": f"{sys.executable} {script} {out}"})
    run_engine(git_repo, summarizer={"enabled": False})
    (notice,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert notice["event"] == "completed" and notice["milestone"] == "m1"
    assert notice["message"] == "Greeter is completed"
    assert notice["project"] == str(git_repo.resolve()) and notice["at"]


def test_a_failing_notify_command_is_logged_not_raised(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                 {"notify_command": "echo no webhook >&2; exit 7"})
    run_engine(git_repo, summarizer={"enabled": False})
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text()
    assert "notify_command failed: exited 7: no webhook" in log
