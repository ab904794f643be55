"""What Anima keeps about a milestone and the project: the record and state.json models.

Every file format is a pydantic model with a schema version; `migrations` brings an older file
up to the current one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from anima.phases import Phase

RECORD_SCHEMA_VERSION = 12
STATE_SCHEMA_VERSION = 4


def now() -> datetime:
    return datetime.now(UTC)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class MilestoneStatus(StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    PAUSED = "paused"
    AWAITING_REVIEW = "awaiting_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FeatureStatus(StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    BLOCKED = "blocked"

    @property
    def box(self) -> str:
        return {"pending": "[ ]", "in_progress": "[/]", "done": "[x]", "blocked": "[!]"}[self.value]


class RoundKind(StrEnum):
    FEATURE = "feature"
    FIX = "fix"
    FINAL = "final"
    RECOVERY = "recovery"
    MERGE = "merge"  # main merged into the branch to resolve a conflict, then reviewed


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class Usage(_Model):
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cache_read_input_tokens: NonNegativeInt = 0
    cache_creation_input_tokens: NonNegativeInt = 0

    @property
    def total(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_read_input_tokens
                + self.cache_creation_input_tokens)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=(
                self.cache_creation_input_tokens + other.cache_creation_input_tokens),
        )

    @classmethod
    def from_api(cls, usage: dict[str, Any] | None) -> Usage:
        """Build from a `result` event's usage dict, ignoring fields we do not count."""
        usage = usage or {}
        return cls(**{k: max(0, int(usage.get(k) or 0)) for k in cls.model_fields})


class Feature(_Model):
    id: str
    title: str
    criteria: list[str] = Field(default_factory=list)
    status: FeatureStatus = FeatureStatus.PENDING
    rounds: int = 0
    commits: list[str] = Field(default_factory=list)
    tool_calls: int = 0


class CheckRun(_Model):
    """Anima's own run of the project's checks (config `check_command`) in a round."""

    command: str
    passed: bool
    exit_code: int | None = None  # None: timed out
    timed_out: bool = False
    duration_seconds: float = 0.0
    tail: str = ""  # the output's last lines, redacted
    # When it failed: the Developer's report's words that claimed the tests passed.
    report_claim: str | None = None


class ContextUse(_Model):
    """An agent's context in use after its last turn of a round (see events.ContextUsage)."""

    tokens: int
    window: int

    @property
    def percent(self) -> float:
        return 100.0 * self.tokens / self.window if self.window else 0.0


class Rollover(_Model):
    """A session Anima ended between rounds and replaced by a fresh one, and why."""

    round: int  # the round the fresh session starts with
    role: str
    tokens: int  # the old session's context when it was ended
    window: int
    reason: str
    old_session: str | None = None
    at: datetime


class Spend(_Model):
    """Tokens and dollars spent."""

    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = Field(0.0, ge=0)
    #: Of `cost_usd`, what Anima priced itself from the model calls of a turn still in flight
    #: (no result stated it yet): an estimate.
    estimated_usd: float = Field(0.0, ge=0)


class Withdrawn(StrEnum):
    """Why a round's verdict no longer counts (its history stays)."""

    #: "Continue from round N" took its commits off the branch.
    DROPPED = "dropped"
    #: A final acceptance after which you requested changes: main waits for another one.
    CHANGES_REQUESTED = "changes_requested"
    #: A final acceptance of the milestone as it was defined before you edited its `.md`.
    REDEFINED = "redefined"


class Iteration(_Model):
    round: int
    kind: RoundKind
    feature: str | None = None
    commit: str | None = None
    changed_files: list[str] = Field(default_factory=list)
    summary: str = ""
    verdict: Verdict
    reason: str = ""
    tokens: int = 0
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    tool_calls: int = 0
    auto_committed: bool = False
    notes: list[str] = Field(default_factory=list)
    #: role -> context in use after that agent's last turn of the round
    context: dict[str, ContextUse] = Field(default_factory=dict)
    check: CheckRun | None = None
    started_at: datetime
    ended_at: datetime
    withdrawn: Withdrawn | None = None


