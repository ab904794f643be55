"""Context engineering in the running loop: bounded prompts, the checklist, cost, budget,
summaries and redaction — end to end with the fake `claude` in real temp repos."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anima.store.models import FeatureStatus, MilestoneStatus, Verdict
from anima.text.context import estimate_tokens
from tests.conftest import FakeClaude, run_git
from tests.fakes.api_stub import ApiStub
from tests.helpers import make_project, milestone_md, record, run_engine

SECRET_KEY = "sk-ant-api03-" + "Zx9Yw8Vu7T" * 6
SECRET_TOKEN = "ghp_" + "a1B2c3D4e5" * 4


@pytest.fixture
def fake(fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    fake_claude.use_env(monkeypatch)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return fake_claude


def test_the_round_20_prompt_stays_bounded_and_names_every_commit(
        git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"long": milestone_md("Long", [f"Part {i}" for i in range(1, 21)])})
    run_engine(git_repo, max_iterations_per_milestone=30)
    rec = record(git_repo, "long")
    assert rec.status is MilestoneStatus.COMPLETED and rec.rounds == 21
    prompts = fake.prompts("developer")
    second, twentieth = prompts[1], prompts[19]
    assert len(twentieth) <= 1.5 * len(second), (len(twentieth), len(second))
    for it in rec.iterations[:19]:
        assert it.commit and it.commit[:7] in twentieth
    # Older rounds are one-liners, the recent ones in full.
    assert "Earlier rounds (one line each)" in twentieth
    assert twentieth.count("### Round ") == 4


def test_the_checklist_shows_every_state_and_progress(git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta", "Gamma"])})
    no = {"text": "REJECTED: Beta is wrong"}
    fake.write_script({"acceptor": [{"text": "ACCEPTED"}, no, no, no]})
    _, outcome = run_engine(git_repo)
    assert outcome.paused == ("m",)
    prompts = fake.prompts("developer")
    assert "- [ ] F1: Alpha" in prompts[0] and "Progress: 0/3" in prompts[0]
    assert "- [x] F1: Alpha" in prompts[1] and "Progress: 1/3" in prompts[1]
    assert "- [/] F2: Beta" in prompts[2]
    rec = record(git_repo, "m")
    assert [f.status for f in rec.features] == [FeatureStatus.DONE, FeatureStatus.BLOCKED,
                                                FeatureStatus.PENDING]
    beta = rec.features[1]
    assert beta.rounds == 3 and len(beta.commits) == 3
    assert rec.features[0].tool_calls > 0  # the fake's Bash calls, counted from events


def test_cost_and_tokens_add_up_and_the_budget_pauses(git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta", "Gamma"])},
                 config={"max_budget_usd": 0.05})
    usage = {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 50}
    turn = {"auto": True, "cost_usd": 0.02, "usage": usage}
    fake.write_script({"developer_default": turn,
                       "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01,
                                            "usage": usage}})
    _, outcome = run_engine(git_repo)
    rec = record(git_repo, "m")
    assert outcome.paused == ("m",) and "budget reached" in (rec.pause_reason or "")
    assert "raise max_budget_usd in .anima/config.json, then resume" in rec.pause_reason
    assert rec.rounds == 2  # $0.03 a round: paused before the third
    assert all(it.cost_usd == pytest.approx(0.03) for it in rec.iterations)
    assert all(it.tokens == 2 * 1250 for it in rec.iterations)
    assert rec.cost_usd == pytest.approx(sum(it.cost_usd for it in rec.iterations))
    assert rec.tokens_used == sum(it.tokens for it in rec.iterations)
    assert rec.usage.cache_read_input_tokens == 4 * 50


@pytest.mark.parametrize("cli", ["2.1.197", "2.1.330"])
def test_a_round_costs_what_it_spent_across_a_resume(git_repo: Path, fake: FakeClaude,
                                                     cli: str) -> None:
    """`total_cost_usd` is cumulative per process; a crash makes the Developer resume (2.1.197
    then counts from 0 again, 2.1.330 carries on and states the spend)."""
    make_project(git_repo, {"m": milestone_md("M", ["Alpha", "Beta"])},
                 config={"max_budget_usd": 0.13})
    fake.write_script({"cost_style": cli,
                       "developer": [{"auto": True, "cost_usd": 0.02}, {"crash": 1},
                                     {"auto": True, "cost_usd": 0.03},
                                     {"auto": True, "cost_usd": 0.04}],
                       "acceptor_default": {"text": "ACCEPTED", "cost_usd": 0.01}})
    _, outcome = run_engine(git_repo)
    rec = record(git_repo, "m")
    assert outcome.paused == () and rec.status is MilestoneStatus.COMPLETED
    assert [round(it.cost_usd, 6) for it in rec.iterations] == [0.03, 0.04, 0.05]
    assert rec.cost_usd == pytest.approx(0.12, rel=0.01)
    # The resumed process: two Developer processes (told apart by their start time; the
    # sandbox gives each a pid of its own namespace, the same number for both).
    assert len({e["started"] for e in fake.entries("developer")}) == 2


def test_a_huge_report_and_a_huge_reason_are_trimmed_to_the_budget(
        git_repo: Path, fake: FakeClaude) -> None:
    """A 2.3 MB Developer reply and a 2 MB rejection stay out of the next prompts."""
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
    report = ("## Implementation Report — Round 1\n**Feature**: F1\n**Commit**: {head}\n"
              "**Tests**: 1 passed\n**Lint**: clean\n### Notes\n" + "lorem ipsum dolor\n" * 130_000)
    reason = "REJECTED: the notes are far too long\n" + "- one more point to fix\n" * 90_000
    fake.write_script({"developer": [{"shell": ["echo a > a.txt && git add -A && "
                                                "git commit -qm 'feat: F1'"], "text": report}],
                       "acceptor": [{"text": reason}]})
    run_engine(git_repo)
    rec = record(git_repo, "m")
    assert rec.status is MilestoneStatus.COMPLETED
    first = rec.iterations[0]
    assert len(first.reason) > 2_000_000  # the record keeps it whole
    review, fix = fake.prompts("acceptor")[0], fake.prompts("developer")[1]
    budget = 16_000  # the default context_budget_tokens
    for prompt in (review, fix):
        assert estimate_tokens(prompt) <= budget, estimate_tokens(prompt)
        assert "trimmed to fit the context budget" in prompt
    assert "lorem ipsum dolor" in review and "**Commit**" in review
    assert ".anima/transcripts/m/events.jsonl" in review
    assert f"Read the commit itself: `git show {first.commit}`" in review
    assert "the notes are far too long" in fix and "- one more point to fix" in fix
    assert ".anima/milestones/m.json" in fix


def test_summaries_come_from_the_model_when_a_key_is_set(
        git_repo: Path, fake: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    with ApiStub(default="Added the greeting command and its test.",
                 is_main=lambda request: True) as stub:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-dummy")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", stub.url)
        make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
        run_engine(git_repo)
        rec = record(git_repo, "m")
        assert rec.iterations[0].summary == "Added the greeting command and its test."
        assert len(stub.requests) >= 1
        # The budget's estimate was calibrated with the API's count, once for the milestone.
        assert len(stub.counted) == 1
        assert "Feature checklist" in str(stub.counted[0]["messages"])


def test_summaries_fall_back_to_the_report_without_a_key(git_repo: Path,
                                                         fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
    run_engine(git_repo)
    first = record(git_repo, "m").iterations[0]
    assert "F1" in first.summary and first.commit[:7] in first.summary


def test_soul_is_never_cut_while_the_rest_is_trimmed(git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])}, config={
        "context_budget_tokens": 1000})
    soul = git_repo / ".anima" / "soul.md"
    soul.write_text("# Soul\n" + "Never skip the tests. " * 300 + "\nLAST SOUL LINE\n")
    (git_repo / "VISION.md").write_text("# Vision\n" + "Grand plans. " * 500)
    run_git(git_repo, "add", "VISION.md")
    run_git(git_repo, "commit", "-qm", "docs: vision")
    run_engine(git_repo)
    first = fake.prompts("developer")[0]
    assert "LAST SOUL LINE" in first and first.count("Never skip the tests.") == 300
    assert "trimmed to fit the context budget" in first
    assert "- [ ] F1: Alpha" in first and "Implementation Report" in first


def test_secrets_never_reach_disk_or_the_headless_output(git_repo: Path, fake: FakeClaude,
                                                         capsys: pytest.CaptureFixture) -> None:
    from anima.cli.printer import HeadlessPrinter
    from anima.engine.facade import Engine

    make_project(git_repo, {"m": milestone_md("M", ["Alpha"])})
    fake.write_script({"developer": [{
        "shell": [f"echo export ANTHROPIC_API_KEY={SECRET_KEY}", "echo token: " + SECRET_TOKEN],
        "auto": True}],
        "acceptor": [{"text": f"I found {SECRET_KEY} in the diff.\nACCEPTED"}]})
    import sys

    engine = Engine(git_repo)
    engine.bus.subscribe(HeadlessPrinter(sys.stdout, sys.stderr))
    try:
        engine.run(start_all=True)
    finally:
        engine.shutdown()
    assert record(git_repo, "m").iterations[0].verdict is Verdict.ACCEPTED
    shown = capsys.readouterr().out
    assert "<REDACTED>" in shown
    leaks = []
    for folder, _, files in os.walk(git_repo / ".anima"):
        for name in files:
            text = (Path(folder) / name).read_text(encoding="utf-8", errors="replace")
            if SECRET_KEY in text or SECRET_TOKEN in text:
                leaks.append(name)
    assert leaks == []
    assert SECRET_KEY not in shown and SECRET_TOKEN not in shown
    transcript = (git_repo / ".anima" / "transcripts" / "m" / "events.jsonl").read_text()
    assert "<REDACTED>" in transcript
