"""A file copied in from `.worktreeinclude` (a `.env`) is a secret: it never ends up in a
commit that a review, the Changes view or main sees, whether the Developer commits it
itself or only un-ignores it and leaves it for Anima's commit of its leftovers. The real
engine, the fake `claude`, real git."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anima.store.models import Iteration, MilestoneStatus, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import (
    engine_held,
    hold,
    ignored_dotenv,
    make_project,
    milestone_md,
    record,
    run_engine,
)
from tests.test_crash import git_shim
from tests.test_integrity import report

SECRET = "sk-local-only-0123456789-do-not-commit"
AUTO = {"auto": True}
TWO = milestone_md("Greeter", ["Greet command", "Farewell command"])
MODES = ["auto", "off"]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    ignored_dotenv(git_repo, f"PAYMENT_KEY={SECRET}\n")
    return make_project(git_repo, {"m1": TWO})


def never_in_main(project: Path) -> None:
    assert run_git(project, "rev-list", "main", "--", ".env") == ""
    assert SECRET not in run_git(project, "log", "-p", "main")


def first_round(project: Path, fake: FakeClaude, shell: str) -> Iteration:
    """The first round of a milestone whose Developer runs `shell`, then works as told: it
    completes whatever the round's fate."""
    fake.write_script({"developer": [{"shell": [shell], "auto": True}],
                       "developer_default": AUTO})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    return rec.iterations[0]


@pytest.mark.parametrize("sandbox", MODES)
def test_a_secret_the_developer_commits_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude, sandbox: str) -> None:
    """Round 1 commits its work and `.env` (forced past the ignore), then more work on top:
    the branch goes back to before that commit, the commits are kept under a local ref, the
    round is rejected before any review, and `.env` is back in the tree, untracked."""
    fake_claude.write_script({"developer": [
        {"shell": ["echo one > one.txt && git add one.txt && git commit -qm 'feat: one'",
                   "git add -f .env && echo two > two.txt && git add two.txt && "
                   "git commit -qm 'feat: two, with the env'",
                   "echo three > three.txt && git add three.txt && git commit -qm 'feat: three'"],
         "auto": True}]})
    run_engine(project, sandbox=sandbox)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert "committed .env, copied in from .worktreeinclude: a secret" in (first.reason or "")
    assert "git rm --cached .env" in (first.reason or "")
    kept = run_git(project, "for-each-ref", "--format=%(refname)", "refs/anima/secrets/")
    assert kept == "refs/anima/secrets/m1/1"
    assert run_git(project, "show", "refs/anima/secrets/m1/1:.env") == f"PAYMENT_KEY={SECRET}"
    never_in_main(project)
    # work before the secret's commit stayed on the branch and was reviewed with round 2
    assert run_git(project, "show", "main:one.txt") == "one"
    for prompt in fake_claude.prompts("acceptor"):
        assert SECRET not in prompt


