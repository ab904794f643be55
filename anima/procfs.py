"""Other processes, seen through Linux `/proc`, and how Anima stops the ones its agents made.

Why a marker: the `claude` CLI starts each Bash call in its own session, so whatever an agent
leaves running in the background (`cmd &`, `(cmd &)`, `nohup`, `setsid`, a dev server) is
outside the agent's process group and survives a group kill. Every agent is started with
`ANIMA_AGENT=<project>:<milestone>:<role>` in its environment; its descendants inherit it
whatever session or group they move to, and `/proc/<pid>/environ` shows it (a process's
environment as it was exec'd, readable for our own user's processes). Stopping an agent, a
milestone or what a dead run left behind means stopping every live process whose marker
starts with the right prefix. (A tool that deliberately clears its environment escapes.)

Everything here degrades to "nothing found" where `/proc` is missing (not Linux).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

#: The environment variable that marks an agent's whole process tree.
AGENT_VAR = "ANIMA_AGENT"
# Between SIGTERM and SIGKILL, and the limit to wait for SIGKILLed processes to go.
_GRACE = 2.0
_POLL = 0.02


# --------------------------------------------------------------------------- reading /proc


def _read(path: str) -> bytes:
    """A /proc file's bytes, with bare system calls: Anima scans every process's files after
    each turn, and pathlib's open costs more than the read itself."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def _stat(pid: int, task: str = "") -> list[str] | None:
    """Fields of /proc/<pid>/stat (of its thread `task`) after the command name (index 0 is
    the state)."""
    try:
        raw = _read(f"/proc/{pid}/{f'task/{task}/' if task else ''}stat")
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:].decode(errors="replace").split()


#: /proc states: gone (a zombie waiting for its parent, or dead), and stopped by a signal.
_GONE = ("Z", "X")
_STOPPED = ("T", "t")


def _running_state(pid: int, state: str) -> str:
    """`state` (the process's own), or for a zombie the state of a thread of it that still
    runs: a process whose main thread ended reads as a zombie while its other threads go on
    (and a signal to it still reaches them)."""
    if state != "Z":
        return state
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return state
    for task in tasks:
        if task != str(pid) and (fields := _stat(pid, task)) and fields[0] not in _GONE:
            return fields[0]
    return state


def _state(pid: int) -> str:
    fields = _stat(pid)
    return _running_state(pid, fields[0]) if fields else "X"


def alive(pid: int) -> bool:
    """Running (or stopped), not a zombie waiting for its parent."""
    return _state(pid) not in _GONE


def stopped(pid: int) -> bool:
    """Stopped by a signal (held between an agent's turns, a terminal's Ctrl-Z)."""
    return _state(pid) in _STOPPED


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def pgid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields and len(fields) > 2 else None


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot: (pid, start time) names one process for
    good, where a pid alone may have been reused since it was recorded."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def cmdline_bytes(pid: int) -> bytes:
    """/proc/<pid>/cmdline as it is (its arguments each ended by a NUL); empty if gone."""
    try:
        return _read(f"/proc/{pid}/cmdline")
    except OSError:
        return b""


def cmdline(pid: int) -> list[str]:
    return decode_cmdline(cmdline_bytes(pid))


def decode_cmdline(raw: bytes) -> list[str]:
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def cwd(pid: int) -> str | None:
    try:
        return os.path.realpath(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def in_tree(pid: int, root: Path) -> bool:
    """Whether `pid` works in `root` or below it."""
    here, where = os.path.realpath(root), cwd(pid) or ""
    return where == here or where.startswith(here + os.sep)


def environ_value(pid: int, name: str) -> str | None:
    """`name` in the environment `pid` was started with; None if unset or unreadable."""
    raw = _environ(pid)
    if raw is None:
        return None
    key = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


def _environ(pid: int) -> bytes | None:
    """`pid`'s environment as it was exec'd. A process whose main thread ended shows it no
    more (ESRCH), its threads that go on still do."""
    with contextlib.suppress(OSError):
        return _read(f"/proc/{pid}/environ")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        with contextlib.suppress(OSError):
            return _read(f"/proc/{pid}/task/{task}/environ")
    return None


def group_members(group: int) -> list[int]:
    """Live pids in process group `group`."""
    return [p for p in pids() if pgid(p) == group and alive(p)]


def _ancestry() -> set[int]:
    """This process and its ancestors: never signalled, whatever marker they inherited (an
    Anima started from an agent's shell carries that agent's marker)."""
    found, pid = set(), os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        pid = parent(pid) or 0
    return found


# --------------------------------------------------------------------------- markers


def project_tag(root: Path) -> str:
    """A short stable name for a project folder (its resolved path, hashed)."""
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:12]


def marker_prefix(root: Path, milestone: str | None = None) -> str:
    """What every marker of the project (or of one of its milestones) starts with; ids
    never hold a colon, so `m1` does not match `m10`."""
    tag = project_tag(root)
    return f"{tag}:" if milestone is None else f"{tag}:{milestone}:"


def agent_marker(root: Path, milestone: str | None, role: str) -> str:
    """The value of ANIMA_AGENT for one agent of one milestone of one project."""
    return f"{marker_prefix(root, milestone or '-')}{role}"


def marked(prefix: str) -> list[int]:
    """Live processes (not this one, nor its ancestors) whose marker starts with `prefix`."""
    spared = _ancestry()
    return [pid for pid in pids() if pid not in spared
            and (value := environ_value(pid, AGENT_VAR)) is not None
            and value.startswith(prefix) and alive(pid)]


