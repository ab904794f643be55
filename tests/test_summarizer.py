"""The round summarizer through the real anthropic SDK against a local Messages API stub."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from anima.config import SummarizerConfig
from anima.store.models import Usage
from anima.text.redact import REDACTED
from anima.text.summarizer import (
    PRICES_PER_MTOK,
    RoundDigest,
    Summarizer,
    cost_usd,
    fallback_summary,
)
from tests.fakes.api_stub import ApiStub, Reply

SECRET = "sk-ant-api03-" + "Q7w8E9r0T1" * 6

REPORT = f"""## Implementation Report — Round 3

**Feature**: F2 Context budget
**Commit**: 3f2a9c1e0b7d4a6f
**Tests**: 12 passed, 0 failed
**Lint**: clean

### Changes
- anima/context.py: fit_to_budget trims the lowest cut_order first
- tests/test_context.py: budget tests
- anima/prompts.py: uses the budget

### Notes
The key {SECRET} was in the environment; password=hunter2 too.
"""


def digest(**overrides: object) -> RoundDigest:
    values: dict[str, object] = dict(
        round=3, kind="feature", feature="F2", commit="3f2a9c1e0b7d4a6f",
        changed_files=["anima/context.py", "tests/test_context.py", "anima/prompts.py",
                       "README.md"],
        verdict="rejected", reason="No CJK estimate test.\nSecond line.", report=REPORT)
    values.update(overrides)
    return RoundDigest(**values)  # type: ignore[arg-type]


@pytest.fixture
def stub() -> Iterator[ApiStub]:
    """Every request is a "main" request here: the summarizer offers no tools."""
    with ApiStub(default="Built the context budget in anima/context.py; rejected: no CJK test.",
                 is_main=lambda request: True) as s:
        yield s


def env_for(url: str) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test-dummy", "ANTHROPIC_BASE_URL": url}


@pytest.fixture
def make() -> Iterator[object]:
    made: list[Summarizer] = []

    def factory(env: dict[str, str], **config: object) -> Summarizer:
        s = Summarizer(SummarizerConfig(**config), env=env)  # type: ignore[arg-type]
        made.append(s)
        return s

    yield factory
    for s in made:
        s.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("anima-summarizer")]


# --- fallback --------------------------------------------------------------------------------

def test_fallback_summary_from_report() -> None:
    text = fallback_summary(digest())
    first, second = text.split("\n")
    assert first.startswith("F2 — commit 3f2a9c1; anima/context.py: fit_to_budget")
    assert "files: anima/context.py, tests/test_context.py, anima/prompts.py (+1 more)" in first
    assert second == "REJECTED: No CJK estimate test."
    assert len(text) <= 300


def test_fallback_summary_is_short_and_redacted() -> None:
    long_report = "### Changes\n" + "".join(f"- file{i}.py: {'x' * 200} {SECRET}\n"
                                            for i in range(20))
    text = fallback_summary(digest(report=long_report, reason="r " * 300,
                                   changed_files=[f"f{i}" for i in range(50)]))
    assert len(text) <= 300 and text.count("\n") <= 1
    assert SECRET not in text


def test_fallback_summary_without_sections_uses_first_line() -> None:
    text = fallback_summary(digest(feature=None, commit=None, changed_files=[],
                                   verdict="accepted", reason="", report="Fixed the flaky test."))
    assert text == "feature — Fixed the flaky test.\nACCEPTED"


def test_fallback_ignores_headings_inside_code_fences() -> None:
    report = "```\n### Changes\n- fake\n```\n### Changes\n- real.py: the real change\n"
    assert "real.py: the real change" in fallback_summary(digest(report=report))


# --- the model path --------------------------------------------------------------------------

def test_model_summary_through_the_sdk(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url), model="claude-haiku-4-5", max_tokens=123)
    stub.push(Reply(text=f"Summary: Built the budget; leaked {SECRET}.",
                    usage={"input_tokens": 1000, "output_tokens": 100}))
    result = s.summarize(digest())
    assert result.source == "model"
    assert result.text == f"Built the budget; leaked {REDACTED}."
    assert result.usage == Usage(input_tokens=1000, output_tokens=100)
    assert result.cost_usd == pytest.approx((1000 * 1.0 + 100 * 5.0) / 1e6)
    [request] = stub.requests
    assert request["model"] == "claude-haiku-4-5" and request["max_tokens"] == 123
    sent = json.dumps(request)
    assert SECRET not in sent and "hunter2" not in sent
    assert "Round: 3 (feature)" in sent and "fit_to_budget" in sent


def test_server_error_falls_back_without_retry(make) -> None:
    hits: list[str] = []

    class Failing(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.dumps({"type": "error", "error": {"type": "api_error",
                                                          "message": "boom"}}).encode()
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        s = make(env_for(f"http://127.0.0.1:{server.server_address[1]}"))
        result = s.summarize(digest())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert result.source == "report"
    assert result.text == fallback_summary(digest())
    assert "500" in result.note
    assert result.usage == Usage() and result.cost_usd == 0.0
    assert hits == ["/v1/messages"]  # max_retries=0: exactly one attempt


def test_hanging_api_falls_back_within_the_timeout(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url), timeout_seconds=0.5)
    stub.push(Reply(text="too late", delay=10))
    start = time.monotonic()
    result = s.summarize(digest())
    elapsed = time.monotonic() - start
    assert result.source == "report" and result.note == "timeout"
    # Well before the 10 s the reply takes: the 0.5 s timeout, plus the SDK's first import on
    # a cold run, which a busy CI machine (the suite on 4 workers) makes seconds long.
    assert elapsed < 8.0


def test_no_key_falls_back_without_any_request(stub: ApiStub, make) -> None:
    s = make({"ANTHROPIC_BASE_URL": stub.url})
    result = s.summarize(digest())
    assert (result.source, result.note) == ("report", "no ANTHROPIC_API_KEY")
    assert not s.uses_model
    assert stub.requests == []


def test_disabled_falls_back_without_any_request(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url), enabled=False)
    result = s.summarize(digest())
    assert (result.source, result.note) == ("report", "summarizer disabled")
    assert stub.requests == []


def test_empty_model_answer_falls_back_but_counts_usage(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url))
    stub.push(Reply(text="", usage={"input_tokens": 10, "output_tokens": 0}))
    result = s.summarize(digest())
    assert result.source == "report" and result.usage.input_tokens == 10


def test_submit_returns_a_future_that_completes(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url))
    stub.push(Reply(text="First round summary.", delay=0.2), "Second round summary.")
    futures = [s.submit(digest(round=1)), s.submit(digest(round=2))]
    results = [f.result(timeout=10) for f in futures]
    assert [r.text for r in results] == ["First round summary.", "Second round summary."]
    assert all(r.source == "model" for r in results)


def test_submit_without_key_is_done_at_once(make) -> None:
    s = make({})
    future = s.submit(digest())
    assert future.done() and future.result().source == "report"
    assert not [t for t in threading.enumerate() if t.name.startswith("anima-summarizer")]


def test_after_close_summaries_fall_back(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url))
    s.close()
    assert s.submit(digest()).result(timeout=1).note == "summarizer closed"
    assert s.summarize(digest()).source == "report"
    assert stub.requests == []


def test_prompt_comes_from_the_resource_template(make) -> None:
    text = make({}).prompt(digest())
    assert "Developer report:" in text and "$report" not in text and "<report>" in text
    assert "Changed files: anima/context.py, tests/test_context.py" in text


def test_a_huge_reason_and_report_stay_out_of_the_summary_request(make) -> None:
    text = make({}).prompt(digest(verdict="rejected", reason="too long\n" * 200_000,
                                  report="lorem\n" * 400_000))
    assert len(text) < 20_000 and "Review reason: too long" in text
    assert "trimmed to fit the context budget" in text


# --- cost ------------------------------------------------------------------------------------

def test_cost_table_and_unknown_model() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000,
                  cache_creation_input_tokens=1_000_000, cache_read_input_tokens=1_000_000)
    assert cost_usd("claude-haiku-4-5-20251001", usage) == pytest.approx(sum(
        PRICES_PER_MTOK["claude-haiku-4-5"]))
    assert cost_usd("claude-3-5-haiku-latest", Usage(output_tokens=1000)) == pytest.approx(0.004)
    assert cost_usd("some-other-model", usage) == 0.0


def test_unknown_model_reports_usage_with_zero_cost(stub: ApiStub, make) -> None:
    s = make(env_for(stub.url), model="stub-model-x")
    stub.push(Reply(text="ok summary", usage={"input_tokens": 50, "output_tokens": 7}))
    result = s.summarize(digest())
    assert result.usage.total == 57 and result.cost_usd == 0.0
