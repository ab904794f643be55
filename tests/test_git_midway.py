"""Git left mid-way never fails a milestone: a lock file of a git an agent killed, a rebase it
walked away from, locks a power cut left. Anima's next git command would fail on each ("File
exists", "cannot switch branch while rebasing"); the real engine and the fake `claude`.

The agents work in the milestone's worktree, whose `.git` is a file: its own git state (index,
HEAD, a rebase) is in `$(git rev-parse --git-dir)` (`.git/worktrees/m1/`), the refs in the
common `.git/`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from anima.git.locks import git_processes, wait_for_git
from anima.procfs import stopped
from anima.store.models import MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, record, run_engine
from tests.test_integrity import TWO, log_text, report
from tests.test_recovery import wait_until

F1 = ["mkdir -p features && echo F1 > features/F1.txt", "git add -A && git commit -qm 'feat: F1'"]
#: Where git keeps the worktree's own state, and the shared refs, seen from the worktree.
OWN = '"$(git rev-parse --git-dir)"'
COMMON = '"$(git rev-parse --git-common-dir)"'


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def merged(project: Path) -> None:
    """The milestone went on to the end, its worktree is gone, and git is at rest on main
    (in the human's checkout and in whatever worktree is left)."""
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged, rec.error
    assert run_git(project, "branch", "--show-current") == "main"
    assert "features/F1.txt" in run_git(project, "ls-tree", "-r", "--name-only", "main")
    assert not (project / ".anima" / "worktrees" / "m1").exists()
    git_dir = project / ".git"
    assert not [p for p in git_dir.rglob("*.lock")]
    for state in ("rebase-merge", "rebase-apply", "MERGE_HEAD"):
        assert not [p for p in git_dir.rglob(state)], state


def test_a_lock_the_developer_left_is_removed_and_its_work_committed(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo more > notes.txt", f"touch {OWN}/index.lock {OWN}/HEAD.lock"],
        "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED and first.auto_committed
    assert ".git/worktrees/m1/index.lock was left by a git command that no longer runs; removed" \
        in first.notes
    assert run_git(project, "show", "main:notes.txt") == "more"
    merged(project)


def test_a_lock_on_its_branch_the_developer_left_is_removed_and_its_work_committed(
        project: Path, fake_claude: FakeClaude) -> None:
    """What a `git commit` killed mid-way leaves: its branch's ref lock, in the common `.git/`
    (which the Developer's sandbox lets it write), not in its worktree's own git folder."""
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo more > notes.txt", f"touch {COMMON}/refs/heads/milestone/m1.lock"],
        "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED and first.auto_committed, record(project, "m1").error
    assert ".git/refs/heads/milestone/m1.lock was left by a git command that no longer runs; " \
        "removed" in first.notes
    assert run_git(project, "show", "main:notes.txt") == "more"
    merged(project)


def test_a_rebase_the_developer_walked_away_from_is_aborted_and_the_round_rejected(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo a > a.txt && git add a.txt && git commit -qm a",
        "echo b > a.txt && git commit -qam b",
        # a conflicting rebase, left stopped half way (from a detached HEAD: in the sandbox
        # the Developer may move no branch but its own)
        "git checkout -q --detach HEAD~1 && echo c > a.txt && git commit -qam c",
        "git rebase milestone/m1 || true"], "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    # (In the sandbox the rebase also leaves CHERRY_PICK_HEAD: its git cannot delete a ref.)
    assert first.reason.startswith("the round left git mid-operation: ")
    assert "an unfinished rebase was aborted" in first.reason
    assert "an unfinished rebase was aborted" in log_text(project)
    merged(project)


@pytest.mark.parametrize("sandbox", ["off", "auto"])
def test_locks_the_acceptor_left_do_not_stop_the_merge(project: Path, fake_claude: FakeClaude,
                                                       sandbox: str) -> None:
    """Unconfined, the Acceptor can leave git's locks (its worktree's index, main's ref in the
    common `.git`): they are removed and noted. Confined, it cannot write them at all."""
    config = project / ".anima" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sandbox": sandbox}))
    fake_claude.write_script({
        "developer": [{"shell": F1, "text": report()}],
        "acceptor": [{"shell": [f"touch {OWN}/index.lock {COMMON}/refs/heads/main.lock"]}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED
    left = [n for n in first.notes if "was left by a git command" in n]
    if sandbox == "off":
        assert any("index.lock was left" in n for n in left), first.notes
        assert any("refs/heads/main.lock was left" in n for n in left), first.notes
    else:
        assert left == []
    merged(project)


def test_locks_a_power_cut_left_are_removed_at_the_next_start(project: Path,
                                                             fake_claude: FakeClaude) -> None:
    for lock in ("index.lock", "HEAD.lock", "refs/heads/main.lock"):
        (project / ".git" / lock).touch()
    run_engine(project)
    merged(project)


#: A rebase, a cherry-pick and an `am` "in progress" that the Developer wrote by hand in its
#: worktree's own git folder (writable: its index and HEAD live there), each naming main: an
#: abort would move main to the Developer's commit, with Anima's own git, which no sandbox
#: confines. `$EVIL` is a commit of the Developer's.
FORGED_STATE = {
    "rebase": [f"mkdir -p {OWN}/rebase-merge",
               f"echo refs/heads/main > {OWN}/rebase-merge/head-name",
               f"echo $EVIL > {OWN}/rebase-merge/orig-head",
               f"git rev-parse HEAD > {OWN}/rebase-merge/onto",
               f"touch {OWN}/rebase-merge/interactive"],
    "cherry-pick": [f"mkdir -p {OWN}/sequencer",
                    f"echo $EVIL > {OWN}/sequencer/head",
                    f"echo 'pick $EVIL evil' > {OWN}/sequencer/todo",
                    f"echo $EVIL > {OWN}/CHERRY_PICK_HEAD",
                    f"echo 'ref: refs/heads/main' > {OWN}/HEAD"],
    "am": [f"mkdir -p {OWN}/rebase-apply", f"touch {OWN}/rebase-apply/applying",
           f"echo 1 > {OWN}/rebase-apply/next", f"echo 1 > {OWN}/rebase-apply/last",
           f"echo $EVIL > {OWN}/ORIG_HEAD",
           f"echo 'ref: refs/heads/main' > {OWN}/HEAD"],
}


@pytest.mark.parametrize("operation", sorted(FORGED_STATE))
@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_forged_operation_left_for_anima_to_abort_never_moves_main(
        project: Path, fake_claude: FakeClaude, operation: str, sandbox: str) -> None:
    config = project / ".anima" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sandbox": sandbox}))
    main = run_git(project, "rev-parse", "main")
    forge = " && ".join([
        "git commit -q --allow-empty -m 'evil: never reviewed' && EVIL=$(git rev-parse HEAD)",
        "git reset -q --hard HEAD~1 && git checkout -q --detach HEAD",
        *FORGED_STATE[operation]])
    fake_claude.write_script({"developer": [{"shell": [*F1, forge], "text": report()}]})
    run_engine(project)
    assert "evil: never reviewed" not in run_git(project, "log", "--format=%s", "main")
    assert run_git(project, "rev-parse", "main^1") == main
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert first.reason.startswith("the round left git mid-operation: "), first.reason
    merged(project)


#: The worktree's own git folder, written by hand: each would fail Anima's next git command.
BROKEN_BY_HAND = {
    "index overwritten": (f"printf garbage > {OWN}/index", "index could not be read"),
    # (sparse: no disk used; read whole, more memory than the machine has)
    "index made huge": (f"printf DIRC > {OWN}/index && truncate -s 100G {OWN}/index",
                        "index could not be read"),
    "HEAD deleted": (f"rm -f {OWN}/HEAD", "HEAD was gone"),
    "index.lock a folder": (f"mkdir {OWN}/index.lock", "index.lock was left"),
}


@pytest.mark.parametrize("damage", sorted(BROKEN_BY_HAND))
def test_a_worktree_git_folder_broken_by_hand_is_mended_and_the_work_kept(
        project: Path, fake_claude: FakeClaude, damage: str) -> None:
    command, said = BROKEN_BY_HAND[damage]
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo more > notes.txt", command], "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED, first.reason
    assert any(said in note for note in first.notes), first.notes
    assert run_git(project, "show", "main:notes.txt") == "more"  # its uncommitted work too
    merged(project)


#: Rewrites the worktree's index with valid checksums: the real entries plus forged ones
#: given as arguments (the blob and mode of the first entry).
FORGE_INDEX = r'''
import hashlib, struct, subprocess, sys
git_dir = subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, text=True,
                         check=True).stdout.strip()
listed = subprocess.run(["git", "ls-files", "-s", "-z"], capture_output=True,
                        check=True).stdout.split(b"\0")
entries = []
for item in filter(None, listed):
    meta, path = item.split(b"\t", 1)
    mode, sha, _ = meta.split()
    entries.append((path, sha.decode(), int(mode, 8)))
blob = entries[0][1]
for arg in sys.argv[1:]:
    path, mode = arg.rsplit(":", 1)
    entries.append((path.encode(), blob, int(mode, 8)))
def entry(path, sha, mode):
    e = struct.pack(">10I", 0, 0, 0, 0, 0, 0, mode, 0, 0, 0) + bytes.fromhex(sha)
    e += struct.pack(">H", min(len(path), 0xFFF)) + path
    return e + b"\0" * (8 - len(e) % 8)
entries.sort(key=lambda t: t[0])
body = b"DIRC" + struct.pack(">II", 2, len(entries)) + b"".join(entry(*e) for e in entries)
open(f"{git_dir}/index", "wb").write(body + hashlib.sha1(body).digest())
'''
#: The worktree's own git folder, written as git never writes it: mended, and the round
#: rejected, saying so; the Developer's work is kept.
FORGED_BY_HAND = {
    "HEAD garbage": (f"printf 'garbage\\n' > {OWN}/HEAD", "HEAD was written by hand"),
    "HEAD naming itself": (f"printf 'ref: HEAD\\n' > {OWN}/HEAD", "HEAD was written by hand"),
    "HEAD a hash of nothing": (f"printf '%040d\\n' 7 > {OWN}/HEAD", "HEAD was written by hand"),
    "index entry out of the tree": ("{py} {forge} ../../../victim.txt:100644",
                                    "index held entries git never writes (../../../victim.txt"),
    "index entry in .git": ("{py} {forge} .git/hooks/post-commit:100644", "never writes (.git/"),
    "index entry twice": ("{py} {forge} features/F1.txt:100644", "never writes (features/F1.txt"),
}


@pytest.mark.parametrize("damage", sorted(FORGED_BY_HAND))
def test_a_worktree_git_folder_forged_by_hand_is_mended_and_the_round_rejected(
        project: Path, fake_claude: FakeClaude, damage: str) -> None:
    """Before, Anima's next git command failed on each ("not a git repository", "outside
    repository" in its commit of the leftovers), and the milestone failed at every resume."""
    forge = fake_claude.root / "forge_index.py"
    forge.write_text(FORGE_INDEX, encoding="utf-8")
    (project / "victim.txt").write_text("yours\n", encoding="utf-8")
    command, said = FORGED_BY_HAND[damage]
    command = command.format(py=sys.executable, forge=forge)
    fake_claude.write_script({"developer": [{"shell": [
        *F1, "echo more > notes.txt", command], "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert said in first.reason, first.reason
    assert (project / "victim.txt").read_text(encoding="utf-8") == "yours\n"
    assert run_git(project, "show", "main:notes.txt") == "more"  # its uncommitted work too
    merged(project)


@pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged"])
def test_what_the_checks_passed_is_what_is_merged(
        project: Path, fake_claude: FakeClaude, flag: str) -> None:
    """The Developer commits one content and keeps another in its tree, hidden from
    `git status` by a flag it sets in its own index: the checks read the tree's "good", main
    got the commit's "broken". The flag is cleared and the tree's content committed."""
    config = project / ".anima" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "check_command": "grep -q good features/F1.txt"}))
    sneak = ("mkdir -p features && echo broken > features/F1.txt && git add -A && "
             f"git commit -q -m 'feat: F1' && git update-index {flag} features/F1.txt && "
             "echo good > features/F1.txt")
    fake_claude.write_script({"developer": [{"shell": [sneak], "text": report()}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert any("hidden from `git status`" in note for note in first.notes), first.notes
    assert first.auto_committed
    merged(project)
    assert run_git(project, "show", "main:features/F1.txt") == "good"


def test_a_sparse_checkout_of_yours_is_not_taken_for_a_hidden_file(
        project: Path, fake_claude: FakeClaude) -> None:
    """With your checkout sparse (`git sparse-checkout set`), a new worktree is sparse too:
    the files outside its patterns are flagged skip-worktree and absent. That is not the
    Developer hiding a file: clearing the flag would have them read as deleted, and the
    deletions be committed and merged into main."""
    (project / "outside").mkdir()
    (project / "outside" / "kept.txt").write_text("yours\n", encoding="utf-8")
    run_git(project, "add", "outside")
    run_git(project, "commit", "-q", "-m", "outside")
    run_git(project, "sparse-checkout", "set", "--no-cone", "/*", "!/outside/")
    fake_claude.write_script({"developer": [{"auto": True}]})
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert run_git(project, "show", "main:outside/kept.txt") == "yours"
    assert not any("hidden from `git status`" in note
                   for i in record(project, "m1").iterations for note in i.notes)


@pytest.mark.timeout(15)
def test_a_stopped_git_is_not_waited_for(git_repo: Path) -> None:
    """A git command held with the agent that left it running (or stopped by a terminal's
    Ctrl-Z) cannot finish while Anima waits: it is named at once, not after the wait."""
    git = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=git_repo,
                           stdin=subprocess.PIPE)
    try:
        wait_until(lambda: git.pid in git_processes(git_repo), what="the git command")
        os.kill(git.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(git.pid), what="it stopped")
        assert wait_for_git(git_repo, timeout=30) == [git.pid]
    finally:
        git.kill()
        git.wait()


def test_a_reading_git_of_yours_neither_slows_anima_nor_keeps_a_stale_lock(
        project: Path, fake_claude: FakeClaude) -> None:
    """An editor keeps `git cat-file --batch` running in your checkout (a `git log` in its
    pager does the same): it reads, it holds no lock. Anima does not wait for it after
    every turn, and a lock a killed git left (here, in the Developer's worktree) is still
    cleared."""
    ide = subprocess.Popen(["git", "cat-file", "--batch"], cwd=project,
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        fake_claude.write_script({"developer": [{"shell": [
            *F1, "echo more > notes.txt", f"touch {OWN}/index.lock"], "text": report()}]})
        run_engine(project)
    finally:
        ide.kill()
        ide.wait()
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED, first.reason
    assert any("index.lock was left" in note for note in first.notes), first.notes
    assert "git still at work" not in log_text(project)
    assert run_git(project, "show", "main:notes.txt") == "more"
    merged(project)


def test_only_gits_that_may_write_are_waited_for(git_repo: Path) -> None:
    readers = [["git", "-c", "core.pager=cat", "-C", ".", "cat-file", "--batch"],
               ["git", "--git-dir", ".git", "--no-pager", "cat-file", "--batch-check"]]
    writers = [["git", "-c", "x.y=log", "hash-object", "-w", "--stdin"]]
    procs = {tuple(argv): subprocess.Popen(argv, cwd=git_repo, stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL)
             for argv in readers + writers}
    try:
        writer = procs[tuple(writers[0])].pid
        wait_until(lambda: writer in git_processes(git_repo), what="the writing git")
        found = git_processes(git_repo)
        assert [procs[tuple(argv)].pid in found for argv in readers + writers] == [
            False, False, True]
        assert all(proc.poll() is None for proc in procs.values())  # all still there
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
