"""Anima runs the project's own checks (config `check_command`) before the Acceptor is asked.

Real processes throughout: the check is a real shell command in a real git repo (in the
milestone's worktree, confined like the agents unless `sandbox` is off), the agents are the
fake `claude`, the engine is the real one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from io import StringIO
from pathlib import Path

import pytest

from anima import procfs, sandbox
from anima.cli.printer import HeadlessPrinter
from anima.engine.facade import Engine
from anima.loop.checks import Confine, run_check
from anima.loop.confinement import WRITABLE_VAR, sandbox_problem
from anima.store.models import MilestoneStatus, RoundKind, Verdict
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine
from tests.test_cli import ANIMA, anima


def mark(tmp_path: Path) -> str:
    """The check's marker, this test's own: run_check stops whatever carries it, and tests
    run side by side (pytest-xdist)."""
    return procfs.agent_marker(tmp_path, "test", "checks")
TWO = milestone_md("Greeter", ["Greet command", "Version flag"])
NO_BWRAP = sandbox_problem("auto")
#: The project's `sandbox` setting: the checks confined to the worktree, or not.
SANDBOXES = [pytest.param("auto", marks=pytest.mark.skipif(
    NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")), "off"]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def outside(tmp_path: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder outside the project where a check leaves what the test reads (how often it
    ran, that it started). The checks are confined to the milestone's worktree, with a /tmp of
    their own: the folder is made writable to them as a shared build cache would be
    (ANIMA_SANDBOX_WRITABLE). Call after `fake_claude.use_env`, which sets that variable."""
    folder = tmp_path / "outside"
    folder.mkdir(exist_ok=True)
    fake_claude.use_env(monkeypatch)
    monkeypatch.setenv(WRITABLE_VAR, os.pathsep.join([str(fake_claude.root), str(folder)]))
    return folder


def _check_processes(project: Path) -> list[int]:
    """The live processes of m1's checks, by their marker: real pids whether or not the
    check runs in a sandbox (where its own `$$` is a pid of the sandbox's namespace)."""
    return procfs.marked(procfs.agent_marker(project, "m1", "checks"))


