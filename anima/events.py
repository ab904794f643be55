"""Typed engine events and the one small bus that carries them.

Events are frozen dataclasses. Subscribers are called synchronously on the thread that
publishes (an engine worker or an agent reader thread); the UI bridge re-emits them as
queued Qt signals, so no widget is ever touched off the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from anima.paths import printable
from anima.phases import Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """Base of every engine event."""


Subscriber = Callable[[Event], None]


class Publisher(Protocol):
    """Where an event source publishes: the bus, or a filter in front of it."""

    def publish(self, event: Event) -> None: ...


class MilestonePublisher:
    """In front of the bus for one milestone's agents: every agent event leaves stamped with
    the milestone id (and a tool call with its summary, by `describe`)."""

    def __init__(self, bus: Publisher, milestone_id: str | None,
                 describe: Callable[[ToolUse], str]) -> None:
        self._bus, self._milestone_id, self._describe = bus, milestone_id, describe

    def publish(self, event: Event) -> None:
        if isinstance(event, ToolUse) and not event.summary:
            event = replace(event, summary=self._describe(event))
        if isinstance(event, AgentEvent) and event.milestone_id != self._milestone_id:
            event = replace(event, milestone_id=self._milestone_id)
        self._bus.publish(event)


class EventBus:
    """Fan-out of events to subscribers; a failing subscriber never breaks the engine."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(event)
            except Exception:
                log.exception("event subscriber failed on %s", type(event).__name__)


# --- agent events: published by anima.agents.process.AgentProcess -------------------------


#: The two agents' roles (`AgentEvent.role`).
DEVELOPER = "developer"
ACCEPTOR = "acceptor"
ROLES = (DEVELOPER, ACCEPTOR)


@dataclass(frozen=True)
class AgentEvent(Event):
    role: str  # DEVELOPER | ACCEPTOR
    #: The milestone the agent works on (stamped by the engine as the event leaves the agent);
    #: None only for an agent run outside a milestone (tests, tools).
    milestone_id: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class SessionStarted(AgentEvent):
    session_id: str
    model: str = ""
    tools: tuple[str, ...] = ()
    #: The CLI's version line (`2.1.330 (Claude Code)`, `codex-cli 0.169.0`): which agent runs.
    cli: str = ""


@dataclass(frozen=True)
class AssistantText(AgentEvent):
    text: str


@dataclass(frozen=True)
class Thinking(AgentEvent):
    text: str


@dataclass(frozen=True)
class ToolUse(AgentEvent):
    tool: str
    tool_use_id: str
    input: dict[str, Any] = field(default_factory=dict)
    #: What the call does, in words (`Bash: git commit -m …`), paths relative to the project:
    #: filled in by the engine, so a view needs neither the agent dialect nor the root.
    summary: str = ""


@dataclass(frozen=True)
class ToolResult(AgentEvent):
    tool_use_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class TurnResult(AgentEvent):
    text: str
    is_error: bool
    session_id: str
    subtype: str = "success"
    #: The CLI's `total_cost_usd`: cumulative for the process, not what this turn cost.
    cost_usd: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    duration_ms: int = 0
    num_turns: int = 0
    #: What this turn spent (None: not known yet; the agent process works it out).
    turn_cost_usd: float | None = None
    #: Tool calls the CLI refused by its tool rules, described (`Bash: git push origin main`).
    permission_denials: tuple[str, ...] = ()
    # What the CLI says about an API error (2.1.197 sets only the status, sometimes null).
    api_error_status: int | None = None
    api_error_type: str = ""
    api_error: str = ""
    terminal_reason: str = ""
    #: Not the CLI's result: what its model calls reported before the process ended, priced
    #: by Anima (`Conversation.unsettled`).
    estimated: bool = False

    @property
    def stopped(self) -> bool:
        """The turn was ended by an interrupt (Anima's Stop, pause, a closed window): claude
        says "aborted_…", codex "interrupted"."""
        return self.terminal_reason in ("aborted_streaming", "aborted_tools", "interrupted")


