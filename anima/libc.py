"""The C library, loaded once in the parent: between fork and exec a child may only call
what is loaded already (`prctl` for the death signal and `no_new_privs`, `syscall` for
Landlock). None where there is none to load (not Linux)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform


def _load() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name or platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    libc.syscall.restype = ctypes.c_long
    return libc


LIBC = _load()
