"""One API account behind every pair: when one agent hits the account's usage limit, no agent
starts a new turn until it resets, and the wait is announced once, not once per milestone.

A transient error is not the account's: it stays with the pair that met it (its own retries,
anima.loop.fault_policy), and the other pairs go on.
"""

from __future__ import annotations

import threading
import time

#: How soon a pair the account holds sees that it waits longer than it said (another pair met
#: a limit that resets later): its record and state.json then say the later reset.
FOLLOW_SECONDS = 1.0


class AccountGate:
    """Shared by the seats of every running milestone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until = 0.0
        self._reason = ""

    def hold(self, until: float, reason: str) -> bool | None:
        """A usage limit holds every turn until `until` (epoch seconds). True when this is
        news, to announce (the first pair to meet it); False when the account now waits
        longer for what was announced already (the same limit met again); None when it
        already waits as long."""
        with self._lock:
            if until <= self._until:
                return None
            news = self._until <= time.time() and reason != self._reason
            self._until, self._reason = until, reason
            return news

    def holding(self) -> tuple[float, str] | None:
        """Until when, and why, new turns wait now; None when they do not."""
        with self._lock:
            return (self._until, self._reason) if self._until > time.time() else None

    def wait(self, stop: threading.Event, held: tuple[float, str]) -> tuple[float, str] | None:
        """Before a turn: wait while the account is `held` (`holding()`; a stop ends the wait
        at once). Returns the later reset it waits for once another pair met a limit that
        resets later (within `FOLLOW_SECONDS`, so the waiting pair can say so), else None:
        the wait is over, or stopped."""
        while not stop.is_set():
            if (now_held := self.holding()) != held:
                return now_held
            stop.wait(min(FOLLOW_SECONDS, max(0.05, held[0] - time.time())))
        return None