@dataclass(frozen=True)
class SpendSoFar(AgentEvent):
    """What the turn in flight has spent so far, from what its model calls reported, before
    any result states it: on record while the turn runs (`in_flight`), so a kill of Anima
    mid-turn loses none of it. The turn's result replaces it (`Ledger.account`)."""

    usage: dict[str, Any] = field(default_factory=dict)
    cost_usd: float = 0.0
    #: Priced by Anima at the model's list price: the result may well say otherwise.
    estimated: bool = False


#: What only an agent's turn in flight produces (its words, its tool calls, its result).
TURN_WORK = (AssistantText, Thinking, ToolUse, ToolResult, TurnResult)


@dataclass(frozen=True)
class ApiRetry(AgentEvent):
    """The CLI retries a failed API call by itself (`system/api_retry`)."""

    attempt: int  # 0: not said (nor max_retries)
    max_retries: int
    delay_ms: float | None  # None: not said (Codex)
    error_status: int | None = None
    error: str = ""

    def describe(self) -> str:
        """"API retry 3/10: 529 overloaded, next in 4 s"."""
        cause = " ".join(str(p) for p in (self.error_status, self.error) if p) or "error"
        count = f" {self.attempt}/{self.max_retries}" if self.attempt else ""
        delay = "" if self.delay_ms is None else f", next in {self.delay_ms / 1000:.0f} s"
        return f"API retry{count}: {cause}{delay}"


@dataclass(frozen=True)
class RateLimitChanged(AgentEvent):
    """A subscriber's usage-limit state (`rate_limit_event`): allowed, allowed_warning,
    rejected; `resets_at` in epoch seconds; `utilization` 0..1 when the CLI says."""

    status: str
    resets_at: float | None = None
    limit_type: str = ""
    utilization: float | None = None

    def describe(self) -> str:
        """"5-hour limit 95 % used, resets 18:41" — the usage-limit state in words."""
        parts = [limit_name(self.limit_type)]
        if self.status == "rejected":
            parts.append("reached")
        elif self.utilization is not None:
            parts.append(f"{self.utilization * 100:.0f} % used")
        elif self.status == "allowed_warning":
            parts.append("nearly used up")
        else:
            parts.append("ok")
        text = " ".join(parts)
        if self.resets_at:
            text += f", resets {clock(self.resets_at)}"
        return text


LIMIT_NAMES = {"five_hour": "5-hour limit", "seven_day": "weekly limit",
               "seven_day_opus": "weekly Opus limit", "seven_day_sonnet": "weekly Sonnet limit",
               "overage": "extra-usage limit"}


def limit_name(limit_type: str) -> str:
    return LIMIT_NAMES.get(limit_type, "usage limit")


def clock(epoch: float) -> str:
    """HH:MM in local time (what a user compares with the clock on the wall), with the day
    when it is more than a day away (a weekly limit's reset). A time no calendar
    holds (a CLI that sent milliseconds) is said as what it is, not raised."""
    try:
        when = datetime.fromtimestamp(epoch)
    except (ValueError, OverflowError, OSError):
        return f"an unreadable time ({epoch:g})"
    if abs(epoch - time.time()) < 86400:
        return when.strftime("%H:%M")
    return when.strftime("%a %d %b %H:%M")


@dataclass(frozen=True)
class ContextUsage(AgentEvent):
    """The agent's context after a turn: the last API call's input + cache tokens, of a
    `window`-token context window (published just before the turn's TurnResult)."""

    session_id: str
    tokens: int
    window: int

    @property
    def percent(self) -> float:
        return 100.0 * self.tokens / self.window if self.window else 0.0


@dataclass(frozen=True)
class Compacted(AgentEvent):
    """The CLI compacted the conversation by itself (Claude's `system/compact_boundary`,
    Codex's `contextCompaction` item, which gives no sizes: the context before is the last
    one it reported)."""

    trigger: str
    pre_tokens: int | None
    post_tokens: int | None = None

    def sizes(self, tokens: Callable[[int], str] = str) -> str:
        """": 160000 → 9000 tokens", as far as they are known."""
        if self.pre_tokens is None:
            return ""
        after = f" → {tokens(self.post_tokens)}" if self.post_tokens else ""
        return f": {tokens(self.pre_tokens)}{after} tokens"


@dataclass(frozen=True)
class SandboxFailure(AgentEvent):
    """The CLI's own sandbox cannot start a command: every command the agent runs fails the
    same way, and the CLI tells only the model why (codex sends no item for such a command),
    so the log and the round's notes must. `message` says what failed and what to do."""

    message: str


