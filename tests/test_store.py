"""Records and state.json: round-trip, atomic writes, corrupt files left untouched,
registration of dropped milestone files in a stable order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.atomic import write_text_atomic
from anima.errors import RecordError
from anima.paths import ProjectPaths
from anima.store.models import (
    RECORD_SCHEMA_VERSION,
    STATE_SCHEMA_VERSION,
    Iteration,
    MergeState,
    MilestoneStatus,
    RoundKind,
    State,
    StateStatus,
    Usage,
    Verdict,
    Withdrawn,
)
from anima.store.store import Scan, Store
from tests.helpers import milestone_md


@pytest.fixture
def store(tmp_path: Path) -> Store:
    paths = ProjectPaths(tmp_path)
    paths.milestones.mkdir(parents=True)
    return Store(paths)


def scan(store: Store) -> Scan:
    return store.scan(max_iterations=20, requires_human_review=False)


def test_a_registered_record_round_trips(store: Store) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A", "B"], ["c1", "c2"]))
    (record,) = scan(store).records
    assert record.status is MilestoneStatus.PENDING
    assert [f.id for f in record.features] == ["F1", "F2"]
    assert record.acceptance_criteria == ["c1", "c2"]
    record.iterations.append(Iteration(
        round=1, kind=RoundKind.FEATURE, feature="F1", commit="a" * 40, verdict=Verdict.ACCEPTED,
        usage=Usage(input_tokens=5, output_tokens=7), tokens=12, cost_usd=0.5,
        started_at=datetime.now(UTC), ended_at=datetime.now(UTC)))
    record.iteration_count = 1
    store.save_record(record)
    again = store.load_record("m1")
    assert again == record
    data = json.loads(store.paths.milestone_record("m1").read_text())
    assert data["schema_version"] == RECORD_SCHEMA_VERSION
    assert data["iterations"][0]["kind"] == "feature"


def test_state_defaults_to_sleeping_and_round_trips(store: Store) -> None:
    assert store.load_state().status is StateStatus.SLEEPING
    store.save_state(State(status=StateStatus.AWAKE, current_milestone="m1"))
    state = json.loads(store.paths.state.read_text())
    assert state["status"] == "awake" and state["current_milestone"] == "m1"


WRITER = """
import json, sys, time
from pathlib import Path
from anima.atomic import write_text_atomic
path, stop_at = Path(sys.argv[1]), time.time() + float(sys.argv[2])
i = 0
while time.time() < stop_at:
    i += 1
    write_text_atomic(path, json.dumps({"payload": "x" * 200_000, "i": i}))
