"""What Anima needs to know of one agent CLI: the `Backend` protocol (with its `Dialect`, the
wire format of one process). The transport and the turns (anima.agents.transport,
anima.agents.process) speak through it; the loop sees only typed events, turn results and the
faults below. `anima.agents.claude` and `anima.agents.codex` implement it, and only the agent
factory (`anima.engine.agents`) picks one (an import-linter contract keeps it so)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from anima.config import Config, RoleConfig
from anima.events import ROLES, Event, RateLimitChanged, TurnResult
from anima.paths import resource

# CSI, OSC (ended by BEL or ST), charset selection (ESC ( B), and the two-byte escapes (ESC 7,
# ESC =, ESC M…).
_TERMINAL_CODES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()*+][0-9A-Za-z]"
    r"|\x1b[0-9@-Z\\-_=>]"
)


def clean_text(raw: str) -> str:
    """A line as a human reads it: the terminal escapes and carriage returns a
    terminal-minded CLI prints (on stderr, or instead of its protocol) removed."""
    return _TERMINAL_CODES.sub("", raw).replace("\r", "")


def wire_number(value: Any) -> float:
    """A figure an agent CLI reports (a cost, tokens, milliseconds) as Anima counts it: a
    finite number not below 0, else 0. One odd field (text, a list, NaN, an infinity, a
    negative cost) must not fail the milestone that reads it, nor reach its record, which
    refuses a negative cost and could not be read back with an infinite one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return 0.0
    return number if math.isfinite(number) and number >= 0 else 0.0


def wire_count(value: Any) -> int:
    """`wire_number` for a count (tokens, turns, a retry's attempt)."""
    return int(wire_number(value))


def wire_flag(value: Any) -> bool:
    """A yes/no an agent CLI reports (`is_error`) as Anima reads it: true, or the text
    "true"; anything else is no. `bool("false")` is True: a flag sent as text would turn
    every reply into an error to retry, then pause on."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True


class FaultKind(StrEnum):
    STOPPED = "stopped"  # Anima's own interrupt ended the turn
    AUTH = "auth"  # not logged in, bad or expired key
    SETUP = "setup"  # the CLI cannot start a session as this machine configures it
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
    advice: str = ""  # auth: what the human does about it, in the CLI's own terms

    def describe(self) -> str:
        status = f"{self.status} " if self.status else ""
        return f"{self.kind.value.replace('_', ' ')} ({status}{self.message or 'no detail'})"


@dataclass(frozen=True)
class AgentBinary:
    """A command that ran `--version` successfully; argv may be several words (`python3 x.py`)."""

    argv: list[str]
    version: str

    def install_paths(self) -> tuple[Path, ...]:
        """What a sandbox must keep visible to run it: the folders of the files its command
        names, and their real locations (npm links `.bin/<cli>` into its package). Inside
        an npm tree, the whole `node_modules`: a package may run a sibling (`@openai/codex`
        runs the binary of `@openai/codex-linux-x64`)."""
        found: list[Path] = []
        for word in self.argv:
            if os.path.isabs(word) and os.path.exists(word):
                real = Path(os.path.realpath(word))
                found += [Path(word).parent, real.parent]
                found += [p for p in real.parents if p.name == "node_modules"][-1:]
        return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class RoleProfile:
    """One role: its name, the system prompt given to the CLI, and its settings."""

    role: str
    system_prompt: str
    config: RoleConfig


def load_system_prompt(role: str) -> str:
    """The role's prompt from `resources/prompts/<role>_system.md` (works from a wheel too);
    the same for every backend."""
    if role not in ROLES:
        raise ValueError(f"unknown agent role {role!r}; expected one of {ROLES}")
    return resource("prompts", f"{role}_system.md").read_text(encoding="utf-8").strip()


class Conversation(Protocol):
    """One process's side of the wire: what Anima writes to its stdin and how its stdout
    reads. It may keep state across lines (the context in use, a thread id, the turn in
    flight)."""

    def opening(self) -> bytes:
        """What is written right after the start, before any turn (b"": nothing); when not
        empty, the process is ready once it printed a `SessionStarted` (or a result)."""
        ...

    def user_message(self, prompt: str) -> bytes:
        """One turn's prompt, as written to the process's stdin."""
        ...

    def interrupt_request(self) -> bytes:
        """Ask the process to abort the running turn (it still answers with a result)."""
        ...

    def parse(self, line: bytes) -> list[Event]:
        """One stdout line in, its typed events out."""
        ...

    def unsettled(self) -> TurnResult | None:
        """What the process spent that no result carried yet (it died, or was stopped, in
        the middle of a turn), as a result no turn takes; None when nothing is known (a CLI
        that states its spend only in its results)."""
        ...

    def replies(self) -> bytes:
        """The answers to what the lines parsed so far asked of Anima (b"": nothing asked),
        written to stdin at once: nobody answers an unattended run, and a CLI that waited
        for an answer would wait until the idle timeout."""
        ...


class Dialect(Protocol):
    """One agent CLI's command line, wire format and error language."""

    def argv(self, binary_argv: list[str], role_config: RoleConfig, *, session_id: str,
             resume: bool, system_prompt: str, session_model: str | None = None) -> list[str]:
        """The command line of one persistent agent process."""
        ...

    def conversation(self, role: str, *, session_id: str, resume: bool,
                     system_prompt: str, role_config: RoleConfig) -> Conversation:
        """A fresh wire state for one process of `role`."""
        ...

    def session_lost(self, result: TurnResult) -> bool:
        """Whether the first result after a resume says the session could not be resumed."""
        ...

    def classify(self, result: TurnResult, rate_limit: RateLimitChanged | None) -> Fault | None:
        """The fault behind an error result, or None for a real reply."""
        ...