@dataclass(frozen=True)
class RawOutput(AgentEvent):
    """A line that was not stream-json (crash trace, warning): shown, never lost."""

    text: str


@dataclass(frozen=True)
class AgentExited(AgentEvent):
    exit_code: int | None
    stderr_tail: str = ""
    expected: bool = False


# --- engine events: published by the scheduler and the engine ------------------------------


@dataclass(frozen=True)
class PhaseChanged(Event):
    """The scheduler entered a phase; `deadline` is the wall-clock time (epoch s) the
    current agent turn times out, when one is running."""

    milestone_id: str
    phase: Phase
    previous: Phase
    reason: str = ""
    deadline: float | None = None


@dataclass(frozen=True)
class MilestoneChanged(Event):
    """A milestone record was persisted; `record` is a private copy (MilestoneRecord)."""

    record: Any


@dataclass(frozen=True)
class MilestonesScanned(Event):
    """The project was opened: every usable record, and what was wrong. Published once per
    start; after it, only what changes is published (`MilestoneChanged`, `MilestoneRemoved`,
    `ProblemReported`, `ProblemResolved`), so a view redraws only that."""

    records: tuple[Any, ...]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class MilestoneRemoved(Event):
    """A milestone's files are gone from `.anima/milestones/`."""

    milestone_id: str


@dataclass(frozen=True)
class MilestoneRedefined(Event):
    """A milestone waiting for your review: what of it (`changed`: "features", "acceptance
    criteria") its `.md` says otherwise than its final acceptance judged, so that approving
    sends it back to the Developer; nothing (`()`) once that no longer holds."""

    milestone_id: str
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProblemReported(Event):
    """A milestone file can't be used (malformed, unreadable…); published once, not per scan."""

    text: str


@dataclass(frozen=True)
class ProblemResolved(Event):
    """A problem reported earlier is gone: the file was fixed or removed."""

    text: str


@dataclass(frozen=True)
class EngineReady(Event):
    """The project's config is loaded: the limits the engine really runs with
    (`anima.config.Config`), before the first record is published."""

    config: Any
    #: milestones run at once: `max_parallel_milestones`, or 1 without the sandbox
    parallel: int = 1


@dataclass(frozen=True)
class VerdictReached(Event):
    milestone_id: str
    round: int
    kind: str
    accepted: bool
    reason: str = ""


@dataclass(frozen=True)
class CheckStarted(Event):
    """Anima started the project's checks (config `check_command`) on a round's commit."""

    milestone_id: str
    round: int
    command: str
    started_at: float  # epoch seconds, for a live elapsed time
    timeout: float


@dataclass(frozen=True)
class CheckFinished(Event):
    """The checks ended; `outcome` is a few words ("passed in 2.1 s", "exited 1 after …")."""

    milestone_id: str
    round: int
    command: str
    passed: bool
    outcome: str
    tail: str = ""


#: What a milestone's transcript keeps (`anima.journal`): its agents' events and Anima's own
#: verdict and check lines, so a window replays them as its panes showed them live.
TranscriptEvent = AgentEvent | VerdictReached | CheckStarted | CheckFinished


@dataclass(frozen=True)
class LogLine(Event):
    """A human-readable line of what Anima itself did ("[anima] …" in headless output)."""

    milestone_id: str | None
    text: str

    def __post_init__(self) -> None:
        # Built from git's output too: a file name that is not UTF-8 would fail the log
        # file's write, anima.log's and the headless print, and the line would be lost.
        object.__setattr__(self, "text", printable(self.text))


@dataclass(frozen=True)
class EngineError(Event):
    """Something the user must see: bad config, not a git repo, missing claude…"""

    message: str
    milestone_id: str | None = None


@dataclass(frozen=True)
class UsageLimitWait(Event):
    """The loop waits for a usage limit to reset (`until`: epoch s); None `until` = over."""

    milestone_id: str
    until: float | None
    message: str = ""


@dataclass(frozen=True)
class Notice(Event):
    """A milestone paused, completed or failed: worth a desktop notification."""

    milestone_id: str
    kind: str  # "paused" | "completed" | "awaiting_review" | "failed" | "waiting" | "held"
    message: str
