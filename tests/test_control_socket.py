"""`anima stop|resume|abort|approve PROJECT ID` from a second terminal reach the Anima that runs
the project, over a Unix socket that only this user's processes outside the sandbox reach."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anima import sandbox
from anima.engine.control import ControlServer, send, socket_paths
from anima.errors import ActionError
from anima.loop.confinement import MilestoneSandbox
from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record

ANIMA = shutil.which("anima") or ""


def anima_argv(*args: str) -> list[str]:
    return [*([ANIMA] if ANIMA else [sys.executable, "-m", "anima"]), *args]


def anima(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(anima_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def status(project: Path, milestone_id: str) -> MilestoneStatus | None:
    try:
        return record(project, milestone_id).status
    except Exception:  # not written yet, or being replaced
        return None


class Recorder:
    """A small real handler: remembers what it was asked; refuses an unknown id as the
    engine does (an ActionError naming it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, action: str, milestone_id: str, note: str) -> str:
        self.calls.append((action, milestone_id, note))
        if milestone_id != "m1":
            raise ActionError(f"no milestone {milestone_id!r}")
        return f"{action} {milestone_id}: done"


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime folder of the test's own, as a desktop session's $XDG_RUNTIME_DIR (short, as
    those are: a socket's path holds 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="xdg-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def server(runtime: Path, tmp_path: Path) -> Iterator[tuple[ControlServer, Recorder]]:
    handler = Recorder()
    server = ControlServer(tmp_path / "project", handler)
    server.start()
    yield server, handler
    server.close()


# ------------------------------------------------------------------ the socket itself
def test_a_request_is_answered_and_the_socket_is_private(
        server: tuple[ControlServer, Recorder], runtime: Path, tmp_path: Path) -> None:
    srv, handler = server
    assert srv.path is not None and srv.path.parent == runtime / "anima"
    assert stat.S_IMODE(os.lstat(runtime / "anima").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(srv.path).st_mode) == 0o600
    assert not any((tmp_path / "project").glob("**/*.sock"))  # never under the project
    reply = send(tmp_path / "project", "resume", "m1", "carry on")
    assert reply is not None and reply.ok and reply.message == "resume m1: done"
    assert handler.calls == [("resume", "m1", "carry on")]
    refused = send(tmp_path / "project", "stop", "m9")
    assert refused is not None and not refused.ok and "m9" in refused.message
    srv.close()
    assert not srv.path and not any((runtime / "anima").iterdir())
    assert send(tmp_path / "project", "stop", "m1") is None  # nobody listens any more


def test_garbage_and_a_silent_client_do_not_wedge_the_server(
        server: tuple[ControlServer, Recorder], tmp_path: Path) -> None:
    srv, handler = server
    assert srv.path is not None
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(srv.path))
        raw.sendall(b'{"schema_version": 2, "action": "stop", "id": "m1"}\n')
        answer = json.loads(raw.makefile().readline())
    assert answer["ok"] is False and "schema_version" in answer["message"]
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(srv.path))  # says nothing: dropped after a short timeout
        started = time.monotonic()
        reply = send(tmp_path / "project", "approve", "m1")
        assert reply is not None and reply.ok
        assert time.monotonic() - started < 5
    assert handler.calls == [("approve", "m1", "")]


