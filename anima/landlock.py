"""Scope a confined process with Landlock, so that what the mounts cannot stop ends at the
sandbox too: connecting to an abstract Unix socket, and signalling a process outside.

An abstract socket has no file: the mounts of `anima.sandbox` do not hide it, and the shared
network namespace (agents need their API) lets a confined process reach any, an X display
above all (`@/tmp/.X11-unix/X0`). Most desktops let the user's own processes in
(`xhost +si:localuser:…`), so a confined agent could type into the human's terminal. Landlock's
scopes (Linux 6.12, ABI 6) refuse it where `bwrap` starts: processes inside the sandbox still
reach each other's sockets (a test server the checks start), nothing outside.

Applied in the child between fork and exec (`restrict`), so it is inherited by bubblewrap
and everything started in the sandbox; no process may lift it. Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from anima.libc import LIBC

#: The Landlock system calls: one number on every architecture (the unified table).
_CREATE_RULESET, _RESTRICT_SELF = 444, 446
_CREATE_RULESET_VERSION = 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
#: The first ABI with scopes.
_SCOPES_ABI = 6
_PR_SET_NO_NEW_PRIVS = 38
#: `struct landlock_ruleset_attr`: no file-system or network access handled, scopes only (the
#: mounts already decide the files; the network stays open).
_ATTR = struct.pack("=QQQ", 0, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
# The attribute buffer is made in the parent: between fork and exec the child only uses it.
_ATTR_BUF = ctypes.create_string_buffer(_ATTR, len(_ATTR))


def _long(value: int) -> ctypes.c_long:
    """A variadic argument as the kernel reads it (a full register, not a C int)."""
    return ctypes.c_long(value)


def unavailable() -> str | None:
    """None when confined processes are scoped here, else why not (one sentence)."""
    if LIBC is None:
        return "Landlock needs Linux"
    abi = LIBC.syscall(_long(_CREATE_RULESET), None, _long(0), _long(_CREATE_RULESET_VERSION))
    if abi < 0:
        err = ctypes.get_errno()
        why = "not enabled in this kernel" if err in (errno.ENOSYS, errno.EOPNOTSUPP) else \
            os.strerror(err)
        return f"Landlock is {why}"
    if abi < _SCOPES_ABI:
        return f"Landlock scopes need Linux 6.12 (this kernel offers ABI {abi})"
    return None


def restrict() -> None:
    """In the child before exec: scope it and everything it starts. Raises OSError when the
    kernel refuses (the spawn then fails: a process is never started less confined than
    Anima said it would be)."""
    assert LIBC is not None
    if LIBC.prctl(_PR_SET_NO_NEW_PRIVS, _long(1), _long(0), _long(0), _long(0)) != 0:
        raise OSError(ctypes.get_errno(), "cannot set no_new_privs")
    fd = LIBC.syscall(_long(_CREATE_RULESET), _ATTR_BUF, _long(len(_ATTR)), _long(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "cannot create a Landlock ruleset")
    try:
        if LIBC.syscall(_long(_RESTRICT_SELF), _long(fd), _long(0)) != 0:
            raise OSError(ctypes.get_errno(), "cannot enter the Landlock domain")
    finally:
        os.close(fd)
