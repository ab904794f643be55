"""What Anima needs to know of one agent CLI: the `Dialect` protocol. The transport and the
turns (anima.agents.transport, anima.agents.process) speak through it, so a second agent CLI is
one more implementation beside `anima.agents.claude`; the loop sees only typed events, turn
results and the faults below."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from anima.config import RoleConfig
from anima.events import Event, RateLimitChanged, TurnResult


class FaultKind(StrEnum):
    STOPPED = "stopped"  # Anima's own interrupt ended the turn
    AUTH = "auth"  # not logged in, bad or expired key
    USAGE_LIMIT = "usage_limit"  # a subscriber's limit is used up until its reset
    PROMPT_TOO_LONG = "prompt_too_long"
    TRANSIENT = "transient"  # overloaded, 5xx, a plain 429, a dropped connection, the unknown


@dataclass(frozen=True)
class Fault:
    """An error result, typed: the loop acts on it (anima.loop.fault_policy), never answers it."""

    kind: FaultKind
    message: str  # the CLI's own words
    status: int | None = None
    resets_at: float | None = None  # usage limit: epoch seconds, when known
    limit_type: str = ""  # usage limit: "five_hour", "seven_day", …

    def describe(self) -> str:
        status = f"{self.status} " if self.status else ""
        return f"{self.kind.value.replace('_', ' ')} ({status}{self.message or 'no detail'})"


#: One process's stdout reader: a line in, its typed events out (it may keep state, such as
#: the context in use, across lines).
LineParser = Callable[[bytes], list[Event]]


class Dialect(Protocol):
    """One agent CLI's command line, wire format and error language."""

    def argv(self, binary_argv: list[str], role_config: RoleConfig, *, session_id: str,
             resume: bool, system_prompt: str, session_model: str | None = None) -> list[str]:
        """The command line of one persistent agent process."""
        ...

    def user_message(self, prompt: str) -> bytes:
        """One turn's prompt, as written to the process's stdin."""
        ...

    def interrupt_request(self) -> bytes:
        """Ask the process to abort the running turn (it still answers with a result)."""
        ...

    def parser(self, role: str) -> LineParser:
        """A fresh stdout parser for one process of `role`."""
        ...

    def clean_text(self, raw: str) -> str:
        """A stderr line as a human reads it (terminal escapes removed)."""
        ...

    def session_lost(self, result: TurnResult) -> bool:
        """Whether the first result after a resume says the session could not be resumed."""
        ...

    def classify(self, result: TurnResult, rate_limit: RateLimitChanged | None) -> Fault | None:
        """The fault behind an error result, or None for a real reply."""
        ...