def test_a_socket_left_by_a_killed_anima_is_replaced(runtime: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    path = socket_paths(project)[0]
    path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as dead:  # bound, then its process died
        dead.bind(str(path))
    assert path.exists() and send(project, "stop", "m1") is None
    handler = Recorder()
    srv = ControlServer(project, handler)
    srv.start()
    try:
        reply = send(project, "stop", "m1")
        assert reply is not None and reply.ok and srv.path == path
    finally:
        srv.close()


@pytest.mark.parametrize("trap", ["symlink", "open to others", "someone else's"])
def test_a_folder_that_is_not_private_is_never_used(runtime: Path, tmp_path: Path,
                                                    trap: str) -> None:
    """Only the folder's owner may create it, or enter it: anything else is refused (not
    fixed) and the socket goes to the next private place."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder = runtime / "anima"
    if trap == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir(mode=0o700)
        if trap == "open to others":
            folder.chmod(0o777)
        else:
            if os.getuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(folder, 65534, 65534)
    srv = ControlServer(tmp_path / "project", Recorder())
    srv.start()
    try:
        assert srv.path is not None and srv.path.parent == Path(f"/tmp/anima-{os.getuid()}")
        assert not any(elsewhere.iterdir()) and not any(folder.iterdir())
        if trap == "open to others":
            assert stat.S_IMODE(folder.stat().st_mode) == 0o777  # not ours to change
        reply = send(tmp_path / "project", "stop", "m1")
        assert reply is not None and reply.ok
    finally:
        srv.close()


# ------------------------------------------------------------------ the sandbox
needs_bwrap = pytest.mark.skipif(sandbox.unavailable() is not None,
                                 reason=str(sandbox.unavailable()))
_APPROVE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(type(e).__name__)
    raise SystemExit(0)
try:
    s.sendall(b'{"schema_version": 1, "action": "approve", "id": "m1"}\\n')
    print(s.makefile("rb").readline().decode().strip() or "no answer")
except (BrokenPipeError, ConnectionResetError):  # the server hung up on it
    print("no answer")
"""


def _approve_from(project: Path, path: Path, confined: bool,
                  shown: tuple[Path, ...] = ()) -> str:
    """What a process gets when it asks the server to approve m1: from outside, or as m1's
    Developer in its sandbox (which is shown `shown` besides the project)."""
    # The interpreter itself, not a venv's link to it (a venv under /tmp is out of sight).
    argv = [os.path.realpath(sys.executable), "-c", _APPROVE, str(path)]
    env = dict(os.environ)
    if confined:
        confine = MilestoneSandbox(ProjectPaths(project), "m1", active=True,
                                   common_dir=project / ".git", visible=shown).confine("developer")
        assert confine is not None
        argv, extra = confine(argv)
        env.update(extra)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def worktree(git_repo: Path) -> Path:
    make_project(git_repo)
    run_git(git_repo, "worktree", "add", "-q", str(git_repo / ".anima" / "worktrees" / "m1"),
            "-b", "milestone/m1")
    return git_repo


@needs_bwrap
@pytest.mark.parametrize("where", ["/tmp", "XDG_RUNTIME_DIR"])
def test_an_agent_in_the_sandbox_cannot_reach_the_socket(
        worktree: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Same user, same network namespace: the socket's folder is out of the Developer's sight,
    or it could approve its own milestone. /tmp is the sandbox's own; a runtime folder outside
    /run/user (here under /var/tmp, which agents otherwise see) is hidden."""
    if where == "/tmp":
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        runtime = Path(tempfile.mkdtemp(prefix="anima-test-runtime-", dir="/var/tmp"))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    handler = Recorder()
    srv = ControlServer(worktree, handler)
    srv.start()
    try:
        assert srv.path is not None
        assert json.loads(_approve_from(worktree, srv.path, confined=False))["ok"] is True
        assert _approve_from(worktree, srv.path, confined=True) == "FileNotFoundError"
        assert handler.calls == [("approve", "m1", "")]
    finally:
        srv.close()
        if where != "/tmp":
            shutil.rmtree(runtime)


@needs_bwrap
def test_a_sandboxed_process_that_sees_the_socket_is_refused_all_the_same(
        worktree: Path, runtime: Path) -> None:
    """Should the folder ever be in sight (a mount Anima did not foresee), a process in a
    sandbox, the same user's, gets no answer: it runs in another pid namespace."""
    handler = Recorder()
    srv = ControlServer(worktree, handler)
    srv.start()
    try:
        assert srv.path is not None
        answer = _approve_from(worktree, srv.path, confined=True, shown=(srv.path.parent,))
        assert answer == "no answer" and handler.calls == []
    finally:
        srv.close()


# ------------------------------------------------------------------ a second terminal
class Headless:
    """`anima run PROJECT --headless --watch` in its own process, as in a first terminal."""

    def __init__(self, project: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(anima_argv("run", str(project), "--headless", "--watch"),
                                     env={**os.environ, **env}, stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._out.close()
        return code


@pytest.fixture
def fake_env(fake_claude: FakeClaude) -> dict[str, str]:
    return {"ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env}


@pytest.fixture
def headless(git_repo: Path, fake_env: dict[str, str],
             tmp_path: Path) -> Iterator[Callable[[], Headless]]:
    started: list[Headless] = []

    def start() -> Headless:
        started.append(Headless(git_repo, fake_env, tmp_path / f"run{len(started)}.log"))
        return started[-1]

    yield start
    for run in started:
        run.stop()


def test_stop_then_resume_from_a_second_terminal_while_anima_runs(
        git_repo: Path, fake_claude: FakeClaude, headless: Callable[[], Headless]) -> None:
    fake_claude.write_script({"developer": [{"hang": True}]})  # a turn in progress
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])})
    run = headless()
    wait_for(lambda: len(fake_claude.prompts("developer")) == 1)

    unknown = anima("stop", str(git_repo), "nope")  # as resume, approve and abort say it
    assert unknown.returncode == 2 and "there is no milestone 'nope'" in unknown.stderr, \
        unknown
    stopped = anima("stop", str(git_repo), "m1")
    assert stopped.returncode == 0, stopped.stderr
    assert "m1" in stopped.stdout
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.PAUSED)
    rec = record(git_repo, "m1")
    assert rec.pause_reason == "stopped by you" and rec.rounds == 0  # its round is redone
    assert run.proc.poll() is None  # the run goes on, waiting

    again = anima("stop", str(git_repo), "m1")  # nothing of m1 runs now
    assert again.returncode == 2 and "m1" in again.stderr, again
    resumed = anima("resume", str(git_repo), "m1", "--note", "carry on gently")
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.COMPLETED)
    assert "carry on gently" in fake_claude.prompts("developer")[1]
    assert run.proc.poll() is None


