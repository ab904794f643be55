"""`anima run --headless`: both agents and Anima itself as `[role] …` lines on the terminal;
once several milestones have run at once, each line about a milestone starts with its id:
`[m1] [developer] …` (so does any milestone's line while another one runs). From then on a
bare line would be about whichever one the reader guesses: one pausing as another completes
left the rest of the other's lines bare.

Apart from the commands so that `anima status`, which scripts poll, never imports the event
types and the tool descriptions.
"""

from __future__ import annotations

import threading
from typing import TextIO

from anima.agents.tools import describe_tool
from anima.events import (
    AgentEvent,
    AssistantText,
    ContextUsage,
    EngineError,
    Event,
    LogLine,
    PhaseChanged,
    RawOutput,
    ToolResult,
    ToolUse,
    TurnResult,
)
from anima.phases import RUNNING
from anima.text.redact import redact

# What one event may print; a terminal scrolling a megabyte of one reply is not watching.
_MAX_CHARS = 20_000


class HeadlessPrinter:
    """Streams both agents and Anima itself to stdout as `[role] …` lines."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self._lock = threading.Lock()
        self._running: set[str] = set()  # the milestones in a running phase
        self._several = False  # whether two have been in one at once in this run

    def __call__(self, event: Event) -> None:
        if isinstance(event, PhaseChanged):
            with self._lock:
                if event.phase in RUNNING:
                    self._running.add(event.milestone_id)
                    self._several = self._several or len(self._running) > 1
                else:
                    self._running.discard(event.milestone_id)
        prefix, text = self._describe(event)
        if text is None:
            return
        milestone = getattr(event, "milestone_id", None)
        if milestone and (self._several or self._running - {milestone}):
            # Another one runs, or ran beside one: the line is about this one (one
            # starting, one that ended).
            prefix = f"{milestone}] [{prefix}"
        stream = self.err if isinstance(event, EngineError) else self.out
        if len(text) > _MAX_CHARS:  # a runaway reply: the transcript has all of it
            text = f"{text[:_MAX_CHARS]}… ({len(text) - _MAX_CHARS} more characters in the " \
                   "transcript)"
        lines = [f"[{prefix}] {line}" for line in text.splitlines() or [""]]
        with self._lock:
            stream.write("\n".join(lines) + "\n")
            stream.flush()

    @staticmethod
    def _describe(event: Event) -> tuple[str, str | None]:
        if isinstance(event, LogLine):
            return "anima", redact(event.text)
        if isinstance(event, EngineError):
            return "anima", f"error: {redact(event.message)}"
        if not isinstance(event, AgentEvent):
            return "", None
        if isinstance(event, AssistantText):
            return event.role, event.text
        if isinstance(event, ToolUse):
            return event.role, f"▸ {describe_tool(event.tool, event.input)}"
        if isinstance(event, ToolResult):
            return (event.role, f"  ✗ {event.content[:200]}") if event.is_error else ("", None)
        if isinstance(event, TurnResult):
            how = "stopped" if event.stopped else "done"
            spent = event.turn_cost_usd  # what this turn cost, not the process's total
            return event.role, (f"— turn {how} in {event.duration_ms / 1000:.1f} s"
                                + (f", ${spent:.4f}" if spent is not None else "")
                                + (" (error)" if event.is_error and not event.stopped else ""))
        if isinstance(event, RawOutput):
            return event.role, f"(raw) {event.text}"
        if isinstance(event, ContextUsage):
            return event.role, (f"— context in use: {event.tokens} of {event.window} tokens "
                                f"({event.percent:.0f}%)")
        return "", None
