"""One small error tree, so callers and the UI can tell failures apart."""

from __future__ import annotations

import errno
from pathlib import Path


class AnimaError(Exception):
    """Base of every error Anima reports to a user."""


class ConfigError(AnimaError):
    """`.anima/config.json` is unreadable or invalid; the message names file and key."""


class RecordError(AnimaError):
    """A milestone record or state.json is corrupt or invalid; it is left untouched."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class MilestoneError(AnimaError):
    """A milestone definition (.md) cannot be parsed or has a bad name."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail

    @classmethod
    def never_starts(cls, md: Path, why: str) -> MilestoneError:
        """The problem a milestone whose `depends_on` keeps it from ever starting is, in
        every report (the scan's, `anima status`'s cached one)."""
        return cls(md, f"{why}; it is not started")


class ProjectError(AnimaError):
    """The managed project cannot be driven (no .anima/, not a git repo, dirty tree…)."""


class GitError(ProjectError):
    """A git precondition or operation failed."""


class InTheWay(GitError):
    """Something of the human's stands where a milestone must work (its branch checked out
    in a checkout of theirs): the milestone pauses until they move it."""


class LockError(ProjectError):
    """Another Anima holds the project's lock."""


class AgentError(AnimaError):
    """Base of failures of a `claude` agent process."""


class AgentNotFound(AgentError):
    """The `claude` binary is missing or does not run."""


class AgentCrashed(AgentError):
    """The agent process exited while a turn was in flight."""

    def __init__(self, message: str, exit_code: int | None = None, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class TurnTimeout(AgentError):
    """A turn exceeded its total or idle time limit."""

    def __init__(self, message: str, idle: bool = False) -> None:
        super().__init__(message)
        self.idle = idle


class SessionLost(AgentError):
    """A resumed session could not be restored (its file was never written); start fresh."""


class ActionError(AnimaError):
    """The action does not apply to the milestone in its current status."""


def unexpected(error: Exception) -> str:
    """The sentence for an error nothing expected; a full disk says so, and what to do."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" (writing {error.filename})" if error.filename else ""
        return (f"the disk is full{where}: free some space, then start Anima again; what was "
                "saved before stays as it was, and the milestones go on from there")
    return f"unexpected error: {error!r}"


class GitStopped(AnimaError):
    """A stop ended a git command of Anima's that the milestone waited for (anima.git.watch):
    the milestone leaves as stopped. Not a GitError: nothing may take it for git's failure."""