def test_stop_one_milestone_while_another_goes_on(
        git_repo: Path, fake_claude: FakeClaude, headless: Callable[[], Headless]) -> None:
    # The fake's turns are counted per role: whichever milestone starts first hangs, the other
    # takes its time over its first turn, then both go as they will.
    fake_claude.write_script({"developer": [{"hang": True}, {"auto": True, "delay": 3.0}]})
    make_project(git_repo, {"m1": milestone_md("One", ["Alpha"]),
                            "m2": milestone_md("Two", ["Beta"])},
                 config={"max_parallel_milestones": 2})
    run = headless()
    wait_for(lambda: len(fake_claude.entries("developer")) == 2)
    first = {e["turn"]: Path(e["cwd"]).name for e in fake_claude.entries("developer")}
    hung, other = first[0], first[1]

    stopped = anima("stop", str(git_repo), hung)
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: status(git_repo, hung) is MilestoneStatus.PAUSED)
    assert status(git_repo, other) is MilestoneStatus.IN_PROGRESS  # mid-turn, untouched
    wait_for(lambda: status(git_repo, other) is MilestoneStatus.COMPLETED)
    rec = record(git_repo, hung)
    assert rec.pause_reason == "stopped by you" and rec.rounds == 0
    assert run.proc.poll() is None


def test_stop_before_the_milestone_took_its_first_step_pauses_it(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str],
        tmp_path: Path) -> None:
    """A stop that lands while Anima still reads the CLI's version (a second for some
    versions): the milestone pauses, the others go on, and resume starts it."""
    slow = tmp_path / "slow"  # runs its arguments, slowly when they ask for a version
    slow.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = --version ] && sleep 2; done\n'
                    'exec "$@"\n')
    slow.chmod(0o755)
    make_project(git_repo, {"m1": milestone_md("One", ["Alpha"]),
                            "m2": milestone_md("Two", ["Beta"])},
                 config={"max_parallel_milestones": 2})
    # The fake's whole command line after it: what a sandbox must let the agent see.
    run = Headless(git_repo, {**fake_env, "ANIMA_CLAUDE_COMMAND": f"{slow} {fake_claude.command}"},
                   tmp_path / "run.log")
    try:
        wait_for(lambda: anima("stop", str(git_repo), "m1").returncode == 0)
        wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.PAUSED
                 and status(git_repo, "m2") is MilestoneStatus.COMPLETED, timeout=60)
        assert record(git_repo, "m1").pause_reason == "stopped by you"
        assert "illegal" not in run.output() and run.proc.poll() is None, run.output()
        assert anima("resume", str(git_repo), "m1").returncode == 0
        wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.COMPLETED, timeout=60)
        assert "feat: F1" in run_git(git_repo, "log", "--format=%s", "main")
    finally:
        run.stop()


