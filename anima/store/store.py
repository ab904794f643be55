"""Milestone records and state.json: pydantic models, atomic writes, never a lost byte.

A record that cannot be read is reported with its path and left exactly as it is; the other
milestones stay usable. Records carry a schema version and are migrated on read.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from anima.atomic import read_regular, write_text_atomic
from anima.config import describe_validation_error
from anima.errors import AnimaError, MilestoneError, RecordError
from anima.paths import ProjectPaths, printable
from anima.store.definitions import MilestoneDef
from anima.store.dependencies import Dependencies, InMain, dependencies
from anima.store.freshness import arrival, changed_after, defined_after_record
from anima.store.migrations import migrate
from anima.store.milestone_md import load_milestone
from anima.store.models import (
    RECORD_SCHEMA_VERSION,
    STATE_SCHEMA_VERSION,
    Feature,
    MilestoneRecord,
    MilestoneStatus,
    State,
    now,
)
from anima.store.names import MILESTONE_ID_RE, is_milestone_name, validate_milestone_id

log = logging.getLogger(__name__)

#: Told of a record about to be written, and held until it is (`Store.on_save`).
SaveListener = Callable[[Path, bytes], AbstractContextManager[None]]

M = TypeVar("M", bound=BaseModel)


def _json(model: BaseModel) -> str:
    """What a record or state.json holds. A file name git gave (in a round's files, a note,
    a merge's reason, a review comment) may hold bytes that are not UTF-8, which JSON cannot
    write: such strings are made `printable` in the model itself, so no save fails (nor every
    one after it) and what is in memory is what is on disk."""
    try:
        return model.model_dump_json(indent=2) + "\n"
    except PydanticSerializationError:
        _make_printable(model)
        return model.model_dump_json(indent=2) + "\n"


def _make_printable(value: Any) -> Any:
    """`value` with every string in it `printable` (a model is changed in place)."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            setattr(value, name, _make_printable(getattr(value, name)))
    elif isinstance(value, list):
        return [_make_printable(v) for v in value]
    elif isinstance(value, dict):
        return {_make_printable(k): _make_printable(v) for k, v in value.items()}
    elif isinstance(value, str) and not isinstance(value, Enum):
        return printable(value)
    return value


#: What a pending record holds that its definition (and the config) decide.
_FROM_DEFINITION = ("title", "features", "acceptance_criteria", "max_iterations",
                    "requires_human_review", "depends_on")
#: What a started milestone takes from an edit of its definition (it has its branch, so
#: what it depends on no longer counts; its round limit is its own, grown by each resume).
_WHILE_RUNNING = ("title", "features", "acceptance_criteria", "requires_human_review")


def _with_progress(features: list[Feature], had: list[Feature]) -> list[Feature]:
    """`features` (as the `.md` says now, numbered by their place) with the progress of the
    ones they were: the feature of the same title (the same titles in order), else the one
    renamed where it stood: same number, same criteria, its title gone. Taking a feature out
    or adding one renumbers the others; their progress goes with them. A feature replaced
    (new title and criteria) is new."""
    titles = {f.title for f in features}
    by_title: dict[str, list[Feature]] = {}
    for f in had:
        by_title.setdefault(f.title, []).append(f)
    by_id = {f.id: f for f in had if f.title not in titles}
    kept = []
    for feature in features:
        same = by_title.get(feature.title)
        before = same.pop(0) if same else by_id.pop(feature.id, None)
        if before is not None and before.title != feature.title and \
                before.criteria != feature.criteria:
            before = None
        kept.append(feature if before is None else before.model_copy(
            update={"id": feature.id, "title": feature.title, "criteria": feature.criteria}))
    return kept


def _read(path: Path) -> bytes:
    try:
        return read_regular(path)
    except OSError as e:
        raise RecordError(path, f"cannot read: {e}") from e


def _decode_json(path: Path, data: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordError(path, f"cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise RecordError(path, f"corrupt JSON (line {e.lineno}, column {e.colno}): {e.msg}; "
                                "left untouched") from e
    if not isinstance(decoded, dict):
        raise RecordError(path, "expected a JSON object; left untouched")
    return decoded


def _validate(model: type[M], data: dict[str, Any], path: Path) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RecordError(path, "invalid record; left untouched\n"
                          + describe_validation_error(path, e)) from e


def _current_record(data: bytes) -> MilestoneRecord | None:
    """The record in `data` parsed and validated in one pass (pydantic's JSON parser, twice
    as fast as `json.loads` then `model_validate` on a hundred long records), if it is valid
    and says it is of the current schema; None sends it down the careful path, which migrates
    an older record and words what is wrong with a broken one."""
    try:
        record = MilestoneRecord.model_validate_json(data)
    except ValidationError:
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
    #: Records listed without their definition (`<id>.md` is gone, or never was).
    orphans: set[str] = field(default_factory=set)
    #: What the records' `depends_on` say: who waits for whom, and who never can start.
    dependencies: Dependencies = field(default_factory=Dependencies)
    #: Pending milestones whose definition cannot be read as it is now (among `problems`):
    #: not started until the file is fixed.
    unreadable: set[str] = field(default_factory=set)
    #: Milestones waiting for your review whose `.md` changed what they build since their
    #: final acceptance (`Store.redefined`): approving one sends it back to the Developer.
    redefined: dict[str, tuple[str, ...]] = field(default_factory=dict)


class Store:
    """Reads and writes one project's records. Not thread-safe: one engine worker writes them,
    except new registrations, which the engine serializes with its scans."""

    def __init__(self, paths: ProjectPaths) -> None:
        self.paths = paths
        #: Told of every record about to be written (path, bytes), and held until it is: the
        #: guard of a running milestone keeps the records as Anima wrote them (anima.guard),
        #: and must not compare them with the disk between its copy and the write.
        self.on_save: list[SaveListener] = []
        #: Each pending milestone's definition as last read, by id, with what its file was
        #: then (inode, size, mtime): a scan every second parses only what changed.
        self._read_definitions: dict[str, tuple[tuple[int, int, int], MilestoneDef]] = {}

    # --- state.json ---------------------------------------------------------------------
    def load_state(self) -> State:
        if not self.paths.state.exists():
            return State()
        return self.parse_state(_read(self.paths.state))

    def parse_state(self, data: bytes | None) -> State:
        """The state in `data`, the bytes of state.json (None: there is none yet)."""
        if data is None:
            return State()
        path = self.paths.state
        return _validate(State, migrate(_decode_json(path, data), STATE_SCHEMA_VERSION, path,
                                        "state"), path)

    def save_state(self, state: State) -> None:
        """state.json is derived from the records and the running loops, and made to agree
        with them at every start: it is replaced atomically but not fsynced (it changes at
        every phase of every running milestone)."""
        state.updated_at = now()
        self._write(self.paths.state, _json(state), durable=False)

    # --- milestone records ----------------------------------------------------------------
    def load_record(self, milestone_id: str) -> MilestoneRecord:
        path = self.paths.milestone_record(milestone_id)
        return self.parse_record(milestone_id, _read(path))

    def parse_record(self, milestone_id: str, data: bytes) -> MilestoneRecord:
        """The record of `milestone_id` from `data`, the bytes of its file, read once."""
        path = self.paths.milestone_record(milestone_id)
        record = _current_record(data)
        if record is None:
            fields = migrate(_decode_json(path, data), RECORD_SCHEMA_VERSION, path, "record")
            record = _validate(MilestoneRecord, fields, path)
        if record.id != milestone_id:
            raise RecordError(path, f"id {record.id!r} does not match the file name; "
                                    "left untouched")
        return record

    def save_record(self, record: MilestoneRecord) -> None:
        path = self.paths.milestone_record(record.id)
        self._write(path, _json(record))

    def _write(self, path: Path, text: str, *, durable: bool = True) -> None:
        with contextlib.ExitStack() as told:
            for listener in list(self.on_save):  # first: a kill in between leaves them ahead
                told.enter_context(listener(path, text.encode("utf-8")))
            write_text_atomic(path, text, durable=durable)

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
        """The milestone's `.md` as it is now (parsed again only when the file changed)."""
        path = self.paths.milestone_md(milestone_id)
        try:
            st = path.stat()
        except OSError:
            return load_milestone(path)  # says why it cannot be read
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        kept = self._read_definitions.get(milestone_id)
        if kept is not None and kept[0] == key:
            return kept[1]
        definition = load_milestone(path)
        self._read_definitions[milestone_id] = (key, definition)
        return definition

    def new_record(self, definition: MilestoneDef, milestone_id: str, created_at: datetime,
                   *, max_iterations: int, requires_human_review: bool) -> MilestoneRecord:
        review = definition.requires_human_review
        return MilestoneRecord(
            id=milestone_id,
            title=definition.title,
            created_at=created_at,
            max_iterations=max_iterations,
            requires_human_review=requires_human_review if review is None else review,
            depends_on=list(definition.depends_on),
            features=[Feature(id=f.id, title=f.title, criteria=list(f.criteria))
                      for f in definition.features],
            acceptance_criteria=list(definition.acceptance_criteria),
        )

    def retake_definition(self, record: MilestoneRecord, *, max_iterations: int,
                          requires_human_review: bool) -> list[str]:
        """Give a record what its definition (and the config) ask now; the names of the
        fields that differed. The human may edit the `.md` after it is registered, and while
        it runs (a feature added, a criterion reworded, review asked for); a record is also a
        file an agent with a shell could have changed. A started milestone keeps each
        feature's progress (`_with_progress`; one taken out of the `.md` leaves the
        checklist), and what it depends on no longer counts. Raises MilestoneError when the
        file does not read."""
        fresh = self.new_record(self.definition(record.id), record.id, record.created_at,
                                max_iterations=max_iterations,
                                requires_human_review=requires_human_review)
        names: tuple[str, ...] = _FROM_DEFINITION
        if record.status is not MilestoneStatus.PENDING:
            fresh.features = _with_progress(fresh.features, record.features)
            names = _WHILE_RUNNING
        changed = [name for name in names if getattr(record, name) != getattr(fresh, name)]
        for name in changed:
            setattr(record, name, getattr(fresh, name))
        return changed

    def redefined(self, record: MilestoneRecord, *, requires_human_review: bool) -> list[str]:
        """What of a started milestone its `.md` changed since the record last took it in,
        in words ("features", "acceptance criteria"), now taken into `record`. A file that
        does not read changes nothing."""
        try:
            changed = self.retake_definition(record, max_iterations=record.max_iterations,
                                             requires_human_review=requires_human_review)
        except MilestoneError:
            return []
        return [name.replace("_", " ") for name in changed
                if name in ("features", "acceptance_criteria")]

    def _as_defined_now(self, record: MilestoneRecord, result: Scan, *, max_iterations: int,
                        requires_human_review: bool) -> None:
        """A pending milestone is what its `.md` says now, not when it was registered (the
        human may edit it until it starts): what it waits for, and what the board and
        `anima status` show (the record itself is written as it starts), with the review and
        round limit the config asks now. One whose file no longer reads is reported, and not
        started until it is fixed. Read only when the file or the config changed after its
        record was written."""
        if not defined_after_record(self.paths, record.id):
            return
        try:
            self.retake_definition(record, max_iterations=max_iterations,
                                   requires_human_review=requires_human_review)
        except MilestoneError as e:
            result.problems.append(e)
            result.unreadable.add(record.id)

    def _not_run_again(self, record: MilestoneRecord, result: Scan) -> None:
        """A milestone that ended (completed, cancelled) does not run again: a different
        `.md` put under its name since is reported, not silently ignored."""
        md = self.paths.milestone_md(record.id)
        if record.completed_at is None or not changed_after(md,
                                                            record.completed_at.timestamp()):
            return
        try:
            definition = self.definition(record.id)
        except MilestoneError:
            return  # it ended: a file that no longer reads is no reason to say anything
        if (problem := self.not_run_again(record, definition, md)) is not None:
            result.problems.append(problem)

    def not_run_again(self, record: MilestoneRecord, definition: MilestoneDef,
                      md: Path) -> MilestoneError | None:
        """Why `definition` (read from `md`), under the name of `record`, which ended, is
        never run: it defines another milestone. None when it is the same one (its file put
        back) or `record` has not ended."""
        if record.completed_at is None:
            return None
        now = self.new_record(definition, record.id, record.created_at,
                              max_iterations=record.max_iterations,
                              requires_human_review=record.requires_human_review)
        if (now.title, [(f.title, f.criteria) for f in now.features],
                now.acceptance_criteria) == (record.title, [(f.title, f.criteria) for f in
                                                            record.features],
                                             record.acceptance_criteria):
            return None
        return MilestoneError(md, f"differs from milestone {record.id}, which is "
                                  f"{record.status.value}: a milestone never runs twice; "
                                  "save the new one under another name to run it")

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
             ready: Callable[[Path], bool] | None = None, in_main: InMain | None = None) -> Scan:
        """Load every record; every `.md` that has none yet is listed as pending (a fresh
        record, saved only with `register`) once `ready` says it has settled (a folder people
        drop files into must not parse a half-written file). Without `register` nothing is
        written. Hidden names (editors' swap and lock files) are not milestones. `in_main`
        says whether you merged a dependency Anima did not (`dependencies.done`).

        One timestamp serves a whole scan that registers: files found together (whose arrival
        nobody saw) start in name order. One listed without registering was created when its
        file arrived, so that each reading lists it alike and in its place.
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
                    known = self.load_record(milestone_id)
                    result.records.append(known)
                    if known.status is MilestoneStatus.PENDING:
                        self._as_defined_now(known, result, max_iterations=max_iterations,
                                             requires_human_review=requires_human_review)
                    elif known.status in (MilestoneStatus.COMPLETED, MilestoneStatus.CANCELLED):
                        self._not_run_again(known, result)
                    elif known.status is MilestoneStatus.AWAITING_REVIEW and \
                            defined_after_record(self.paths, milestone_id) and (changed := \
                            self.redefined(known.model_copy(deep=True),
                                           requires_human_review=requires_human_review)):
                        result.redefined[milestone_id] = tuple(changed)
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
                    record = self.new_record(load_milestone(md), milestone_id, arrival(md),
                                             max_iterations=max_iterations,
                                             requires_human_review=requires_human_review)
                result.records.append(record)
            except (MilestoneError, RecordError) as e:
                result.problems.append(e)
        # Milestones whose file is there but cannot be read as it is written.
        unreadable = {getattr(p, "path", Path()).stem for p in result.problems}
        # A record whose definition went missing still says where its milestone stands.
        listed = {r.id for r in result.records} | unreadable
        for milestone_id in self._record_ids():
            if milestone_id not in listed:
                try:
                    result.records.append(self.load_record(milestone_id))
                    result.orphans.add(milestone_id)
                except RecordError as e:
                    result.problems.append(e)
        result.records.sort(key=lambda r: (r.created_at, r.id))
        result.dependencies = dependencies(result.records, in_main, unreadable=unreadable,
                                           undefined=result.orphans)
        for milestone_id, why in result.dependencies.broken.items():
            result.problems.append(
                MilestoneError.never_starts(self.paths.milestone_md(milestone_id), why))
        return result
