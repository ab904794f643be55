"""One persistent agent process per role, in turns: send a prompt, wait for its result (with
a turn timeout and an idle timeout), interrupt, stop, restart.

The process itself (ptys, the reader thread, stopping in steps) is `anima.agents.transport`;
its wire format is the backend's `Dialect` (one `Conversation` per process). Each line the reader
frames is parsed into typed events, redacted (`anima.text.redact`) before anything else
sees them. The calling thread writes each prompt to stdin without blocking forever, then waits
for the turn's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from pathlib import Path

from anima import procfs, sandbox
from anima.agents.dialect import AgentBinary, Conversation, Dialect, RoleProfile, clean_text
from anima.agents.transport import ProcessOutcome, PtyProcess
from anima.credentials import inherited
from anima.errors import AgentCrashed, AgentError, SessionLost, TurnTimeout
from anima.events import (
    TURN_WORK,
    AgentExited,
    Event,
    Publisher,
    RawOutput,
    SessionStarted,
    TurnResult,
)
from anima.git_options import AGENT_GIT_ENV
from anima.text.redact import AgentRedactor

log = logging.getLogger(__name__)

_STDERR_TAIL_LINES = 40
_POLL_SECONDS = 0.05


class AgentProcess:
    """Owns one agent CLI child: its lifecycle is published on the bus, failures raise AgentError.

    `env` holds variables laid over Anima's own environment (the child inherits Anima's, so
    ANTHROPIC_BASE_URL and proxies reach it), without its credentials (`anima.credentials`)
    but those named in `keep` (its CLI's own login, config `pass_env`); `CLAUDECODE` is always
    removed, else the CLI refuses to start inside another Claude Code session. `marker` (see
    `anima.procfs`) tags the child and everything it starts, so stopping the agent stops all
    of that too.
    """

    def __init__(
        self,
        role: str,
        binary: AgentBinary,
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
        keep: Collection[str] = (),
        marker: str | None = None,
        interrupt_grace: float = 3.0,
        dialect: Dialect,
        confine: Callable[[list[str]], tuple[list[str], dict[str, str]]] | None = None,
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
        self._keep = frozenset(keep)
        self._marker = marker
        self._confine = confine  # wraps the whole CLI in its sandbox (`anima.sandbox`)
        self.dialect = dialect

        self._cond = threading.Condition()
        self._io = PtyProcess(role, self._cond, self._on_line, self._on_quiet,
                              lambda: self._publish_exit(expected=False), marker)
        self._results: deque[TurnResult] = deque()
        # Results no turn took (an interrupted turn's, a late one): spent all the same.
        self._unclaimed: list[TurnResult] = []
        self._stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        self._cost_total = 0.0  # the process's last `total_cost_usd`
        self._redact = AgentRedactor()
        self._conv = self._conversation()
        self._opened = threading.Event()  # its opening answered (a session started)

        self._turn_lock = threading.Lock()
        self._stdin_lock = threading.Lock()
        self._turn_active = threading.Event()
        self._turn_done = threading.Event()
        self._interrupt_sent = False
        self._turns_sent = 0
        self._held: list[procfs.Held] = []  # stopped between turns (see `_hold`)
        self._hold_lock = threading.Lock()  # `stop` (another thread) vs. a turn's end
        self._stopping = False
        self._exit_published = False
        self.outcome: ProcessOutcome | None = None  # how the last process ended

    # --- properties -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._io.pid

    @property
    def alive(self) -> bool:
        return self._io.alive

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
        return self.dialect.argv(
            self.binary.argv, self.profile.config, session_id=self._session_id,
            resume=self._resume, system_prompt=self.profile.system_prompt,
            session_model=self._session_model,
        )

    def child_env(self) -> dict[str, str]:
        env = {**inherited(self._keep), **AGENT_GIT_ENV, **self._env_overrides}
        env.pop("CLAUDECODE", None)  # an override may name it too
        if self._marker is not None:
            env[procfs.AGENT_VAR] = self._marker
        return env

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the CLI in its own session (so one signal reaches it and all its tools)."""
        if self.alive:
            raise AgentError(f"{self.role} agent is already running (pid {self.pid})")
        self._reset_state()
        argv, env = self.argv(), self.child_env()
        before_exec = None
        if self._confine is not None:
            argv, extra = self._confine(argv)
            env.update(extra)
            before_exec = sandbox.before_exec()
        self._io.start(argv, self.cwd, env, before_exec)
        self._open()
        log.info("%s agent started: pid %s, session %s%s", self.role, self._io.pid,
                 self._session_id, " (resume)" if self._resume else "")

    def _open(self) -> None:
        """Write the conversation's opening (a JSON-RPC handshake) and wait until the session
        started, so its id is known before any turn; a CLI that answers the opening with a
        result (a resume that failed) leaves it for the first turn."""
        opening = self._conv.opening()
        if not opening:
            return
        deadline = time.monotonic() + self.idle_timeout
        written = self._write(opening, deadline)
        with self._cond:
            if isinstance(written, TurnResult):
                self._results.appendleft(written)
            opened = self._cond.wait_for(
                lambda: self._opened.is_set() or bool(self._results) or self._io.eof,
                timeout=max(0.0, deadline - time.monotonic()))
        if not opened:
            self.stop(grace=0.5)
            raise AgentCrashed(f"{self.role} agent did not open its session in "
                               f"{self.idle_timeout:g}s", None, self.stderr_tail)

    def _conversation(self) -> Conversation:
        return self.dialect.conversation(
            self.role, session_id=self._session_id, resume=self._resume,
            system_prompt=self.profile.system_prompt, role_config=self.profile.config)

    def _reset_state(self) -> None:
        with self._cond:
            self._results.clear()
            self._stderr_tail.clear()
        self._cost_total = 0.0
        self._redact = AgentRedactor()
        self._conv = self._conversation()
        self._opened.clear()
        self._turns_sent = 0
        self._exit_published = False
        self._interrupt_sent = False
        self._stopping = False
        self._went_on = False
        self._held_still = True

    def stop(self, grace: float = 5.0) -> None:
        """End the process in steps and reap it (see `PtyProcess.stop`)."""
        proc = self._io.proc
        if proc is None:
            return
        with self._hold_lock:  # held processes would only take SIGKILL
            self._stopping = True
            self._release()
        self._io.stop(grace)
        self._settle()
        self._publish_exit(expected=True)
        log.info("%s agent stopped (exit %s)", self.role, proc.returncode)

    def restart(self) -> None:
        """Stop, then start again on the same session id and cwd with `--resume`."""
        self.stop()
        self._resume = True
        self.start()

    def _publish_exit(self, expected: bool) -> None:
        with self._cond:
            if self._exit_published:
                return
            self._exit_published = True
        proc = self._io.proc
        self.outcome = outcome = ProcessOutcome(
            exit_code=proc.returncode if proc is not None else None, expected=expected,
            stderr_tail=self.stderr_tail)
        self.bus.publish(AgentExited(role=self.role, exit_code=outcome.exit_code,
                                     stderr_tail=outcome.stderr_tail, expected=expected))

    # --- output ---------------------------------------------------------------------------

    def _on_line(self, is_stdout: bool, line: bytes) -> float | None:
        if is_stdout:
            events = self._conv.parse(line)
            if replies := self._conv.replies():  # not from the reader: stdin may be busy
                threading.Thread(target=self._reply, args=(replies,), daemon=True,
                                 name=f"anima-{self.role}-reply").start()
        else:
            text = clean_text(line.decode("utf-8", errors="replace")).rstrip()
            events = [RawOutput(role=self.role, text=text)] if text.strip() else []
        for event in events:
            for ready in self._redact(event, "stdout" if is_stdout else "stderr"):
                self._take(ready)
        return self._redact.due

    def _on_quiet(self, ended: bool) -> float | None:
        """No more output came in time to finish a known value in a held line (or none will
        come: output `ended`): pass it on as it is."""
        for event in self._redact.release(None if ended else time.monotonic()):
            self._take(event)
        return self._redact.due

    def _take(self, event: Event) -> None:
        """Pass on one redacted event (the reader's thread)."""
        if isinstance(event, TurnResult):
            event = self._with_turn_cost(event)
        if isinstance(event, RawOutput):
            with self._cond:
                self._stderr_tail.append(event.text[-2000:])
        elif isinstance(event, SessionStarted):
            event = dataclasses.replace(event, cli=self.binary.version)
            self._session_model = event.model or self._session_model
            if event.session_id:  # the id a CLI that names its own sessions chose
                self._session_id = event.session_id
            self._opened.set()
            with self._cond:
                self._cond.notify_all()
        elif isinstance(event, TurnResult) and event.stopped and not self._asked_to_stop():
            # An interrupt's result that came after its turn had ended: it must not
            # close the next turn.
            log.info("%s agent: ignored a late interrupted result", self.role)
            with self._cond:
                self._unclaimed.append(event)
            return
        if isinstance(event, TURN_WORK) and self._turns_sent and not self._turn_active.is_set():
            if not self._went_on:
                log.warning("%s agent: went on working after its turn had ended", self.role)
            self._went_on = True
            if isinstance(event, TurnResult):
                # It would answer the next prompt before it is sent; unconfined, another
                # agent can write it (the Developer an ACCEPTED into the Acceptor's).
                log.warning("%s agent: a result outside any turn, not taken", self.role)
                with self._cond:
                    self._unclaimed.append(event)
                return
        self.bus.publish(event)
        if isinstance(event, TurnResult):
            with self._cond:
                self._results.append(event)
                self._cond.notify_all()

    def _settle(self) -> None:
        """What the process spent in a turn it did not finish (its reader is done): no
        result carries it, yet it counts (`take_unclaimed`)."""
        if (spent := self._conv.unsettled()) is not None:
            spent = self._with_turn_cost(spent)
            with self._cond:
                self._unclaimed.append(spent)

    def take_unclaimed(self) -> list[TurnResult]:
        """The results no turn took since the last call (a timed-out turn's, one that came
        after its turn): what they spent counts all the same."""
        with self._cond:
            taken, self._unclaimed = self._unclaimed, []
        return taken

    @property
    def held_still(self) -> bool:
        """Whether everything the agent left running was held after its last turn
        (`procfs.hold`); if not, only stopping it (its sandbox: all it started) ends them."""
        return self._held_still

    @property
    def went_on(self) -> bool:
        """Whether the CLI worked (spoke, called a tool, gave a result) after a turn had
        ended: a result that ended a turn before the CLI's own would be one it did not give
        (its output is a socket no tool can open, `anima.agents.transport`; this is the
        second line). The CLI then goes on with that turn while Anima checks and reviews
        the tree."""
        return self._went_on

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

    def send(self, prompt: str, waiting: Callable[[], None] | None = None) -> TurnResult:
        """Run one turn and return its result; raises TurnTimeout, AgentCrashed or SessionLost.
        `waiting` is called on this thread every few milliseconds while the turn runs (it
        writes what the turn spent so far, `Ledger.write_running`).

        After a timeout the turn is interrupted; if the CLI answers within `interrupt_grace`
        the process stays usable, otherwise it is stopped (check `alive`).
        """
        if not self._turn_lock.acquire(blocking=False):
            raise AgentError(f"{self.role} agent: a turn is already in flight")
        try:
            with self._hold_lock:
                self._release()
            self._turn_done.clear()
            self._interrupt_sent = False
            self._turn_active.set()
            first_turn = self._turns_sent == 0
            self._turns_sent += 1
            result = self._run_turn(prompt, waiting)
            if (self._resume and first_turn and self.dialect.session_lost(result)
                    and not self._interrupt_sent):
                raise SessionLost(
                    f"{self.role} session {self._session_id} could not be resumed "
                    f"(the CLI answered {result.subtype!r}: {result.text or 'no detail'}); "
                    "start a fresh session"
                )
            return result
        finally:
            self._turn_active.clear()
            self._hold()
            self._turn_done.set()
            self._turn_lock.release()

    def _hold(self) -> None:
        """Between its turns nothing the agent started runs: a job it left in the background
        would otherwise go on writing the tree while it is checked and reviewed, or its
        branch's ref while Anima commits on the branch. The CLI itself runs on (it writes its
        session file after the result). The next turn (or the stop) continues them."""
        proc = self._io.proc
        with self._hold_lock:
            if proc is None or proc.poll() is not None or self._stopping or proc.stdin is None:
                return
            with contextlib.suppress(OSError, ValueError):
                st = os.fstat(proc.stdin.fileno())
                # Confined, nothing leaves the sandbox's process tree; unconfined, what left
                # it (a daemon) still carries the marker.
                self._held, self._held_still = procfs.hold(
                    proc.pid, None if self._confine else self._marker, (st.st_dev, st.st_ino))

    def _release(self) -> None:
        held, self._held = self._held, []
        procfs.release(held)

    def _run_turn(self, prompt: str, waiting: Callable[[], None] | None) -> TurnResult:
        started = time.monotonic()
        deadline = started + self.turn_timeout
        with self._cond:
            self._io.last_activity = started
            if self._results:  # e.g. a failed --resume answers before any input arrives
                return self._results.popleft()
        if self._io.proc is None:
            raise AgentCrashed(f"{self.role} agent is not started", None, "")
        outcome = self._write(self._conv.user_message(prompt), deadline)
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
                idle_for = now - self._io.last_activity
                if now >= deadline:
                    timeout = TurnTimeout(
                        f"{self.role} turn exceeded {self.turn_timeout:g}s", idle=False)
                    break
                if idle_for >= self.idle_timeout:
                    timeout = TurnTimeout(
                        f"{self.role} agent produced no output for {self.idle_timeout:g}s",
                        idle=True)
                    break
                if self._io.eof or not self._io.alive:
                    crashed = True
                else:
                    crashed = False
                    self._cond.wait(_POLL_SECONDS)
            if crashed:
                return self._on_crash()
            if waiting is not None:
                waiting()
        self._abort_turn()
        raise timeout

    def _write(self, data: bytes, deadline: float) -> str | TurnResult:
        """Write all of `data` to stdin; never block past the deadline or the child's death.

        Returns "ok", "timeout", "dead", or the result the child wrote before it stopped
        reading (a failed --resume answers and exits at once).
        """
        proc = self._io.proc
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
        proc = self._io.proc
        assert proc is not None
        self._io.wait(2.0)
        # Let the reader drain what the process wrote before dying (a last result, a trace).
        with self._cond:
            self._cond.wait_for(lambda: self._io.eof or bool(self._results), timeout=1.0)
            if self._results:
                return self._results.popleft()
        if proc.poll() is None:  # output closed but still running: treat as dead
            self._io.signal_group(signal.SIGKILL)
            self._io.wait(5.0)
        self._io.kill_stragglers()
        self._io.close_reader()
        self._settle()
        self._publish_exit(expected=False)
        outcome = self.outcome
        assert outcome is not None
        raise AgentCrashed(f"{self.role} agent {outcome.reason} during a turn",
                           outcome.exit_code, outcome.stderr_tail)

    def _abort_turn(self) -> None:
        """Interrupt the stuck turn; stop the process if it does not answer in time."""
        if self.alive:
            with contextlib.suppress(AgentError, OSError):
                self._send_control(self._conv.interrupt_request())
            with self._cond:
                got = self._cond.wait_for(lambda: bool(self._results) or self._io.eof,
                                          timeout=self.interrupt_grace)
                if got and self._results:  # the interrupted turn's own result
                    self._unclaimed.append(self._results.popleft())
                    return
        log.warning("%s agent did not answer an interrupt; stopping it", self.role)
        self.stop(grace=0.5)

    def _send_control(self, data: bytes) -> None:
        """Write one control line (an interrupt)."""
        self._interrupt_sent = True
        self._write_line(data)

    def _reply(self, data: bytes) -> None:
        """Answer what the CLI asked; a process that is gone needs no answer."""
        with contextlib.suppress(AgentError, OSError):
            self._write_line(data)

    def _write_line(self, data: bytes) -> None:
        """Write lines outside a turn's prompt; waits for a prompt being written so lines
        never interleave."""
        proc = self._io.proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            raise AgentError(f"{self.role} agent is not running")
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
        self._send_control(self._conv.interrupt_request())
        self._turn_done.wait(timeout)