def test_abort_of_a_running_milestone_is_refused_until_it_is_stopped(
        git_repo: Path, fake_claude: FakeClaude, headless: Callable[[], Headless]) -> None:
    """`anima abort` applies to paused, awaiting_review, pending and failed milestones, and
    refuses an in_progress one when no Anima runs; through the running Anima it stopped and
    cancelled it all the same."""
    fake_claude.write_script({"developer": [{"hang": True}]})
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])})
    run = headless()
    wait_for(lambda: len(fake_claude.prompts("developer")) == 1)
    refused = anima("abort", str(git_repo), "m1")
    assert refused.returncode == 2, refused
    assert f"`anima stop {git_repo} m1`" in refused.stderr  # ready to paste
    assert status(git_repo, "m1") is MilestoneStatus.IN_PROGRESS
    assert anima("stop", str(git_repo), "m1").returncode == 0
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.PAUSED)
    aborted = anima("abort", str(git_repo), "m1")
    assert aborted.returncode == 0, aborted.stderr
    assert status(git_repo, "m1") is MilestoneStatus.CANCELLED
    assert run.proc.poll() is None


def test_approve_and_abort_reach_the_running_anima(
        git_repo: Path, headless: Callable[[], Headless]) -> None:
    review = "---\nrequires_human_review: true\n---\n"
    make_project(git_repo, {"m1": review + milestone_md("One", ["Alpha"]),
                            "m2": review + milestone_md("Two", ["Beta"])})
    run = headless()
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.AWAITING_REVIEW
             and status(git_repo, "m2") is MilestoneStatus.AWAITING_REVIEW, timeout=60)
    assert run.proc.poll() is None

    approved = anima("approve", str(git_repo), "m1")
    assert approved.returncode == 0, approved.stderr
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.COMPLETED)
    assert "feat: F1" in run_git(git_repo, "log", "--format=%s", "main")
    aborted = anima("abort", str(git_repo), "m2")
    assert aborted.returncode == 0, aborted.stderr
    wait_for(lambda: status(git_repo, "m2") is MilestoneStatus.CANCELLED)
    refused = anima("approve", str(git_repo), "m2")
    assert refused.returncode == 2 and "cancelled" in refused.stderr, refused
    assert run.proc.poll() is None


def test_approve_the_moment_the_milestone_awaits_review_is_not_refused(
        git_repo: Path, fake_claude: FakeClaude, headless: Callable[[], Headless]) -> None:
    """`anima status` says awaiting_review as the run hands the milestone over, and the run
    then stops its agents (a CLI takes a moment to write its session file and exit): an
    `anima approve` meanwhile was refused with "m1 is running: stop it first", and `anima
    stop` then said it "got there before the stop". It waits for the run to let go."""
    fake_claude.write_script({"exit_delay": 4})
    make_project(git_repo, {"m1": "---\nrequires_human_review: true\n---\n"
                            + milestone_md("One", ["Alpha"])})
    run = headless()
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.AWAITING_REVIEW, timeout=60)
    approved = anima("approve", str(git_repo), "m1")
    assert approved.returncode == 0, approved.stderr
    assert "approved m1: completed; merged milestone/m1 into main" in approved.stdout
    assert "feat: F1" in run_git(git_repo, "log", "--format=%s", "main")
    assert run.proc.poll() is None


def test_with_no_anima_running_the_commands_act_on_the_files(
        git_repo: Path, fake_claude: FakeClaude, headless: Callable[[], Headless]) -> None:
    """A killed Anima leaves its socket behind: nobody answers on it, so `resume` acts on the
    files as it always did, and `stop` says there is nothing to stop."""
    fake_claude.write_script({"developer": [{"hang": True}]})
    make_project(git_repo, {"m1": milestone_md("M", ["Alpha"])})
    run = headless()
    wait_for(lambda: len(fake_claude.prompts("developer")) == 1)
    stopped = anima("stop", str(git_repo), "m1")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: status(git_repo, "m1") is MilestoneStatus.PAUSED)
    run.proc.kill()
    run.stop()
    assert any(p.exists() for p in socket_paths(git_repo))  # left behind by the kill

    nothing = anima("stop", str(git_repo), "m1")
    assert nothing.returncode == 2 and "nothing to stop" in nothing.stderr, nothing
    unknown = anima("stop", str(git_repo), "nosuch")
    assert unknown.returncode == 2 and "there is no milestone 'nosuch'" in unknown.stderr
    resumed = anima("resume", str(git_repo), "m1")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed m1: in_progress" in resumed.stdout
    assert status(git_repo, "m1") is MilestoneStatus.IN_PROGRESS
    for path in socket_paths(git_repo):  # the next Anima on the project would replace it
        path.unlink(missing_ok=True)


def test_help_lists_stop() -> None:
    shown = anima("--help")
    assert shown.returncode == 0 and "stop" in shown.stdout
    usage = anima("stop")
    assert usage.returncode == 2 and "PROJECT" in usage.stderr.upper()
