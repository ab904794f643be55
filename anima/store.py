"""Milestone records and state.json: pydantic models, atomic writes, never a lost byte.

A record that cannot be read is reported with its path and left exactly as it is; the other
milestones stay usable. Records carry a schema version and are migrated on read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from anima.atomic import write_model_atomic
from anima.config import describe_validation_error
from anima.errors import AnimaError, MilestoneError, RecordError
from anima.milestone_md import (
    MILESTONE_ID_RE,
    MilestoneDef,
    is_milestone_name,
    load_milestone,
    validate_milestone_id,
)
from anima.paths import ProjectPaths
from anima.phases import Phase

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

RECORD_SCHEMA_VERSION = 7
STATE_SCHEMA_VERSION = 2


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


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class Usage(_Model):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

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
        return cls(**{k: int(usage.get(k) or 0) for k in cls.model_fields})


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


class Sessions(_Model):
    developer: str | None = None
    acceptor: str | None = None
    # The model each session started with (its system/init), passed again on --resume:
    # without it 2.1.197 resumes on a smaller context window.
    developer_model: str | None = None
    acceptor_model: str | None = None


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
    requires_human_review: bool = False
    features: list[Feature] = Field(default_factory=list)
    iterations: list[Iteration] = Field(default_factory=list)
    acceptance_criteria: list[str] = Field(default_factory=list)
    sessions: Sessions = Field(default_factory=Sessions)
    claude_version: str | None = None  # `claude --version` of the run that drove it last
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


class StateStatus(StrEnum):
    SLEEPING = "sleeping"
    AWAKE = "awake"
    PAUSED = "paused"


class State(_Model):
    schema_version: int = STATE_SCHEMA_VERSION
    status: StateStatus = StateStatus.SLEEPING
    current_milestone: str | None = None
    updated_at: datetime | None = None
    # Set while the loop waits for a usage limit to reset: when it sends again, and why.
    waiting_until: datetime | None = None
    waiting_reason: str | None = None


def _record_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 added `claude_version` (unknown for rounds driven before it)."""
    return {**data, "claude_version": None}


def _record_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 added each round's `context` in use and the milestone's session `rollovers`
    (none known for rounds driven before it)."""
    iterations = [{**it, "context": {}} if isinstance(it, dict) else it
                  for it in data.get("iterations") or []]
    return {**data, "iterations": iterations, "rollovers": []}


def _record_v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 added each round's `check` (no check ran in rounds driven before it)."""
    iterations = [{**it, "check": None} if isinstance(it, dict) else it
                  for it in data.get("iterations") or []]
    return {**data, "iterations": iterations}


def _record_v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v5 gave `merge` a state and added `error`. A completed record without a merge
    outcome or `completed_at` is a completion an older Anima died in: its merge is pending."""
    merge = data.get("merge")
    if isinstance(merge, dict):
        merge = {**merge, "state": "merged" if merge.get("merged") else "failed"}
    elif data.get("status") == "completed" and data.get("completed_at") is None:
        merge = {"state": "pending", "merged": False,
                 "detail": "the completion was cut short by a restart"}
    return {**data, "merge": merge, "error": None}


def _record_v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """v6 added the sessions' models (unknown for sessions started before it)."""
    sessions = data.get("sessions")
    if isinstance(sessions, dict):
        data = {**data, "sessions": {"developer_model": None, "acceptor_model": None,
                                     **sessions}}
    return data


def _state_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 added the usage-limit wait (none in a file written before it)."""
    return {**data, "waiting_until": None, "waiting_reason": None}


def _record_v6_to_v7(data: dict[str, Any]) -> dict[str, Any]:
    """v7 added `comments` (line comments awaiting their Resume / Request changes)."""
    return {**data, "comments": []}


#: (kind of file, version) -> the step to version + 1. Each step is pure and small.
_MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("record", 1): _record_v1_to_v2,
    ("record", 2): _record_v2_to_v3,
    ("record", 3): _record_v3_to_v4,
    ("record", 4): _record_v4_to_v5,
    ("record", 5): _record_v5_to_v6,
    ("record", 6): _record_v6_to_v7,
    ("state", 1): _state_v1_to_v2,
}


def _migrate(data: dict[str, Any], current: int, path: Path, kind: str) -> dict[str, Any]:
    """Bring an older file up to the current schema; refuse one from a newer Anima."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int):
        raise RecordError(path, f"schema_version must be an integer, got {version!r}")
    if version > current:
        raise RecordError(path, f"schema_version {version} was written by a newer Anima "
                                f"(this one reads up to {current}); left untouched")
    while version < current:
        data = _MIGRATIONS[(kind, version)](data)
        version += 1
    data["schema_version"] = current
    return data


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(path, f"cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise RecordError(path, f"corrupt JSON (line {e.lineno}, column {e.colno}): {e.msg}; "
                                "left untouched") from e
    if not isinstance(data, dict):
        raise RecordError(path, "expected a JSON object; left untouched")
    return data


def _validate(model: type[M], data: dict[str, Any], path: Path) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RecordError(path, "invalid record; left untouched\n"
                          + describe_validation_error(path, e)) from e


def _current_record(path: Path) -> MilestoneRecord | None:
    """The record at `path` parsed and validated in one pass (pydantic's JSON parser, twice
    as fast as `json.loads` then `model_validate` on a hundred long records), if it is valid
    and says it is of the current schema; None sends it down the careful path, which migrates
    an older record and words what is wrong with a broken one."""
    try:
        record = MilestoneRecord.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None
    current = ("schema_version" in record.model_fields_set
               and record.schema_version == RECORD_SCHEMA_VERSION)
    return record if current else None


