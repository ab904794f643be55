"""The worktree's `.git` file names its git folder. The checks run code the Developer
committed, and they write the worktree: had they rewritten `.git` (to a repository of their
own, or the human's), Anima's own git in the worktree, the next Developer's sandbox and the
Acceptor would have followed it. Confined, nothing that writes the tree can write `.git`;
Anima's git never reads it (its git folder is found from the repository's side), and a start
points it back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from anima.config import Config
from anima.loop.actions import resume
from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.conftest import run_git
from tests.helpers import milestone_md, record, run_engine
from tests.test_isolation import (  # noqa: F401 - fixtures
    AUTO,
    ONE,
    attack,
    b64_file,
    exits,
    fake,
    human_home,
    project_with,
)

TWO = milestone_md("Pair", ["First thing", "Second thing"])


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_the_checks_cannot_point_the_worktrees_git_at_your_checkout(
        git_repo: Path, fake, mode: str) -> None:  # noqa: F811
    """check.sh (committed by the Developer, run by `check_command`) rewrites the worktree's
    `.git` to `gitdir: <project>/.git`. Had Anima's restore after the checks followed it, it
    would have switched the human's checkout to the milestone branch and reset its index.
    Unconfined too: Anima's own git never reads the file."""
    project = project_with(git_repo, mode, check_command="sh check.sh")
    (project / "notes.txt").write_text("staged by the human\n", encoding="utf-8")
    run_git(project, "add", "notes.txt")  # the human's staged work, in their index
    check = ('common=$(git rev-parse --path-format=absolute --git-common-dir)\n'
             'echo "gitdir: $common" > .git\nexit 0\n')
    fake.write_script({"developer": [{"shell": [
        f"echo {b64_file(check)} | base64 -d > check.sh"], "auto": True}]})
    run_engine(project)

    assert run_git(project, "symbolic-ref", "HEAD") == "refs/heads/main"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True,
                            text=True, check=True).stdout
    assert "A  notes.txt" in status.splitlines(), status  # still staged, nothing deleted
    assert "D" not in "".join(line[:2] for line in status.splitlines()), status


#: check.sh: a repository of its own in the worktree, made of links to the real one, except
#: that the folder of the branch's reflog is the human's `.git/hooks`; the worktree's `.git`
#: pointed at it. Anima's git reads the same refs and objects through the links, so nothing
#: looks different; the next Developer sandbox binds the "reflog folder" read-write.
FAKE_REPO = r"""gd=$(git rev-parse --path-format=absolute --git-dir)
case "$gd" in */evil/admin) exit 0;; esac
common=$(git rev-parse --path-format=absolute --git-common-dir)
mkdir -p evil/admin evil/common/info evil/common/logs/refs/heads
for f in objects refs packed-refs config HEAD; do ln -s "$common/$f" "evil/common/$f"; done
ln -s "$common/hooks" evil/common/logs/refs/heads/milestone
echo /evil/ > evil/common/info/exclude
cp "$gd/HEAD" "$gd/index" evil/admin/
echo ../common > evil/admin/commondir
echo "$PWD/.git" > evil/admin/gitdir
echo "gitdir: evil/admin" > .git
exit 0
"""


def test_the_checks_cannot_widen_the_next_developer_sandbox(
        git_repo: Path, fake) -> None:  # noqa: F811
    """The next Developer process (here: a fresh session per feature; also any crash
    restart, rollover or Anima restart) is confined from the forged `.git`: `git_writable`
    binds the forged common dir's `logs/refs/heads/milestone` read-write after resolving the
    link, i.e. the human's `.git/hooks`. The Developer plants a hook that the human's own git
    then runs outside any sandbox."""
    project = project_with(git_repo, "auto", {"m1": TWO}, check_command="sh check.sh",
                           session_per_feature=True)
    hook = project / ".git" / "hooks" / "post-checkout"
    pwned = project.parent / "pwned"
    plant = (f"printf '#!/bin/sh\\ntouch {pwned}\\n' > {hook} && chmod +x {hook}")
    fake.write_script({"developer": [
        {"shell": [f"echo {b64_file(FAKE_REPO)} | base64 -d > check.sh"], "auto": True},
        {"shell": [attack(fake, "hook", plant)], "auto": True}]})
    run_engine(project)
    subprocess.run(["git", "checkout", "-q", "main"], cwd=project, check=False)  # the human

    assert not pwned.exists(), "a hook the Developer planted ran in the human's git"
    assert exits(fake)["hook"] != 0, "the Developer wrote the human's .git/hooks"
    assert not hook.exists()


