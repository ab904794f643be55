"""`notify_command` gets each notice as JSON on stdin, so users can forward it anywhere."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from anima.cli import main as cli
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record, run_engine


def forwarder(tmp_path: Path) -> tuple[str, Path]:
    """A `notify_command` that appends each notice's JSON to a file: (command, file)."""
    out = tmp_path / "notices.jsonl"
    script = tmp_path / "forward.py"
    script.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n"
                      "    f.write(sys.stdin.read() + '\\n')\n")
    return f"{sys.executable} {script} {out}", out


def notices(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_notify_command_gets_the_completion_as_json(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    fake_claude.use_env(monkeypatch)
    command, out = forwarder(tmp_path)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                 {"notify_command": command})
    run_engine(git_repo, summarizer={"enabled": False})
    (notice,) = notices(out)
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


def test_approving_from_the_command_line_notifies_like_the_window(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`anima approve` completes and merges the milestone: `notify_command` hears of it,
    as it does when the window's Approve or a headless run completes one."""
    fake_claude.use_env(monkeypatch)
    command, out = forwarder(tmp_path)
    make_project(git_repo, {"m1": "---\nrequires_human_review: true\n---\n"
                            + milestone_md("Greeter", ["Greet"])}, {"notify_command": command})
    run_engine(git_repo, summarizer={"enabled": False})
    assert [n["event"] for n in notices(out)] == ["awaiting_review"]
    assert cli(["approve", str(git_repo), "m1"]) == 0
    assert record(git_repo, "m1").status.value == "completed"
    completed = notices(out)[-1]
    assert completed["event"] == "completed" and completed["milestone"] == "m1"
    assert completed["message"].startswith("Greeter is completed")
    assert "approved m1: completed" in capsys.readouterr().out


def test_a_timed_out_notify_command_is_stopped_with_what_it_started(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A notify command that outlives its time is stopped with every process it started
    (a child it left in the background would otherwise run for ever), and the log says so."""
    fake_claude.use_env(monkeypatch)
    monkeypatch.setattr("anima.notify.NOTIFY_TIMEOUT_SECONDS", 1.0)
    pid_file = tmp_path / "child.pid"
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet"])},
                 {"notify_command": f"sleep 300 & echo $! > {pid_file}; wait"})
    run_engine(git_repo, summarizer={"enabled": False})
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and \
            Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the notify command's child still runs"
        time.sleep(0.05)
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text()
    assert "notify_command failed: did not finish within 1s; Anima killed it and every " \
        "process it started" in log