def _children() -> tuple[dict[int, list[int]], set[int]]:
    """Each process's children, and the live processes, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    live = set()
    for pid in pids():
        if (fields := _stat(pid)) is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
            if _running_state(pid, fields[0]) not in _GONE:
                live.add(pid)
    return children, live


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, theirs, ...), from one scan of /proc."""
    return _below(root, *_children())


def _below(root: int, children: dict[int, list[int]], live: set[int]) -> list[int]:
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, ())
    return [pid for pid in found if pid in live]


def _program(root: int, program: tuple[int, int], children: dict[int, list[int]]
             ) -> list[int]:
    """`root` and the line of processes below it that runs the program: at each step the
    first-started child reading `program` (a wrapper, a launcher, the CLI). Any process can
    open the CLI's input through /proc and read it too; only the first of its siblings, in
    that line, is the program's (a process that left its parent joins the line's top)."""
    line = [root]
    while kids := [pid for pid in children.get(line[-1], ()) if stdin_of(pid) == program]:
        line.append(min(kids, key=lambda pid: start_time(pid) or 0))
    return line


def _reaped(pids: list[int]) -> int:
    """The page faults of the children these processes have reaped (`cminflt`): it grows
    as an orphan that ran below them ends."""
    return sum(int(fields[8]) for pid in pids if (fields := _stat(pid)) and len(fields) > 8)


# --------------------------------------------------------------------------- holding

#: A process held between an agent's turns: (pid, start time), so that a pid reused since is
#: never continued.
Held = tuple[int, int]


def stdin_of(pid: int) -> tuple[int, int] | None:
    """(device, inode) of what `pid` reads as its standard input."""
    try:
        st = os.stat(f"/proc/{pid}/fd/0")
    except OSError:
        return None
    return st.st_dev, st.st_ino


#: Scans in a row that must find nothing running before a hold is taken as complete.
_QUIET_SCANS = 3


def hold(root: int, marker: str | None, program: tuple[int, int],
         rounds: int = 100) -> tuple[list[Held], bool]:
    """SIGSTOP every process below `root` and every one carrying `marker` (what left the
    tree keeps it) but the program itself (`_program`: the line below `root` reading
    `program`, the CLI's input; its tools read none of it). Rescans until a
    scan finds none running, so what a process forked just before it stopped is held too.
    `release` continues them. The flag: whether all is held — scans in a row found none
    running and nothing ended below the program's wrappers meanwhile; not after `rounds`."""
    held: dict[int, int] = {}
    children, live = _children()
    line = _program(root, program, children)
    spared = _ancestry() | set(line)
    # The wrappers around the program (a sandbox's init) reap what is orphaned below them.
    reaped = _reaped(line[:-1])
    quiet = 0  # scans in a row that found none running
    for _ in range(rounds):
        found = {*_below(root, children, live), *(marked(marker) if marker else ())} - spared
        fresh = [pid for pid in found if pid not in held]
        if not fresh:
            # One scan can miss a process of such a line: it left between the listing of
            # /proc and the read of its stat, its child came after the listing.
            quiet += 1
            if quiet == _QUIET_SCANS:
                # A line of processes each forking the next and leaving is never seen
                # running by a scan; orphaned, its ends are reaped above it meanwhile.
                return list(held.items()), _reaped(line[:-1]) == reaped
            time.sleep(0.003)
            children, live = _children()
            continue
        quiet = 0
        for pid in fresh:
            if (started := start_time(pid)) is not None:
                held[pid] = started
                _signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + _GRACE  # stopped once its fork, if any, has returned
        while any(_state(pid) not in (*_STOPPED, *_GONE) for pid in fresh) \
                and time.monotonic() < deadline:
            time.sleep(0.001)
        children, live = _children()
    return list(held.items()), False


def release(held: list[Held]) -> None:
    """SIGCONT what `hold` stopped, where it is still the same process."""
    for pid, started in held:
        if start_time(pid) == started:
            _signal(pid, signal.SIGCONT)


# --------------------------------------------------------------------------- stopping


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stop_marked(prefix: str, grace: float = _GRACE) -> list[int]:
    """Stop every process marked with `prefix`: SIGTERM, up to `grace` seconds to exit, then
    SIGKILL. Rescans while it waits, so children forked meanwhile go too. Returns the pids
    it signalled (empty, and at once, when there were none)."""
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    while (left := marked(prefix)) and time.monotonic() < deadline + _GRACE:
        kill = time.monotonic() >= deadline
        for pid in left:
            if kill or pid not in signalled:
                _signal(pid, signal.SIGKILL if kill else signal.SIGTERM)
                _signal(pid, signal.SIGCONT)  # one held between turns takes it now
        signalled.update(left)
        time.sleep(_POLL)
    return sorted(signalled)


def signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def group_alive(group: int) -> bool:
    """Whether a member of process group `group` still runs (zombies don't count: orphans
    are reaped by init, which may take a moment). `killpg(0)` answers "none" without a scan."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(group))


def stop_group(leader: int, grace: float = _GRACE) -> None:
    """Stop the whole process group `leader` leads; a process that does not lead its group
    is stopped alone."""
    if pgid(leader) == leader:
        stop_process_group(leader, grace)
    else:
        _stop(lambda sig: _signal(leader, sig), lambda: alive(leader), grace)


def stop_process_group(group: int, grace: float = _GRACE) -> None:
    """SIGTERM every process in `group`, then SIGKILL what is left after `grace` seconds."""
    _stop(lambda sig: signal_group(group, sig), lambda: group_alive(group), grace)


def _stop(send: Callable[[signal.Signals], None], remaining: Callable[[], bool],
          grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not remaining():
            return
        send(sig)
        send(signal.SIGCONT)  # one held between turns takes the SIGTERM now
        deadline = time.monotonic() + grace
        while remaining() and time.monotonic() < deadline:
            time.sleep(_POLL)
