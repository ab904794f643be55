"""What a failed Codex turn means, from the CLI's own lines (`turn/completed` with status
`failed` and `error: {message, codexErrorInfo}`), measured with codex-cli 0.169:

- a ChatGPT plan's usage limit: `usageLimitExceeded`, "You’ve hit your usage limit. … try again
  at 9:00 PM." (the reset in the machine's local time; a later day adds the date);
- a refused key: `{"httpConnectionFailed": {"httpStatusCode": 401}}`, "unexpected status 401
  Unauthorized: …"; no key at all: "Missing environment variable: `OPENAI_API_KEY`";
- an API key's account out of credit ("Quota exceeded. Check your plan and billing details.")
  and a ChatGPT plan without Codex ("To use Codex with your ChatGPT plan, upgrade to Plus"):
  `usageLimitExceeded` as well, with no reset, since none comes;
- a model the API does not know: `modelNotFound`, "The model `x` does not exist or you do not
  have access to it.";
- a 5xx that outlasted the CLI's retries: `internalServerError` (or `serverOverloaded`);
- a context that no longer fits: `contextWindowExceeded`;
- a config it cannot start a thread with: `thread/start` answers an error ("failed to load
  configuration: Model provider `x` not found").
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

from anima.agents.codex.protocol import INTERRUPTED, NOT_STARTED, SESSION_LOST
from anima.agents.dialect import Fault, FaultKind
from anima.events import RateLimitChanged, TurnResult

_AUTH_KINDS = {"unauthorized"}
_AUTH_TEXT = re.compile(r"\b401\b|\b403\b|unauthorized|invalid api key|incorrect api key|"
                        r"missing environment variable|not logged in|codex login|"
                        r"refresh token", re.IGNORECASE)
_USAGE_TEXT = re.compile(r"hit your usage limit|usage limit has been reached", re.IGNORECASE)
_BILLING_TEXT = re.compile(r"quota exceeded|billing details|upgrade to plus", re.IGNORECASE)
_TOO_LONG_TEXT = re.compile(r"context window|context_length_exceeded", re.IGNORECASE)
_RESET_TEXT = re.compile(
    r"try again at\s+(?:(?P<month>[A-Z][a-z]{2})[a-z]*\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?"
    r"\s+(?:(?P<year>\d{4}),?\s+)?)?(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>AM|PM)?",
    re.IGNORECASE)
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]


def _advice(trouble: str, message: str, fix: str) -> str:
    return f"{trouble} ({message}): {fix}; then resume"


def login_advice(message: str) -> str:
    return _advice("codex cannot use the API", message or "not logged in",
                   "run `codex login`, or set OPENAI_API_KEY (or the key your Codex provider "
                   "names)")


def setup_advice(message: str) -> str:
    return _advice("codex could not start a thread", message,
                   "fix its configuration (config.toml in CODEX_HOME, ~/.codex by default, or "
                   "the role's extra_args in .anima/config.json)")


def billing_advice(message: str) -> str:
    return _advice("codex's account cannot pay for more calls", message,
                   "add credit or change the plan (see its billing details), or log codex in "
                   "to another account")


def model_advice(message: str) -> str:
    return _advice("codex's model is not available", message,
                   "fix the role's model in .anima/config.json (or `model` in config.toml in "
                   "CODEX_HOME, ~/.codex by default)")


def classify(result: TurnResult, rate_limit: RateLimitChanged | None = None,
             now: float | None = None) -> Fault | None:
    """The fault behind a failed turn, or None for a real reply. `rate_limit` is the latest
    window state the process reported: used up, its reset is exact (the text names a
    minute)."""
    if not result.is_error:
        return None
    text, status, kind = result.text.strip(), result.api_error_status, result.api_error
    if result.subtype == INTERRUPTED:
        return Fault(FaultKind.STOPPED, text or "interrupted", status)
    if kind == "usageLimitExceeded" and not _USAGE_TEXT.search(text) \
            and _BILLING_TEXT.search(text):  # no reset comes: waiting would never end it
        return Fault(FaultKind.SETUP, text, status or 429, advice=billing_advice(text))
    if kind == "usageLimitExceeded" or _USAGE_TEXT.search(text):
        known = rate_limit if rate_limit is not None and rate_limit.status == "rejected" \
            else None
        return Fault(FaultKind.USAGE_LIMIT, text, status or 429,
                     resets_at=(known.resets_at if known else None) or reset_from_text(text, now),
                     limit_type=known.limit_type if known else "")
    if status in (401, 403) or kind in _AUTH_KINDS or _AUTH_TEXT.search(text):
        return Fault(FaultKind.AUTH, text, status, advice=login_advice(text))
    if kind == "modelNotFound":
        return Fault(FaultKind.SETUP, text, status, advice=model_advice(text))
    if result.subtype == NOT_STARTED:
        return Fault(FaultKind.SETUP, text, status, advice=setup_advice(text))
    if kind == "contextWindowExceeded" or _TOO_LONG_TEXT.search(text):
        return Fault(FaultKind.PROMPT_TOO_LONG, text, status)
    return Fault(FaultKind.TRANSIENT, text or result.subtype, status)


def session_lost(result: TurnResult) -> bool:
    return result.subtype == SESSION_LOST


def reset_from_text(text: str, now: float | None = None) -> float | None:
    """"… try again at 9:00 PM." (or "at Nov 27th, 2026 9:00 PM") as epoch seconds, read in
    the machine's local time as Codex writes it: the next such minute from `now` on."""
    match = _RESET_TEXT.search(text)
    if match is None:
        return None
    current = datetime.fromtimestamp(time.time() if now is None else now).astimezone()
    hour = int(match["hour"])
    if match["ampm"]:
        hour = hour % 12 + (12 if match["ampm"].upper() == "PM" else 0)
    candidate = current.replace(hour=hour, minute=int(match["minute"]), second=0,
                                microsecond=0)
    if match["month"] and match["month"][:3].lower() in _MONTHS:
        candidate = candidate.replace(
            year=int(match["year"] or candidate.year),
            month=_MONTHS.index(match["month"][:3].lower()) + 1, day=int(match["day"]))
    elif candidate <= current - timedelta(minutes=1):
        candidate += timedelta(days=1)
    # Codex names the minute: a reset within the current one is due now (the loop's margin,
    # `usage_limit_margin_seconds`, covers the rest of it).
    return max(candidate, current).timestamp()
