"""One persistent `claude -p` process per role: start, turns, interrupt, stop, restart.

The process writes stdout and stderr to two pseudo-terminals (so the CLI behaves as in a
terminal and nothing is block-buffered) and reads turns from a pipe on stdin (with a TTY on
stdin, `claude -p` refuses to start). One reader thread drains both terminals all the time and
publishes typed events, redacted (`anima.agents.redaction`) before anything else sees them; a
stalled reader would deadlock the CLI. The calling thread writes each prompt to stdin without
blocking forever, then waits for the turn's `result`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import logging
import os
import select
import signal
import struct
import subprocess
import termios
import threading
import time
import tty
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path

from anima import procfs
from anima.agents.discovery import ClaudeBinary
from anima.agents.profiles import RoleProfile
from anima.agents.protocol import (
    ERROR_DURING_EXECUTION,
    ContextMeter,
    LineFramer,
    build_argv,
    clean_text,
    interrupt_request,
    parse_line,
    user_message,
)
from anima.agents.redaction import AgentRedactor
from anima.errors import AgentCrashed, AgentError, SessionLost, TurnTimeout
from anima.events import AgentExited, Publisher, RawOutput, SessionStarted, TurnResult

log = logging.getLogger(__name__)

_READ_SIZE = 1 << 16
_STDERR_TAIL_LINES = 40
_POLL_SECONDS = 0.05


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, loaded in the parent: the child between fork and exec may only call it."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True).prctl if name else None
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_anima() -> None:
    """In the child before exec: SIGTERM when Anima dies, even by SIGKILL, so an agent never
    goes on working (committing!) with nobody reading it. Linux only; elsewhere the next
    start stops leftovers (anima.loop.recovery)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _open_raw_pty() -> tuple[int, int]:
    """A pty pair in raw mode: no echo, no `\\n`→`\\r\\n`, no line discipline surprises."""
    master, slave = os.openpty()
    tty.setraw(slave, termios.TCSANOW)
    # A wide terminal, so nothing a terminal-minded program prints gets wrapped.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
    return master, slave


