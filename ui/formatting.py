"""How records' values read in the window: enums, durations, token counts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def enum_text(x: Any) -> str:
    """The string of a StrEnum or a plain string (records are engine pydantic models)."""
    return str(getattr(x, "value", x))


def format_duration(seconds: float) -> str:
    """'42 s', '3:07', '1:02:03' — short and monotone so a ticking clock does not jitter."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    end = end or datetime.now(UTC)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    if end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    return (end - start).total_seconds()


def format_tokens(n: int) -> str:
    """12345 → '12.3k'; the panes and bars show orders of magnitude, not digits."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return str(n)


class ElapsedClock:
    """How long each milestone has run, as this window shows it: it never runs backwards.

    A running milestone counts from its start to now; one that stopped counts to its last
    round's end, which is earlier than the moment it stopped when a round was cut short (Stop
    now, a pause mid-round); one stopped before any round ended counts no further (it keeps
    what was shown while it ran, else "—"). The clock keeps the highest value it showed
    instead of jumping back from 5:54 to 3:50 on pause.
    """

    def __init__(self) -> None:
        self._shown: dict[str, float] = {}

    def seconds(self, record: Any) -> float | None:
        end = record.completed_at
        running = enum_text(record.status) == "in_progress"
        if end is None and not running:
            if not record.iterations:
                # Stopped before its first round ended: when is not on record. What this
                # window showed while it ran stays; it never counts on to now.
                return self._shown.get(record.id)
            end = max(it.ended_at for it in record.iterations)
        seconds = seconds_between(record.started_at, end)
        if seconds is None:
            return None
        shown = max(seconds, self._shown.get(record.id, 0.0))
        self._shown[record.id] = shown
        return shown

    def text(self, record: Any) -> str:
        seconds = self.seconds(record)
        return "—" if seconds is None else format_duration(seconds)


def local_time(moment: datetime) -> str:
    """"14:05" today, "3 Mar 14:05" another day: when something happened, in local time."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    local = moment.astimezone()
    today = datetime.now().astimezone().date()
    return local.strftime("%H:%M" if local.date() == today else "%-d %b %H:%M")
