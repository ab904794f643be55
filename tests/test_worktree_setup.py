"""A milestone's worktree: made at the start with the `.worktreeinclude` files, set up once by
`worktree_setup_command` (confined like the agents), kept while it waits for the human,
re-attached or removed after a crash. Real git repositories, the fake `claude`, the real
engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from anima.git import GitRepo
from anima.loop.confinement import sandbox_problem
from anima.paths import ProjectPaths
from anima.phases import Phase
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import ignored_dotenv, make_project, milestone_md, record, run_engine
from tests.test_crash import git_shim

ONE = milestone_md("Greeter", ["Greet command"])
SANDBOXES = ["auto", "off"]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    ignored_dotenv(git_repo, "API_TOKEN=local-only\n")
    return make_project(git_repo, {"m1": ONE})


def _log(project: Path) -> str:
    return (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_setup_runs_once_in_the_new_worktree_with_the_included_files(
        project: Path, fake_claude: FakeClaude, sandbox: str) -> None:
    # The setup sees the copied .env and leaves a file the Developer's first turn can see.
    setup = "test -f .env && cat .env > setup-saw.txt && echo set up >> setup-ran.txt"
    fake_claude.write_script({"developer": [{"shell": ["cat setup-saw.txt setup-ran.txt"],
                                             "auto": True}]})
    run_engine(project, sandbox=sandbox, worktree_setup_command=setup,
               requires_human_review=True)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    worktree = project / ".anima" / "worktrees" / "m1"
    assert (worktree / "setup-ran.txt").read_text() == "set up\n"  # once
    assert (worktree / ".env").read_text() == "API_TOKEN=local-only\n"
    log = _log(project)
    assert "copied from .worktreeinclude: .env" in log
    assert "worktree setup: `" in log and "passed" in log
    assert "local-only" not in log  # a copied secret is named, never shown
    # A second run (the milestone waits for review) does not set it up again.
    run_engine(project, sandbox=sandbox, worktree_setup_command=setup,
               requires_human_review=True)
    assert (worktree / "setup-ran.txt").read_text() == "set up\n"
    # The human's checkout never left main, and holds nothing the setup made.
    assert run_git(project, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not (project / "setup-ran.txt").exists()


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_failing_setup_pauses_as_a_configuration_error(
        project: Path, fake_claude: FakeClaude, sandbox: str) -> None:
    _, outcome = run_engine(project, sandbox=sandbox, worktree_setup_command=(
        "echo cannot fetch packages; echo from the index; exit 3"))
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED and outcome.paused == ("m1",)
    assert "worktree_setup_command exited 3" in (rec.pause_reason or "")
    assert rec.iterations == []  # no round was spent or counted
    assert fake_claude.entries("developer") == []  # the Developer never started
    log = _log(project)
    assert "cannot fetch packages" in log and "from the index" in log  # the output's tail
    # design.md: the log is "[HH:MM:SS] ..." lines, a multi-line entry's too
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] ", line) for line in log.splitlines()), log
    # Fixed, then resumed: it runs again and the milestone goes on.
    subprocess.run(["anima", "resume", str(project), "m1"], check=True, capture_output=True)
    run_engine(project, sandbox=sandbox, worktree_setup_command="true")
    assert record(project, "m1").status is MilestoneStatus.COMPLETED


@pytest.mark.skipif(sandbox_problem("auto") is not None, reason="bubblewrap cannot run here")
def test_the_setup_is_confined_like_the_agents(project: Path) -> None:
    outside = project / "written-by-setup.txt"
    run_engine(project, worktree_setup_command=f"echo x > {outside}")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED  # the write failed: the setup failed
    assert not outside.exists()
    assert "Read-only file system" in _log(project)


def test_a_worktree_left_by_a_crash_is_reattached_or_removed(
        project: Path, fake_claude: FakeClaude) -> None:
    # m1 is paused holding its worktree with uncommitted work; an orphan worktree of a
    # milestone nobody knows is left behind too.
    fake_claude.write_script({"developer": [{"shell": ["echo wip > wip.txt"], "text": "oops"},
                                            {"text": "still no report"}]})
    run_engine(project, max_iterations_per_milestone=1)
    assert record(project, "m1").status is MilestoneStatus.PAUSED
    worktree = project / ".anima" / "worktrees" / "m1"
    assert (worktree / "wip.txt").exists()
    repo = GitRepo.open(project)
    orphan = project / ".anima" / "worktrees" / "ghost"
    repo.add_worktree(orphan, "milestone/ghost", "main")
    (orphan / "left.txt").write_text("left behind\n", encoding="utf-8")
    run_engine(project)
    assert (worktree / "wip.txt").exists()  # a paused milestone keeps its tree as it is
    assert not orphan.exists()
    assert "ghost" not in run_git(project, "worktree", "list")
    assert "no milestone has it" in (project / ".anima" / "logs" / "anima.log").read_text()
    assert "left behind" in run_git(project, "stash", "show", "-p", "--include-untracked")
    # The worktree's folder gone but still registered (a crash mid-removal): re-attached.
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    subprocess.run(["anima", "resume", str(project), "m1"], check=True, capture_output=True)
    fake_claude.write_script({})
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.COMPLETED


@pytest.mark.parametrize("record_text", ['{"schema_version": 99, "id": "m1", "title": "M"}',
                                         '{"id": "m1", "stat'], ids=["newer", "corrupt"])
def test_a_worktree_whose_record_does_not_read_is_kept(
        project: Path, fake_claude: FakeClaude, record_text: str) -> None:
    """A record this Anima cannot read (a newer Anima's, a corrupt one) is refused and left
    as it is: its milestone still has that worktree, which a restart must not remove as one
    "no milestone has" (the Developer's work stashed, the tree gone)."""
    fake_claude.write_script({"developer": [{"shell": ["echo wip > wip.txt"], "text": "oops"},
                                            {"text": "still no report"}]})
    run_engine(project, max_iterations_per_milestone=1)
    worktree = project / ".anima" / "worktrees" / "m1"
    assert (worktree / "wip.txt").exists()
    (project / ".anima" / "milestones" / "m1.json").write_text(record_text, encoding="utf-8")
    run_engine(project)
    assert (worktree / "wip.txt").read_text(encoding="utf-8") == "wip\n"
    assert "worktrees/m1" in run_git(project, "worktree", "list")


def test_a_kill_right_after_an_aborts_stash_still_leaves_the_stash_named_in_the_record(
        project: Path, fake_claude: FakeClaude, tmp_path: Path) -> None:
    """`anima abort` of a paused milestone with uncommitted work: cancelled on record, the
    work stashed, then killed (a `git` first on PATH kills it as the stash ends) before the
    record that names the stash was written. The next start names it in the record."""
    fake_claude.write_script({"developer": [{"shell": ["echo wip > wip.txt"], "text": "oops"},
                                            {"text": "still no report"}]})
    run_engine(project, max_iterations_per_milestone=1)
    assert record(project, "m1").status is MilestoneStatus.PAUSED
    real, folder = shutil.which("git"), tmp_path / "killing-git"
    folder.mkdir()
    (folder / "git").write_text(f'#!/bin/sh\ncase " $* " in *" stash push "*)\n'
                                f'  {real} "$@"; kill -KILL $PPID; exit 0;; esac\n'
                                f'exec {real} "$@"\n', encoding="utf-8")
    (folder / "git").chmod(0o755)
    killed = subprocess.run(["anima", "abort", str(project), "m1"], capture_output=True,
                            env={**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"})
    assert killed.returncode == -9, killed.stderr
    stash = run_git(project, "stash", "list", "--format=%gs")
    assert "anima-recovery-m1-" in stash
    assert not any("anima-recovery-m1-" in n for n in record(project, "m1").notes)
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.CANCELLED
    name = stash.split(": ", 1)[1]
    assert any(name in n for n in rec.notes), rec.notes
    assert "wip" in run_git(project, "stash", "show", "-p", "--include-untracked")


MEMORY_NOTE = ("echo '- the greeter lives in greet.py' >> .anima/memory/project.md && "
               "git add .anima/memory/project.md && git commit -qm 'docs: memory'")


def test_the_developers_memory_notes_reach_an_unchanged_untracked_copy_of_yours(
        project: Path, fake_claude: FakeClaude) -> None:
    memory = project / ".anima" / "memory" / "project.md"
    mine = memory.read_text(encoding="utf-8")  # `anima init` made it; main does not track it
    fake_claude.write_script({"developer": [{"shell": [MEMORY_NOTE], "auto": True}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.merge is not None and rec.merge.merged, rec.merge
    assert memory.read_text(encoding="utf-8") == mine + "- the greeter lives in greet.py\n"
    assert "memory" not in run_git(project, "status", "--porcelain")  # tracked now, as merged


def test_memory_notes_you_changed_meanwhile_keep_the_merge_waiting(
        project: Path, fake_claude: FakeClaude) -> None:
    memory = project / ".anima" / "memory" / "project.md"
    edit = f"echo '- mine' >> {memory}"  # the human, while the milestone ran (no sandbox)
    fake_claude.write_script({"developer": [{"shell": [MEMORY_NOTE, edit], "auto": True}]})
    run_engine(project, sandbox="off")
    rec = record(project, "m1")
    assert rec.merge is not None and not rec.merge.merged
    assert ".anima/memory/project.md" in rec.merge.detail and "waits" in rec.merge.detail
    assert memory.read_text(encoding="utf-8").endswith("- mine\n")  # never overwritten
    assert run_git(project, "rev-parse", "main") == rec.base_commit  # main unchanged
    shown = subprocess.run(["anima", "status", str(project)], capture_output=True, text=True,
                           check=True).stdout
    assert "merge waiting: " in shown and ".anima/memory/project.md" in shown


def test_the_next_prompt_carries_the_memory_the_developer_keeps_in_its_worktree(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet command", "Version flag"])})
    fake_claude.write_script({"developer": [{"shell": [MEMORY_NOTE], "auto": True}]})
    run_engine(git_repo)
    second = fake_claude.prompts("developer")[1]
    assert "the greeter lives in greet.py" in second


@pytest.mark.skipif(sandbox_problem("auto") is not None, reason="bubblewrap cannot run here")
def test_a_confined_developer_commits_as_you(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Its HOME is private, so its git reads no `~/.gitconfig` of yours: the private one
    carries your identity (here only in your global config)."""
    home = tmp_path / "you"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Ada Human\n\temail = ada@example.org\n",
                                     encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for key in ("user.name", "user.email"):
        run_git(git_repo, "config", "--unset", key)
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE})
    run_engine(git_repo)
    assert record(git_repo, "m1").status is MilestoneStatus.COMPLETED
    commits = run_git(git_repo, "log", "--format=%an <%ae> %s", "main^1..main^2")
    assert commits.splitlines() == ["Ada Human <ada@example.org> feat: F1"]  # its own commit


def test_worktrees_added_at_once_from_several_threads_all_succeed(tmp_path: Path) -> None:
    """Milestones start on threads of their own; `git worktree add` can read another add's
    half-made admin folder and fail (about one call in a hundred, three at a time), unless
    the adds take turns."""
    from anima.paths import ProjectPaths
    from tests.conftest import init_repo

    failures: list[str] = []
    for trial in range(8):
        repo = init_repo(tmp_path / f"repo{trial}", {"README.md": "x\n"})
        paths, project = ProjectPaths(repo), GitRepo.open(repo)

        def add(i: int, paths: ProjectPaths = paths, project: GitRepo = project) -> None:
            try:
                project.add_worktree(paths.worktree(f"m{i}"), f"milestone/m{i}", "main")
            except Exception as e:  # what a milestone's start would fail with
                failures.append(str(e))

        threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert len(project.worktrees()) == 6


@pytest.mark.parametrize("started", [False, True], ids=["pending", "in_progress"])
def test_a_worktree_a_killed_git_left_half_checked_out_is_made_again(
        project: Path, fake_claude: FakeClaude, started: bool) -> None:
    """`git worktree add` killed mid-checkout leaves a registered worktree, locked
    "initializing", whose missing files read as deleted: were it kept, Anima would commit
    those deletions as the Developer's leftovers and merge them into main."""
    tracked = run_git(project, "ls-files").split()
    if started:  # the record already said so when git was killed
        store = Store(ProjectPaths(project))
        store.scan(max_iterations=20, requires_human_review=False)
        rec = store.load_record("m1")
        rec.status, rec.phase = MilestoneStatus.IN_PROGRESS, Phase.STARTING
        rec.branch_name, rec.main_branch = "milestone/m1", "main"
        rec.base_commit = run_git(project, "rev-parse", "main").strip()
        store.save_record(rec)
    worktree = project / ".anima" / "worktrees" / "m1"
    run_git(project, "worktree", "add", "-q", "-b", "milestone/m1", str(worktree))
    for name in (".worktreeinclude", ".gitignore"):  # not checked out yet when git died
        run_git(worktree, "rm", "-q", "--cached", name)
        (worktree / name).unlink()
    admin = Path(run_git(worktree, "rev-parse", "--absolute-git-dir").strip())
    (admin / "locked").write_text("initializing\n", encoding="utf-8")

    run_engine(project)

    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert set(tracked) <= set(run_git(project, "ls-files").split())  # main lost nothing
    if started:
        assert "half checked out" in (project / ".anima" / "logs" / "anima.log").read_text()
    # The new worktree got the .worktreeinclude files, which the half-made one never had.
    assert "copied from .worktreeinclude: .env" in _log(project)


def test_a_cancel_cut_short_while_the_worktree_goes_still_cancels(
        project: Path, fake_claude: FakeClaude, tmp_path: Path) -> None:
    """Ctrl+C (or a power cut) during `anima abort` kills git while it deletes the worktree:
    the milestone is cancelled on record first, so the restart removes the rest. Kept for a
    paused milestone, the half-deleted tree's missing files would read as the Developer's
    deletions, committed and merged at its next resume."""
    fake_claude.write_script({"developer": [{"text": "oops"}, {"text": "still no report"}]})
    run_engine(project, max_iterations_per_milestone=1)
    assert record(project, "m1").status is MilestoneStatus.PAUSED
    worktree = project / ".anima" / "worktrees" / "m1"
    _, env = git_shim(tmp_path, fake_claude, " worktree remove ",
                      f'rm -f "{worktree}/.gitignore"; kill -9 $PPID; exit 1')
    done = subprocess.run(["anima", "abort", str(project), "m1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr  # killed halfway through the removal
    assert worktree.is_dir() and not (worktree / ".gitignore").exists()

    run_engine(project)

    assert record(project, "m1").status is MilestoneStatus.CANCELLED
    assert not worktree.exists()
    assert "worktrees/m1" not in run_git(project, "worktree", "list")


@pytest.mark.parametrize("ended", ["cancelled", "completed"])
def test_a_removal_cut_short_stashes_nothing_git_had_deleted(
        project: Path, fake_claude: FakeClaude, tmp_path: Path, ended: str) -> None:
    """git deletes a worktree's files before its `.git`: a kill halfway through the removal
    of an ended milestone's worktree left a tree whose missing files read as uncommitted
    deletions, and the restart stashed them as work the milestone had left, named in its
    record ("found at a restart: what was left uncommitted…"): a merged milestone that
    left nothing got a stash of its own files' deletions, a cancelled one a second stash
    beside the one holding its real leftovers."""
    worktree = project / ".anima" / "worktrees" / "m1"
    _, env = git_shim(tmp_path, fake_claude, " worktree remove ",
                      f'rm -f "{worktree}/.gitignore" "{worktree}/README.md"; kill -9 $PPID; '
                      'exit 1')
    if ended == "cancelled":  # paused with work of the Developer's left uncommitted
        fake_claude.write_script({"developer": [{"shell": ["echo wip > wip.txt"],
                                                 "text": "oops"}, {"text": "no report"}]})
        run_engine(project, max_iterations_per_milestone=1)
        command = ["anima", "abort", str(project), "m1"]
    else:
        command = ["anima", "run", str(project), "--headless"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stdout[-2000:] + done.stderr
    assert worktree.is_dir() and not (worktree / "README.md").exists()

    run_engine(project)

    rec = record(project, "m1")
    assert rec.status.value == ended and not worktree.exists()
    stashes = run_git(project, "stash", "list").splitlines()
    stashed = [n for n in rec.notes if "stash" in n]
    if ended == "completed":
        assert rec.merge is not None and rec.merge.merged
        assert stashes == [] and stashed == [], rec.notes
    else:  # the Developer's leftovers, stashed by the abort, and nothing else
        assert len(stashes) == 1 and len(stashed) == 1, (stashes, rec.notes)
        assert "wip" in run_git(project, "stash", "show", "-p", "--include-untracked")
