"""ProjectLock: one Anima per project, real processes as the other holder."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anima.errors import LockError, ProjectError
from anima.lock import LockInfo, ProjectLock

REPO_ROOT = Path(__file__).resolve().parent.parent

HOLDER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from anima.lock import ProjectLock
    lock = ProjectLock(Path(sys.argv[1]), command="anima run demo --headless")
    lock.acquire()
    print("locked", flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    (tmp_path / ".anima").mkdir()
    return tmp_path / ".anima" / "anima.lock"


Spawn = Callable[[], "subprocess.Popen[str]"]


@pytest.fixture
def spawn_holder(lock_path: Path) -> Iterator[Spawn]:
    """Start real processes that acquire the lock and sleep; always reaped at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def spawn() -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER_SCRIPT, str(lock_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the child holds the lock (or dies)
        assert line.strip() == "locked", proc.stderr.read() if proc.stderr else ""
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def dead_pid() -> int:
    """A pid that certainly belonged to a process which has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def record(path: Path) -> dict[str, object]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_acquire_writes_record_and_release_removes_it(lock_path: Path) -> None:
    lock = ProjectLock(lock_path, command="anima run . --headless")
    assert lock.holder() is None
    lock.acquire()
    data = record(lock_path)
    assert data["pid"] == os.getpid()
    assert data["host"] == socket.gethostname()
    assert data["command"] == "anima run . --headless"
    assert str(data["started_at"])[:4].isdigit()
    assert lock.held
    assert lock.holder() == LockInfo(**data)  # type: ignore[arg-type]
    lock.acquire()  # re-acquiring what we hold is a no-op
    lock.release()
    assert not lock_path.exists()
    assert not lock.held
    assert lock.holder() is None
    lock.release()  # twice is harmless
    # Only the permanent flock file stays: no temp files left behind.
    assert list(lock_path.parent.iterdir()) == [lock_path.with_suffix(".flock")]


def test_context_manager_and_reacquire(lock_path: Path) -> None:
    with ProjectLock(lock_path) as lock:
        assert lock.held
        with pytest.raises(LockError, match=f"pid {os.getpid()}"):
            ProjectLock(lock_path).acquire()  # one holder per process, too
    assert not lock_path.exists()
    with ProjectLock(lock_path):
        assert lock_path.exists()


def test_missing_anima_dir_is_a_project_error(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match="does not exist"):
        ProjectLock(tmp_path / ".anima" / "anima.lock").acquire()


def test_live_holder_in_another_process_is_refused(lock_path: Path, spawn_holder: Spawn) -> None:
    proc = spawn_holder()
    lock = ProjectLock(lock_path)
    info = lock.holder()
    assert info is not None and info.pid == proc.pid
    with pytest.raises(LockError) as err:
        lock.acquire()
    message = str(err.value)
    assert f"pid {proc.pid} on {socket.gethostname()}" in message
    assert "`anima run demo --headless`" in message
    assert "stop it first" in message
    assert str(lock_path.parent.parent) in message
    assert not lock.held
    lock.release()  # we hold nothing: must not touch the holder's file
    assert record(lock_path)["pid"] == proc.pid


def test_holder_killed_with_sigkill_is_taken_over(
    lock_path: Path,
    spawn_holder: Spawn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proc = spawn_holder()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert record(lock_path)["pid"] == proc.pid  # the file outlives its holder
    lock = ProjectLock(lock_path)
    assert lock.holder() is None  # the kernel dropped the flock
    with caplog.at_level(logging.WARNING, logger="anima.lock"):
        lock.acquire()
    assert record(lock_path)["pid"] == os.getpid()
    assert lock.taken_over_from is not None and lock.taken_over_from.pid == proc.pid
    assert f"pid {proc.pid}" in caplog.text and "taking over" in caplog.text
    lock.release()


def test_stale_file_with_dead_pid_is_taken_over(lock_path: Path) -> None:
    pid = dead_pid()
    stale = LockInfo(pid=pid, host=socket.gethostname(), started_at="then", command="anima")
    lock_path.write_text(stale.to_json(), encoding="utf-8")
    lock = ProjectLock(lock_path)
    assert lock.holder() is None
    lock.acquire()
    assert lock.taken_over_from == stale
    assert record(lock_path)["pid"] == os.getpid()
    lock.release()


def test_stale_file_naming_a_live_unrelated_pid_is_taken_over(lock_path: Path) -> None:
    """pid reuse after a reboot: the recorded pid lives, but nobody holds the flock."""
    stale = LockInfo(pid=1, host=socket.gethostname(), started_at="then", command="anima")
    lock_path.write_text(stale.to_json(), encoding="utf-8")
    with ProjectLock(lock_path) as lock:
        assert lock.taken_over_from == stale


@pytest.mark.parametrize(
    "garbage",
    ["", "{not json", "[]", '{"pid": "x"}', '{"pid": -4}', "\x00\x01binary\xff"],
)
def test_garbage_lock_file_is_taken_over(lock_path: Path, garbage: str) -> None:
    lock_path.write_text(garbage, encoding="utf-8")
    lock = ProjectLock(lock_path)
    assert lock.holder() is None
    lock.acquire()
    assert lock.taken_over_from is None
    assert record(lock_path)["pid"] == os.getpid()
    lock.release()
    assert not lock_path.exists()


def test_deleting_the_record_does_not_free_the_lock(lock_path: Path) -> None:
    """The record only names the holder; the flock on the permanent file is the lock."""
    lock = ProjectLock(lock_path)
    lock.acquire()
    lock_path.unlink()
    with pytest.raises(LockError, match="names no holder"):
        ProjectLock(lock_path, command="other").acquire()
    assert lock.held
    lock.release()
    with ProjectLock(lock_path, command="other"):
        assert record(lock_path)["command"] == "other"


def test_forked_child_release_keeps_parents_lock(lock_path: Path) -> None:
    lock = ProjectLock(lock_path)
    lock.acquire()
    pid = os.fork()
    if pid == 0:  # child: release must neither unlink nor unlock the shared open file
        try:
            lock.release()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert lock_path.exists() and record(lock_path)["pid"] == os.getpid()
    with pytest.raises(LockError):
        ProjectLock(lock_path).acquire()
    lock.release()


def test_takeover_race_has_one_winner(lock_path: Path) -> None:
    """Several processes race for a stale lock: exactly one wins, the rest name it."""
    stale = LockInfo(pid=dead_pid(), host=socket.gethostname(), started_at="", command="")
    lock_path.write_text(stale.to_json(), encoding="utf-8")
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from anima.errors import LockError
        from anima.lock import ProjectLock
        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
        lock = ProjectLock(Path(sys.argv[1]))
        try:
            lock.acquire()
        except LockError:
            print("refused", flush=True)
            sys.exit(0)
        print("won", flush=True)
        time.sleep(1.5)
        lock.release()
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    start_at = str(time.time() + 1.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(lock_path), start_at],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    outs = [proc.communicate(timeout=20)[0].strip() for proc in procs]
    assert sorted(outs) == ["refused", "refused", "refused", "won"]
    assert not lock_path.exists()
