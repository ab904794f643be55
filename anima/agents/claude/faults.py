"""What a `result` with `is_error: true` means: a typed fault the loop acts on, never a reply.

The CLI reports API trouble as an ordinary turn (README, "When the API fails"; the lines are
captured in tests/fixtures/cli_lines/): 2.1.330 names it in `api_error_status`,
`api_error_type`, `api_error` and `terminal_reason`; 2.1.197 gives only the status, and a
529 that outlasts the retries comes with a null status. So the fields decide first and the
CLI's own words second.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from anima.agents.dialect import Fault, FaultKind
from anima.events import RateLimitChanged, TurnResult

_AUTH_TYPES = {"authentication_error", "permission_error"}
_AUTH_TEXT = re.compile(r"not logged in|invalid api key|/login\b|oauth token|"
                        r"authentication_failed|authentication_error", re.IGNORECASE)
_USAGE_TEXT = re.compile(r"you[’']ve hit your\b.*\blimit", re.IGNORECASE)
_RESET_TEXT = re.compile(
    r"resets\s+(?:(?P<month>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}),?\s+(?:at\s+)?)?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>am|pm)"
    r"(?:\s*\((?P<tz>[^)]+)\))?", re.IGNORECASE)
_TOO_LONG_TEXT = re.compile(r"prompt is too long", re.IGNORECASE)
_STOPPED_REASONS = {"aborted_streaming", "aborted_tools"}
#: A reset shown this long ago or less is the one just past (see `reset_from_text`).
_JUST_PAST = timedelta(hours=1)
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]


def classify(result: TurnResult, rate_limit: RateLimitChanged | None = None,
             now: float | None = None) -> Fault | None:
    """The fault behind an error result, or None for a real reply.

    `rate_limit` is the latest `rate_limit_event` the same process printed (a subscriber's
    rejected 429 comes right after one with `status: rejected` and `resetsAt`).
    """
    if not result.is_error:
        return None
    text = result.text.strip()
    status = result.api_error_status
    if result.terminal_reason in _STOPPED_REASONS:
        return Fault(FaultKind.STOPPED, text or "interrupted", status)
    if status in (401, 403) or result.api_error_type in _AUTH_TYPES or _AUTH_TEXT.search(text):
        return Fault(FaultKind.AUTH, text, status, advice=login_advice(text))
    rejected = rate_limit is not None and rate_limit.status == "rejected"
    if (result.api_error == "usage_limit_reached" or _USAGE_TEXT.search(text)
            or (status == 429 and rejected)):
        resets_at = rate_limit.resets_at if rejected and rate_limit else None
        return Fault(FaultKind.USAGE_LIMIT, text, status,
                     resets_at=resets_at or reset_from_text(text, now),
                     limit_type=rate_limit.limit_type if rate_limit else "")
    if result.terminal_reason == "prompt_too_long" or _TOO_LONG_TEXT.search(text):
        return Fault(FaultKind.PROMPT_TOO_LONG, text, status)
    return Fault(FaultKind.TRANSIENT, text or result.subtype, status)


def login_advice(message: str) -> str:
    """The words a user needs: what is wrong with `claude` here and the two ways to fix it."""
    if re.search(r"not logged in|/login", message, re.IGNORECASE) or not message:
        return ("claude is not logged in: run `claude` once and log in, or set "
                "ANTHROPIC_API_KEY; then resume")
    if re.search(r"oauth", message, re.IGNORECASE):  # a login's token, never an API key's
        return (f"claude's login no longer works ({message}): run `claude` once and log in "
                "again; then resume")
    return (f"claude cannot use the API ({message}): check ANTHROPIC_API_KEY, "
            "or unset it and run `claude` once to log in; then resume")


def reset_from_text(text: str, now: float | None = None) -> float | None:
    """"… · resets 9:41pm (UTC)" (or "resets Nov 25, 3pm (Europe/Berlin)") as epoch seconds:
    the next such moment after `now`, or one less than an hour ago: the CLI shows it to
    the minute (or the hour), so a limit hit within that minute, or by a clock a little ahead
    of the server's, names a moment just past, not tomorrow's."""
    match = _RESET_TEXT.search(text)
    if match is None:
        return None
    try:
        zone = ZoneInfo(match["tz"].strip()) if match["tz"] else ZoneInfo("UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    current = datetime.fromtimestamp(time.time() if now is None else now, zone)
    hour = int(match["hour"]) % 12 + (12 if match["ampm"].lower() == "pm" else 0)
    candidate = current.replace(hour=hour, minute=int(match["minute"] or 0), second=0,
                                microsecond=0)
    if match["month"] and match["month"].lower() in _MONTHS:
        month = _MONTHS.index(match["month"].lower()) + 1
        candidate = candidate.replace(month=month, day=int(match["day"]))
        if candidate <= current - _JUST_PAST:
            candidate = candidate.replace(year=candidate.year + 1)
    elif candidate <= current - _JUST_PAST:
        candidate += timedelta(days=1)
    return candidate.timestamp()
