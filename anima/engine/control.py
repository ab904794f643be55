"""Control of a running Anima from a second terminal: `anima stop|resume|abort|approve PROJECT
ID` reach the Anima that drives the project instead of being refused by its lock.

One JSON request per connection on a Unix socket, one JSON reply. The socket must stay out of
the agents' reach (they run as the same user, so the peer's uid alone cannot tell them apart):
not under the project (`.anima/` is visible to them, and a read-only bind does not stop a
connect), not in the abstract namespace (the network namespace is shared), but in a private
0700 folder under `$XDG_RUNTIME_DIR` (the sandbox hides it) or `/tmp/anima-<uid>/` (the
sandbox's /tmp is its own). The peer is checked all the same: this user, and a process outside
any sandbox (bubblewrap gives each a pid namespace of its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import socket
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from anima.errors import AnimaError

log = logging.getLogger(__name__)

CONTROL_SCHEMA_VERSION: Literal[1] = 1
Action = Literal["stop", "pause", "resume", "abort", "approve"]
#: (action, milestone id, note) → what to tell the human; raises an AnimaError to refuse.
Handler = Callable[[str, str, str], str]

#: A client that connects and says nothing (or reads nothing) is dropped after this long:
#: the server answers one request at a time.
_IO_SECONDS = 2.0
#: How long the CLI waits for the answer: an approve merges into main, and the engine may
#: take a while to get to the request.
ANSWER_SECONDS = 120.0
_MAX_REQUEST = 64 * 1024
#: sun_path holds 108 bytes with its terminating NUL.
_MAX_SOCKET_PATH = 107
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = CONTROL_SCHEMA_VERSION
    action: Action
    id: str
    note: str = ""


class ControlReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = CONTROL_SCHEMA_VERSION
    ok: bool
    message: str


# ------------------------------------------------------------------ where the socket lives
def _candidate_folders() -> list[Path]:
    """Private folders a control socket may live in, preferred first: the user's runtime
    folder when it is set and is what the spec says (ours, 0700), else one under /tmp."""
    found: list[Path] = []
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        with contextlib.suppress(OSError):
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
                found.append(Path(runtime) / "anima")
    found.append(Path("/tmp") / f"anima-{os.getuid()}")
    return found


def _private(folder: Path, create: bool) -> str | None:
    """None when `folder` is a real folder of ours that no one else may enter (made so when
    `create`), else why not. Anyone may make `/tmp/anima-<uid>` first, as a symlink or a
    folder of theirs: such a folder is refused, never used nor changed."""
    if create:
        with contextlib.suppress(FileExistsError, FileNotFoundError):
            os.mkdir(folder, 0o700)
    try:
        st = os.lstat(folder)
    except OSError as e:
        return f"{folder}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder (a symlink?)"
    if st.st_uid != os.getuid():
        return f"{folder} belongs to uid {st.st_uid}, not to you"
    if st.st_mode & 0o077:
        return f"{folder} may be entered by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _name(root: Path) -> str:
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:32] + ".sock"


def socket_paths(root: Path) -> list[Path]:
    """Where the control socket of the project at `root` may be, preferred first."""
    return [folder / _name(root) for folder in _candidate_folders()
            if len(str(folder / _name(root))) <= _MAX_SOCKET_PATH]


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel saw it connect."""
    pid, uid, _gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(pid), int(uid)


def _refusal(conn: socket.socket) -> str | None:
    """Why the peer may not control this Anima: another user, or a process in a sandbox
    (another pid namespace), should one ever see the socket. None: it may."""
    pid, uid = _peer(conn)
    if uid != os.getuid():
        return f"uid {uid} is not this Anima's user"
    try:
        same = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError as e:
        return f"cannot tell where pid {pid} runs: {e.strerror}"
    return None if same else f"pid {pid} runs in a sandbox (another pid namespace)"


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) <= _MAX_REQUEST:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\n")[0]