@dataclass
class Scan:
    """Result of looking at `.anima/milestones/`: what is usable and what is wrong."""

    records: list[MilestoneRecord] = field(default_factory=list)
    problems: list[AnimaError] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)

    def find(self, milestone_id: str) -> MilestoneRecord | None:
        return next((r for r in self.records if r.id == milestone_id), None)


class Store:
    """Reads and writes one project's records. Not thread-safe: one engine worker writes them,
    except new registrations, which the engine serializes with its scans."""

    def __init__(self, paths: ProjectPaths) -> None:
        self.paths = paths

    # --- state.json ---------------------------------------------------------------------
    def load_state(self) -> State:
        if not self.paths.state.exists():
            return State()
        data = _migrate(_read_json(self.paths.state), STATE_SCHEMA_VERSION, self.paths.state,
                        "state")
        return _validate(State, data, self.paths.state)

    def save_state(self, state: State) -> None:
        state.updated_at = now()
        write_model_atomic(self.paths.state, state)

    # --- milestone records ----------------------------------------------------------------
    def load_record(self, milestone_id: str) -> MilestoneRecord:
        path = self.paths.milestone_record(milestone_id)
        record = _current_record(path)
        if record is None:
            data = _migrate(_read_json(path), RECORD_SCHEMA_VERSION, path, "record")
            record = _validate(MilestoneRecord, data, path)
        if record.id != milestone_id:
            raise RecordError(path, f"id {record.id!r} does not match the file name; "
                                    "left untouched")
        return record

    def save_record(self, record: MilestoneRecord) -> None:
        write_model_atomic(self.paths.milestone_record(record.id), record)

    def load_records(self) -> list[MilestoneRecord]:
        """Every readable record, whether or not its definition is still there (a record is
        the truth about a milestone's status even when its `.md` went missing)."""
        records = []
        for milestone_id in self._record_ids():
            try:
                records.append(self.load_record(milestone_id))
            except RecordError:
                continue
        return records

    def _record_ids(self) -> list[str]:
        if not self.paths.milestones.is_dir():
            return []
        return [p.stem for p in sorted(self.paths.milestones.glob("*.json"))
                if MILESTONE_ID_RE.fullmatch(p.stem)]

    def definition(self, milestone_id: str) -> MilestoneDef:
        return load_milestone(self.paths.milestone_md(milestone_id))

    def new_record(self, definition: MilestoneDef, milestone_id: str, created_at: datetime,
                   *, max_iterations: int, requires_human_review: bool) -> MilestoneRecord:
        review = definition.requires_human_review
        return MilestoneRecord(
            id=milestone_id,
            title=definition.title,
            created_at=created_at,
            max_iterations=max_iterations,
            requires_human_review=requires_human_review if review is None else review,
            features=[Feature(id=f.id, title=f.title, criteria=list(f.criteria))
                      for f in definition.features],
            acceptance_criteria=list(definition.acceptance_criteria),
        )

    def register(self, md: Path, created_at: datetime, *, max_iterations: int,
                 requires_human_review: bool) -> MilestoneRecord | None:
        """Make the definition `md` a pending milestone created at `created_at` (when the
        file arrived, so the queue keeps that order); None if it has a record already.
        Raises MilestoneError for a bad name or file (which is left as it is)."""
        milestone_id = validate_milestone_id(md.stem, md)
        if self.paths.milestone_record(milestone_id).exists():
            return None
        record = self.new_record(load_milestone(md), milestone_id, created_at,
                                 max_iterations=max_iterations,
                                 requires_human_review=requires_human_review)
        self.save_record(record)
        log.info("registered milestone %s", milestone_id)
        return record

    def scan(self, *, max_iterations: int, requires_human_review: bool, register: bool = True,
             ready: Callable[[Path], bool] | None = None) -> Scan:
        """Load every record; every `.md` that has none yet is listed as pending (a fresh
        record, saved only with `register`) once `ready` says it has settled (a folder people
        drop files into must not parse a half-written file). Without `register` nothing is
        written. Hidden names (editors' swap and lock files) are not milestones.

        One timestamp serves a whole scan: files found together (whose arrival nobody saw)
        start in name order.
        """
        result = Scan()
        if not self.paths.milestones.is_dir():
            return result
        stamp = now()
        for md in sorted(self.paths.milestones.glob("*.md")):
            if not is_milestone_name(md.name):
                continue
            milestone_id = md.stem
            try:
                validate_milestone_id(milestone_id, md)
                if self.paths.milestone_record(milestone_id).exists():
                    result.records.append(self.load_record(milestone_id))
                    continue
                if ready is not None and not ready(md):
                    continue
                if register:
                    record = self.register(md, stamp, max_iterations=max_iterations,
                                           requires_human_review=requires_human_review)
                    if record is None:  # registered by another thread meanwhile
                        record = self.load_record(milestone_id)
                    else:
                        result.registered.append(milestone_id)
                else:
                    record = self.new_record(load_milestone(md), milestone_id, stamp,
                                             max_iterations=max_iterations,
                                             requires_human_review=requires_human_review)
                result.records.append(record)
            except (MilestoneError, RecordError) as e:
                result.problems.append(e)
        # A record whose definition went missing still says where its milestone stands.
        listed = {r.id for r in result.records} | {getattr(p, "path", Path()).stem
                                                    for p in result.problems}
        for milestone_id in self._record_ids():
            if milestone_id not in listed:
                try:
                    result.records.append(self.load_record(milestone_id))
                except RecordError as e:
                    result.problems.append(e)
        result.records.sort(key=lambda r: (r.created_at, r.id))
        return result
