"""A short summary of every round for the iteration history (seed 000), made by a small model.

Summaries are a convenience, never a dependency: the loop must not wait for one or fail
because of one. So with no API key or with the summarizer disabled the summary is built from
the Developer's report at once (no network, not even the SDK import), and a model call that
fails or exceeds `timeout_seconds` (no SDK retries) falls back the same way. `submit` runs the
call on one background thread; the scheduler folds the result into the record when it is done.

Everything in the digest is redacted before it is sent, and the summary before it is returned.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from string import Template
from typing import Any

from anima.config import SummarizerConfig
from anima.paths import resource
from anima.store.models import Usage
from anima.text.context import clip
from anima.text.formats import read_developer_report
from anima.text.redact import redact

log = logging.getLogger(__name__)

__all__ = [
    "PRICES_PER_MTOK",
    "RoundDigest",
    "Summarizer",
    "SummaryResult",
    "cost_usd",
    "fallback_summary",
]

FALLBACK_MAX_CHARS = 300
MODEL_SUMMARY_MAX_CHARS = 500
# The report is the bulk of the request; a round's essentials are at its top.
REPORT_MAX_CHARS = 6000
DEFAULT_BASE_URL = "https://api.anthropic.com"

# USD per million tokens: (input, output, cache write (5 min), cache read), from Anthropic's
# published price list: the summaries' models, and the agents' (a turn whose process ended
# before its result is priced with it, `anima.agents.claude.protocol.CallLedger`). Matched by
# prefix, so dated ids ("claude-haiku-4-5-20251001") work. A model not listed costs 0 here
# (its usage is still reported).
PRICES_PER_MTOK: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-2025": (15.00, 75.00, 18.75, 1.50),  # Opus 4 ("claude-opus-4-20250514")
    "claude-opus-4-1": (15.00, 75.00, 18.75, 1.50),
    "claude-opus-4": (5.00, 25.00, 6.25, 0.50),  # 4.5 and later
    "claude-sonnet-4": (3.00, 15.00, 3.75, 0.30),
    "claude-3-7-sonnet": (3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 1.25, 0.10),
    "claude-3-5-haiku": (0.80, 4.00, 1.00, 0.08),
    "claude-3-haiku": (0.25, 1.25, 0.30, 0.03),
}


def cost_usd(model: str, usage: Usage) -> float:
    """The price of `usage` on `model` per `PRICES_PER_MTOK`; 0.0 for an unknown model."""
    for prefix in sorted(PRICES_PER_MTOK, key=len, reverse=True):
        if model.startswith(prefix):
            inp, out, write, read = PRICES_PER_MTOK[prefix]
            return (usage.input_tokens * inp + usage.output_tokens * out
                    + usage.cache_creation_input_tokens * write
                    + usage.cache_read_input_tokens * read) / 1_000_000
    return 0.0


@dataclass(frozen=True)
class RoundDigest:
    """What the summarizer sees of one round."""

    round: int
    kind: str
    feature: str | None
    commit: str | None
    changed_files: list[str]
    verdict: str
    reason: str
    report: str  # the Developer's report text


@dataclass(frozen=True)
class SummaryResult:
    """A summary and where it came from: "model" or "report" (the local fallback)."""

    text: str
    source: str
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    note: str = ""  # why the fallback was used ("no API key", "timeout", …); "" for the model


def _redacted(digest: RoundDigest) -> RoundDigest:
    return RoundDigest(
        round=digest.round, kind=redact(digest.kind),
        feature=redact(digest.feature) if digest.feature else digest.feature,
        commit=digest.commit, changed_files=[redact(f) for f in digest.changed_files],
        verdict=redact(digest.verdict), reason=redact(digest.reason), report=redact(digest.report),
    )


# --- the fallback: built from the report ----------------------------------------------------

_SPACE = re.compile(r"\s+")


def _clip(text: str, limit: int) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: max(0, limit - 1)].rstrip() + "…"


def fallback_summary(digest: RoundDigest) -> str:
    """One or two lines (≤ 300 chars) from the report: what, commit, files, outcome.

    Line 1: feature, short commit, the first Changes items (or Notes), the files.
    Line 2: the verdict and, when there is one, the reason.
    """
    d = _redacted(digest)
    report = read_developer_report(d.report)
    parts = [d.feature or report.feature_text or d.kind]
    if d.commit:
        parts.append(f"commit {d.commit[:7]}")
    notes = (report.notes or report.summary).strip()
    changes = "; ".join(report.changes[:2]) or (notes.splitlines()[0] if notes else "")
    if not changes:  # not in the format: its first line says what it is about
        changes = next((ln.strip() for ln in d.report.splitlines() if ln.strip()), "")
    if changes:
        parts.append(changes)
    if d.changed_files:
        shown = ", ".join(d.changed_files[:3])
        more = len(d.changed_files) - 3
        parts.append(f"files: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    outcome = d.verdict.upper() if d.verdict else ""
    reason = d.reason.strip().splitlines()[0] if d.reason.strip() else ""
    line2 = _clip(f"{outcome}: {reason}" if reason else outcome, 140) if outcome or reason else ""
    line1 = _clip(" — ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if parts[2:] else ""),
                  FALLBACK_MAX_CHARS - len(line2) - 1 if line2 else FALLBACK_MAX_CHARS)
    return f"{line1}\n{line2}" if line2 else line1


# --- the model summary ------------------------------------------------------------------------

def _load_template() -> Template:
    text = resource("prompts", "round_summary.md").read_text(encoding="utf-8")
    return Template(text)


def _clean_model_text(text: str) -> str:
    """At most two non-empty lines, without fences, quotes or a "Summary:" preamble."""
    lines = [ln.strip() for ln in text.strip().strip("`").splitlines() if ln.strip()]
    text = "\n".join(_clip(ln, MODEL_SUMMARY_MAX_CHARS) for ln in lines[:2])
    text = re.sub(r"^(?:summary|总结|摘要)\s*[:：]\s*", "", text, flags=re.IGNORECASE)
    text = text.strip().strip('"“”').strip()
    return _clip(text, MODEL_SUMMARY_MAX_CHARS) if "\n" not in text else text


class Summarizer:
    """Round summaries from a small model, with the report-based fallback.

    `summarize` blocks (for at most about `timeout_seconds`) and never raises; `submit` runs it
    on one background thread. Thread-safe; call `close` when the milestone run ends.
    """

    def __init__(self, config: SummarizerConfig, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.config = config
        self._api_key = env.get("ANTHROPIC_API_KEY") or None
        self._base_url = env.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
        self._client: Any = None  # anthropic.Anthropic; the SDK is imported only when used
        self._template: Template | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def uses_model(self) -> bool:
        """Whether summaries will be attempted with the model (enabled and a key present)."""
        return self.config.enabled and self._api_key is not None

    def summarize(self, digest: RoundDigest) -> SummaryResult:
        """The round's summary: the model's when possible, else the report-based fallback."""
        try:
            if self._closed:
                return self._fallback(digest, "summarizer closed")
            if not self.config.enabled:
                return self._fallback(digest, "summarizer disabled")
            if self._api_key is None:
                return self._fallback(digest, "no ANTHROPIC_API_KEY")
            return self._from_model(digest)
        except Exception as e:  # a summary must never fail the loop
            reason = _describe(e)
            log.warning("round %s summary fell back to the report: %s", digest.round, reason)
            return self._fallback(digest, reason)

    def submit(self, digest: RoundDigest) -> Future[SummaryResult]:
        """Summarize in the background; without a model call the future is already done."""
        if not self.uses_model or self._closed:
            done: Future[SummaryResult] = Future()
            done.set_result(self.summarize(digest) if not self._closed
                            else self._fallback(digest, "summarizer closed"))
            return done
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="anima-summarizer")
            return self._executor.submit(self.summarize, digest)

    def close(self) -> None:
        """Finish queued summaries (each bounded by the timeout) and release the HTTP client."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # --- internals ------------------------------------------------------------------------

    def _fallback(self, digest: RoundDigest, note: str) -> SummaryResult:
        return SummaryResult(text=fallback_summary(digest), source="report", note=note)

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                import anthropic  # slow to import; only runs when a model call is due

                self._client = anthropic.Anthropic(
                    api_key=self._api_key, base_url=self._base_url,
                    timeout=self.config.timeout_seconds, max_retries=0)
            if self._template is None:
                self._template = _load_template()
            return self._client

    def prompt(self, digest: RoundDigest) -> str:
        """The request text for `digest` (redacted), from resources/prompts/round_summary.md."""
        if self._template is None:
            self._template = _load_template()
        d = _redacted(digest)
        report = d.report.strip()
        if len(report) > REPORT_MAX_CHARS:
            report = report[:REPORT_MAX_CHARS] + "\n[… report truncated …]"
        return self._template.safe_substitute(
            round=d.round, kind=d.kind, feature=d.feature or "(none)",
            commit=d.commit[:12] if d.commit else "(no commit)",
            changed_files=", ".join(d.changed_files[:20]) or "(none)",
            verdict=d.verdict or "(none)",
            reason=clip(d.reason.strip(), REPORT_MAX_CHARS // 4) or "(none)",
            report=report or "(empty)",
        ).strip()

    def _from_model(self, digest: RoundDigest) -> SummaryResult:
        client = self._get_client()
        message = client.messages.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            messages=[{"role": "user", "content": self.prompt(digest)}],
        )
        usage = Usage.from_api(message.usage.model_dump() if message.usage else None)
        cost = cost_usd(self.config.model, usage)
        text = "".join(getattr(b, "text", "") for b in message.content
                       if getattr(b, "type", "") == "text")
        text = redact(_clean_model_text(text))
        if not text:
            result = self._fallback(digest, "empty model answer")
            return SummaryResult(text=result.text, source="report", usage=usage,
                                 cost_usd=cost, note=result.note)
        return SummaryResult(text=text, source="model", usage=usage, cost_usd=cost)


def _describe(e: Exception) -> str:
    """A short reason for the log and `SummaryResult.note`; never the request or the key."""
    name = type(e).__name__
    status = getattr(e, "status_code", None)
    if status is not None:
        return f"{name} (HTTP {status})"
    if "Timeout" in name:
        return "timeout"
    return name