class Sessions(_Model):
    developer: str | None = None
    acceptor: str | None = None
    # The model each session started with (its system/init), passed again on --resume:
    # without it 2.1.197 resumes on a smaller context window.
    developer_model: str | None = None
    acceptor_model: str | None = None


class AgentRun(_Model):
    """Which agent CLI a role ran on, as last started: its backend, model and version."""

    agent: str
    model: str | None = None
    version: str

    def describe(self, session_model: str | None = None) -> str:
        """`codex gpt-5-codex, codex-cli 0.169.0`: the configured model, else the one its
        session reported."""
        return f"{self.agent} {self.model or session_model or '(CLI default model)'}, " \
            f"{self.version}"


class HumanNote(_Model):
    at: datetime
    text: str
    delivered: bool = False


class MergeState(StrEnum):
    PENDING = "pending"  # the intent, written with `completed` before `git merge` runs
    MERGED = "merged"
    FAILED = "failed"  # not merged: `detail` says why (a conflict, a dirty tree, …)


class ReviewComment(_Model):
    """A reviewer's remark on one line of the milestone's diff, kept until it is sent."""

    id: str
    path: str
    line: int
    text: str
    at: datetime


class MergeInfo(_Model):
    """The merge into main of a completed milestone. `pending` is on disk before the merge
    starts, so a kill in between is finished by the next start, never forgotten."""

    state: MergeState
    merged: bool = False
    detail: str
    at: datetime | None = None

    @property
    def waits_for_you(self) -> bool:
        """Pending because a file of the human's is in its way (`detail` names it): the merge
        goes on by itself only once they commit, stash or move it."""
        return self.state is MergeState.PENDING and " waits" in self.detail


class LimitWait(_Model):
    """A usage limit the milestone's agents wait out: on disk, so that a start after a kill
    waits until the same reset instead of meeting the limit again at once."""

    role: str  # whose turn waits (its account is the one held; another pair may have met it)
    until: datetime  # when the prompt is sent again
    reason: str


