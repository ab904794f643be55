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
