"""The agents share the project's tree: a FIFO or a link to a device where Anima reads a file
would hang it (a FIFO's open waits for a writer) or never end the read (/dev/zero). Each case
here hung Anima for good before; the suite's timeout is what would catch a regression."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record
from tests.test_cli import ANIMA, anima

ONE = milestone_md("Greeter", ["Greet command"], ["greet prints hello"])
ANIMA_COMMAND = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
_MEMORY = 3 * 2**30


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": ONE})


def test_prompt_files_an_agent_made_special_do_not_hang_the_next_prompt(
        project: Path, fake_claude: FakeClaude) -> None:
    """The Developer keeps `.anima/memory/` and may commit VISION.md: the next prompts read
    both."""
    fake_claude.write_script({"developer": [{"shell": [
        "mkdir -p .anima/memory", "rm -f .anima/memory/project.md",
        "mkfifo .anima/memory/project.md", "ln -s /dev/zero VISION.md",
        "git add VISION.md", "git commit -qm 'docs: vision'"], "auto": True}]})
    # In a child with a memory limit: reading /dev/zero to its end must not take the suite.
    done = subprocess.run(
        [*ANIMA_COMMAND, "run", str(project), "--headless"], capture_output=True, text=True,
        timeout=90, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    # The Acceptor's and the final prompts were built with the files left out.
    assert len(fake_claude.prompts("acceptor")) == 2


def test_status_names_a_record_an_agent_replaced_by_a_fifo(git_repo: Path,
                                                          tmp_path: Path) -> None:
    """Users' scripts poll `anima status`: it answers, naming the file, instead of waiting."""
    make_project(git_repo)
    for name in ("m1", "m2"):
        (tmp_path / f"{name}.md").write_text(ONE, encoding="utf-8")
        assert anima("add", str(git_repo), str(tmp_path / f"{name}.md")).returncode == 0
    record_path = git_repo / ".anima" / "milestones" / "m2.json"
    record_path.unlink()
    os.mkfifo(record_path)
    done = anima("status", str(git_repo), "--json", timeout=30)
    assert "m2.json" in done.stdout + done.stderr
    assert "not a regular file" in done.stdout + done.stderr
    assert '"id": "m1"' in done.stdout or '"id":"m1"' in done.stdout


def test_a_milestone_definition_that_is_a_fifo_is_reported_not_read(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    project = make_project(git_repo, {"m1": ONE})
    os.mkfifo(project / ".anima" / "milestones" / "m2.md")
    said = anima("status", str(project), timeout=30)
    assert "m2.md" in said.stdout + said.stderr
    assert "not a regular file" in said.stdout + said.stderr


@pytest.mark.timeout(90)
def test_a_fifo_the_developer_named_gitignore_does_not_hang_the_round(
        project: Path, fake_claude: FakeClaude) -> None:
    """git reads every `.gitignore` in the folders it walks, and a FIFO's open waits for a
    writer: Anima's first `git status` after the turn used to wait for ever, saying nothing."""
    fake_claude.write_script({"developer": [
        {"auto": True},  # (its own `git add -A` would wait too)
        {"shell": ["mkdir -p notes", "mkfifo notes/.gitignore .gitattributes"], "auto": True}]})
    done = subprocess.run([*ANIMA_COMMAND, "run", str(project), "--headless"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert "notes/.gitignore was a FIFO (or another special file) where git reads its rules" \
        in done.stdout
    assert ".gitattributes was a FIFO" in done.stdout


@pytest.mark.timeout(90)
def test_a_fifo_the_developer_named_mailmap_does_not_hang_anima_s_git_log(
        project: Path, fake_claude: FakeClaude) -> None:
    """`git log` and `git show` open the work tree's `.mailmap` (log.mailmap is on by default),
    and a FIFO's open waits for a writer: Anima's log of the round's commits used to wait for
    ever, saying nothing."""
    fake_claude.write_script({"developer": [  # (its own `git log` would wait too)
        {"shell": ["mkfifo .mailmap"], "auto": True},
        {"text": "## ALL_FEATURES_COMPLETE\n\n### Summary\nEvery feature is implemented."}]})
    done = subprocess.run([*ANIMA_COMMAND, "run", str(project), "--headless"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED


@pytest.mark.timeout(90)
@pytest.mark.parametrize("special", ["HEAD", "commondir"])
def test_a_fifo_in_a_repository_the_developer_nested_does_not_hang_the_round(
        project: Path, fake_claude: FakeClaude, special: str) -> None:
    """git takes a folder holding `.git/` for a nested repository only once it has read that
    `.git`'s `commondir` and `HEAD`, in every walk of the tree (`status`, `add`, `stash`): a
    FIFO there waits for a writer, and Anima's first `git status` after the turn waited for
    ever."""
    nested = "vendor/lib/.git"
    fake_claude.write_script({"developer": [
        {"auto": True},
        {"shell": [f"mkdir -p {nested}/objects {nested}/refs",
                   f"echo {'1' * 40} > {nested}/HEAD",  # (a commit it never made)
                   f"rm {nested}/{special}; mkfifo {nested}/{special}"], "auto": True}]})
    done = subprocess.run([*ANIMA_COMMAND, "run", str(project), "--headless"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert f"{nested}/{special} was a FIFO" in done.stdout


@pytest.mark.parametrize("committed", [False, True], ids=["empty", "with-a-commit"])
def test_a_repository_the_developer_nests_is_left_out_of_anima_s_commit(
        project: Path, fake_claude: FakeClaude, committed: bool) -> None:
    """An agent's `git init scratch` left behind: with no commit in it, Anima's commit of the
    round's leftovers failed and so did the milestone, on every resume; with one, main got a
    submodule whose commit only the worktree held."""
    commit = " && cd scratch && echo x > f && git add f && git commit -qm x" if committed else ""
    fake_claude.write_script({"developer": [
        {"auto": True}, {"shell": ["git init -q scratch" + commit], "auto": True}]})
    done = subprocess.run([*ANIMA_COMMAND, "run", str(project), "--headless"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert "scratch" not in subprocess.run(
        ["git", "-C", str(project), "ls-tree", "-r", "--name-only", "main"],
        capture_output=True, text=True, check=True).stdout
    assert "left out of Anima's commit, as git repositories of their own: scratch/" \
        in (project / ".anima/logs/m1.log").read_text()
