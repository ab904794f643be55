"""The context in use and the session rollover, end to end with the fake `claude` (which
reports the context sizes a script gives it) in real temp repos."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.events import Compacted, ContextUsage, EventBus, LogLine
from anima.store.models import MilestoneStatus, RoundKind
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record, run_engine
from tests.test_recovery import (
    Runner,
    our_processes_fixture,  # noqa: F401  (the fixture `our_processes`)
    run_to_end,
    wait_until,
)

FRESH_MARK = "This is a fresh session"


@pytest.fixture
def fake(fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    fake_claude.use_env(monkeypatch)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return fake_claude


def turn(tokens: int, **more: object) -> dict[str, object]:
    return {"auto": True, "context_tokens": tokens, **more}


def sessions(fake: FakeClaude, role: str = "developer") -> list[str]:
    return [e["session_id"] for e in fake.entries(role)]


def test_each_rounds_context_is_published_kept_and_compaction_logged(
        git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta"])})
    fake.write_script({
        "developer": [turn(30_000), turn(50_000, context_window=1_000_000,
                                         compact={"pre_tokens": 160_000, "post_tokens": 9_000})],
        "acceptor": [turn(12_000)]})
    bus = EventBus()
    seen: list[object] = []
    bus.subscribe(lambda e: seen.append(e) if isinstance(e, ContextUsage | Compacted | LogLine)
                  else None)
    engine = Engine(git_repo, bus=bus)
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    first, second = rec.iterations[0].context, rec.iterations[1].context
    assert (first["developer"].tokens, first["developer"].window) == (30_000, 200_000)
    assert first["developer"].percent == 15.0 and first["acceptor"].tokens == 12_000
    assert (second["developer"].tokens, second["developer"].window) == (50_000, 1_000_000)
    usages = [e for e in seen if isinstance(e, ContextUsage) and e.role == "developer"]
    assert [(u.tokens, u.window) for u in usages[:2]] == [(30_000, 200_000), (50_000, 1_000_000)]
    assert usages[0].session_id == rec.sessions.developer
    assert [(c.pre_tokens, c.post_tokens) for c in seen if isinstance(c, Compacted)] == \
        [(160_000, 9_000)]
    log = (git_repo / ".anima" / "logs" / "m.log").read_text(encoding="utf-8")
    assert "developer: the CLI compacted its context by itself (auto): 160000 → 9000" in log


def test_a_growing_context_rolls_over_at_the_threshold_with_the_history(
        git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", [f"Part {i}" for i in range(1, 6)])})
    # 39.9% stays, 40% goes: the check is "passed the threshold", between rounds.
    fake.write_script({"developer": [turn(30_000), turn(79_800), turn(80_000), turn(20_000)]})
    run_engine(git_repo, context_rollover_percent=40)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    ids = sessions(fake)
    assert ids[0] == ids[1] == ids[2] != ids[3] == ids[4] == ids[5]
    fresh = fake.entries("developer")[3]
    assert not fresh["resume"] and fresh["session_id"] == ids[3]
    assert [(r.round, r.role, r.tokens, r.window, r.old_session) for r in rec.rollovers] == \
        [(4, "developer", 80_000, 200_000, ids[0])]
    assert "context at 40% of the 200k window" in rec.rollovers[0].reason
    prompts = fake.prompts("developer")
    assert FRESH_MARK not in prompts[2] and FRESH_MARK in prompts[3]
    assert FRESH_MARK not in prompts[4]  # only the session's first prompt says so
    for it in rec.iterations[:3]:
        assert it.commit and it.commit[:7] in prompts[3]
    assert "Progress: 3/5" in prompts[3] and "Previous iterations" in prompts[3]
    assert "Milestone definition" in prompts[3]  # the original task
    assert rec.sessions.developer == ids[3]
    assert len(set(sessions(fake, "acceptor"))) == 1  # the Acceptor's context stayed small


def test_session_per_feature_starts_a_fresh_developer_per_feature_not_per_fix(
        git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta", "Gamma"])})
    fake.write_script({"acceptor": [{"text": "ACCEPTED"}, {"text": "REJECTED: Beta lacks a test"}]})
    run_engine(git_repo, session_per_feature=True)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    kinds = [(i.kind, i.feature) for i in rec.iterations]
    assert kinds[:4] == [(RoundKind.FEATURE, "F1"), (RoundKind.FEATURE, "F2"),
                         (RoundKind.FIX, "F2"), (RoundKind.FEATURE, "F3")]
    ids = sessions(fake)
    assert ids[0] != ids[1] == ids[2] != ids[3] != ids[4]  # the fix stays in F2's session
    assert [r.round for r in rec.rollovers] == [2, 4, 5]
    assert all(r.reason == "a new feature (session_per_feature)" for r in rec.rollovers)
    assert FRESH_MARK in fake.prompts("developer")[3]


def test_a_restart_after_a_rollover_resumes_the_new_session(
        git_repo: Path, fake_claude: FakeClaude, our_processes: Callable[[], list[int]]) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta", "Gamma"])},
                 config={"context_rollover_percent": 40})
    fake_claude.write_script({"developer": [turn(30_000), turn(90_000), {"hang": True}]})
    first = Runner(git_repo, fake_claude)
    wait_until(lambda: len(fake_claude.entries("developer")) >= 3, what="round 3 started")
    first.kill()
    hung = fake_claude.entries("developer")[-1]
    old, new = fake_claude.entries("developer")[0]["session_id"], hung["session_id"]
    assert old != new and record(git_repo, "m").sessions.developer == new

    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:] + second.stderr
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    entries = fake_claude.entries("developer")
    resumed = entries[entries.index(hung) + 1]
    assert resumed["resume"] and resumed["session_id"] == new
    assert [r.round for r in rec.rollovers] == [3]
    assert our_processes() == []
