"""One agent CLI process: start, a reader thread that frames its output into lines, a stop
in steps (stdin closed, SIGTERM, SIGKILL, then whatever it left running), and how it ended
(`ProcessOutcome`, as qutebrowser's). Nothing here knows a wire format or a turn: that is the
dialect's and `anima.agents.process`'s.

The process writes stdout and stderr to Unix sockets and reads from a pipe on stdin (with a
TTY on stdin, `claude -p` refuses to start). Not terminals, nor pipes: a tool the agent runs
(the Developer's code, run by the Acceptor) can reopen its CLI's terminal or pipe through
`/proc/<cli>/fd/1` and write a turn's result of its own, a verdict the Acceptor never gave; a
socket cannot be reopened that way. Node and Codex write to a socket at once, line by line,
as to a terminal. The reader drains both all the time: a stalled reader would deadlock the CLI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from anima import procfs
from anima.errors import AgentCrashed
from anima.libc import LIBC

log = logging.getLogger(__name__)

_READ_SIZE = 1 << 16


_PR_SET_PDEATHSIG = 1


def _die_with_anima() -> None:
    """In the child before exec: SIGTERM when Anima dies, even by SIGKILL, so an agent never
    goes on working (committing!) with nobody reading it. Linux only; elsewhere the next
    start stops leftovers (anima.loop.recovery)."""
    if LIBC is not None:
        LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _open_stream() -> tuple[int, int]:
    """(Anima's end, the child's end) of one output stream: a socket pair, whose child end
    no other process can open again (`open` of `/proc/<pid>/fd/N` on a socket fails)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.shutdown(socket.SHUT_WR)
    theirs.shutdown(socket.SHUT_RD)
    return ours.detach(), theirs.detach()


#: The longest line kept (the CLI's own lines stay far below: an image it read is a few MB).
MAX_LINE_BYTES = 32 << 20