class MilestoneRecord(_Model):
    schema_version: int = RECORD_SCHEMA_VERSION
    id: str
    title: str
    status: MilestoneStatus = MilestoneStatus.PENDING
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    branch_name: str | None = None
    base_commit: str | None = None
    main_branch: str | None = None
    main_head: str | None = None
    iteration_count: int = 0
    consecutive_rejections: int = 0
    max_iterations: int = 20
    tokens_used: int = 0
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    #: What the round in flight has spent so far, not yet in the totals above: on disk so
    #: that a kill mid-round loses none of it (the next start adds it to them).
    in_flight: Spend = Field(default_factory=Spend)
    limit_wait: LimitWait | None = None
    requires_human_review: bool = False
    #: milestones completed and merged into main before this one starts (front matter)
    depends_on: list[str] = Field(default_factory=list)
    features: list[Feature] = Field(default_factory=list)
    iterations: list[Iteration] = Field(default_factory=list)
    acceptance_criteria: list[str] = Field(default_factory=list)
    sessions: Sessions = Field(default_factory=Sessions)
    claude_version: str | None = None  # `claude --version` of the run that drove it last
    agents: dict[str, AgentRun] = Field(default_factory=dict)  # role -> its agent CLI
    phase: Phase = Phase.IDLE
    pause_reason: str | None = None
    human_notes: list[HumanNote] = Field(default_factory=list)
    comments: list[ReviewComment] = Field(default_factory=list)  # unsent line comments
    interrupted: bool = False
    merge: MergeInfo | None = None
    error: str | None = None  # why the milestone is `failed` (an unexpected error)
    notes: list[str] = Field(default_factory=list)
    rollovers: list[Rollover] = Field(default_factory=list)

    @field_validator("phase", mode="before")
    @classmethod
    def _known_phase(cls, value: object) -> object:
        """A phase this version does not know (a newer Anima's) reads as idle: resumable."""
        return value if value in set(Phase) else Phase.IDLE

    def feature(self, feature_id: str | None) -> Feature | None:
        return next((f for f in self.features if f.id == feature_id), None)

    @property
    def features_done(self) -> int:
        return sum(1 for f in self.features if f.status is FeatureStatus.DONE)

    @property
    def rounds(self) -> int:
        return len(self.iterations)

    @property
    def spent_usd(self) -> float:
        """Every dollar spent, the round in flight's too (a kill leaves it there until the
        next start): what a person is shown, since the totals hold it only after a verdict."""
        return self.cost_usd + self.in_flight.cost_usd

    @property
    def spent_text(self) -> str:
        """`spent_usd` for people, saying how much of it a round still in flight spent."""
        pending = self.in_flight.cost_usd
        return f"${self.spent_usd:.2f}" + (f" (incl. ${pending:.2f} in flight)"
                                           if round(pending, 2) else "")

    @property
    def standing(self) -> list[Iteration]:
        """The rounds whose verdicts still count: what comes next, and what main may
        receive, follow from these alone."""
        return [it for it in self.iterations if it.withdrawn is None]

    @property
    def to_fix(self) -> Iteration | None:
        """The rejection the next round fixes: the newest round that counts, when it was
        rejected. A final acceptance you withdrew (changes requested, the `.md` edited) still
        closed what came before it: nothing to fix then, what comes next is yours to say."""
        for it in reversed(self.iterations):
            if it.withdrawn is Withdrawn.DROPPED:
                continue
            return it if it.withdrawn is None and it.verdict is Verdict.REJECTED else None
        return None

    @property
    def requested_changes(self) -> list[str]:
        """What you asked for since you first requested changes (your notes from the final
        acceptance you withdrew on): judged as criteria too."""
        withdrawn = [it.ended_at for it in self.iterations
                     if it.withdrawn is Withdrawn.CHANGES_REQUESTED]
        return [n.text for n in self.human_notes if withdrawn and n.at >= min(withdrawn)]

    @property
    def accepted_tip(self) -> str | None:
        """The commit main may receive: that of the newest accepted round when it is the
        final acceptance, or a merge round's reviewed resolution after it; None when the
        newest accepted work is not finally accepted."""
        standing = self.standing
        for it in reversed(standing):
            if it.verdict is not Verdict.ACCEPTED:
                continue
            if it.kind is RoundKind.FINAL:
                return it.commit
            if it.kind is not RoundKind.MERGE or not any(
                    r.kind is RoundKind.FINAL and r.verdict is Verdict.ACCEPTED
                    for r in standing):
                return None
            return it.commit
        return None


class StateStatus(StrEnum):
    SLEEPING = "sleeping"
    AWAKE = "awake"
    PAUSED = "paused"


class RunningMilestone(_Model):
    """One milestone a loop drives now, as `state.json` lists it."""

    id: str
    phase: Phase = Phase.IDLE
    round: int = 0
    worktree: str | None = None  # relative to the project
    #: what its agents are doing ("Developer: round 3 (feature)", "waiting for a usage limit")
    activity: str = ""
    #: while its next turn waits for a usage limit to reset: when it is sent, and why (pairs
    #: on different agent CLIs wait for different accounts, each until its own reset)
    waiting_until: datetime | None = None
    waiting_reason: str | None = None


class State(_Model):
    schema_version: int = STATE_SCHEMA_VERSION
    status: StateStatus = StateStatus.SLEEPING
    #: the first of `running` (what readers of schema 2 knew), or the milestone that rests
    current_milestone: str | None = None
    #: every milestone a loop drives now, in the order they started
    running: list[RunningMilestone] = Field(default_factory=list)
    updated_at: datetime | None = None
    #: the earliest wait of `running` (what readers of schema 3 knew): when the first waiting
    #: milestone sends again, and why
    waiting_until: datetime | None = None
    waiting_reason: str | None = None
