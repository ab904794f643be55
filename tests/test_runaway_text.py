"""An agent's runaway or terminal-garbling reply (megabytes, ESC codes, NUL, progress lines
with carriage returns) reaches neither the user's terminal nor the record raw: the headless
output, the log, the record and the pause line stay readable and bounded."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine
from tests.test_recovery import run_to_end

ONE = milestone_md("Greeter", ["Greet command"], ["greet prints hello"])
ESC_TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title
REASON = ("REJECTED: \x1b[31mthe tests fail\x1b[0m\x00" + ESC_TITLE
          + "\nprogress 10%\rprogress 99%\n" + "x" * 1_000_000)


def test_a_runaway_rejection_is_clean_and_bounded_everywhere(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    make_project(git_repo, {"m1": ONE}, config={"max_consecutive_rejections": 1})
    fake_claude.write_script({"acceptor": [{"text": REASON}]})
    runner = run_to_end(git_repo, fake_claude)
    assert runner.proc.returncode == 3, runner.stderr[-2000:]  # 3: a milestone paused
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.PAUSED
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert first.reason.startswith("the tests fail\nprogress 99%\nxxx")
    assert len(first.reason) > 1_000_000  # the record keeps it whole, without the controls
    assert rec.pause_reason is not None and len(rec.pause_reason) < 600
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    for shown in (runner.stdout, log, first.reason, rec.pause_reason):
        assert not any(c in shown for c in "\x1b\x00\x07\r"), repr(shown[:300])
    assert len(log) < 200_000 and len(runner.stdout) < 400_000


def test_a_tool_cannot_flood_its_cli_output(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that writes 400 MB without a newline into its CLI's own output
    (`/proc/<cli>/fd/1`) cannot open it (a socket), so nothing of it reaches Anima; the run
    goes on. (A line the CLI itself makes too long is dropped by the framer, its size said.)"""
    fake_claude.use_env(monkeypatch)
    project = make_project(git_repo, {"m1": ONE})
    flood = ("( head -c 400000000 /dev/zero > /proc/$PPID/fd/1 ) 2> flood.err; "
             "echo done > flood.txt")
    fake_claude.write_script({"developer": [{"shell": [flood], "auto": True}]})
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run_engine(project)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mb < 256, f"Anima's memory grew by {grown_mb:.0f} MB"
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert "flood.txt" in run_git(project, "ls-tree", "--name-only", "main").split()
    assert "No such device or address" in run_git(project, "show", "main:flood.err")
