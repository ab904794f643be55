"""The project's own checks (config `check_command`), run by Anima on the Developer's commit.

A model reviewer that only reads the diff is wrong in both directions; a test run is not. So
before the Acceptor spends a token, Anima runs the project's command itself in the project
root, with the agents' environment but none of the credentials in it (`anima.credentials`;
config `pass_env` lets one through), and keeps the exit code, the duration and the last lines
of the output (redacted: a test run prints environments and tokens too).

The command runs in a session of its own. On a timeout (or a stop) the whole group goes, and
so does anything it spawned that left the group (`setsid`, a daemonised server): every process
started from the check carries the milestone's process marker (`anima.procfs`), and every live
process with the check's marker is stopped. After a normal exit, leftovers are stopped the same
way; after a kill of Anima, the next start stops them with the agents' leftovers.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from anima import procfs, sandbox
from anima.credentials import inherited
from anima.git_options import AGENT_GIT_ENV
from anima.text.redact import redact

#: Exit codes of `sh -c` when the command is missing (127) or not executable (126).
_SHELL_CANNOT_START = {126: "not executable", 127: "command not found"}
#: What bubblewrap says (exit 1) when an argv command is missing inside the sandbox.
_BWRAP_CANNOT_START = re.compile(r"bwrap: execvp (.+): (.+)")
#: What it says (exit 1) when it cannot make the sandbox, before running anything.
_BWRAP_SETUP = re.compile(r"bwrap: (?!execvp )[^\n]+")
TAIL_LINES = 30
TAIL_LINE_CHARS = 300
_KEEP_BYTES = 64 * 1024  # of the output, from the end; a chatty suite never fills memory
_POLL = 0.1
# An OSC ends at BEL, or is cut short by the next escape (else a run of unended ones would
# each be scanned to the end of the output).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*\x07")


#: Wraps a command line in a sandbox: the confined argv, and variables for its environment.
Confine = Callable[[list[str]], tuple[list[str], dict[str, str]]]


class CheckCancelled(Exception):
    """The run was stopped from outside (Anima is stopping); its processes are gone."""


@dataclass(frozen=True)
class CheckResult:
    """One run of the check. `error` is set when it could not start (a configuration error):
    then `exit_code` is the shell's 126/127 or None."""

    command: str
    exit_code: int | None
    duration: float
    tail: str
    timed_out: bool = False
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code == 0

    @property
    def outcome(self) -> str:
        """A few words for logs and the window: "passed in 2.1 s", "exited 1 after 3.0 s"…"""
        if self.error is not None:
            return f"could not start: {self.error}"
        if self.timed_out:
            return f"timed out after {self.duration:.1f} s"
        if self.passed:
            return f"passed in {self.duration:.1f} s"
        return f"exited {self.exit_code} after {self.duration:.1f} s"


def display(command: str | list[str]) -> str:
    """The command as a person would type it."""
    return command if isinstance(command, str) else shlex.join(command)


def check_environment(marker: str, keep: Collection[str] = ()) -> dict[str, str]:
    """Anima's environment without CLAUDECODE and its credentials but those in `keep`
    (config `pass_env`: a check runs the Developer's code, and the network is open), marked
    as the check's."""
    return {**inherited(keep), **AGENT_GIT_ENV, procfs.AGENT_VAR: marker}


def tail_of(raw: bytes, lines: int = TAIL_LINES) -> str:
    """The last lines of an output, without colour codes, each line bounded, redacted.

    The whole output is redacted before the tail is taken and lines are cut: a key whose BEGIN
    line is above the tail, or a token cut at the line's end, no longer looks like one."""
    text = _ANSI.sub("", raw.decode("utf-8", errors="replace")).replace("\r\n", "\n")
    kept = [line.rsplit("\r", 1)[-1] for line in redact(text).rstrip().split("\n")][-lines:]
    clipped = [line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS - 1] + "…"
               for line in kept]
    return "\n".join(clipped).strip("\n")