# ------------------------------------------------------------------ the server
class ControlServer:
    """Listens for one project's control requests on its own daemon thread; the handler runs
    there too, one request at a time, so a slow or silent client never holds up the engine."""

    def __init__(self, root: Path, handler: Handler) -> None:
        self.root = Path(root).resolve()
        self._handler = handler
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._wake: tuple[int, int] | None = None  # a pipe: close() wakes the waiting thread
        self._inode: int | None = None
        self.path: Path | None = None

    def start(self) -> None:
        """Bind and listen. A socket left by a killed Anima is replaced (the project's lock,
        held by the caller, says no other Anima drives it). Raises AnimaError when no private
        folder can be had."""
        if self._sock is not None:
            return
        problems: list[str] = []
        for path in socket_paths(self.root):
            if (problem := _private(path.parent, create=True)) is None:
                break
            problems.append(problem)
        else:
            raise AnimaError(f"no private folder for the control socket ({'; '.join(problems)})"
                             ": `anima stop|resume|abort|approve` from another terminal "
                             "cannot reach this Anima")
        # Bound beside it (a shorter name), then renamed over it: a stale socket is replaced
        # in one step.
        tmp = path.with_name(f".{os.getpid()}-{path.name[:8]}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            sock.bind(str(tmp))
            os.chmod(tmp, 0o600)
            sock.listen(8)
            os.replace(tmp, path)
            self._inode = os.lstat(path).st_ino
        except OSError as e:
            sock.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise AnimaError(f"cannot listen on {path}: {e}") from None
        self._sock, self.path, self._wake = sock, path, os.pipe()
        self._closed.clear()
        self._thread = threading.Thread(target=self._serve, name="anima-control", daemon=True)
        self._thread.start()
        log.info("listening for control requests on %s", path)

    def close(self) -> None:
        """Stop listening and remove the socket, unless another Anima's has replaced it."""
        self._closed.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        if self._thread is not None:
            self._thread.join(timeout=_IO_SECONDS + 1)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                if os.lstat(self.path).st_ino == self._inode:
                    self.path.unlink()
            self.path = None

    def _serve(self) -> None:
        sock, wake = self._sock, self._wake
        assert sock is not None and wake is not None
        while not self._closed.is_set():
            try:
                select.select([sock.fileno(), wake[0]], [], [])
                if self._closed.is_set():
                    return
                conn, _ = sock.accept()
            except (OSError, ValueError):  # ValueError: closed under a slow request
                if self._closed.is_set():
                    return
                log.exception("control socket failed; no more control requests")
                return
            with conn:
                try:
                    self._answer(conn)
                except OSError as e:  # the client went away or said nothing in time
                    log.info("control request dropped: %s", e)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_IO_SECONDS)
        if (refused := _refusal(conn)) is not None:  # the folder is ours alone: said twice
            log.warning("control request refused: %s", refused)
            return
        reply = self._reply(_read_line(conn))
        conn.settimeout(_IO_SECONDS)
        conn.sendall(reply.model_dump_json().encode() + b"\n")

    def _reply(self, line: bytes) -> ControlReply:
        try:
            request = ControlRequest.model_validate_json(line)
        except ValidationError as e:
            return ControlReply(ok=False, message=f"not a control request this Anima "
                                                  f"understands: {_first_error(e)}")
        log.info("control request: %s %s", request.action, request.id)
        try:
            message = self._handler(request.action, request.id, request.note)
        except AnimaError as e:
            return ControlReply(ok=False, message=str(e))
        except Exception as e:
            log.exception("control request %s %s failed", request.action, request.id)
            return ControlReply(ok=False, message=f"unexpected error: {e!r}; the traceback "
                                                  "is in .anima/logs/anima.log")
        return ControlReply(ok=True, message=message)


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


# ------------------------------------------------------------------ the client
def send(root: Path, action: Action, milestone_id: str, note: str = "",
         timeout: float = ANSWER_SECONDS) -> ControlReply | None:
    """Ask the Anima running the project at `root`; None when none listens (no socket, or a
    stale one nobody answers on). Raises AnimaError when one took the request but gave no
    answer."""
    request = ControlRequest(action=action, id=milestone_id, note=note)
    for path in socket_paths(root):
        if _private(path.parent, create=False) is not None:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(_IO_SECONDS)
            try:
                conn.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                continue  # left by an Anima that was killed
            except OSError as e:
                raise AnimaError(f"cannot reach the Anima running {root}: {e}") from None
            if _peer(conn)[1] != os.getuid():
                continue
            try:
                conn.sendall(request.model_dump_json().encode() + b"\n")
                conn.settimeout(timeout)
                line = _read_line(conn)
            except OSError as e:
                raise AnimaError(f"the Anima running {root} took the request but did not "
                                 f"answer: {e}") from None
        if not line:
            raise AnimaError(f"the Anima running {root} closed the connection without an "
                             "answer; see its .anima/logs/anima.log")
        try:
            return ControlReply.model_validate_json(line)
        except ValidationError as e:
            raise AnimaError(f"the Anima running {root} answered what this one does not "
                             f"understand: {_first_error(e)}") from None
    return None
