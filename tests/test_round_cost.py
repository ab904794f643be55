"""What a round costs Anima stays flat, and every commit reaches main through a review.

- A round's git work does not grow with the milestone's history (the history check once
  asked git about every accepted commit, every round: quadratic over a long milestone). It
  rests on the accepted commits forming a chain on the branch, and on a few git helpers
  (`tips`, `ancestry`, `independent`, `check_developer_commit(since=…)`), tested here too.
- A review covers every commit since the last accepted one, not only the round's own.
- Anima killed after the Developer committed a feature and before it reported: after the
  restart that commit is reviewed in a round of its own, its feature is done once accepted,
  and nothing unreviewed reaches main (a real `anima run --headless`, SIGKILLed).
"""

from __future__ import annotations

import itertools
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from anima.engine.facade import Engine
from anima.git import GitRepo
from anima.git.repo import RepoBase
from anima.paths import ProjectPaths
from anima.store.models import FeatureStatus, MilestoneStatus, RoundKind, Verdict
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import engine_held, hold, make_project, milestone_md, record, run_engine
from tests.test_cli import anima
from tests.test_recovery import (
    Runner,
    assert_consistent,
    our_processes_fixture,  # noqa: F401 - the fixture `our_processes`
    run_to_end,
    wait_until,
)

BENCH = Path(__file__).resolve().parent.parent / "bench"
THREE = milestone_md("Greeter", ["Greet command", "Version flag", "Help text"])
DONE = "## ALL_FEATURES_COMPLETE\n\n### Summary\nEvery feature is implemented."


def report(feature: str, commit: str = "{head}") -> str:
    return (f"## Implementation Report — Round 1\n\n**Feature**: {feature} — done\n"
            f"**Commit**: {commit}\n**Tests**: 1 passed, 0 failed\n**Lint**: clean\n")


def commit_feature(fid: str) -> list[str]:
    return [f"mkdir -p features && echo {fid} > features/{fid}.txt", "git add -A",
            f"git commit -qm 'feat: {fid}'"]


def reviews(fake: FakeClaude) -> dict[int, str]:
    """Round number -> the (last) review prompt of that round; final acceptances left out."""
    found: dict[int, str] = {}
    for prompt in fake.prompts("acceptor"):
        if match := re.match(r"Review round (\d+) ", prompt):
            found[int(match.group(1))] = prompt
    return found


def commits_of(project: Path, rev_range: str) -> dict[str, str]:
    """Subject -> full hash of each commit in `rev_range`."""
    lines = run_git(project, "log", "--format=%H %s", rev_range).splitlines()
    return {subject: commit for commit, _, subject in (line.partition(" ") for line in lines)}


# --------------------------------------------------------------------------- cost per round


