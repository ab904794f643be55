"""The one place where secrets in what an agent says are removed.

Everything that leaves an agent process — each stdout event, the turn's result text, every
stderr line and so the stderr tail a crash reports — passes through `AgentRedactor` in the
process's reader before anything else sees it: records, events, the log, the transcript, the
headless output, the window and the next prompt all get the redacted text, and none of them
has to remember to redact it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from anima.events import Event, RawOutput
from anima.redact import LineRedactor, redact_data

E = TypeVar("E", bound=Event)


def redact_event(event: E) -> E:
    """A copy of an agent event with every string (and nested dict/list) redacted."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, str | dict | list | tuple):
            cleaned = redact_data(value)
            if isinstance(value, tuple):
                cleaned = tuple(cleaned)
            if cleaned != value:
                changes[f.name] = cleaned
    return dataclasses.replace(event, **changes) if changes else event


class AgentRedactor:
    """Redacts one agent process's events. Non-JSON lines arrive one by one, so a PEM private
    key spans many events: a `LineRedactor` per stream hides lines until the key's END line."""

    def __init__(self) -> None:
        self._streams: dict[str, LineRedactor] = {}

    def __call__(self, event: E, stream: str) -> E:
        if isinstance(event, RawOutput):
            line = self._streams.setdefault(stream, LineRedactor())
            event = dataclasses.replace(event, text=line(event.text))
        return redact_event(event)