class Backend(Dialect, Protocol):
    """Everything vendor-specific about one agent CLI: its dialect, finding and versioning its
    binary, the roles' settings, how its sessions are named, what its processes look like after
    a crash, and what its private home in the sandbox needs.

    Anima names a new session (claude's `--session-id`), or the CLI does: then its
    conversation's opening reports the id in a `SessionStarted` and the process adopts it."""

    #: The config's `agent` value ("claude", "codex").
    name: str
    #: The model API its account speaks ("anthropic", "openai"): Anima's own summaries and
    #: token counts use Anthropic's, so they run only beside a backend that speaks it.
    api: str
    #: What the CLI reads in its HOME as its user's instructions and settings (folders end in
    #: "/"): read-only to a confined reviewer, whose commands run the Developer's code.
    home_config: tuple[str, ...]

    def find(self, configured: str | None, roles: tuple[str, ...] = ()) -> AgentBinary:
        """The CLI to run: `configured`, else its environment variable, else PATH; raises
        AgentNotFound saying how to install it and naming the settings of `roles` (those
        that run it)."""
        ...

    def profile(self, role: str, config: Config, tree: Path, *,
                confined: bool = False) -> RoleProfile:
        """The role's prompt and settings, with pushes denied unless `allow_push` is set;
        `tree`: the folder it works in (for the Acceptor, the Developer's); `confined`: it
        runs in Anima's sandbox (`anima.loop.confinement`)."""
        ...

    def owns_process(self, argv: list[str], session_id: str) -> bool:
        """Whether a command line is one of this backend's agents on `session_id` (for
        leftovers after a crash; the caller also checks it runs in the project)."""
        ...

    def prepare_home(self, home: Path, real_home: Path) -> tuple[tuple[Path, Path], ...]:
        """Fill a sandboxed agent's private HOME with what the CLI needs to start logged in;
        returns (real file, file in the private home) pairs to bind read-write."""
        ...

    def environment(self, config: Config, home: Path | None) -> dict[str, str]:
        """Variables the CLI's process needs on top of Anima's (`home`: its private HOME when
        sandboxed)."""
        ...

    def credentials(self, environ: Mapping[str, str]) -> set[str]:
        """The credential variables of `environ` (`anima.credentials`) its CLI logs in with:
        they reach its process, and no other agent's nor the checks'."""
        ...