class AgentProcess:
    """Owns one `claude` child: its lifecycle is published on the bus, failures raise AgentError.

    `env` holds variables laid over Anima's own environment (the child inherits Anima's, so
    ANTHROPIC_BASE_URL, keys and proxies reach it); `CLAUDECODE` is always removed, else the CLI
    refuses to start inside another Claude Code session. `marker` (see `anima.procfs`) tags
    the child and everything it starts, so stopping the agent stops all of that too.
    """

    def __init__(
        self,
        role: str,
        binary: ClaudeBinary,
        profile: RoleProfile,
        cwd: Path,
        bus: Publisher,
        *,
        session_id: str,
        resume: bool = False,
        session_model: str | None = None,
        turn_timeout: float,
        idle_timeout: float,
        env: dict[str, str] | None = None,
        marker: str | None = None,
        interrupt_grace: float = 3.0,
    ) -> None:
        self.role = role
        self.binary = binary
        self.profile = profile
        self.cwd = Path(cwd)
        self.bus = bus
        self.turn_timeout = turn_timeout
        self.idle_timeout = idle_timeout
        self.interrupt_grace = interrupt_grace
        self._session_id = session_id
        self._resume = resume
        self._session_model = session_model  # what the session's system/init reported
        self._env_overrides = dict(env or {})
        self._marker = marker

        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._out_fd: int | None = None
        self._err_fd: int | None = None
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._reader: threading.Thread | None = None

        self._cond = threading.Condition()
        self._results: deque[TurnResult] = deque()
        self._eof = False
        self._last_activity = 0.0
        self._stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        self._cost_total = 0.0  # the process's last `total_cost_usd`
        self._redact = AgentRedactor()
        self._meter = ContextMeter()

        self._turn_lock = threading.Lock()
        self._stdin_lock = threading.Lock()
        self._turn_active = threading.Event()
        self._turn_done = threading.Event()
        self._interrupt_sent = False
        self._turns_sent = 0
        self._stopping = False
        self._exit_published = False

    # --- properties -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def resumed(self) -> bool:
        return self._resume

    @property
    def stderr_tail(self) -> str:
        with self._cond:
            return "\n".join(self._stderr_tail)

    def argv(self) -> list[str]:
        """The exact command line `start()` runs (also shown to users when it fails)."""
        return build_argv(
            self.binary.argv, self.profile.config, session_id=self._session_id,
            resume=self._resume, system_prompt=self.profile.system_prompt,
            session_model=self._session_model,
        )

    def child_env(self) -> dict[str, str]:
        env = {**os.environ, **self._env_overrides}
        env.pop("CLAUDECODE", None)
        if self._marker is not None:
            env[procfs.AGENT_VAR] = self._marker
        return env

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the CLI in its own session (so one signal reaches it and all its tools)."""
        if self.alive:
            raise AgentError(f"{self.role} agent is already running (pid {self.pid})")
        self._reset_state()
        out_master, out_slave = _open_raw_pty()
        err_master, err_slave = _open_raw_pty()
        try:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.PIPE,
                stdout=out_slave,
                stderr=err_slave,
                cwd=self.cwd,
                env=self.child_env(),
                start_new_session=True,
                close_fds=True,
                # The signal follows the thread that forks: the engine's worker (or the
                # headless main thread), which lives as long as the agents it drives.
                preexec_fn=_die_with_anima,
            )
        except OSError as e:
            for fd in (out_master, out_slave, err_master, err_slave):
                os.close(fd)
            raise AgentCrashed(f"{self.role} agent could not start: {e}", None, "") from e
        finally:
            # The child holds its own copies; ours would keep the terminals open past its exit.
            for fd in (out_slave, err_slave):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pgid = self._proc.pid  # start_new_session: the child leads its own group
        self._out_fd, self._err_fd = out_master, err_master
        self._wake_r, self._wake_w = os.pipe()
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._last_activity = time.monotonic()
        self._reader = threading.Thread(
            target=self._read_loop, name=f"agent-{self.role}-reader", daemon=True
        )
        self._reader.start()
        log.info("%s agent started: pid %s, session %s%s", self.role, self._proc.pid,
                 self._session_id, " (resume)" if self._resume else "")

    def _reset_state(self) -> None:
        with self._cond:
            self._results.clear()
            self._eof = False
            self._stderr_tail.clear()
        self._cost_total = 0.0
        self._redact = AgentRedactor()
        self._meter = ContextMeter()
        self._turns_sent = 0
        self._stopping = False
        self._exit_published = False
        self._interrupt_sent = False

    def stop(self, grace: float = 5.0) -> None:
        """End the process in steps and reap it: close stdin, wait, SIGTERM, wait, SIGKILL.

        Closing stdin lets the CLI finish writing its session file (resuming needs it); the
        signals go to the whole process group so no tool the agent started is left behind.
        """
        proc = self._proc
        if proc is None:
            return
        self._stopping = True
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if not self._wait(proc, grace):
            self._signal_group(signal.SIGTERM)
            if not self._wait(proc, grace):
                self._signal_group(signal.SIGKILL)
                self._wait(proc, 10.0)
        self._kill_stragglers()
        self._close_reader()
        self._publish_exit(expected=True)
        log.info("%s agent stopped (exit %s)", self.role, proc.returncode)

    def restart(self) -> None:
        """Stop, then start again on the same session id and cwd with `--resume`."""
        self.stop()
        self._resume = True
        self.start()

    def _wait(self, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        try:
            proc.wait(timeout=max(timeout, 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._pgid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, sig)

    def _group_alive(self) -> bool:
        """Whether any member of the child's process group still runs (zombies don't count:
        orphans are reaped by init, which may take a moment)."""
        if self._pgid is None:
            return False
        try:
            os.killpg(self._pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return bool(procfs.group_members(self._pgid))

    def _kill_stragglers(self) -> None:
        """Tools the agent left running go with it: those in its group, and (the CLI runs
        each Bash call in a session of its own) every process that carries its marker."""
        if self._group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + 1.0
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._group_alive():
                self._signal_group(signal.SIGKILL)
        if self._marker is not None and (left := procfs.stop_marked(self._marker, grace=1.0)):
            log.info("%s agent: stopped %d process(es) it left running (pids %s)", self.role,
                     len(left), ", ".join(map(str, left)))

    def _close_reader(self) -> None:
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

    def _publish_exit(self, expected: bool) -> None:
        with self._cond:
            if self._exit_published:
                return
            self._exit_published = True
        code = self._proc.returncode if self._proc is not None else None
        self.bus.publish(AgentExited(role=self.role, exit_code=code,
                                     stderr_tail=self.stderr_tail, expected=expected))

    # --- reader thread --------------------------------------------------------------------

    def _read_loop(self) -> None:
        """Drain stdout and stderr until both close; never blocks on anything but select."""
        out_fd, err_fd, wake = self._out_fd, self._err_fd, self._wake_r
        assert out_fd is not None and err_fd is not None and wake is not None
        framers = {out_fd: LineFramer(), err_fd: LineFramer()}
        open_fds = {out_fd, err_fd}
        try:
            while open_fds:
                ready, _, _ = select.select([*open_fds, wake], [], [])
                if wake in ready:
                    break
                for fd in ready:
                    try:
                        data = os.read(fd, _READ_SIZE)
                    except OSError as e:
                        if e.errno != errno.EIO:  # EIO: the child closed its end of the pty
                            log.warning("%s agent: read failed: %s", self.role, e)
                        data = b""
                    if not data:
                        open_fds.discard(fd)
                        tail = framers[fd].flush()
                        if tail:
                            self._on_line(fd == out_fd, tail)
                        continue
                    with self._cond:
                        self._last_activity = time.monotonic()
                    for line in framers[fd].feed(data):
                        self._on_line(fd == out_fd, line)
        except Exception:  # a reader that dies silently would hang every later turn
            log.exception("%s agent reader failed", self.role)
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()
        self._note_unexpected_exit()

    def _note_unexpected_exit(self) -> None:
        """Output closed without stop(): if the process is gone, say so on the bus at once
        (a death between turns would otherwise surface only at the next send)."""
        proc = self._proc
        if proc is None or self._stopping:
            return
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return
        if not self._stopping:
            self._publish_exit(expected=False)

    def _on_line(self, is_stdout: bool, line: bytes) -> None:
        if is_stdout:
            events = parse_line(self.role, line, self._meter)
        else:
            text = clean_text(line.decode("utf-8", errors="replace")).rstrip()
            events = [RawOutput(role=self.role, text=text)] if text.strip() else []
        for event in events:
            event = self._redact(event, "stdout" if is_stdout else "stderr")
            if isinstance(event, TurnResult):
                event = self._with_turn_cost(event)
            if isinstance(event, RawOutput):
                with self._cond:
                    self._stderr_tail.append(event.text[-2000:])
            elif isinstance(event, SessionStarted) and event.model:
                self._session_model = event.model
            elif isinstance(event, TurnResult) and event.stopped and not self._asked_to_stop():
                # An interrupt's result that came after its turn had ended: it must not
                # close the next turn.
                log.info("%s agent: ignored a late interrupted result", self.role)
                continue
            self.bus.publish(event)
            if isinstance(event, TurnResult):
                with self._cond:
                    self._results.append(event)
                    self._cond.notify_all()

    def _with_turn_cost(self, result: TurnResult) -> TurnResult:
        """Fill in what the turn spent: `total_cost_usd` is cumulative for the process.

        2.1.330 states the spend itself (`model_usage_since_last_result`; after --resume its
        total carries on from the earlier process). 2.1.197 does not, and after --resume its
        total starts again from 0: the spend is the rise since this process's previous result,
        or the whole total when it fell (a restart from 0).
        """
        previous, self._cost_total = self._cost_total, result.cost_usd
        if result.turn_cost_usd is not None:
            return result
        spent = result.cost_usd - previous if result.cost_usd >= previous else result.cost_usd
        return dataclasses.replace(result, turn_cost_usd=spent)

    def _asked_to_stop(self) -> bool:
        """Whether the turn in flight was interrupted (only then is a stopped result its)."""
        return self._turn_active.is_set() and self._interrupt_sent

    # --- turns ----------------------------------------------------------------------------

    def send(self, prompt: str) -> TurnResult:
        """Run one turn and return its result; raises TurnTimeout, AgentCrashed or SessionLost.

        After a timeout the turn is interrupted; if the CLI answers within `interrupt_grace`
        the process stays usable, otherwise it is stopped (check `alive`).
        """
        if not self._turn_lock.acquire(blocking=False):
            raise AgentError(f"{self.role} agent: a turn is already in flight")
        try:
            self._turn_done.clear()
            self._interrupt_sent = False
            self._turn_active.set()
            first_turn = self._turns_sent == 0
            self._turns_sent += 1
            result = self._run_turn(prompt)
            if (self._resume and first_turn and result.subtype == ERROR_DURING_EXECUTION
                    and not self._interrupt_sent):
                raise SessionLost(
                    f"{self.role} session {self._session_id} could not be resumed "
                    f"(the CLI answered {result.subtype!r}: {result.text or 'no detail'}); "
                    "start a fresh session"
                )
            return result
        finally:
            self._turn_active.clear()
            self._turn_done.set()
            self._turn_lock.release()

    def _run_turn(self, prompt: str) -> TurnResult:
        started = time.monotonic()
        deadline = started + self.turn_timeout
        with self._cond:
            self._last_activity = started
            if self._results:  # e.g. a failed --resume answers before any input arrives
                return self._results.popleft()
        if self._proc is None:
            raise AgentCrashed(f"{self.role} agent is not started", None, "")
        outcome = self._write(user_message(prompt), deadline)
        if isinstance(outcome, TurnResult):
            return outcome
        if outcome == "timeout":
            self._abort_turn()
            raise TurnTimeout(f"{self.role} agent did not read its prompt in "
                              f"{self.turn_timeout:g}s")
        if outcome == "dead":
            return self._on_crash()
        while True:
            with self._cond:
                if self._results:
                    return self._results.popleft()
                now = time.monotonic()
                idle_for = now - self._last_activity
                if now >= deadline:
                    timeout = TurnTimeout(
                        f"{self.role} turn exceeded {self.turn_timeout:g}s", idle=False)
                    break
                if idle_for >= self.idle_timeout:
                    timeout = TurnTimeout(
                        f"{self.role} agent produced no output for {self.idle_timeout:g}s",
                        idle=True)
                    break
                if self._eof or self._proc.poll() is not None:
                    crashed = True
                else:
                    crashed = False
                    self._cond.wait(_POLL_SECONDS)
            if crashed:
                return self._on_crash()
        self._abort_turn()
        raise timeout

    def _write(self, data: bytes, deadline: float) -> str | TurnResult:
        """Write all of `data` to stdin; never block past the deadline or the child's death.

        Returns "ok", "timeout", "dead", or the result the child wrote before it stopped
        reading (a failed --resume answers and exits at once).
        """
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        fd = proc.stdin.fileno()
        view = memoryview(data)
        with self._stdin_lock:
            while view:
                with self._cond:
                    if self._results:
                        return self._results.popleft()
                if proc.poll() is not None:
                    return "dead"
                if time.monotonic() >= deadline:
                    return "timeout"
                _, writable, _ = select.select([], [fd], [], _POLL_SECONDS)
                if not writable:
                    continue
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the child is gone
                    return "dead"
        return "ok"

    def _on_crash(self) -> TurnResult:
        """The process died mid-turn: return a result it managed to write, else raise."""
        proc = self._proc
        assert proc is not None
        self._wait(proc, 2.0)
        # Let the reader drain what the process wrote before dying (a last result, a trace).
        with self._cond:
            self._cond.wait_for(lambda: self._eof or bool(self._results), timeout=1.0)
            if self._results:
                return self._results.popleft()
        if proc.poll() is None:  # output closed but still running: treat as dead
            self._signal_group(signal.SIGKILL)
            self._wait(proc, 5.0)
        self._kill_stragglers()
        self._close_reader()
        self._publish_exit(expected=False)
        raise AgentCrashed(
            f"{self.role} agent exited with code {proc.returncode} during a turn",
            proc.returncode, self.stderr_tail,
        )

    def _abort_turn(self) -> None:
        """Interrupt the stuck turn; stop the process if it does not answer in time."""
        if self.alive:
            with contextlib.suppress(AgentError, OSError):
                self._send_control(interrupt_request(f"anima_{uuid.uuid4().hex[:12]}"))
            with self._cond:
                got = self._cond.wait_for(lambda: bool(self._results) or self._eof,
                                          timeout=self.interrupt_grace)
                if got and self._results:
                    self._results.popleft()  # the interrupted turn's own result
                    return
        log.warning("%s agent did not answer an interrupt; stopping it", self.role)
        self.stop(grace=0.5)

    def _send_control(self, data: bytes) -> None:
        """Write one control line; waits for a prompt being written so lines never interleave."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            raise AgentError(f"{self.role} agent is not running")
        self._interrupt_sent = True
        fd = proc.stdin.fileno()
        view = memoryview(data)
        deadline = time.monotonic() + 2.0
        if not self._stdin_lock.acquire(timeout=self.turn_timeout):
            raise AgentError(f"{self.role} agent: stdin is blocked")
        try:
            while view and time.monotonic() < deadline:
                _, writable, _ = select.select([], [fd], [], _POLL_SECONDS)
                if writable:
                    try:
                        view = view[os.write(fd, view):]
                    except BlockingIOError:
                        continue
        finally:
            self._stdin_lock.release()

    def interrupt(self, timeout: float = 10.0) -> None:
        """Abort the running turn (if any) and wait until that turn's `result` arrived.

        The turn's `send()` returns the interrupted result (subtype error_during_execution).
        """
        if not self._turn_active.is_set() or not self.alive:
            return
        self._send_control(interrupt_request(f"anima_{uuid.uuid4().hex[:12]}"))
        self._turn_done.wait(timeout)
