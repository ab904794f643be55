"""What the loop does when an agent's turn ends in an API fault instead of a reply.

None of these is the agent's fault, so none is a rejection: a login problem pauses at once; a
usage limit waits for its reset and sends the same prompt again; a transient error is retried
with backoff, then pauses; a prompt too long gets one fresh session, then pauses. A pause is
raised as `AgentFault`, which the loop turns into a `paused` transition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from anima.agents.dialect import Fault, FaultKind
from anima.config import Config
from anima.errors import AnimaError
from anima.events import clock, limit_name

#: The first wait after a transient error; it doubles up to `api_retry_max_wait_seconds`.
FIRST_RETRY_WAIT_SECONDS = 15.0
#: A usage limit whose reset time the CLI did not say is tried again after this long.
UNKNOWN_RESET_WAIT_SECONDS = 30 * 60.0


class AgentFault(AnimaError):
    """An API fault a human must deal with; the message says what happened and what to do."""


class NotLoggedIn(AgentFault):
    """The agent CLI cannot use the API at all (no login, a bad key, a config it cannot
    start a session with): a set-up error on this machine, not anything the agents did."""


def not_logged_in(fault: Fault) -> NotLoggedIn:
    """The backend's own words on how to log in, else the CLI's message."""
    return NotLoggedIn(fault.advice or f"the agent CLI cannot use the API ({fault.message}); "
                       "log it in, then resume")


class Retry(Enum):
    SAME_SESSION = "same"
    FRESH_SESSION = "fresh"


#: Called when a usage-limit wait starts (epoch s it ends, the message) and ends (None, "", or
#: why it ended early).
WaitHook = Callable[[float | None, str], None]


def _on_calendar(epoch: float) -> bool:
    """Whether a date holds `epoch` (a CLI that sent milliseconds names a year past 9999,
    which no record can keep: however long you allow to wait, it is no reset to wait for)."""
    try:
        datetime.fromtimestamp(epoch, UTC)
    except (ValueError, OverflowError, OSError):
        return False
    return True


@dataclass
class FaultPolicy:
    """The faults of one prompt: its counters start afresh with every new prompt."""

    config: Config
    stop: threading.Event  # set by a stop request: every wait ends at once
    log: Callable[[str], None]
    on_wait: WaitHook
    #: Waits out the usage-limit wait `on_wait` was told of: until its reset, or the later
    #: one the account waits for since (another pair met a limit), or a stop.
    wait_out: Callable[[], None]
    transient_attempts: int = 0
    fresh_session_tried: bool = False
    waited_seconds: float = 0.0
    limit_waits: int = 0  # usage-limit waits of this turn

    def handle(self, role: str, fault: Fault) -> Retry:
        """Wait as the fault requires and say how to retry; raise AgentFault to pause."""
        who = role.capitalize()
        if fault.kind in (FaultKind.AUTH, FaultKind.SETUP):
            raise not_logged_in(fault)
        if fault.kind is FaultKind.USAGE_LIMIT:
            self._wait_for_reset(fault)
            return Retry.SAME_SESSION
        if fault.kind is FaultKind.PROMPT_TOO_LONG:
            if self.fresh_session_tried:
                raise AgentFault(f"{who}'s prompt is too long even for a fresh session: "
                                 f"{fault.message}")
            self.fresh_session_tried = True
            return Retry.FRESH_SESSION
        return self._back_off(who, fault)

    def _back_off(self, who: str, fault: Fault) -> Retry:
        limit = self.config.api_retry_attempts
        if self.transient_attempts >= limit:
            raise AgentFault(f"{who}: the API kept failing, {limit + 1} attempts: "
                             f"{fault.describe()} — resume when it works again")
        self.transient_attempts += 1
        delay = min(self.config.api_retry_max_wait_seconds,
                    FIRST_RETRY_WAIT_SECONDS * 2 ** (self.transient_attempts - 1))
        self.log(f"{who}: API error, not a reply: {fault.describe()}; sending the prompt again "
                 f"in {delay:g} s (attempt {self.transient_attempts + 1} of {limit + 1})")
        self.stop.wait(delay)
        return Retry.SAME_SESSION

    def _wait_for_reset(self, fault: Fault) -> None:
        now = time.time()
        resets_at = fault.resets_at or now + UNKNOWN_RESET_WAIT_SECONDS
        name = limit_name(fault.limit_type)
        # A reset already past (a clock ahead of the server's, a stale event) still waits, and
        # longer each time the limit is met again: the prompt is never sent again at once.
        floor = min(self.config.api_retry_max_wait_seconds,
                    FIRST_RETRY_WAIT_SECONDS * 2 ** self.limit_waits)
        self.limit_waits += 1
        until = (resets_at if resets_at > now else now + floor) + \
            self.config.usage_limit_margin_seconds
        max_hours = self.config.max_usage_limit_wait_hours
        if self.waited_seconds + (until - now) > max_hours * 3600 or not _on_calendar(until):
            raise AgentFault(f"{name} reached ({fault.message}); it resets at "
                             f"{clock(resets_at)}, later than max_usage_limit_wait_hours "
                             f"({max_hours:g} h) allows: resume after the reset")
        self.on_wait(until, f"waiting for the usage limit to reset at {clock(resets_at)} "
                            f"({name}: {fault.message})")
        started = time.monotonic()
        try:
            self.wait_out()
        finally:
            self.waited_seconds += time.monotonic() - started
            self.on_wait(None, "stopped while waiting for the usage limit to reset"
                         if self.stop.is_set() else "")