def test_a_secret_value_written_into_the_code_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude) -> None:
    """The Developer copies the key out of `.env` into a source file: the commit is the
    leak, whatever the file's name."""
    fake_claude.write_script({"developer": [
        {"shell": [f"echo 'KEY = \\\"{SECRET}\\\"' > pay.py && git add pay.py && "
                   "git commit -qm 'feat: pay'"], "auto": True}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert "a value of the files copied in from .worktreeinclude, in pay.py" in first.reason
    assert "have pay.py read it at run time" in first.reason
    assert SECRET not in run_git(project, "log", "-p", "main")
    assert SECRET in run_git(project, "show", "refs/anima/secrets/m1/1:pay.py")


@pytest.mark.parametrize("what", ["value", "file", "plumbing"])
def test_a_secret_a_merge_commit_adds_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude, what: str) -> None:
    """`git log -p` prints no diff for a merge commit: what a merge adds itself (a conflict
    resolution, or any merge the Developer makes, here of a commit made with
    `git commit-tree`) was never looked at, and main got the value, or `.env` itself."""
    add = {"value": f"echo 'KEY = {SECRET}' > pay.py && git add pay.py",
           "file": "git add -f .env"}
    if what == "plumbing":  # a merge made without `git merge`, its tree adding pay.py
        merge = ("echo one > one.txt && git add one.txt && git commit -qm 'feat: one' && "
                 "B=$(git commit-tree -p HEAD~1 -m side HEAD~1^{tree}) && "
                 f"printf 'KEY = \"{SECRET}\"\\n' > pay.py && git add pay.py && "
                 "M=$(git commit-tree -p HEAD -p $B -m 'merge side' $(git write-tree)) && "
                 "git reset -q --soft $M")
    else:
        merge = ("side=$(git commit-tree 'HEAD^{tree}' -p HEAD -m side) && "
                 f"git merge -q --no-ff --no-commit $side && {add[what]} && "
                 "git commit -qm 'merge side'")
    first = first_round(project, fake_claude, merge)
    assert first.verdict is Verdict.REJECTED
    assert ("committed .env, copied in" if what == "file" else
            "a value of the files copied in from .worktreeinclude, in pay.py") in first.reason
    never_in_main(project)
    assert SECRET not in run_git(project, "log", "-p", "-m", "main")


@pytest.mark.parametrize("line", ["KEY = 1\\r{}", "++{}"])
def test_a_secret_on_any_added_line_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude, line: str) -> None:
    """Git's line is what is added: the check split the patch at a carriage return (and
    other separators `str.splitlines` knows), and took an added line starting `++` for the
    `+++ b/file` header, so the value after either went unseen."""
    first = first_round(project, fake_claude, f"printf '{line.format(SECRET)}\\n' > pay.py && "
                        "git add pay.py && git commit -qm 'feat: pay'")
    assert "a value of the files copied in from .worktreeinclude, in pay.py" in (
        first.reason or "")
    never_in_main(project)


@pytest.mark.parametrize("name", ['quo"ted.bin', "tab\\tbed.bin", "new\\nline.bin"])
def test_a_secret_value_in_a_binary_file_with_an_odd_name_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude, name: str) -> None:
    """A binary file's blob is read by its path: git C-quotes a name holding a `"`, a tab or
    a newline in a patch's `diff --git` line, that path was misread, the blob never looked at,
    and the key went to review and to main."""
    leak = (f"printf '\\0\\1\\2{SECRET}\\0' > \"$(printf '{name}')\" && git add -A && "
            "git commit -qm 'feat: data'")
    first = first_round(project, fake_claude, leak)
    assert first.verdict is Verdict.REJECTED, first
    assert "a value of the files copied in from .worktreeinclude" in (first.reason or "")
    never_in_main(project)
    assert SECRET not in run_git(project, "log", "-p", "--text", "main")


@pytest.mark.parametrize("where", ["author", "committer", "header"])
def test_a_secret_in_a_commits_identity_or_headers_is_taken_off_the_branch(
        project: Path, fake_claude: FakeClaude, where: str) -> None:
    """The check read each commit's patch and message only: a key the Developer made its
    commit's author or committer (`git -c user.name=…`), or a header line of its own
    (`git hash-object -t commit`), went to review and to main's history."""
    commit = "echo one > one.txt && git add one.txt && "
    leak = {"author": commit + f"git -c 'user.name=Dev {SECRET}' commit -qm 'feat: one'",
            "committer": commit + f"GIT_COMMITTER_EMAIL='{SECRET}@x' git commit -qm 'feat: one'",
            "header": commit + "git commit -qm 'feat: one' && git cat-file commit HEAD | "
                      f"sed '/^committer /a x-note {SECRET}' > /tmp/c && "
                      "git reset -q --soft $(git hash-object -t commit -w /tmp/c)"}[where]
    first = first_round(project, fake_claude, leak)
    assert first.verdict is Verdict.REJECTED, first
    assert "a value of the files copied in from .worktreeinclude, in its commit's" in (
        first.reason or "")
    assert SECRET not in run_git(project, "log", "--format=raw", "main")
    assert SECRET in run_git(project, "log", "--format=raw", "refs/anima/secrets/m1/1")


@pytest.mark.parametrize("sandbox", MODES)
def test_a_secret_left_uncommitted_is_never_committed_for_the_developer(
        project: Path, fake_claude: FakeClaude, sandbox: str) -> None:
    """The Developer un-ignores `.env` and leaves everything uncommitted: Anima commits the
    work, not the secret."""
    fake_claude.write_script({"developer": [
        {"shell": ["printf '' > .gitignore && echo work > work.txt"],
         "text": report(commit="")},
        {"shell": ["printf '.env\\n' > .gitignore"], "auto": True}]})
    run_engine(project, sandbox=sandbox)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert rec.iterations[0].verdict is Verdict.ACCEPTED and rec.iterations[0].auto_committed
    assert run_git(project, "show", "main:work.txt") == "work"
    never_in_main(project)