class LineFramer:
    """Splits a byte stream into lines on `\\n` only, whatever the read boundaries.

    Bytes are joined once per completed line, so a multi-MB line arriving in 64 KB reads costs
    linear time, not quadratic. A line over `limit` is not kept: a CLI that printed a
    gigabyte without a newline would otherwise have it sit in Anima's memory, several times
    over once parsed. A short note stands in its place.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._limit = limit
        self._dropped = 0  # bytes of the current line over the limit, thrown away

    def feed(self, data: bytes) -> list[bytes]:
        """Return the lines completed by `data` (without their `\\n`; a trailing `\\r` kept)."""
        lines: list[bytes] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self._add(data[start:nl])
            lines.append(self._take())
            start = nl + 1
        if start < len(data):
            self._add(data[start:])
        return lines

    def flush(self) -> bytes | None:
        """The unterminated tail at end of stream, if any."""
        return self._take() if self._parts or self._dropped else None

    @property
    def pending_bytes(self) -> int:
        return self._size

    def _add(self, part: bytes) -> None:
        if self._dropped or self._size + len(part) > self._limit:
            self._dropped += self._size + len(part)
            self._parts.clear()
            self._size = 0
        elif part:
            self._parts.append(part)
            self._size += len(part)

    def _take(self) -> bytes:
        if self._dropped:
            line = (f"(Anima dropped a line of {self._dropped:,} bytes here: over its limit of "
                    f"{self._limit:,})").encode()
        else:
            line = b"".join(self._parts)
        self._parts.clear()
        self._size = self._dropped = 0
        return line


@dataclass(frozen=True)
class ProcessOutcome:
    """How an agent process ended: its exit code, whether Anima asked it to stop, and the end
    of what it said on stderr (what a user needs to see why it died)."""

    exit_code: int | None
    expected: bool
    stderr_tail: str

    @property
    def reason(self) -> str:
        if self.expected:
            return "stopped by Anima"
        if self.exit_code is None:
            return "output closed"
        if self.exit_code < 0:
            return f"killed by signal {-self.exit_code}"
        return f"exited with code {self.exit_code}"


#: (is_stdout, line) for each complete line the process wrote. It returns when (monotonic
#: time) what its owner holds back of the lines so far, waiting for more, must go out; None
#: while it holds nothing (see `PtyProcess`).
LineHandler = Callable[[bool, bytes], float | None]


def _child_setup(before_exec: Callable[[], None] | None) -> Callable[[], None]:
    if before_exec is None:
        return _die_with_anima

    def both() -> None:
        _die_with_anima()
        before_exec()
    return both


class PtyProcess:
    """Owns one child process and its reader thread. `cond` is shared with the owner: the
    reader sets `eof` and `last_activity` under it and notifies it. When `on_line` holds
    output back, the reader calls `on_quiet(False)` at the time it asked for (which returns
    the next such time, like `on_line`), and `on_quiet(True)` when output ends: what was held
    then goes out as it is."""

    def __init__(self, name: str, cond: threading.Condition, on_line: LineHandler,
                 on_quiet: Callable[[bool], float | None], on_died: Callable[[], None],
                 marker: str | None = None) -> None:
        self.name = name
        self.cond = cond
        self._on_line = on_line
        self._on_quiet = on_quiet
        self._on_died = on_died
        self.marker = marker
        self.proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._out_fd: int | None = None
        self._err_fd: int | None = None
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._reader: threading.Thread | None = None
        self.eof = False
        self.last_activity = 0.0
        self.stopping = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, argv: list[str], cwd: Path, env: dict[str, str],
              before_exec: Callable[[], None] | None = None) -> None:
        """Spawn the process in its own session (so one signal reaches it and all its tools);
        its child runs `before_exec` last before exec (`anima.sandbox.before_exec`)."""
        with self.cond:
            self.eof = False
        self.stopping = False
        out_master, out_slave = _open_stream()
        err_master, err_slave = _open_stream()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out_slave,
                stderr=err_slave,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                # The signal follows the thread that forks: the engine's worker (or the
                # headless main thread), which lives as long as the agents it drives.
                preexec_fn=_child_setup(before_exec),
            )
        except (OSError, subprocess.SubprocessError) as e:  # the latter: `before_exec` failed
            for fd in (out_master, out_slave, err_master, err_slave):
                os.close(fd)
            raise AgentCrashed(f"{self.name} agent could not start: {e}", None, "") from e
        finally:
            # The child holds its own copies; ours would keep the streams open past its exit.
            for fd in (out_slave, err_slave):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pgid = self.proc.pid  # start_new_session: the child leads its own group
        self._out_fd, self._err_fd = out_master, err_master
        self._wake_r, self._wake_w = os.pipe()
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.last_activity = time.monotonic()
        self._reader = threading.Thread(
            target=self._read_loop, name=f"agent-{self.name}-reader", daemon=True
        )
        self._reader.start()

    def stop(self, grace: float) -> None:
        """End the process in steps and reap it: close stdin, wait, SIGTERM, wait, SIGKILL.

        Closing stdin lets the CLI finish writing its session file (resuming needs it); the
        signals go to the whole process group so no tool the agent started is left behind.
        """
        proc = self.proc
        if proc is None:
            return
        self.stopping = True
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if not self.wait(grace):
            self.signal_group(signal.SIGTERM)
            if not self.wait(grace):
                self.signal_group(signal.SIGKILL)
                self.wait(10.0)
        self.kill_stragglers()
        self.close_reader()

    def wait(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=max(timeout, 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False

    def signal_group(self, sig: signal.Signals) -> None:
        if self._pgid is not None:
            procfs.signal_group(self._pgid, sig)

    def kill_stragglers(self) -> None:
        """Tools the agent left running go with it: those in its group, and (the CLI runs
        each Bash call in a session of its own) every process that carries its marker."""
        if self._pgid is not None:
            procfs.stop_process_group(self._pgid, grace=1.0)
        if self.marker is not None and (left := procfs.stop_marked(self.marker, grace=1.0)):
            log.info("%s agent: stopped %d process(es) it left running (pids %s)", self.name,
                     len(left), ", ".join(map(str, left)))

    def close_reader(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5.0)
        for name in ("_out_fd", "_err_fd", "_wake_r", "_wake_w"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
        self._reader = None

    def _read_loop(self) -> None:
        """Drain stdout and stderr until both close; never blocks on anything but select."""
        out_fd, err_fd, wake = self._out_fd, self._err_fd, self._wake_r
        assert out_fd is not None and err_fd is not None and wake is not None
        framers = {out_fd: LineFramer(), err_fd: LineFramer()}
        open_fds = {out_fd, err_fd}
        held_until: float | None = None  # when what the owner holds back must go out
        try:
            while open_fds:
                wait = None if held_until is None else max(0.0, held_until - time.monotonic())
                ready, _, _ = select.select([*open_fds, wake], [], [], wait)
                if wake in ready:
                    break
                for fd in ready:
                    try:
                        data = os.read(fd, _READ_SIZE)
                    except OSError as e:
                        log.warning("%s agent: read failed: %s", self.name, e)
                        data = b""
                    if not data:
                        open_fds.discard(fd)
                        tail = framers[fd].flush()
                        if tail:
                            held_until = self._on_line(fd == out_fd, tail)
                        continue
                    with self.cond:
                        self.last_activity = time.monotonic()
                    for line in framers[fd].feed(data):
                        held_until = self._on_line(fd == out_fd, line)
                if held_until is not None and time.monotonic() >= held_until:
                    held_until = self._on_quiet(False)
            self._on_quiet(True)  # output ended, or Anima stopped reading it: nothing stays held
        except Exception:  # a reader that dies silently would hang every later turn
            log.exception("%s agent reader failed", self.name)
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()
        self._note_unexpected_exit()

    def _note_unexpected_exit(self) -> None:
        """Output closed without stop(): if the process is gone, say so at once (a death
        between turns would otherwise surface only at the next send)."""
        proc = self.proc
        if proc is None or self.stopping:
            return
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return
        if not self.stopping:
            self._on_died()