def test_the_git_work_of_a_round_does_not_grow_with_the_history(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop, store and git checks with instant agents (`bench/instant.py`): every
    round after the first asks git the same number of questions, round 3 as round 20."""
    sys.path.insert(0, str(BENCH))
    try:
        import instant
    finally:
        sys.path.remove(str(BENCH))
    from anima.events import Event, VerdictReached

    calls = [0]
    run_git_layer = RepoBase._run

    def counted(self: RepoBase, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        return run_git_layer(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RepoBase, "_run", counted)
    at_verdicts: list[int] = []

    def on_event(event: Event) -> None:
        if isinstance(event, VerdictReached):
            at_verdicts.append(calls[0])

    run, _, _ = instant.run_milestone(20, on_event=on_event)
    run.run()
    assert run.record.status is MilestoneStatus.COMPLETED
    assert run.record.iteration_count == 20
    per_round = [b - a for a, b in itertools.pairwise(at_verdicts)]
    feature_rounds = per_round[1:-1]  # round 1 makes the worktree; the last is the final
    assert len(set(feature_rounds)) == 1, per_round  # flat: no check grows with the history
    # 14 today (11 the branch keeper's, 3 the turn guard's); once 20 + one per accepted commit
    assert feature_rounds[0] <= 14, per_round


# --------------------------------------------------------------------------- the git helpers


@pytest.fixture
def repo(git_repo: Path) -> GitRepo:
    return GitRepo.open(git_repo)


def commit(repo_root: Path, name: str) -> str:
    (repo_root / f"{name}.txt").write_text(f"{name}\n", encoding="utf-8")
    run_git(repo_root, "add", "-A")
    run_git(repo_root, "commit", "-qm", name)
    return run_git(repo_root, "rev-parse", "HEAD")


def test_tips_reads_both_branches_and_where_head_is_in_one_call(git_repo: Path,
                                                                repo: GitRepo) -> None:
    main = run_git(git_repo, "rev-parse", "main")
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    tip = commit(git_repo, "a")
    run_git(git_repo, "branch", "milestone/m10", main)  # a name that m1 begins
    tips = repo.tips("milestone/m1", "main")
    assert (tips.branch, tips.main, tips.on_branch) == (tip, main, True)
    run_git(git_repo, "switch", "-q", "--detach")
    assert not repo.tips("milestone/m1", "main").on_branch
    run_git(git_repo, "switch", "-q", "main")
    gone = repo.tips("milestone/gone", "main")
    assert (gone.branch, gone.main, gone.on_branch) == (None, main, False)
    assert repo.tips("milestone/m1", None).main is None


def test_ancestry_lists_what_a_round_adds_and_tells_new_work_from_merged_side_work(
        git_repo: Path, repo: GitRepo) -> None:
    base = run_git(git_repo, "rev-parse", "HEAD")
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    last = commit(git_repo, "accepted")
    run_git(git_repo, "switch", "-q", "-c", "side", base)
    side = commit(git_repo, "side")
    run_git(git_repo, "switch", "-q", "milestone/m1")
    run_git(git_repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = run_git(git_repo, "rev-parse", "HEAD")
    new = commit(git_repo, "new")
    work = repo.ancestry(last, new)
    assert [c for c, _ in work.commits] == [side, merge, new]  # parents first
    assert dict(work.commits)[new] == "new"
    assert work.path == {merge, new} and work.descends  # side does not descend from last
    assert not repo.ancestry(last, side).descends  # the accepted commit is not under side
    assert repo.ancestry(new, new).descends and repo.ancestry(new, new).commits == ()
    assert repo.independent([new, base, last, merge]) == [new]
    assert set(repo.independent([side, last])) == {side, last}


def test_a_commit_must_be_new_work_on_top_of_the_last_accepted_one(
        git_repo: Path, repo: GitRepo) -> None:
    base = run_git(git_repo, "rev-parse", "HEAD")
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    first = commit(git_repo, "first")
    second = commit(git_repo, "second")
    args: dict[str, Any] = {"branch": "milestone/m1", "base_commit": base, "main": "main",
                            "definitions": {}}
    assert repo.check_developer_commit(second, **args, since=first) == []
    assert repo.check_developer_commit(first, **args) == []  # from the base: new work
    [problem] = repo.check_developer_commit(first, **args, since=first)
    assert f"not new work on top of the last accepted commit {first[:7]}" in problem


# --------------------------------------------------------------------------- what a review sees


def test_a_fix_is_reviewed_with_the_rejected_attempt_it_fixes(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rejected attempt's commits stay on the branch and reach main with the fix: the fix
    round's review lists them too (everything since the last accepted commit)."""
    fake_claude.use_env(monkeypatch)
    project = make_project(git_repo, {"m1": milestone_md("Greeter", ["Greet command"])})
    fake_claude.write_script({
        "developer": [{"shell": commit_feature("F1"), "text": report("F1")},
                      {"shell": ["echo fixed >> features/F1.txt", "git commit -qam 'fix: F1'"],
                       "text": report("F1")}],
        "acceptor": [{"text": "REJECTED: the greeting is missing its test"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert [(i.kind, i.verdict) for i in rec.iterations] == [
        (RoundKind.FEATURE, Verdict.REJECTED), (RoundKind.FIX, Verdict.ACCEPTED),
        (RoundKind.FINAL, Verdict.ACCEPTED)]
    made = commits_of(project, f"{rec.base_commit}..milestone/m1")
    fix_review = reviews(fake_claude)[2]
    assert f"{made['feat: F1'][:7]} feat: F1" in fix_review
    assert f"{made['fix: F1'][:7]} fix: F1" in fix_review
    assert f"git diff {rec.base_commit} {made['fix: F1']}" in fix_review


# --------------------------------------------------------------------------- a kill mid-round


def test_a_feature_committed_before_a_kill_is_reviewed_in_a_round_of_its_own(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """Killed after the Developer committed F2 and before it reported. The restart tells the
    Developer not to redo committed work and it goes on to F3; F2's commit must not reach
    main without a review of its own, nor the milestone complete with F2 pending."""
    project = make_project(git_repo, {"m1": THREE})
    committed = fake_claude.root / "f2-committed"
    fake_claude.write_script({"developer": [
        {"auto": True},  # F1
        {"shell": [*commit_feature("F2"), f"touch {committed}"], "hang_after": True},
        {"shell": commit_feature("F3"), "text": report("F3")},  # after the restart
        {"text": DONE}]})
    first = Runner(project, fake_claude)
    wait_until(lambda: committed.exists(), what="F2 committed", timeout=60)
    first.kill()
    killed = record(project, "m1")
    assert killed.rounds == 1 and killed.feature("F2").status is FeatureStatus.PENDING

    second = run_to_end(project, fake_claude, timeout=120)
    assert second.proc.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    assert_consistent(rec)
    made = commits_of(project, f"{rec.base_commit}..milestone/m1")
    f2 = made["feat: F2"]
    # F2's commit had a round of its own, and its feature is done.
    assert [(i.kind, i.feature, i.verdict) for i in rec.iterations] == [
        (RoundKind.FEATURE, "F1", Verdict.ACCEPTED),
        (RoundKind.RECOVERY, "F2", Verdict.ACCEPTED),
        (RoundKind.FEATURE, "F3", Verdict.ACCEPTED),
        (RoundKind.FINAL, None, Verdict.ACCEPTED)]
    assert rec.iterations[1].commit == f2
    assert [f.status for f in rec.features] == [FeatureStatus.DONE] * 3
    assert "features/F2.txt" in rec.iterations[1].changed_files
    # Every commit main got from the milestone was listed in an accepted round's review.
    shown = reviews(fake_claude)
    accepted = [i.round for i in rec.iterations
                if i.verdict is Verdict.ACCEPTED and i.kind is not RoundKind.FINAL]
    for subject, commit_hash in made.items():
        assert any(f"{commit_hash[:7]} {subject}" in shown[n] for n in accepted), subject
        run_git(project, "merge-base", "--is-ancestor", commit_hash, "main")
    assert "No report: Anima was restarted" in shown[2]
    # The Developer, asked after that review, still had the recovery context.
    resumed = [e for e in fake_claude.entries("developer") if "This is round 3." in e["prompt"]]
    assert resumed and "This milestone was interrupted by a restart" in resumed[0]["prompt"]
    assert our_processes() == []


@pytest.mark.parametrize("cli", ["2.1.197", "2.1.330"])
def test_a_timed_out_turn_keeps_what_it_spent(git_repo: Path, fake_claude: FakeClaude,
                                              monkeypatch: pytest.MonkeyPatch, cli: str) -> None:
    """The interrupted turn's result says $0.40 went on model calls before the timeout: the
    record counted none of it (the result was thrown away), nor did the budget."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])},
                 config={"agent_timeout_seconds": 1.5})
    fake_claude.write_script({
        "cost_style": cli,
        "developer": [{"hang": True, "interrupted_cost_usd": 0.40}],
        "developer_default": {"auto": True, "cost_usd": 0.01},
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    run_engine(git_repo)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.iterations[0].reason.startswith("Developer timed out")
    assert rec.iterations[0].cost_usd == pytest.approx(0.40)
    assert rec.cost_usd == pytest.approx(0.40 + 4 * 0.01), [i.cost_usd for i in rec.iterations]


def test_a_turn_that_ends_as_you_stop_it_keeps_what_it_spent(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop now as the Developer's turn finishes: its result ($0.50) came, the round is
    dropped, and the spend went with it."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
    fake_claude.write_script({
        "developer": [{"auto": True, "delay": 1.0, "ignore_interrupt": True,
                       "cost_usd": 0.50}],
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    engine = Engine(git_repo)
    engine.start(watch=False)
    try:
        deadline = time.monotonic() + 30
        while len(fake_claude.prompts("developer")) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        engine.stop_now()
        while record(git_repo, "m").status is not MilestoneStatus.PAUSED:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        engine.shutdown()
    rec = record(git_repo, "m")
    assert rec.pause_reason == "stopped by you"
    assert rec.cost_usd == pytest.approx(0.50)


def test_a_kill_mid_round_keeps_what_its_finished_turns_spent(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """The Developer's turn spent $0.30; Anima is SIGKILLed while the Acceptor reviews. The
    round is redone, and its $0.30 was lost: only the record's totals hold spend, and the
    round in flight was in memory. Until that restart, `anima status` counts it (it printed
    only the totals: $0.00)."""
    make_project(git_repo, {"m1": milestone_md("Solo", ["Greet command"])})
    fake_claude.write_script({
        "developer": [{"auto": True, "cost_usd": 0.30}],
        "developer_default": {"auto": True, "cost_usd": 0.01},
        "acceptor": [{"hang": True}],
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    first = Runner(git_repo, fake_claude)
    wait_until(lambda: fake_claude.entries("acceptor"), what="the review")
    first.kill()
    assert record(git_repo, "m1").in_flight.cost_usd == pytest.approx(0.30)
    status = anima("status", str(git_repo))
    line = next(x for x in status.stdout.splitlines() if x.strip().startswith("m1"))
    assert "$0.30 (incl. $0.30 in flight)" in line, line
    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:]
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.in_flight.cost_usd == 0
    assert rec.cost_usd == pytest.approx(0.30 + sum(it.cost_usd for it in rec.iterations))
    assert any("cut short by a restart spent $0.3000" in n for n in rec.notes), rec.notes


def test_spend_outside_a_round_before_a_pause_reaches_the_totals_of_a_cancelled_milestone(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill leaves a dirty tree; the restart's clean-up turn spends $0.01 (outside any
    round); the loop then pauses (Pause after the round, asked during it); you cancel it.
    The clean-up's spend stayed in `in_flight` and never joined the totals."""
    import time

    from anima.config import load_config
    from anima.git import GitRepo
    from anima.loop import actions
    from tests.test_recovery import Runner
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Alpha"], ["works"])},
                 {"summarizer": {"enabled": False}})
    fake_claude.write_script({"developer": [{"shell": ["echo wip > wip.txt"],
                                             "hang_after": True}]})
    runner = Runner(git_repo, fake_claude)
    deadline = time.monotonic() + 30
    while not list((git_repo / ".anima" / "worktrees").glob("m1/wip.txt")):
        assert time.monotonic() < deadline, runner.stdout
        time.sleep(0.05)
    runner.kill()
    paths = ProjectPaths(git_repo)
    fake_claude.write_script({"developer": [{}, {"shell": [hold(fake_claude.root)],
                                                 "text": "cleaned"}]})
    with engine_held(git_repo, fake_claude.root) as engine:  # the clean-up turn
        engine.pause_after_round("m1")
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.PAUSED, (rec.status, rec.pause_reason)
    assert not rec.iterations
    actions.abort(Store(paths), GitRepo.open(git_repo), load_config(paths.config), "m1")
    rec = record(git_repo, "m1")
    answered = len(fake_claude.entries()) - 1  # the killed turn gave no result
    assert rec.cost_usd == pytest.approx(0.01 * answered), (rec.cost_usd, answered,
                                                           rec.in_flight, rec.notes)


def test_a_turn_killed_before_its_result_keeps_the_spend_its_model_calls_reported(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Developer ignores the interrupt after a timeout and is killed: no result ever
    says what the turn cost, and the record counted nothing of the 100k tokens its model
    call had reported (nor did the budget). What the `assistant` lines said is counted,
    priced by the model's list price, and the round says it is an estimate."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])},
                 config={"agent_timeout_seconds": 1.5,
                         "developer": {"model": "claude-sonnet-4-5-20250929"}})
    fake_claude.write_script({
        "developer": [{"shell": ["true"], "context_tokens": 100_010, "hang_after": True,
                       "ignore_sigterm": True}],
        "developer_default": {"auto": True, "cost_usd": 0.01},
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    run_engine(git_repo)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    first = rec.iterations[0]
    assert first.reason.startswith("Developer timed out")
    assert first.usage.cache_read_input_tokens == 100_000 and first.usage.output_tokens == 5
    estimate = (10 * 3 + 100_000 * 0.30 + 5 * 15) / 1_000_000
    assert first.cost_usd == pytest.approx(estimate)
    assert rec.cost_usd == pytest.approx(estimate + 4 * 0.01)
    assert any("estimate" in note for note in first.notes), first.notes


SONNET = "claude-sonnet-4-5-20250929"
#: What one call of the fake reports with context_tokens=100_010 (10 in, 100k cache read,
#: 5 out), at Sonnet 4.5's list price.
CALL_ESTIMATE = (10 * 3 + 100_000 * 0.30 + 5 * 15) / 1_000_000


def test_a_kill_of_anima_mid_turn_keeps_what_the_turns_model_calls_had_reported(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """Anima is SIGKILLed in the middle of the Developer's turn, after two of its model calls
    reported 100k tokens each. `in_flight` was written only after a turn's result, so the
    restart counted nothing of that turn. What the calls reported reaches the record while
    the turn runs, and after the restart it is in the totals, noted as an estimate."""
    make_project(git_repo, {"m1": milestone_md("Solo", ["Greet command"])},
                 config={"developer": {"model": SONNET}})
    fake_claude.write_script({
        "developer": [{"shell": ["true", "echo wip > wip.txt"], "context_tokens": 100_010,
                       "hang_after": True}],
        "developer_default": {"auto": True, "cost_usd": 0.01},
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    first = Runner(git_repo, fake_claude)
    wait_until(lambda: list(git_repo.glob(".anima/worktrees/m1/wip.txt")),
               what="the Developer's model calls")
    estimate = 2 * CALL_ESTIMATE
    try:  # the second call within a few seconds of the first (the writes are throttled)
        wait_until(lambda: record(git_repo, "m1").in_flight.cost_usd >= estimate - 1e-9,
                   what="the turn's spend so far on record")
    finally:
        first.kill()
    spent = record(git_repo, "m1").in_flight
    assert spent.usage.total == 2 * 100_015 and spent.estimated_usd == pytest.approx(estimate)
    second = run_to_end(git_repo, fake_claude)
    assert second.proc.returncode == 0, second.stdout[-2000:]
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.in_flight.cost_usd == 0
    assert rec.cost_usd == pytest.approx(estimate + sum(it.cost_usd for it in rec.iterations))
    assert rec.tokens_used == 2 * 100_015 + sum(it.tokens for it in rec.iterations)
    assert any(f"${estimate:.4f} of it an estimate" in n for n in rec.notes), rec.notes


def test_a_turns_result_replaces_the_spend_its_model_calls_reported_on_the_way(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """The Developer's model calls report 100k tokens while it works, and that reaches the
    record; then its result says the turn cost $0.30 for 150 tokens. The result's figure
    stands alone, while the Acceptor reviews (what a kill then would keep) and in the
    totals: nothing of the running estimate is counted on top of it."""
    make_project(git_repo, {"m1": milestone_md("Solo", ["Greet command"])},
                 config={"developer": {"model": SONNET}, "summarizer": {"enabled": False}})
    fake_claude.write_script({
        "developer": [{"shell": ["true"], "context_tokens": 100_010, "think": 3.0,
                       "auto": True, "cost_usd": 0.30}],
        "acceptor": [{"delay": 2.0, "text": "ACCEPTED", "cost_usd": 0.01}],
        "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    runner = Runner(git_repo, fake_claude)
    wait_until(lambda: fake_claude.prompts("developer"), what="the Developer's turn")
    try:
        wait_until(lambda: record(git_repo, "m1").in_flight.estimated_usd > 0,
                   what="the turn's spend so far on record")
        wait_until(lambda: fake_claude.prompts("acceptor"), what="the review")
        spent = record(git_repo, "m1").in_flight
    finally:
        assert runner.wait() == 0, runner.stdout[-2000:]
    assert spent.cost_usd == pytest.approx(0.30) and spent.estimated_usd == 0, spent
    assert spent.usage.total == 150, spent
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED and rec.in_flight.cost_usd == 0
    first = rec.iterations[0]
    assert first.cost_usd == pytest.approx(0.30 + 0.01)  # and the review's
    assert first.tokens == 2 * 150 and first.usage.cache_read_input_tokens == 0, first.usage
    assert rec.cost_usd == pytest.approx(sum(it.cost_usd for it in rec.iterations))
    assert rec.tokens_used == sum(it.tokens for it in rec.iterations) == rec.usage.total
    assert not any("estimate" in n for it in rec.iterations for n in it.notes)
    assert not any("estimate" in n for n in rec.notes), rec.notes