@pytest.mark.parametrize("kind", ["feature", "fix"])
def test_a_value_left_uncommitted_in_a_round_is_checked_before_its_review(
        project: Path, fake_claude: FakeClaude, kind: str) -> None:
    """A feature or fix round leaves a file holding the key uncommitted: Anima's commit of
    the leftovers is checked like the Developer's own, and used to come after the check, so
    the value was reviewed, accepted and merged."""
    leak = {"shell": [f"echo 'KEY = {SECRET}' > pay.py"], "text": report(commit="")}
    rounds = [leak] if kind == "feature" else [AUTO, leak]
    fake_claude.write_script({
        "developer": rounds, "developer_default": AUTO,
        "acceptor": [] if kind == "feature" else [{"text": "REJECTED: greet louder"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    leaked = rec.iterations[len(rounds) - 1]
    assert leaked.kind.value == kind and leaked.verdict is Verdict.REJECTED
    assert "a value of the files copied in from .worktreeinclude, in pay.py" in (
        leaked.reason or "")
    never_in_main(project)


def test_the_changes_view_never_shows_a_secret(project: Path, fake_claude: FakeClaude) -> None:
    """Committed during a turn, before Anima looks at it, the file is listed, its content
    not."""
    fake_claude.write_script({"developer": [{"shell": [
        "git add -f .env && git commit -qm 'feat: oops'", hold(fake_claude.root)],
        "auto": True}]})
    with engine_held(project, fake_claude.root) as engine:
        change = engine.changes("m1").file(".env")
        assert change is not None and SECRET not in change.patch
        assert [r.text for r in change.rows] == [
            "Not shown: .env is copied in from .worktreeinclude: a secret"]
    never_in_main(project)


ANT_KEY = "sk-ant-api03-Zq8Xv1Lm3Nc5Bd7Fg9Hj2Kp4Qr6St8Uw0Yx"


@pytest.mark.parametrize(("commit", "secret"), [
    (f"printf '%s\\n' \"KEY = '{SECRET}'\" > pay.py", SECRET),  # the .env value, in code
    (f"printf 'A = 1\\nKEY = \"%s\"\\n' {ANT_KEY} > pay.py", ANT_KEY),  # a key of any shape
    (f"echo x > 'cfg-{SECRET}.txt' && echo y > pay.py", SECRET),  # in a file's name
])
def test_the_changes_view_never_shows_a_secret_in_any_file(
        project: Path, fake_claude: FakeClaude, commit: str, secret: str) -> None:
    """While the turn runs (before Anima checks the commit), the whole-milestone diff hid
    only the copied-in file's own patch: a value or a key written into another file, or its
    name, was shown as it is. The line is there, the secret redacted in it."""
    fake_claude.write_script({"developer": [{"shell": [
        f"{commit} && git add -A && git commit -qm 'feat: pay'", hold(fake_claude.root)],
        "auto": True}], "developer_default": AUTO})
    with engine_held(project, fake_claude.root) as engine:
        files = engine.changes("m1").files
        assert all(secret not in f.path and secret not in f.patch
                   and all(secret not in r.text for r in f.rows) for f in files)
        pay = next(f for f in files if f.path == "pay.py")
        if secret == ANT_KEY:
            assert [(r.kind, r.text, r.new_line) for r in pay.rows][2:] == [
                ("+", "A = 1", 1), ("+", 'KEY = "<REDACTED>"', 2)]
    never_in_main(project)


@pytest.mark.parametrize(("content", "value"), [
    ("STRIPE=stripe_live_Hx83jfk29Dkq01Lmz\n", "stripe_live_Hx83jfk29Dkq01Lmz"),
    # a name that says nothing, a value without a digit
    ("COOKIE_SIGNATURE=correcthorsebatterystaple\n", "correcthorsebatterystaple"),
    ("q8Zt3vK1pL9mN2xR7sW4\n", "q8Zt3vK1pL9mN2xR7sW4"),  # a file that is only the token
])
def test_what_the_copied_in_files_hold_never_leaves_an_agent(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        content: str, value: str) -> None:
    """A value no pattern knows is hidden because the project copies it into the worktree,
    whatever it looks like: the Developer's `cat .env`, its reply quoting it, the record,
    the log, the transcript and the Acceptor's prompt never hold it."""
    fake_claude.use_env(monkeypatch)
    ignored_dotenv(git_repo, content)
    project = make_project(git_repo, {"m1": TWO})
    fake_claude.write_script({"developer": [{"shell": ["cat .env"], "auto": True,
                                             "say": f"I used {value} to test."}]})
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    anima = project / ".anima"
    written = [p for p in anima.rglob("*") if p.is_file() and "worktrees" not in p.parts
               and "sandbox" not in p.parts]
    assert any(p.suffix == ".jsonl" for p in written)  # the transcript is among them
    for path in written:
        assert value.encode() not in path.read_bytes(), path
    for prompt in fake_claude.prompts("acceptor"):
        assert value not in prompt


@pytest.mark.parametrize("left", ["value", "worktreeinclude"])
def test_what_the_final_turn_leaves_uncommitted_is_checked_before_the_final_acceptance(
        project: Path, fake_claude: FakeClaude, left: str) -> None:
    """The turn that says ALL_FEATURES_COMPLETE leaves a file holding the key, or a line
    added to `.worktreeinclude`, uncommitted: Anima commits it for the Developer, and used
    to do so after the checks, so main got it with the final acceptance."""
    leftover = f"echo 'KEY = {SECRET}' > notes.txt" if left == "value" \
        else "printf '.env\\n*.key\\n' > .worktreeinclude"
    fake_claude.write_script({"developer": [AUTO, AUTO, {"shell": [leftover], "auto": True}],
                              "developer_default": AUTO})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    claimed = rec.iterations[2]  # it said ALL_FEATURES_COMPLETE: rejected before review
    assert claimed.verdict is Verdict.REJECTED
    assert ("notes.txt" if left == "value" else ".worktreeinclude") in (claimed.reason or "")
    assert rec.iterations[-1].kind.value == "final"
    assert len(fake_claude.prompts("acceptor")) == 3  # the rejected final was never reviewed
    never_in_main(project)
    assert ".key" not in run_git(project, "show", "main:.worktreeinclude")


def test_a_kill_right_after_the_secret_is_taken_off_the_branch_still_copies_it_in_again(
        project: Path, fake_claude: FakeClaude, tmp_path: Path) -> None:
    """The reset that takes the secret's commit off the branch takes its file out of the
    tree too, and a copy puts it back: a kill between the two left the worktree without its
    `.env` for good (its copy is done once per worktree), and every later turn and check
    ran without it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    fake_claude.write_script({"developer": [
        {"shell": ["git add -f .env && git commit -qm 'feat: config'"], "auto": True},
        {"shell": [f"cp .env {marks}/seen"], "auto": True}]})
    # the real git first, then the kill of its caller
    _, env = git_shim(tmp_path, fake_claude, " reset -q --hard ",
                      f'{shutil.which("git")} "$@"; kill -9 $PPID; exit 1')
    done = subprocess.run(["anima", "run", str(project), "--headless"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stdout[-2000:] + done.stderr
    worktree = project / ".anima" / "worktrees" / "m1"
    assert not (worktree / ".env").exists()  # the reset took it; the copy never came

    run_engine(project, sandbox="off")

    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    assert (marks / "seen").read_text() == f"PAYMENT_KEY={SECRET}\n"
    never_in_main(project)


def test_a_window_that_did_not_run_the_milestone_hides_the_copied_in_values_too(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value too short to refuse the commit (under twelve characters) written into the
    code: the Changes view of the process that ran the milestone hid it, a window opened
    after the run (another process, which never opened that worktree) showed it as it is."""
    fake_claude.use_env(monkeypatch)
    ignored_dotenv(git_repo, "WEBHOOK=wh7Qz2pX\n")
    project = make_project(git_repo, {"m1": TWO})
    fake_claude.write_script({"developer": [{"shell": [
        "echo 'ID = \"wh7Qz2pX\"' > pay.py && git add -A && git commit -qm 'feat: pay'"],
        "auto": True}]})
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
    window = ("from anima.engine.facade import Engine\n"
              f"engine = Engine({str(project)!r})\n"
              "print(engine.changes('m1').file('pay.py').patch)\n"
              "engine.shutdown()\n")
    shown = subprocess.run([sys.executable, "-c", window], capture_output=True, text=True,
                           check=True).stdout
    assert "wh7Qz2pX" not in shown and '+ID = "<REDACTED>"' in shown, shown