def _wait_for(path: Path, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# --------------------------------------------------------------------------- the runner


def test_a_hanging_check_is_stopped_at_its_timeout_with_everything_it_started(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A child in the check's group, and one that left it for a session of its own.
    command = (f"sleep 300 & echo $! >> {pids}; "
               f"setsid sh -c 'echo $$ >> {pids}; exec sleep 300' & "
               "echo started; sleep 300")
    started = time.monotonic()
    result = run_check(command, tmp_path, timeout=1.5, marker=mark(tmp_path))
    took = time.monotonic() - started
    assert result.timed_out and not result.passed and result.exit_code is None
    assert 1.5 <= took < 6, took
    assert "started" in result.tail
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2
    assert [p for p in children if _alive(p)] == []


def _confined(tmp_path: Path) -> Confine:
    """A sandbox around `tmp_path` as the milestone's checks get one (`MilestoneSandbox`)."""
    c = sandbox.Confinement(cwd=tmp_path, home=tmp_path / ".home", tmp=tmp_path / ".tmp",
                            writable=(tmp_path,), visible=(tmp_path,))
    return lambda argv: (sandbox.wrap(argv, c), sandbox.environment(c))


@pytest.mark.parametrize("confined", [pytest.param(True, id="confined", marks=pytest.mark.skipif(
    NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")),
    pytest.param(False, id="unconfined")])
def test_a_missing_command_cannot_start_in_either_form(tmp_path: Path, confined: bool) -> None:
    confine = _confined(tmp_path) if confined else None
    argv = run_check(["no-such-checker-xyz", "--all"], tmp_path, timeout=10, marker=mark(tmp_path),
                     confine=confine)
    assert argv.error is not None and "no-such-checker-xyz" in argv.error
    shell = run_check("no-such-checker-xyz --all", tmp_path, timeout=10, marker=mark(tmp_path),
                      confine=confine)
    assert shell.error is not None and "not found" in shell.error
    # A suite that fails with 127 for its own reasons is a failing check, not a config error.
    own = run_check("echo 'running 3 tests'; exit 127", tmp_path, timeout=10, marker=mark(tmp_path),
                    confine=confine)
    assert own.error is None and own.exit_code == 127 and not own.passed
    # Nor is a suite that fails with 1, the exit code of bubblewrap when it cannot start one.
    fails = run_check(["sh", "-c", "echo 'FAILED test_greet'; exit 1"], tmp_path, timeout=10,
                      marker=mark(tmp_path), confine=confine)
    assert fails.error is None and fails.exit_code == 1 and not fails.passed


@pytest.mark.skipif(NO_BWRAP is not None, reason=f"the sandbox cannot run here: {NO_BWRAP}")
def test_a_hidden_socket_that_goes_away_as_the_check_starts_is_no_failure(
        tmp_path: Path) -> None:
    """A daemon's socket the sandbox hides (Docker restarting) can go between the moment
    Anima names it and bubblewrap's mount over it, which then fails: "Can't create file at
    /run/docker.sock". That is no failing check of the Developer's commit (it rejected one
    in CI); the sandbox is made again, without the socket."""
    socket = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="anima-test-")) / "daemon.sock"
    socket.write_text("")
    c = sandbox.Confinement(cwd=tmp_path, home=tmp_path / ".home", tmp=tmp_path / ".tmp",
                            writable=(tmp_path,), visible=(tmp_path,), hidden_files=(socket,))
    made: list[list[str]] = []

    def restarting(argv: list[str]) -> tuple[list[str], dict[str, str]]:
        made.append(sandbox.wrap(argv, c))
        socket.unlink(missing_ok=True)  # gone after Anima looked, before bubblewrap mounts
        return made[-1], sandbox.environment(c)

    try:
        result = run_check("echo all 3 passed", tmp_path, timeout=30, marker=mark(tmp_path),
                           confine=restarting)
    finally:
        shutil.rmtree(socket.parent)
    assert result.passed, result.tail
    assert result.tail == "all 3 passed"
    assert len(made) == 2 and str(socket) in made[0] and str(socket) not in made[1]


def test_the_tail_is_bounded_and_redacted(tmp_path: Path) -> None:
    secret = "sk-ant-api03-" + "Q" * 40
    command = (f"{sys.executable} -c \"print('x' * 5000); "
               f"[print('line', i) for i in range(100000)]; print('ANTHROPIC_API_KEY={secret}')\"")
    result = run_check(command, tmp_path, timeout=30, marker=mark(tmp_path))
    assert result.passed
    lines = result.tail.splitlines()
    assert len(lines) == 30 and lines[-2] == "line 99999"
    assert secret not in result.tail and "REDACTED" in result.tail


def test_a_key_whose_begin_line_is_above_the_tail_is_still_redacted(tmp_path: Path) -> None:
    body = "".join(f"print('MIIEowIBAAKCAQEAx8nR{i:04d}secretbody');" for i in range(40))
    long_line = "print('x' * 278 + ' sk-ant-api03-' + 'Qw3Er5Ty7U' * 6);"  # cut 7 chars in
    command = (f"{sys.executable} -c \"print('-----BEGIN RSA PRIVATE KEY-----'); {body} "
               f"print('-----END RSA PRIVATE KEY-----'); {long_line} print('done')\"")
    result = run_check(command, tmp_path, timeout=30, marker=mark(tmp_path))
    assert "secretbody" not in result.tail and "Qw3Er5T" not in result.tail
    assert result.tail.splitlines()[-1] == "done"



def test_git_config_given_by_the_environment_still_reaches_a_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GIT_CONFIG_KEY_<n>` names a setting, not a credential: without it git refuses to run
    at all ("missing config key"), and a check that runs git would fail for nothing."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "anima.test")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "kept")
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-0123456789")
    result = run_check('git config anima.test; echo "[$DEPLOY_TOKEN]"', tmp_path, timeout=30,
                       marker=mark(tmp_path))
    assert result.passed, result.tail
    assert result.tail == "kept\n[]"



# --------------------------------------------------------------------------- in the loop


def test_a_failing_check_rejects_without_an_acceptor_turn(project: Path,
                                                         fake_claude: FakeClaude) -> None:
    check = "echo 'test_greet FAILED: expected hello'; exit 1"
    _, outcome = run_engine(project, check_command=check)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.status is MilestoneStatus.PAUSED
    assert fake_claude.prompts("acceptor") == []
    assert [i.verdict for i in rec.iterations] == [Verdict.REJECTED] * 3
    first = rec.iterations[0]
    assert first.reason.startswith(f"checks failed: `{check}` exited 1")
    assert first.check is not None and first.check.exit_code == 1 and not first.check.passed
    assert first.check.tail == "test_greet FAILED: expected hello"
    # The fake Developer reports "1 passed, 0 failed": the record says plainly it was wrong.
    assert first.check.report_claim == "1 passed, 0 failed"
    assert "report said the tests passed (\"1 passed, 0 failed\"), but they did not" \
        in first.reason
    fix_prompt = fake_claude.prompts("developer")[1]
    assert "test_greet FAILED: expected hello" in fix_prompt
    assert f"`{check}`" in fix_prompt and "exited 1" in fix_prompt
    assert "Your report said the tests passed (\"1 passed, 0 failed\"). They did not" \
        in fix_prompt


def test_a_passing_check_reaches_the_acceptor_and_the_final_acceptance(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs = outside(tmp_path, fake_claude, monkeypatch) / "check-runs"
    check = ["sh", "-c", f"echo run >> {runs}; ls features"]
    run_engine(project, check_command=check)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert runs.read_text().count("run") == 3  # two features, then the final acceptance
    assert all(i.check is not None and i.check.passed for i in rec.iterations)
    review, second, final = fake_claude.prompts("acceptor")
    shown = "sh -c 'echo run >> " + str(runs) + "; ls features'"
    assert f"Anima ran `{shown}`: passed in " in review and "F1.txt" in review
    assert "F2.txt" in second
    assert f"Anima ran `{shown}`: passed in " in final and "F2.txt" in final


def test_a_secret_in_the_check_command_is_not_shown(
        project: Path, fake_claude: FakeClaude) -> None:
    """`DB_PASSWORD=… pytest` in the config: the record, the log and the prompts show the
    command without it."""
    secret = "ghp_" + "a1B2c3D4e5" * 4
    run_engine(project, check_command=f"DB_PASSWORD={secret} ls features")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert all(i.check is not None and "DB_PASSWORD=<REDACTED>" in i.check.command
               for i in rec.iterations)
    for text in [(project / ".anima" / "milestones" / "m1.json").read_text(),
                 (project / ".anima" / "logs" / "m1.log").read_text(), *fake_claude.prompts()]:
        assert secret not in text


def test_the_final_acceptance_runs_the_check_and_a_failure_goes_back(
        project: Path, fake_claude: FakeClaude, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    count = outside(tmp_path, fake_claude, monkeypatch) / "count"
    # The third run (the first final acceptance) fails; every other run passes.
    check = (f"n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; "
             "if [ $n -eq 3 ]; then echo 'integration: 1 failed'; exit 2; fi")
    run_engine(project, check_command=check)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    finals = [i for i in rec.iterations if i.kind is RoundKind.FINAL]
    assert [i.verdict for i in finals] == [Verdict.REJECTED, Verdict.ACCEPTED]
    assert finals[0].reason.startswith(f"checks failed: `{check}` exited 2")
    assert rec.consecutive_rejections == 0
    # The rejected final round never reached the Acceptor: two reviews and one final.
    prompts = fake_claude.prompts("acceptor")
    assert len(prompts) == 3 and sum("final acceptance" in p for p in prompts) == 1
    after = fake_claude.prompts("developer")[3]
    assert "integration: 1 failed" in after and "exited 2" in after


def test_what_a_check_leaves_in_the_tree_is_undone(project: Path,
                                                  fake_claude: FakeClaude) -> None:
    # Waiting for review, the milestone keeps its worktree, where the check ran: it is clean.
    run_engine(project, check_command="echo junk > junk.txt; echo 1 >> features/F1.txt",
               requires_human_review=True)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    worktree = project / ".anima" / "worktrees" / "m1"
    assert (worktree / "features" / "F1.txt").is_file()
    assert not (worktree / "junk.txt").exists()
    assert run_git(worktree, "status", "--porcelain") == ""
    assert not (project / "junk.txt").exists()
    assert "the checks changed the repository; undone" in " ".join(rec.iterations[0].notes)
    assert "junk" not in run_git(project, "log", "--stat", "--format=%s", "milestone/m1")


def test_a_huge_file_a_check_leaves_is_undone_without_reading_it_whole(
        project: Path, fake_claude: FakeClaude) -> None:
    """A test of large files may leave one (sparse: no disk used): Anima fingerprints it in
    pieces, as a file bigger than its memory."""
    run_engine(project, check_command="truncate -s 100G big.img")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.pause_reason
    assert "untracked big.img removed" in " ".join(rec.iterations[0].notes)
    assert "big.img" not in run_git(project, "ls-tree", "--name-only", "main").split()


@pytest.mark.parametrize("mode", SANDBOXES)
def test_a_check_that_cannot_start_pauses_the_milestone(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        mode: str) -> None:
    fake_claude.use_env(monkeypatch)
    project = make_project(git_repo, {"m1": TWO},
                           config={"check_command": ["no-such-checker-xyz"], "sandbox": mode})
    result = anima("run", str(project), "--headless")
    assert result.returncode == 3, result.stdout + result.stderr
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.PAUSED
    assert "checks could not start" in (rec.pause_reason or "")
    assert "no-such-checker-xyz" in (rec.pause_reason or "")
    assert "check_command" in (rec.pause_reason or "")
    # A configuration error, not the Developer's fault: nothing rejected, nobody reviewed.
    assert rec.iterations == [] and rec.consecutive_rejections == 0
    assert fake_claude.prompts("acceptor") == []
    assert "[anima] checks: `no-such-checker-xyz` could not start" in result.stdout


@pytest.mark.parametrize("mode", SANDBOXES)
def test_a_round_cut_short_by_a_pause_keeps_what_it_spent(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        mode: str) -> None:
    """The Developer's turn cost real money before the checks could not start: the round is
    redone on resume, but its spend stays in the record's totals (and so in the budget)."""
    fake_claude.use_env(monkeypatch)
    fake_claude.write_script({"developer_default": {"auto": True, "cost_usd": 0.25}})
    project = make_project(git_repo, {"m1": TWO},
                           config={"check_command": ["no-such-checker-xyz"], "sandbox": mode})
    result = anima("run", str(project), "--headless")
    assert result.returncode == 3, result.stdout + result.stderr
    rec = record(project, "m1")
    assert rec.iterations == []
    assert rec.cost_usd == pytest.approx(0.25, rel=0.01)
    assert rec.tokens_used > 0
    assert any("round 1 was dropped" in note and "$0.2500" in note for note in rec.notes)


def test_headless_output_shows_the_checks(project: Path, fake_claude: FakeClaude) -> None:
    out = StringIO()
    engine = Engine(project, config_overrides={"check_command": "echo all good"})
    engine.bus.subscribe(HeadlessPrinter(out, out))
    try:
        engine.run(start_all=True)
    finally:
        engine.shutdown()
    shown = out.getvalue()
    assert "[anima] checks: running `echo all good` on " in shown
    assert "[anima] checks: `echo all good` passed in " in shown


@pytest.mark.parametrize("mode", SANDBOXES)
def test_a_stop_during_a_check_ends_it_at_once(project: Path, fake_claude: FakeClaude,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              mode: str) -> None:
    began = outside(tmp_path, fake_claude, monkeypatch) / "began"
    engine = Engine(project, config_overrides={
        "check_command": f"echo $$ > {began}; exec sleep 300", "sandbox": mode})
    engine.start(watch=False)
    try:
        _wait_for(began, "the check never started")
        pids = _check_processes(project)
        assert pids and all(_alive(p) for p in pids)
        started = time.monotonic()
    finally:
        engine.shutdown()
    assert time.monotonic() - started < 8
    assert [p for p in pids if _alive(p)] == []
    assert _check_processes(project) == []
    rec = record(project, "m1")
    assert rec.iterations == []  # the round in flight is redone on the next start
    # The Developer's work stays in the milestone's worktree, kept for the next start.
    assert os.path.exists(project / ".anima" / "worktrees" / "m1" / "features" / "F1.txt")


@pytest.mark.parametrize("mode", SANDBOXES)
def test_a_check_left_running_by_a_killed_anima_is_stopped_by_the_next_start(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, mode: str) -> None:
    """Without the sandbox the check outlives a killed Anima and the next start stops it; in
    the sandbox it cannot outlive it at all (bubblewrap dies with its parent, and takes its
    whole PID namespace along)."""
    began = outside(tmp_path, fake_claude, monkeypatch) / "began"
    project = make_project(git_repo, {"m1": milestone_md("One", ["Alpha"])}, config={
        "check_command": f"test -f {began} && exit 0; echo $$ > {began}; exec sleep 300",
        "sandbox": mode})
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    first = subprocess.Popen([*command, "run", str(project), "--headless"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)
    try:
        _wait_for(began, "the check never started")
        deadline = time.monotonic() + 10
        while not (pids := _check_processes(project)):
            assert time.monotonic() < deadline, "no process of the check found"
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait()
    if mode == "off":
        assert any(_alive(p) for p in pids)  # the check outlived the Anima that ran it
    else:
        deadline = time.monotonic() + 5
        while _check_processes(project):
            assert time.monotonic() < deadline, "the confined check outlived Anima"
            time.sleep(0.05)
    second = anima("run", str(project), "--headless")
    assert second.returncode == 0, second.stdout + second.stderr
    assert [p for p in pids if _alive(p)] == []
    assert _check_processes(project) == []
    if mode == "off":
        assert "leftover tool process" in second.stdout
    assert record(project, "m1").status is MilestoneStatus.COMPLETED