def run_check(command: str | list[str], cwd: Path, *, timeout: float, marker: str,
              cancel: threading.Event | None = None, confine: Confine | None = None,
              keep: Collection[str] = ()) -> CheckResult:
    """Run the check to its end, its timeout or `cancel`; raise CheckCancelled on the last.
    `marker` (`procfs.agent_marker`) marks every process it starts; `confine` wraps it in the
    milestone's sandbox (it runs code the Developer wrote); `keep`: the credential variables
    it gets all the same (config `pass_env`).

    A sandbox that bubblewrap could not set up is made once more: a path it hides that went
    away just before (a daemon restarting its socket) fails the mount, and that is no verdict
    on the Developer's commit. A check that prints the same line itself merely runs twice."""
    result = _run(command, cwd, timeout, marker, cancel, confine, keep)
    if confine is not None and result.exit_code == 1 and _BWRAP_SETUP.fullmatch(result.tail):
        result = _run(command, cwd, timeout, marker, cancel, confine, keep)
    return result


def _run(command: str | list[str], cwd: Path, timeout: float, marker: str,
         cancel: threading.Event | None, confine: Confine | None, keep: Collection[str]
         ) -> CheckResult:
    shown = display(command)
    started = time.monotonic()
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    env = check_environment(marker, keep)
    before_exec = None
    if confine is not None:
        argv, extra = confine(argv)
        env.update(extra)
        before_exec = sandbox.before_exec()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=before_exec)
    except (OSError, subprocess.SubprocessError) as e:  # argv form: missing or not executable
        why = getattr(e, "strerror", None) or e
        return CheckResult(shown, None, 0.0, "", error=f"`{shown}`: {why}")
    assert proc.stdout is not None
    output = bytearray()
    timed_out = cancelled = False
    try:
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        deadline = started + timeout
        open_ = True
        while proc.poll() is None:
            if open_:
                open_ = _read_some(fd, output)
            else:  # the check closed its output and goes on
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(_POLL)
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
        # A child that kept the pipe open must not hold the round: read what is there, go.
        if open_:
            _read_some(fd, output, wait=0.0)
    finally:
        _stop_tree(proc, marker)
        proc.stdout.close()
    duration = time.monotonic() - started
    if cancelled:
        raise CheckCancelled(shown)
    tail = tail_of(bytes(output))
    code = None if timed_out else proc.returncode
    if isinstance(command, str) and code in _SHELL_CANNOT_START and _shell_complaint(tail):
        last = tail.splitlines()[-1] if tail else ""
        return CheckResult(shown, code, duration, tail,
                           error=f"`{shown}`: {_SHELL_CANNOT_START[code]} ({last.strip()})")
    if confine is not None and not isinstance(command, str) and code == 1 \
            and (found := _BWRAP_CANNOT_START.fullmatch(tail.strip())) is not None:
        return CheckResult(shown, None, duration, tail, error=f"`{shown}`: {found.group(2)}")
    return CheckResult(shown, code, duration, tail, timed_out=timed_out)


def _shell_complaint(tail: str) -> bool:
    """Whether the output is the shell saying it could not run the command itself (so a test
    suite that happens to exit 127 is still a failing check, not a configuration error)."""
    lines = tail.splitlines()
    return len(lines) == 1 and bool(re.match(r"^(/bin/)?(ba|da)?sh: ", lines[0]))


def _read_some(fd: int, into: bytearray, wait: float = _POLL) -> bool:
    """Read what the pipe has (waiting up to `wait`), keeping only the last bytes; False at
    the end of the output."""
    if not select.select([fd], [], [], wait)[0]:
        return True
    try:
        while chunk := os.read(fd, 1 << 16):
            into += chunk
            if len(into) > 2 * _KEEP_BYTES:
                del into[:-_KEEP_BYTES]
            if not select.select([fd], [], [], 0)[0]:
                return True
    except BlockingIOError:
        return True
    return False


def _stop_tree(proc: subprocess.Popen[bytes], marker: str) -> None:
    """Stop the check's group, then every process it started that left the group, and reap
    the check itself."""
    if proc.poll() is None:
        procfs.stop_group(proc.pid)
    procfs.stop_marked(marker)
    proc.wait()
