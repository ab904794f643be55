"""Classifying error results, on lines the real CLIs (2.1.197 and 2.1.330) printed against the
stub (tests/fixtures/cli_lines/<case>-<version>.jsonl)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.agents.claude.faults import Fault, FaultKind, classify, reset_from_text
from anima.agents.claude.protocol import parse_line
from anima.events import ApiRetry, Event, RateLimitChanged, TurnResult

CLI_LINES = Path(__file__).resolve().parent / "fixtures" / "cli_lines"
VERSIONS = ["2.1.197", "2.1.330"]


def first_turn(case: str, version: str) -> list[Event]:
    """The events of the captured first turn, up to and including its result."""
    events: list[Event] = []
    for line in (CLI_LINES / f"{case}-{version}.jsonl").read_bytes().splitlines():
        events += parse_line("developer", line)
        if events and isinstance(events[-1], TurnResult):
            return events
    raise AssertionError(f"no result in {case}-{version}")


def fault_of(case: str, version: str, kind: FaultKind) -> Fault:
    """The fault of the captured turn, which must be of `kind`."""
    events = first_turn(case, version)
    limits = [e for e in events if isinstance(e, RateLimitChanged)]
    result = events[-1]
    assert isinstance(result, TurnResult)
    fault = classify(result, limits[-1] if limits else None)
    assert fault is not None and fault.kind is kind
    return fault


@pytest.mark.parametrize("version", VERSIONS)
def test_an_invalid_key_and_no_login_are_auth_faults(version: str) -> None:
    bad_key = fault_of("401", version, FaultKind.AUTH)
    assert bad_key.message == "Invalid API key · Fix external API key"
    no_login = fault_of("nologin", version, FaultKind.AUTH)
    assert "Not logged in" in no_login.message


@pytest.mark.parametrize("version", VERSIONS)
def test_a_subscriber_429_is_a_usage_limit_with_its_reset(version: str) -> None:
    events = first_turn("usage", version)
    (limit,) = [e for e in events if isinstance(e, RateLimitChanged)]
    assert limit.status == "rejected" and limit.limit_type == "five_hour"
    fault = fault_of("usage", version, FaultKind.USAGE_LIMIT)
    assert fault.resets_at == limit.resets_at and fault.limit_type == "five_hour"
    assert fault.message.startswith("You've hit your")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_usage_limit_text_alone_is_enough(version: str) -> None:
    """Without the rate_limit_event (it may have come in an earlier turn), the words decide
    and the reset time is read from them."""
    result = first_turn("usage", version)[-1]
    assert isinstance(result, TurnResult)
    fault = classify(result, None, now=datetime(2026, 11, 23, 20, 0, tzinfo=UTC).timestamp())
    assert fault is not None and fault.kind is FaultKind.USAGE_LIMIT
    assert fault.resets_at == datetime(2026, 11, 23, 21, 42, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("version", VERSIONS)
def test_repeated_529s_are_transient_even_with_a_null_status(version: str) -> None:
    events = first_turn("529", version)
    retries = [e for e in events if isinstance(e, ApiRetry)]
    assert [(r.attempt, r.max_retries, r.error_status, r.error) for r in retries] == [
        (1, 2, 529, "overloaded"), (2, 2, 529, "overloaded")]
    assert retries[0].describe() == "API retry 1/2: 529 overloaded, next in 1 s"
    fault = fault_of("529", version, FaultKind.TRANSIENT)
    assert "Repeated 529 Overloaded" in fault.message


@pytest.mark.parametrize("version", VERSIONS)
def test_prompt_too_long(version: str) -> None:
    fault = fault_of("toolong", version, FaultKind.PROMPT_TOO_LONG)
    assert fault.status == 400 and fault.message.startswith("Prompt is too long")


@pytest.mark.parametrize("version", VERSIONS)
def test_an_interrupted_turn_is_stopped_not_failed(version: str) -> None:
    result = first_turn("interrupt", version)[-1]
    assert isinstance(result, TurnResult) and result.stopped
    fault = classify(result)
    assert fault is not None and fault.kind is FaultKind.STOPPED


@pytest.mark.parametrize("version", VERSIONS)
def test_a_real_reply_is_no_fault_and_a_warning_is_worded(version: str) -> None:
    events = first_turn("warn", version)
    (limit,) = [e for e in events if isinstance(e, RateLimitChanged)]
    assert limit.status == "allowed_warning" and limit.utilization == 0.95
    assert limit.describe().startswith("5-hour limit 95 % used, resets ")
    result = events[-1]
    assert isinstance(result, TurnResult) and classify(result, limit) is None


def test_2_1_330_keeps_a_warning_in_its_window_while_the_top_says_allowed() -> None:
    line = ('{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":'
            '1795470075,"rateLimitType":"five_hour","isUsingOverage":false,"unifiedWindows":'
            '{"five_hour":{"utilization":0.95,"resetsAt":1795470075,"status":"allowed_warning"}}}'
            ',"uuid":"u","session_id":"s"}')
    (event,) = parse_line("acceptor", line)
    assert isinstance(event, RateLimitChanged)
    assert (event.status, event.utilization, event.resets_at) == (
        "allowed_warning", 0.95, 1795470075.0)


def test_reset_times_in_other_words() -> None:
    now = datetime(2026, 11, 23, 22, 30, tzinfo=UTC).timestamp()
    tomorrow = reset_from_text("You've hit your limit · resets 6am (UTC)", now)
    assert tomorrow == datetime(2026, 11, 24, 6, 0, tzinfo=UTC).timestamp()
    berlin = reset_from_text("You've hit your weekly limit · resets Nov 25, 3pm "
                             "(Europe/Berlin)", now)
    assert berlin == datetime(2026, 11, 25, 14, 0, tzinfo=UTC).timestamp()
    assert reset_from_text("no time here", now) is None


@pytest.mark.parametrize("shown", ["3:41am", "3am"])
def test_a_reset_shown_as_the_minute_just_passed_is_now_not_tomorrow(shown: str) -> None:
    """The CLI shows the reset to the minute (or the hour): a limit hit within that minute,
    or by a clock a little ahead of the server's, reads as a moment just past. Taken for
    tomorrow's, it would pause an overnight run for a human (more than the 6 h wait allowed)
    for a limit that is lifting now."""
    now = datetime(2026, 11, 26, 3, 41, 25, tzinfo=UTC).timestamp()
    shown_at = datetime(2026, 11, 26, 3, 0 if shown == "3am" else 41, tzinfo=UTC).timestamp()
    assert reset_from_text(f"You've hit your 5-hour limit · resets {shown} (UTC)",
                           now) == shown_at
    an_hour_ago = reset_from_text("You've hit your limit · resets 2:30am (UTC)", now)
    assert an_hour_ago == datetime(2026, 11, 27, 2, 30, tzinfo=UTC).timestamp()
