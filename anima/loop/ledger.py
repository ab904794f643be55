"""The round in flight and its verdict: what a round spent (tokens, cost, tool calls, context),
recorded on the milestone in one atomic write once its verdict is known, with its counters and
background summary. A round in flight never reaches the record, so a kill redoes it."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime

from anima.config import Config
from anima.events import EventBus, SpendSoFar, TurnResult, VerdictReached
from anima.store.models import (
    CheckRun,
    ContextUse,
    FeatureStatus,
    Iteration,
    MilestoneRecord,
    RoundKind,
    Spend,
    Usage,
    Verdict,
    now,
)
from anima.text.context import clip
from anima.text.formats import ReviewVerdict
from anima.text.redact import redact
from anima.text.summarizer import RoundDigest, Summarizer, SummaryResult, fallback_summary

log = logging.getLogger(__name__)

# The log (and the headless output) quotes this much of a reason; the record keeps it whole,
# and the prompts trim it to their budget.
MAX_LOGGED_TOKENS = 2000

#: While a turn runs, what it spent so far reaches the record at most this often: each
#: write is a whole record, fsynced, and the window redraws it.
RUNNING_WRITE_SECONDS = 3.0


@dataclass
class Round:
    """A round in flight. It only reaches the record once its verdict is known."""

    round: int
    kind: RoundKind
    started_at: datetime
    previous_head: str
    feature: str | None = None
    commit: str | None = None
    changed_files: list[str] = field(default_factory=list)
    report: str = ""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    tool_calls: int = 0
    auto_committed: bool = False
    notes: list[str] = field(default_factory=list)
    check: CheckRun | None = None
    context: dict[str, ContextUse] = field(default_factory=dict)


class Ledger:
    """The round in flight (`round`, None between rounds) and the accounting around it."""

    def __init__(self, record: MilestoneRecord, config: Config, bus: EventBus,
                 summarizer: Summarizer, save: Callable[[], None],
                 log_line: Callable[[str], None]) -> None:
        self.record = record
        self.config = config
        self.bus = bus
        self.summarizer = summarizer
        self._save = save
        self._log = log_line
        self.round: Round | None = None
        # Usage of turns outside a round (the clean-up turn after a restart): it goes into the
        # next round, so the record's totals always equal the sum of its iterations.
        self._carry = Usage()
        self._carry_cost = 0.0
        self._pending_summaries: list[tuple[int, Future[SummaryResult]]] = []
        # role -> what its turn in flight spent so far, until its result (the agents' reader
        # threads set it, the loop's thread writes it: `running`, `write_running`)
        self._running: dict[str, SpendSoFar] = {}
        self._running_new = False
        self._running_written = -math.inf  # time.monotonic() of its last write

    def open(self, kind: RoundKind, previous_head: str) -> Round:
        """Start the next round; it carries what was spent since the last one."""
        self.round = Round(round=self.record.rounds + 1, kind=kind, started_at=now(),
                           previous_head=previous_head, usage=self._carry,
                           cost_usd=self._carry_cost)
        self._carry, self._carry_cost = Usage(), 0.0
        return self.round

    def note(self, text: str) -> None:
        """A note on the round in flight (none between rounds), and in the log."""
        if self.round is not None:
            self.round.notes.append(text)
        self._log(text)

    def running(self, spent: SpendSoFar) -> None:
        """From an agent's reader thread: what its turn in flight spent so far (it replaces
        the figure before; the turn's result replaces it in turn)."""
        self._running[spent.role] = spent
        self._running_new = True

    def write_running(self) -> None:
        """From the loop's thread, while it waits for a turn: what the turn spent so far goes
        on record (`in_flight`), at most every RUNNING_WRITE_SECONDS and only when there is
        news, so that a kill of Anima before the turn's result keeps it."""
        if not self._running_new or \
                time.monotonic() - self._running_written < RUNNING_WRITE_SECONDS:
            return
        self._running_new = False  # first: news that comes meanwhile is written next time
        self._running_written = time.monotonic()
        self.record.in_flight = self._unsettled()
        try:
            self._save()
        except OSError as e:  # a full disk: the turn goes on, its result writes it again
            log.warning("could not write what the turn in flight spent so far: %s", e)

    def account(self, result: TurnResult) -> None:
        """Add what the turn spent (`usage` is per turn; the agent works out the cost), and
        what the tool rules refused to the round's notes. It replaces what the turn's model
        calls had reported so far (`running`)."""
        estimate = self._running.pop(result.role, None)
        usage = Usage.from_api(result.usage)
        spent = result.turn_cost_usd or 0.0
        if result.estimated and (usage.total or spent):
            self.note(f"the {result.role}'s process ended before its turn did: an estimated "
                      f"${spent:.4f} and {usage.total} tokens, from what its model calls "
                      "reported, are counted")
        if result.permission_denials:
            self.note(f"the {result.role}'s tool rules refused: "
                      + "; ".join(result.permission_denials))
        if self.round is not None:
            self.round.usage = self.round.usage + usage
            self.round.cost_usd += spent
        else:
            self._carry = self._carry + usage
            self._carry_cost += spent
        if usage.total or spent or estimate is not None:
            self.record.in_flight = self._unsettled()  # on disk with the next write

    def _unsettled(self) -> Spend:
        """What was spent since the last round was recorded: the round in flight's, the
        turns' outside any round, and what the turns in flight spent so far."""
        rnd, running = self.round, list(self._running.values())
        usage = sum((Usage.from_api(s.usage) for s in running),
                    (rnd.usage if rnd is not None else Usage()) + self._carry)
        cost = sum((s.cost_usd for s in running),
                   (rnd.cost_usd if rnd is not None else 0.0) + self._carry_cost)
        return Spend(usage=usage, cost_usd=cost,
                     estimated_usd=sum(s.cost_usd for s in running if s.estimated))

    def settle_in_flight(self) -> None:
        """At a start: what a round that a kill cut short had spent joins the totals (the
        round itself is redone)."""
        rec, spent = self.record, self.record.in_flight
        if spent.usage.total == 0 and spent.cost_usd == 0:
            return
        self._add_to_totals(spent.usage, spent.cost_usd)
        estimate = (f" (${spent.estimated_usd:.4f} of it an estimate, at the model's list "
                    "price, of what the turn it cut short had spent)"
                    if spent.estimated_usd else "")
        rec.notes.append(f"a round cut short by a restart spent ${spent.cost_usd:.4f} and "
                         f"{spent.usage.total} tokens{estimate}; they stay in the milestone's "
                         "totals")

    def _add_to_totals(self, usage: Usage, cost: float) -> None:
        rec = self.record
        rec.tokens_used += usage.total
        rec.usage = rec.usage + usage
        rec.cost_usd += cost
        rec.in_flight = Spend()

    def drop(self, why: str) -> None:
        """Leave the round in flight unrecorded (it is redone), but keep what it spent: the
        record's totals and the budget count every real spend, even a round a stop, a pause
        or a failure cut short. Saved by the caller's next write."""
        rnd, rec, spent = self.round, self.record, self._unsettled()
        usage, cost = spent.usage, spent.cost_usd
        self.round, self._carry, self._carry_cost = None, Usage(), 0.0
        self._running.clear()  # a turn no result ended (its agent is stopped): spent too
        if usage.total == 0 and cost == 0:
            rec.in_flight = Spend()
            return
        self._add_to_totals(usage, cost)
        what = f"round {rnd.round}" if rnd is not None else "the turns since the last round"
        rec.notes.append(f"{what} was dropped ({redact(why)}); its ${cost:.4f} and {usage.total} "
                         "tokens stay in the milestone's totals")

    def finish(self, verdict: ReviewVerdict, persist: bool = True) -> None:
        """Record the round with its verdict and counters, in one atomic write (or, without
        `persist`, in the next one: the transition that the verdict brings)."""
        rec, rnd = self.record, self.round
        assert rnd is not None
        # Notes, reasons and file names are built from git's output (the names of files an
        # agent made, its commit subjects), which never crossed the agents' redaction.
        reason = redact(verdict.reason)
        notes = [redact(n) for n in rnd.notes]
        changed_files = [redact(f) for f in rnd.changed_files]
        final = rnd.kind is RoundKind.FINAL
        feature = rec.feature(rnd.feature)
        if verdict.accepted:
            if not final:
                rec.consecutive_rejections = 0
                rec.iteration_count += 1
                if feature is not None:
                    feature.status = FeatureStatus.DONE
        elif not final:  # a final-acceptance rejection is not a consecutive rejection
            rec.consecutive_rejections += 1
        if feature is not None:
            feature.rounds += 1
            feature.tool_calls += rnd.tool_calls
            if rnd.commit and rnd.commit not in feature.commits and rnd.kind is not \
                    RoundKind.FINAL:
                feature.commits.append(rnd.commit)
        digest = RoundDigest(round=rnd.round, kind=rnd.kind.value, feature=rnd.feature,
                             commit=rnd.commit, changed_files=changed_files,
                             verdict="accepted" if verdict.accepted else "rejected",
                             reason=reason, report=rnd.report)
        iteration = Iteration(
            round=rnd.round, kind=rnd.kind, feature=rnd.feature, commit=rnd.commit,
            changed_files=changed_files, summary=fallback_summary(digest),
            verdict=Verdict.ACCEPTED if verdict.accepted else Verdict.REJECTED,
            reason=reason, tokens=rnd.usage.total, usage=rnd.usage,
            cost_usd=rnd.cost_usd, tool_calls=rnd.tool_calls, auto_committed=rnd.auto_committed,
            notes=notes, context=dict(rnd.context), check=rnd.check, started_at=rnd.started_at,
            ended_at=now())
        rec.iterations.append(iteration)
        self._add_to_totals(rnd.usage, rnd.cost_usd)
        if persist:
            self._save()
        self.round = None
        word = "ACCEPTED" if verdict.accepted else "REJECTED: " + clip(
            reason, MAX_LOGGED_TOKENS, f"(the whole reason is on round {rnd.round} in the record)")
        self._log(f"round {rnd.round} ({rnd.kind}{' ' + rnd.feature if rnd.feature else ''}) "
                  f"{word}")
        self.bus.publish(VerdictReached(rec.id, rnd.round, rnd.kind.value, verdict.accepted,
                                        reason))
        if self.config.summarizer.enabled:
            self._pending_summaries.append((len(rec.iterations) - 1,
                                            self.summarizer.submit(digest)))

    def apply_summaries(self, wait: bool = False, persist: bool = True) -> None:
        """Fold finished background summaries into the record (they never block a round);
        with `wait`, also those still running. Without `persist`, the caller's next write
        saves them."""
        pending, changed = [], False
        for index, future in self._pending_summaries:
            if not future.done() and not wait:
                pending.append((index, future))
                continue
            try:
                result = future.result(timeout=self.config.summarizer.timeout_seconds + 5)
            except Exception:
                log.exception("summary failed")
                continue
            it = self.record.iterations[index]
            it.summary = result.text
            it.usage = it.usage + result.usage  # a round's cost includes its summary
            it.tokens += result.usage.total
            self.record.usage = self.record.usage + result.usage
            self.record.tokens_used += result.usage.total
            self.record.cost_usd += result.cost_usd
            it.cost_usd += result.cost_usd
            changed = True
        self._pending_summaries = pending
        if changed and persist:
            self._save()
