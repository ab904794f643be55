"""What each agent is told: the seed's context table, with missing optional files left out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from anima.engine.project import init_project
from anima.paths import ProjectPaths
from anima.store.models import FeatureStatus, Iteration, MilestoneRecord, RoundKind, Verdict
from anima.store.store import Store
from anima.text.context import estimate_tokens
from anima.text.prompts import DeveloperContext, PromptBuilder
from tests.helpers import milestone_md


@pytest.fixture
def paths(tmp_path: Path) -> ProjectPaths:
    init_project(tmp_path, make_repository=True)
    paths = ProjectPaths(tmp_path)
    paths.milestone_md("m1").write_text(milestone_md("Greeter", ["Greet", "Version"],
                                                     ["greet works", "lint is clean"]))
    return paths


def record_of(paths: ProjectPaths) -> MilestoneRecord:
    rec = Store(paths).scan(max_iterations=20, requires_human_review=False).records[0]
    rec.branch_name, rec.main_branch, rec.base_commit = "milestone/m1", "main", "b" * 40
    return rec


def builder(paths: ProjectPaths) -> PromptBuilder:
    return PromptBuilder(paths, budget_tokens=16000, recent_in_full=4)


def test_the_first_developer_prompt_has_the_seed_context(paths: ProjectPaths) -> None:
    paths.vision.write_text("# Vision\nA friendly CLI.\n")
    prompt = builder(paths).developer(record_of(paths), DeveloperContext())
    for expected in ("A friendly CLI.", "Soul — quality standards", "# Greeter",
                     "Project memory", "Branch: `milestone/m1`", "Round: 1",
                     "Features completed so far: none yet", "- [ ] F1: Greet",
                     "Progress: 0/2", "Implement the next unfinished feature",
                     "## Implementation Report — Round 1", "ALL_FEATURES_COMPLETE",
                     "conventional commit"):
        assert expected in prompt, expected
    assert "Review feedback" not in prompt and "Previous iterations" not in prompt


def test_missing_optional_files_are_left_out(paths: ProjectPaths) -> None:
    paths.memory.unlink()
    paths.soul.unlink()
    prompt = builder(paths).developer(record_of(paths), DeveloperContext())
    assert "Project memory" not in prompt and "Soul" not in prompt and "VISION" not in prompt
    assert "- [ ] F1: Greet" in prompt


def test_a_fix_round_carries_the_reason_the_note_and_history(paths: ProjectPaths) -> None:
    rec = record_of(paths)
    now = datetime.now(UTC)
    rec.iterations.append(Iteration(round=1, kind=RoundKind.FEATURE, feature="F1",
                                    commit="c" * 40, changed_files=["greet.py"],
                                    summary="Added greet.", verdict=Verdict.REJECTED,
                                    reason="no test", started_at=now, ended_at=now))
    rec.features[0].status = FeatureStatus.IN_PROGRESS
    prompt = builder(paths).developer(rec, DeveloperContext(fix_reason="no test",
                                                            human_note="use argparse"))
    assert "your last round was REJECTED\nno test" in prompt
    assert "use argparse" in prompt and "Fix the problems" in prompt
    assert "### Round 1 (feature, F1) → commit ccccccc" in prompt
    assert "- [/] F1: Greet" in prompt and "Round: 2" in prompt


def test_the_acceptor_review_names_the_commit_criteria_and_soul(paths: ProjectPaths) -> None:
    rec = record_of(paths)
    prompt = builder(paths).acceptor_review(rec, report="## Implementation Report", feature="F1",
                                            commit="d" * 40, previous_head="b" * 40,
                                            commits="- ddddddd feat: F1")
    assert f"git show {'d' * 40}" in prompt and "Soul" in prompt
    assert "F1 — Greet" in prompt and "- Greet works\n- test 1 passes" in prompt
    assert "`ACCEPTED`" in prompt and "`REJECTED: <" in prompt


def test_the_final_acceptance_lists_every_criterion_and_commit(paths: ProjectPaths) -> None:
    prompt = builder(paths).acceptor_final(record_of(paths), report="## ALL_FEATURES_COMPLETE",
                                           commits="aaaaaaa feat: F1\nbbbbbbb feat: F2")
    assert "- [ ] greet works" in prompt and "- [ ] lint is clean" in prompt
    assert "aaaaaaa feat: F1" in prompt and "bbbbbbb feat: F2" in prompt
    assert "one by one" in prompt


def test_git_logs_pasted_into_prompts_are_redacted(paths: ProjectPaths) -> None:
    """Commit subjects come from git, not through the agents' redaction."""
    key = "sk-ant-api03-" + "Qw3Er5Ty7U" * 6
    rec, log = record_of(paths), f"aaaaaaa feat: F1 key {key}"
    prompts = [
        builder(paths).developer(rec, DeveloperContext(recovery_log=log)),
        builder(paths).developer(rec, DeveloperContext(fresh_session="rollover", commit_log=log)),
        builder(paths).acceptor_review(rec, report="r", feature="F1", commit="d" * 40,
                                       previous_head="b" * 40, commits=f"- {log}"),
        builder(paths).acceptor_final(rec, report="r", commits=log),
    ]
    for prompt in prompts:
        assert "aaaaaaa feat: F1 key <REDACTED>" in prompt and key not in prompt


class CountingApi:
    """Stands in for the Messages API's count_tokens: this tokenizer counts 2× the estimate."""

    available = True

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return 2 * estimate_tokens(text)


def test_the_budget_is_calibrated_once_with_the_api_count(paths: ProjectPaths) -> None:
    paths.vision.write_text("# Vision\n" + "A long vision. " * 4000)
    plain = PromptBuilder(paths, budget_tokens=8000, recent_in_full=4)
    api = CountingApi()
    calibrated = PromptBuilder(paths, budget_tokens=8000, recent_in_full=4,
                               counter=api)  # type: ignore[arg-type]
    rec = record_of(paths)
    first = calibrated.developer(rec, DeveloperContext())
    assert calibrated.scale == pytest.approx(0.5, abs=0.01)
    assert 2 * estimate_tokens(first) <= 8000 + 200  # fits by the API's count
    assert estimate_tokens(plain.developer(rec, DeveloperContext())) > estimate_tokens(first)
    calibrated.developer(rec, DeveloperContext())
    assert api.calls == 1  # once per milestone, not per round
