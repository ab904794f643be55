"""Git's own lock files that a killed git left behind, and who may remove them.

A `git` killed mid-command (with a dead Anima, or by an agent whose turn ended) leaves
`index.lock`, `HEAD.lock` or a ref's `.lock`; every later git command that writes then fails
with "File exists". A lock is stale only when no git process works in the repository.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from anima import procfs

# Lock files git writes directly in its directory (refs' locks live under refs/).
_TOP_LOCKS = ("index.lock", "HEAD.lock", "ORIG_HEAD.lock", "config.lock", "packed-refs.lock",
              "shallow.lock")


def git_processes(root: Path) -> list[int]:
    """Live `git` processes working in this repository (cwd inside it)."""
    return [pid for pid in procfs.pids()
            if (argv := procfs.cmdline(pid)) and os.path.basename(argv[0]) == "git"
            and procfs.alive(pid) and procfs.in_tree(pid, root)]


def wait_for_git(root: Path, timeout: float) -> list[int]:
    """Let git commands still running in the repository finish; returns those still running
    after `timeout` (a human's long git command, most likely), which are left alone."""
    deadline = time.monotonic() + timeout
    while (running := git_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running


def clear_stale_locks(root: Path, git_dir: Path) -> list[str]:
    """Remove git's lock files when no git process works here; returns them, relative to
    the git directory. Call `wait_for_git` first."""
    found = [git_dir / name for name in _TOP_LOCKS if (git_dir / name).exists()]
    if (refs := git_dir / "refs").is_dir():
        found += sorted(refs.rglob("*.lock"))
    if not found or git_processes(root):
        return []
    for lock in found:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    return [str(lock.relative_to(git_dir)) for lock in found]