#: check.py: the same kind of repository of its own, whose object store (searched before the
#: real one, its alternate) holds a forged object under the name of the Developer's commit:
#: same hash, other tree. Git never checks a loose object against its name when it reads one.
#: The worktree's pay.py is rewritten to the forged content, the forged index matches it.
SWAP = r'''
import os, subprocess, sys, zlib
from pathlib import Path

def git(*args):
    return subprocess.run(["git", *args], capture_output=True, check=True).stdout.decode().strip()

gd = git("rev-parse", "--path-format=absolute", "--git-dir")
if gd.endswith("/evil/admin"):
    sys.exit(0)
common = git("rev-parse", "--path-format=absolute", "--git-common-dir")
evil = Path("evil").absolute()
for d in ("admin", "common/objects/info", "common/info"):
    (evil / d).mkdir(parents=True)
for name in ("refs", "packed-refs", "HEAD"):
    os.symlink(f"{common}/{name}", evil / "common" / name)
(evil / "common" / "config").write_text(Path(common, "config").read_text()
                                        + "[core]\n\ttrustctime = false\n\tcheckStat = minimal\n")
(evil / "common" / "objects" / "info" / "alternates").write_text(f"{common}/objects\n")
(evil / "common" / "info" / "exclude").write_text("/evil/\n")
for name in ("HEAD", "index"):
    (evil / "admin" / name).write_bytes(Path(gd, name).read_bytes())
(evil / "admin" / "commondir").write_text("../common\n")
(evil / "admin" / "gitdir").write_text(f"{Path('.git').absolute()}\n")
# the blob main will get, forged under its own name with the content the Acceptor will see
good = b"print('good')\n"
blob = git("rev-parse", "HEAD:pay.py")
obj = evil / "common" / "objects" / blob[:2] / blob[2:]
obj.parent.mkdir(parents=True, exist_ok=True)
obj.write_bytes(zlib.compress(b"blob %d\0" % len(good) + good))
# same size, and an mtime an hour back in both the file and its index entry (not "racy"):
# unchanged to checkStat=minimal, so nothing is hashed
Path("pay.py").write_bytes(good)
index = bytearray((evil / "admin" / "index").read_bytes())
pos, count = 12, int.from_bytes(index[8:12], "big")
for _ in range(count):
    end = index.index(b"\0", pos + 62)
    if index[pos + 62:end] == b"pay.py":
        old = int.from_bytes(index[pos + 8:pos + 12], "big") - 3600
        index[pos + 8:pos + 12] = old.to_bytes(4, "big")
        os.utime("pay.py", (old, old))
    pos += (62 + (end - pos - 62) + 8) // 8 * 8
index[-20:] = __import__("hashlib").sha1(bytes(index[:-20])).digest()
(evil / "admin" / "index").write_bytes(bytes(index))
Path(".git").write_text("gitdir: evil/admin\n")
'''


def test_what_the_acceptor_reviews_is_what_is_merged(git_repo: Path, fake) -> None:  # noqa: F811
    """The Developer commits pay.py = "print('evil')" and check.py. Had the checks forged the
    worktree's `.git` (above), the Acceptor, reading the file and `git show HEAD:pay.py`,
    would have seen "print('good')" and accepted, and main got "print('evil')" by the very
    hash the final acceptance judged. The write fails: the checks fail, nothing is merged."""
    project = project_with(git_repo, "auto", check_command=f"{sys.executable} check.py")
    seen = fake.root / "seen"
    fake.write_script({
        "developer": [{"shell": [f"echo {b64_file(SWAP)} | base64 -d > check.py",
                                 "echo \"print('evil')\" > pay.py",
                                 "git add -A && git commit -qm 'feat: pay'"], "auto": True}],
        "acceptor": [{"shell": [f"cat pay.py >> {seen}", f"git show HEAD:pay.py >> {seen}"],
                      "auto": True}]})
    run_engine(project)

    merged = subprocess.run(["git", "show", "main:pay.py"], cwd=project, capture_output=True,
                            text=True, check=False).stdout
    reviewed = seen.read_text(encoding="utf-8") if seen.exists() else ""
    assert "print('good')" not in reviewed, "the Acceptor reviewed a forged tree"
    assert not merged or merged.strip() in reviewed, f"main got {merged!r} unreviewed"


def test_a_start_points_a_rewritten_git_file_back(git_repo: Path, fake) -> None:  # noqa: F811
    """Unconfined, the Developer points the worktree's `.git` at a repository that is not
    there. Anima's own git goes on (it never reads the file); when the milestone starts again,
    the file names the worktree's git folder again, and the log says so."""
    project = project_with(git_repo, "off", {"m1": TWO}, max_iterations_per_milestone=1)
    fake.write_script({"developer": [
        {"shell": ["mkdir -p features && echo one > features/one.txt",
                   "git add -A && git commit -qm 'feat: one'",
                   "echo 'gitdir: /nonexistent/repo' > .git"], "auto": True},
        {"shell": ["git rev-parse --absolute-git-dir > where.txt"], "auto": True}]})
    run_engine(project)  # round 1 accepted, then the round limit pauses it
    dot_git = project / ".anima" / "worktrees" / "m1" / ".git"
    assert record(project, "m1").status is MilestoneStatus.PAUSED
    assert dot_git.read_text(encoding="utf-8") == "gitdir: /nonexistent/repo\n"

    paths = ProjectPaths(project)
    resume(Store(paths), Config(), "m1")
    run_engine(project)

    admin = project / ".git" / "worktrees" / "m1"
    log = (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    assert "did not name the worktree's git folder" in log
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.pause_reason
    assert f"{admin}\n" in run_git(project, "show", "main:where.txt") + "\n"