"""


def test_a_reader_during_writes_never_sees_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    write_text_atomic(path, json.dumps({"i": 0}))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "1.5"])
    reads = 0
    try:
        while writer.poll() is None:
            json.loads(path.read_text())  # raises on a torn file
            reads += 1
    finally:
        writer.wait()
    assert writer.returncode == 0 and reads > 50
    assert json.loads(path.read_text())["i"] > 1
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("content", ["{ torn", "[1, 2]", '{"id": "m1", "status": "bogus"}',
                                     '{"schema_version": 99, "id": "m1"}'])
def test_a_corrupt_record_is_reported_and_left_byte_identical(store: Store,
                                                              content: str) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    store.paths.milestone_md("m2").write_text(milestone_md("M2", ["B"]))
    corrupt = store.paths.milestone_record("m1")
    corrupt.write_text(content)
    before = corrupt.read_bytes()
    result = scan(store)
    assert [r.id for r in result.records] == ["m2"]  # the other milestone stays usable
    (problem,) = result.problems
    assert isinstance(problem, RecordError) and str(corrupt) in str(problem)
    assert "left untouched" in str(problem)
    assert corrupt.read_bytes() == before
    scan(store)
    assert corrupt.read_bytes() == before


def test_bad_names_and_malformed_files_are_reported_not_registered(store: Store) -> None:
    store.paths.milestones.joinpath("Bad Name.md").write_text(milestone_md("X", ["A"]))
    store.paths.milestone_md("broken").write_text("no title, no features\n")
    store.paths.milestone_md("good").write_text(milestone_md("Good", ["A"]))
    result = scan(store)
    assert [r.id for r in result.records] == ["good"]
    messages = " ".join(str(p) for p in result.problems)
    assert "Bad Name.md" in messages and "broken.md" in messages
    assert not store.paths.milestone_record("broken").exists()
    assert store.paths.milestone_md("broken").read_text() == "no title, no features\n"


def test_registration_orders_by_created_at_then_name(store: Store) -> None:
    for name in ("zeta", "alpha"):
        store.paths.milestone_md(name).write_text(milestone_md(name, ["A"]))
    first = scan(store)
    assert [r.id for r in first.records] == ["alpha", "zeta"]  # same scan: by name
    created = {r.id: r.created_at for r in first.records}
    store.paths.milestone_md("beta").write_text(milestone_md("beta", ["A"]))
    second = scan(store)
    assert [r.id for r in second.records] == ["alpha", "zeta", "beta"]
    assert {r.id: r.created_at for r in second.records if r.id != "beta"} == created
    assert second.registered == ["beta"]


def test_a_version_3_record_keeps_its_rounds_without_a_check(store: Store) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    scan(store)
    data = json.loads(store.paths.milestone_record("m1").read_text())
    data["schema_version"] = 3  # as Anima wrote it before it ran the project's checks
    data["iterations"] = [{"round": 1, "kind": "feature", "verdict": "accepted",
                           "started_at": "2026-01-01T00:00:00Z",
                           "ended_at": "2026-01-01T00:01:00Z"}]
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    migrated = store.load_record("m1")
    assert migrated.schema_version == RECORD_SCHEMA_VERSION
    assert migrated.iterations[0].check is None
    assert migrated.iterations[0].verdict is Verdict.ACCEPTED


def test_a_version_1_record_is_migrated_and_a_newer_one_refused(store: Store) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    (record,) = scan(store).records
    data = json.loads(store.paths.milestone_record("m1").read_text())
    assert data["schema_version"] == RECORD_SCHEMA_VERSION
    for key in ("claude_version", "rollovers", "error", "comments"):
        del data[key]
    data["sessions"] = {"developer": "d-1", "acceptor": None}
    data["schema_version"] = 1  # as the first Anima wrote it
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    migrated = store.load_record("m1")
    assert migrated.schema_version == RECORD_SCHEMA_VERSION and migrated.claude_version is None
    assert migrated.sessions.developer == "d-1" and migrated.sessions.developer_model is None
    assert migrated.comments == []
    assert migrated.features == record.features
    data["schema_version"] = RECORD_SCHEMA_VERSION + 1
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    with pytest.raises(RecordError, match="written by a newer Anima"):
        store.load_record("m1")


def test_a_version_2_record_gains_context_and_rollovers(store: Store) -> None:
    """A record from before the context figure loads with empty figures and no rollovers."""
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    (record,) = scan(store).records
    record.iterations.append(Iteration(
        round=1, kind=RoundKind.FEATURE, feature="F1", commit="a" * 40, verdict=Verdict.ACCEPTED,
        started_at=datetime.now(UTC), ended_at=datetime.now(UTC)))
    store.save_record(record)
    data = json.loads(store.paths.milestone_record("m1").read_text())
    del data["rollovers"], data["iterations"][0]["context"], data["iterations"][0]["check"]
    del data["comments"]
    data["schema_version"] = 2
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    migrated = store.load_record("m1")
    assert migrated.schema_version == RECORD_SCHEMA_VERSION
    assert migrated.rollovers == [] and migrated.iterations[0].context == {}
    assert migrated.comments == []  # v6


def test_a_version_9_record_knows_which_rounds_a_rewind_dropped(store: Store) -> None:
    """Before v10 only a note said so: those rounds must not decide what comes next, nor
    what main receives, after an upgrade either."""
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    (record,) = scan(store).records
    for n in (1, 2, 3):
        record.iterations.append(Iteration(
            round=n, kind=RoundKind.FEATURE, feature="F1", commit=f"{n}" * 40,
            verdict=Verdict.ACCEPTED, started_at=datetime.now(UTC), ended_at=datetime.now(UTC)))
    record.notes.append("continued from round 1 (rounds 2–3 dropped): milestone/m1 put back")
    store.save_record(record)
    data = json.loads(store.paths.milestone_record("m1").read_text())
    for it in data["iterations"]:
        del it["withdrawn"]
    data["schema_version"] = 9
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    migrated = store.load_record("m1")
    assert [it.withdrawn for it in migrated.iterations] == [None, Withdrawn.DROPPED,
                                                           Withdrawn.DROPPED]
    assert [it.round for it in migrated.standing] == [1]


@pytest.mark.parametrize(("phase", "withdrawn"), [
    ("awaiting_review", Withdrawn.CHANGES_REQUESTED),  # what a v9 Request changes left
    ("paused", None)])  # a v9 resume with a note (after a pause past the final): not a request
def test_a_version_9_record_knows_whether_you_requested_changes(
        store: Store, phase: str, withdrawn: Withdrawn | None) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    (record,) = scan(store).records
    record.iterations.append(Iteration(
        round=1, kind=RoundKind.FINAL, commit="1" * 40, verdict=Verdict.ACCEPTED,
        started_at=datetime.now(UTC), ended_at=datetime.now(UTC)))
    store.save_record(record)
    data = json.loads(store.paths.milestone_record("m1").read_text())
    del data["iterations"][0]["withdrawn"], data["in_flight"]
    data.update(schema_version=9, status="in_progress", phase=phase,
                human_notes=[{"at": data["iterations"][0]["ended_at"], "text": "carry on",
                              "delivered": False}])
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    assert store.load_record("m1").iterations[0].withdrawn is withdrawn


def test_negative_spend_in_a_record_is_refused_naming_the_field(store: Store) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    scan(store)
    path = store.paths.milestone_record("m1")
    data = json.loads(path.read_text())
    data["in_flight"] = {"usage": {"output_tokens": -1000000}, "cost_usd": -50}
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(RecordError, match="in_flight"):
        store.load_record("m1")
    assert path.read_bytes() == before


@pytest.mark.parametrize(("merge", "completed_at", "state"), [
    ({"merged": True, "detail": "merged milestone/m1 into main as abc1234"}, "2026-01-01T00:00:00Z",
     MergeState.MERGED),
    ({"merged": False, "detail": "conflicts in a.py"}, "2026-01-01T00:00:00Z", MergeState.FAILED),
    (None, None, MergeState.PENDING),  # an older Anima died between `completed` and the merge
])
def test_a_version_3_completion_gets_its_merge_state(
        store: Store, merge: dict[str, object] | None, completed_at: str | None,
        state: MergeState) -> None:
    store.paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    scan(store)
    data = json.loads(store.paths.milestone_record("m1").read_text())
    del data["error"]
    data.update(schema_version=3, status="completed", merge=merge, completed_at=completed_at)
    store.paths.milestone_record("m1").write_text(json.dumps(data))
    migrated = store.load_record("m1")
    assert migrated.merge is not None and migrated.merge.state is state
    assert migrated.merge.merged is (state is MergeState.MERGED) and migrated.error is None


def test_a_schema_2_state_reads_as_its_one_running_milestone(store: Store) -> None:
    """What an older Anima wrote: the milestone it was awake on is the one running."""
    store.paths.state.write_text(json.dumps({"schema_version": 2, "status": "awake",
                                             "current_milestone": "m1", "waiting_until": None,
                                             "waiting_reason": None}))
    state = store.load_state()
    assert [r.id for r in state.running] == ["m1"] and state.current_milestone == "m1"
    store.paths.state.write_text(json.dumps({"schema_version": 2, "status": "paused",
                                             "current_milestone": "m1"}))
    assert store.load_state().running == []


def test_a_schema_3_states_wait_stays_the_projects(store: Store) -> None:
    """Schema 3 kept one wait, not whose: it stays what `waiting_until` says, and no running
    milestone is said to wait for it."""
    store.paths.state.write_text(json.dumps({
        "schema_version": 3, "status": "awake", "current_milestone": "m1",
        "running": [{"id": "m1", "phase": "developer", "round": 2}],
        "waiting_until": "2030-01-01T10:00:00Z", "waiting_reason": "waiting for the usage "
                                                                 "limit to reset at 10:00"}))
    state = store.load_state()
    assert state.schema_version == STATE_SCHEMA_VERSION
    assert state.waiting_reason == "waiting for the usage limit to reset at 10:00"
    assert state.waiting_until is not None and state.waiting_until.year == 2030
    (line,) = state.running
    assert (line.id, line.round, line.waiting_until, line.waiting_reason) == ("m1", 2, None, None)


def test_a_bad_depends_on_is_reported_with_the_file(store: Store) -> None:
    md = store.paths.milestone_md("m1")
    md.write_text("---\ndepends_on: [ok, Not An Id]\n---\n" + milestone_md("M1", ["A"]))
    result = scan(store)
    assert result.records == []
    (found,) = result.problems
    assert str(md) in str(found) and "'Not An Id', which is not a milestone id" in str(found)


def test_a_milestone_that_depends_on_itself_is_listed_as_a_cycle_of_one(store: Store) -> None:
    """It reads (it is not a malformed file): listed, pending, and never started."""
    md = store.paths.milestone_md("m1")
    md.write_text("---\ndepends_on: [m1]\n---\n" + milestone_md("M1", ["A"]))
    result = scan(store)
    assert [r.id for r in result.records] == ["m1"]
    assert result.dependencies.broken == {"m1": "depends_on makes a cycle: m1 → m1 (m1 names "
                                                "itself)"}
    (found,) = result.problems
    assert str(md) in str(found) and "makes a cycle" in str(found)


def test_depends_on_is_read_in_every_spelling(store: Store) -> None:
    for name, front in (("a", "depends_on: [b, c]"), ("b", "depends_on: c"),
                        ("c", "depends_on: []"), ("d", "depends_on: 'b', \"c\"")):
        store.paths.milestone_md(name).write_text(f"---\n{front}\n---\n"
                                                  + milestone_md(name, ["A"]))
    got = {r.id: r.depends_on for r in scan(store).records}
    assert got == {"a": ["b", "c"], "b": ["c"], "c": [], "d": ["b", "c"]}
