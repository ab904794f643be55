"""The M4 loop end to end: the fake `claude` in a real temp git repo, the real engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from anima.engine.facade import Engine
from anima.loop.confinement import sandbox_problem
from anima.paths import ProjectPaths
from anima.store.models import FeatureStatus, MilestoneStatus, RoundKind, Verdict, Withdrawn
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record, run_engine, state

ONE_FEATURE = milestone_md("Greeter", ["Alpha"], ["works"])
TWO = milestone_md("Greeter", ["Greet command", "Version flag"], ["greet prints hello",
                                                                 "--version prints it"])
NO_BWRAP = sandbox_problem("auto")
needs_sandbox = pytest.mark.skipif(NO_BWRAP is not None,
                                   reason=f"the sandbox cannot run here: {NO_BWRAP}")
#: The Developer checks main out in its worktree (main is the human checkout's branch, so git
#: wants --ignore-other-worktrees) and commits there.
COMMIT_ON_MAIN = ["git switch -q --ignore-other-worktrees main", "echo x > onmain.txt",
                  "git add onmain.txt", "git commit -qm 'feat: on main'"]


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": TWO})


def test_whole_milestone_completes_on_its_branch_and_merges(project: Path,
                                                            fake_claude: FakeClaude) -> None:
    main_before = run_git(project, "rev-parse", "main")
    _, outcome = run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert outcome.paused == ()
    assert [(i.kind, i.feature, i.verdict) for i in rec.iterations] == [
        (RoundKind.FEATURE, "F1", Verdict.ACCEPTED),
        (RoundKind.FEATURE, "F2", Verdict.ACCEPTED),
        (RoundKind.FINAL, None, Verdict.ACCEPTED)]
    assert rec.iteration_count == 2 and rec.consecutive_rejections == 0
    assert all(f.status is FeatureStatus.DONE for f in rec.features)
    assert rec.branch_name == "milestone/m1" and rec.base_commit == main_before
    # Both features were committed on the milestone branch, then merged into main.
    branch_log = run_git(project, "log", "--format=%s", "milestone/m1")
    assert "feat: F1" in branch_log and "feat: F2" in branch_log
    assert rec.merge is not None and rec.merge.merged
    assert rec.claude_version == "9.9.9 (Fake Claude)"
    assert run_git(project, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert (project / "features" / "F2.txt").exists()
    assert state(project) == {**state(project), "status": "sleeping", "current_milestone": None}
    # Both agents worked in the milestone's own worktree, which is gone once it is merged;
    # the human's checkout stayed on main all along, and shows the merged files.
    worktree = project / ".anima" / "worktrees" / "m1"
    assert {e["cwd"] for e in fake_claude.entries()} == {str(worktree.resolve())}
    assert not worktree.exists()
    assert "worktrees/m1" not in run_git(project, "worktree", "list")
    # One persistent process per role for the whole milestone.
    assert len({e["pid"] for e in fake_claude.entries("developer")}) == 1
    assert len({e["pid"] for e in fake_claude.entries("acceptor")}) == 1
    # The Acceptor was told which commit to inspect with git show.
    review = fake_claude.prompts("acceptor")[0]
    assert f"git show {rec.iterations[0].commit}" in review
    log = (project / ".anima" / "logs" / "m1.log").read_text()
    assert "ACCEPTED" in log and "phase" in log


def test_rejection_reason_reaches_the_developer(project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"text": "Looked at it.\n\nREJECTED: no test covers "
                                                    "the greeting"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    first, second = rec.iterations[0], rec.iterations[1]
    assert first.verdict is Verdict.REJECTED and first.reason == "no test covers the greeting"
    assert second.kind is RoundKind.FIX
    fix_prompt = fake_claude.prompts("developer")[1]
    assert "REJECTED" in fix_prompt and "no test covers the greeting" in fix_prompt
    assert "Fix the problems" in fix_prompt


def test_a_rejection_reason_with_bullets_is_kept_whole(project: Path,
                                                     fake_claude: FakeClaude) -> None:
    reason = "two problems\n- no test covers the greeting\n- the README is not updated"
    final = "criterion 2 unmet:\n- --version prints nothing\n- exit code is 1"
    fake_claude.write_script({"acceptor": [{"text": f"REJECTED: {reason}"}, {"auto": True},
                                           {"auto": True}, {"text": f"REJECTED: {final}"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.iterations[0].reason == reason
    assert next(i.reason for i in rec.iterations if i.kind is RoundKind.FINAL) == final
    prompts = fake_claude.prompts("developer")
    assert reason in prompts[1]
    assert final in prompts[-1]
    log = (project / ".anima" / "logs" / "m1.log").read_text()
    assert "the README is not updated" in log and "exit code is 1" in log


def test_three_rejections_in_a_row_pause_and_an_accept_resets(project: Path,
                                                              fake_claude: FakeClaude) -> None:
    no = {"text": "REJECTED: still wrong"}
    fake_claude.write_script({"acceptor": [no, {"text": "ACCEPTED"}, no, no, no]})
    _, outcome = run_engine(project)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",)
    assert rec.status is MilestoneStatus.PAUSED
    assert [i.verdict.value for i in rec.iterations] == [
        "rejected", "accepted", "rejected", "rejected", "rejected"]
    assert rec.consecutive_rejections == 3 and rec.iteration_count == 1
    # What the human can do, as every pause says: what a resume lifts.
    assert rec.pause_reason == (
        "3 consecutive rejections, resume, with a note for the Developer if it helps, to give "
        "it 3 more tries; last: still wrong")
    assert state(project)["status"] == "paused"
    assert state(project)["current_milestone"] == "m1"


def test_final_acceptance_rejection_goes_back_and_is_not_counted(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"text": "ACCEPTED"}, {"text": "ACCEPTED"},
                                           {"text": "REJECTED: criterion 2 (--version) unmet"}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    kinds = [(i.kind.value, i.verdict.value) for i in rec.iterations]
    assert kinds == [("feature", "accepted"), ("feature", "accepted"), ("final", "rejected"),
                     ("final", "accepted")]
    assert rec.consecutive_rejections == 0
    final_prompt = fake_claude.prompts("acceptor")[2]
    assert "greet prints hello" in final_prompt and "--version prints it" in final_prompt
    assert rec.iterations[0].commit[:7] in final_prompt
    after_final = fake_claude.prompts("developer")[3]
    assert "final acceptance" in after_final and "criterion 2 (--version) unmet" in after_final


def test_developer_timeout_counts_as_a_rejection_and_the_loop_goes_on(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"hang": True}]})
    run_engine(project, agent_timeout_seconds=1.5)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED and "timed out" in first.reason
    assert rec.iterations[1].kind is RoundKind.FIX
    # The Acceptor never saw the timed-out round.
    assert len(fake_claude.prompts("acceptor")) == 3


def test_round_limit_pauses(project: Path, fake_claude: FakeClaude) -> None:
    _, outcome = run_engine(project, max_iterations_per_milestone=1)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.rounds == 1
    assert rec.status is MilestoneStatus.PAUSED and rec.pause_reason == (
        "round limit reached: 1 of 1 rounds used; resume, with a note for the Developer if it "
        "helps, for 1 more (max_iterations_per_milestone)")


def test_human_review_then_the_next_milestone_starts_from_main(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_claude.use_env(monkeypatch)
    one = milestone_md("One", ["Alpha"])
    make_project(git_repo, {"a-first": "---\nrequires_human_review: true\n---\n" + one,
                            "b-second": milestone_md("Two", ["Beta"])})
    _, outcome = run_engine(git_repo)
    first, second = record(git_repo, "a-first"), record(git_repo, "b-second")
    assert first.status is MilestoneStatus.AWAITING_REVIEW
    assert outcome.awaiting_review == ("a-first",), outcome
    assert second.status is MilestoneStatus.COMPLETED
    assert state(git_repo)["status"] == "sleeping" and state(git_repo)["current_milestone"] is None
    # Not merged before approval: the second milestone started from main without it.
    assert second.base_commit == first.base_commit


def test_changes_you_request_are_made_before_main_gets_anything(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Awaiting your review, you request changes: the next run used to merge the branch you
    declined at once (its final acceptance still stood), your note never sent. Now the
    Developer gets the note and the task of making those changes, a new final acceptance
    judges the result, and it waits for your review again; main is untouched."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": "---\nrequires_human_review: true\n---\n" + TWO})
    run_engine(git_repo)
    assert record(git_repo, "m1").status is MilestoneStatus.AWAITING_REVIEW
    main_before = run_git(git_repo, "rev-parse", "main")
    engine = Engine(git_repo)
    try:
        engine.request_changes("m1", "please also handle --help")
    finally:
        engine.shutdown()
    assert record(git_repo, "m1").iterations[-1].withdrawn is Withdrawn.CHANGES_REQUESTED
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW, rec.merge
    assert run_git(git_repo, "rev-parse", "main") == main_before
    changes = fake_claude.prompts("developer")[-1]
    assert "please also handle --help" in changes and "Make the changes the human" in changes
    # The new final acceptance judges your request with the criteria.
    final = fake_claude.prompts("acceptor")[-1]
    assert "asked for these changes; each must be made:\n- [ ] please also handle --help" \
        in final, final
    assert [(it.kind, it.verdict, it.withdrawn) for it in rec.iterations[-2:]] == [
        (RoundKind.FINAL, Verdict.ACCEPTED, Withdrawn.CHANGES_REQUESTED),
        (RoundKind.FINAL, Verdict.ACCEPTED, None)]


def report(commit: str = "{head}", feature: str = "F1") -> str:
    return (f"## Implementation Report — Round 1\n\n**Feature**: {feature} — done\n"
            f"**Commit**: {commit}\n**Tests**: 1 passed, 0 failed\n**Lint**: clean\n")


def test_an_unreadable_report_is_restated_once(project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"text": "I implemented the greeting, all good."}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.iterations[0].verdict is Verdict.ACCEPTED
    assert "could not read your last reply" in fake_claude.prompts("developer")[1]


def test_a_report_unreadable_twice_is_a_rejection_without_review(
        project: Path, fake_claude: FakeClaude) -> None:
    chatter = {"text": "Working on it, will report later."}
    fake_claude.write_script({"developer": [chatter, chatter]})
    run_engine(project)
    rec = record(project, "m1")
    first = rec.iterations[0]
    assert first.verdict is Verdict.REJECTED and first.reason.startswith("unreadable report")
    reviewed = [p for p in fake_claude.prompts("acceptor") if "Review round 1 " in p]
    assert reviewed == []


def test_an_unreadable_verdict_twice_is_a_rejection(project: Path,
                                                    fake_claude: FakeClaude) -> None:
    vague = {"text": "Looks mostly fine to me."}
    fake_claude.write_script({"acceptor": [vague, vague]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED and first.reason.startswith("unreadable verdict")
    assert "only the verdict line" in fake_claude.prompts("acceptor")[1]


@pytest.mark.parametrize(("turn", "expected", "sandbox"), [
    ({"text": report("1234567deadbeef")}, "does not exist", "auto"),
    ({"text": report("").replace("**Commit**: \n", "")}, "names no commit", "auto"),
    ({"shell": ["mkdir -p .anima", "echo '{}' > .anima/state.json",
                "git add -f .anima/state.json", "git commit -qm 'chore: state'"],
      "text": report()}, ".anima/state.json", "auto"),
    # Only unconfined can the Developer commit on main at all: the sandbox keeps main's ref
    # read-only (test_in_the_sandbox_a_commit_on_main_is_refused).
    ({"shell": COMMIT_ON_MAIN, "text": report()}, "main", "off"),
], ids=["forged-hash", "missing-hash", "touches-anima", "commit-on-main"])
def test_git_checks_reject_before_any_acceptor_token(project: Path, fake_claude: FakeClaude,
                                                     turn: dict, expected: str,
                                                     sandbox: str) -> None:
    main = run_git(project, "rev-parse", "main")
    fake_claude.write_script({"developer": [turn]})
    run_engine(project, max_iterations_per_milestone=1, sandbox=sandbox)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert expected in first.reason
    assert fake_claude.prompts("acceptor") == []
    if turn.get("shell") == COMMIT_ON_MAIN:  # it did reach main: the check is not vacuous
        assert "feat: on main" in run_git(project, "log", "--format=%s", f"{main}..main")
        assert "the Developer moved main" in first.reason


@needs_sandbox
def test_in_the_sandbox_a_commit_on_main_is_refused(project: Path,
                                                    fake_claude: FakeClaude) -> None:
    """The same Developer, confined: git cannot write main's ref (read-only), so main stays
    where it was; what it staged is carried back to the milestone branch and reviewed there."""
    main = run_git(project, "rev-parse", "main")
    fake_claude.write_script({"developer": [{"shell": COMMIT_ON_MAIN, "text": report()}]})
    run_engine(project, max_iterations_per_milestone=1, sandbox="required")
    assert run_git(project, "rev-parse", "main") == main
    assert not (project / "onmain.txt").exists()
    transcript = (project / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert "git commit -qm 'feat: on main'" in transcript
    assert "Read-only file system" in transcript
    first = record(project, "m1").iterations[0]
    assert "the tree was on main; back on milestone/m1" in first.notes
    assert first.commit is not None
    assert run_git(project, "branch", "--contains", first.commit, "--format=%(refname:short)") \
        == "milestone/m1"
    assert "onmain.txt" in run_git(project, "show", "--name-only", "--format=", first.commit)


def test_a_hallucinated_hash_beside_a_real_commit_reviews_the_real_one(
        project: Path, fake_claude: FakeClaude) -> None:
    """Models invent hashes: git is the truth, so the round's own commit is reviewed (and the
    record says the report named one that does not exist) instead of wasting the round."""
    fake_claude.write_script({"developer": [{
        "shell": ["mkdir -p features && echo F1 > features/F1.txt", "git add -A",
                  "git commit -qm 'feat: F1'"], "text": report("1234567deadbeef")}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.ACCEPTED
    assert run_git(project, "log", "-1", "--format=%s", first.commit or "") == "feat: F1"
    assert any("the report named 1234567deadb, which does not exist; reviewing "
               f"{first.commit[:7]}" in n for n in first.notes), first.notes


def test_uncommitted_leftovers_are_committed_by_anima(project: Path,
                                                      fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"shell": ["echo left > left.txt"],
                                             "text": report()}]})
    run_engine(project)
    rec = record(project, "m1")
    first = rec.iterations[0]
    assert first.verdict is Verdict.ACCEPTED and first.auto_committed
    assert "left.txt" in first.changed_files
    subject = run_git(project, "log", "-1", "--format=%s", first.commit)
    assert subject.startswith("chore(anima): commit uncommitted work of round 1")
    assert any("Anima committed" in n for n in first.notes)


@pytest.mark.parametrize("sandbox", [pytest.param("auto", marks=needs_sandbox), "off"])
def test_an_acceptor_that_edits_a_file_is_undone_and_reported(project: Path,
                                                              fake_claude: FakeClaude,
                                                              sandbox: str) -> None:
    """Unconfined, what the reviewer changes is undone and written into the round's notes; in
    the sandbox its worktree is read-only to it, so the edits fail and there is nothing to
    undo. Either way the branch and the worktree end as the Developer left them."""
    if sandbox == "off":
        turn = {"edit_file": {"path": "README.md", "content": "reviewer was here\n"},
                "shell": ["echo new > reviewer.txt"], "text": "ACCEPTED"}
    else:  # the fake's Write tool would crash on EROFS (the real one reports it): use Bash
        turn = {"shell": ["echo 'reviewer was here' > README.md", "echo new > reviewer.txt"],
                "text": "ACCEPTED"}
    fake_claude.write_script({"acceptor": [turn]})
    # Waiting for review, the milestone keeps its worktree, where the Acceptor worked.
    run_engine(project, merge_on_complete=False, requires_human_review=True, sandbox=sandbox)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    first = rec.iterations[0]
    assert first.verdict is Verdict.ACCEPTED
    changed = [n for n in first.notes if "Acceptor changed the repository" in n]
    if sandbox == "off":
        assert any("README.md" in n for n in changed), first.notes
    else:
        assert changed == [], first.notes  # refused, so nothing was undone
        transcript = (project / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
        for name in ("README.md", "reviewer.txt"):
            assert f"cannot create {name}: Read-only file system" in transcript
        # Refused, not crashed: the one Acceptor process answered every review.
        assert len({e["started"] for e in fake_claude.entries("acceptor")}) == 1
    assert run_git(project, "show", "milestone/m1:README.md") == "# test project"
    assert "reviewer.txt" not in run_git(project, "ls-tree", "-r", "--name-only", "milestone/m1")
    worktree = project / ".anima" / "worktrees" / "m1"
    assert (worktree / "README.md").read_text() == "# test project\n"
    assert not (worktree / "reviewer.txt").exists()
    assert run_git(worktree, "status", "--porcelain") == ""
    # The human's checkout was never the reviewer's to touch.
    assert (project / "README.md").read_text() == "# test project\n"
    assert not (project / "reviewer.txt").exists()


def test_a_crashed_agent_is_restarted_on_its_session_and_the_turn_retried(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"crash": 9}]})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED
    assert rec.iterations[0].verdict is Verdict.ACCEPTED  # the retry answered
    first, second = fake_claude.entries("developer")[:2]
    # A new process (the sandbox gives each its own pid namespace: tell them by start time).
    assert first["started"] != second["started"] and second["resume"]
    assert first["session_id"] == second["session_id"] == rec.sessions.developer
    log = (project / ".anima" / "logs" / "m1.log").read_text()
    assert "developer crashed" in log


def test_an_agent_that_crashes_twice_in_a_round_is_a_rejection(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"developer": [{"crash": 9}, {"crash": 9}]})
    run_engine(project)
    first = record(project, "m1").iterations[0]
    assert first.verdict is Verdict.REJECTED
    assert first.reason.startswith("Developer crashed twice in this round")


def test_a_timeout_storm_pauses_the_loop(project: Path, fake_claude: FakeClaude) -> None:
    hang = {"hang": True}
    fake_claude.write_script({"developer": [hang, hang, hang]})
    _, outcome = run_engine(project, agent_timeout_seconds=1.0)
    rec = record(project, "m1")
    assert outcome.paused == ("m1",) and rec.rounds == 3
    assert all("timed out" in it.reason for it in rec.iterations)
    assert (rec.pause_reason or "").startswith(
        "3 consecutive rejections, every one a timeout: raise agent_timeout_seconds (or "
        "agent_idle_timeout_seconds) in .anima/config.json if the work needs longer turns, "
        "then resume; last: Developer timed out")
    assert fake_claude.prompts("acceptor") == []


def test_changes_requested_under_an_older_anima_are_not_merged_over_after_the_upgrade(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A v9 Anima's Request changes left the final acceptance standing (the bug 6ae5cc1
    fixed). A record in that state read by this Anima must not merge the declined branch."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE_FEATURE}, {"requires_human_review": True})
    run_engine(git_repo)
    assert record(git_repo, "m1").status is MilestoneStatus.AWAITING_REVIEW
    path = ProjectPaths(git_repo).milestone_record("m1")
    data = json.loads(path.read_text(encoding="utf-8"))
    # what a v9 request_changes wrote: in progress, the note, the final acceptance untouched
    data["schema_version"] = 9
    data.pop("in_flight", None)
    for it in data["iterations"]:
        it.pop("withdrawn", None)
    data["status"] = "in_progress"  # the phase stays that of the review (v9 set no other)
    data["human_notes"] = [{"at": data["iterations"][-1]["ended_at"],
                            "text": "rename greet to hello", "delivered": False}]
    path.write_text(json.dumps(data), encoding="utf-8")
    main_before = run_git(git_repo, "rev-parse", "main")
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert any("rename greet to hello" in p for p in fake_claude.prompts("developer")), \
        "the note never reached the Developer"
    assert run_git(git_repo, "rev-parse", "main") == main_before, rec.status


def test_changes_requested_after_a_rejected_final_are_not_a_fix_of_that_rejection(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    from anima.loop import actions
    """The last round that counted, once the accepted final was withdrawn, was the final
    rejection before it: the Developer was told to fix what the next final had overruled."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE_FEATURE}, {"requires_human_review": True})
    fake_claude.write_script({"acceptor": [{"text": "ACCEPTED"},
                                           {"text": "REJECTED: OLDREASON the readme is missing"},
                                           {"text": "ACCEPTED"}]})
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    assert [(i.kind, i.verdict) for i in rec.iterations][-2:] == [
        (RoundKind.FINAL, Verdict.REJECTED), (RoundKind.FINAL, Verdict.ACCEPTED)]
    actions.request_changes(Store(ProjectPaths(git_repo)), "m1", "MAGICNOTE use tabs")
    fake_claude.write_script({})
    n = len(fake_claude.prompts("developer"))
    run_engine(git_repo)
    prompt = fake_claude.prompts("developer")[n]
    assert "MAGICNOTE" in prompt
    task = prompt[prompt.find("## Your task this round"):]
    # it was told to fix the final rejection the next final acceptance had overruled
    assert "Fix the problems the review found" not in task, task[:300]
    assert "Make the changes the human who reviewed this milestone asked for" in task


def test_a_developer_that_changes_nothing_after_your_request_is_judged_against_it(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    from anima.loop import actions
    """It reported ALL_FEATURES_COMPLETE at once: the final acceptance passed without your
    request in any Acceptor prompt (the Developer decided it had done what you asked)."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE_FEATURE}, {"requires_human_review": True})
    run_engine(git_repo)
    store = Store(ProjectPaths(git_repo))
    actions.request_changes(store, "m1", "MAGICNOTE: rename greet to hello")
    run_engine(git_repo)  # the fake Developer, all features done, says ALL_FEATURES_COMPLETE
    rec = record(git_repo, "m1")
    assert "MAGICNOTE" in fake_claude.prompts("developer")[-1]
    assert any("MAGICNOTE" in p for p in fake_claude.prompts("acceptor")[-1:]), \
        (rec.status, [it.kind for it in rec.iterations])


def test_request_changes_then_an_edit_then_a_kill_builds_the_edit_and_counts_every_dollar(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from anima.loop import actions
    from tests.test_recovery import Runner
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE_FEATURE}, {"requires_human_review": True,
                                         "summarizer": {"enabled": False}})
    run_engine(git_repo)
    store = Store(ProjectPaths(git_repo))
    actions.request_changes(store, "m1", "MAGICNOTE rename it")
    ProjectPaths(git_repo).milestone_md("m1").write_text(
        milestone_md("Greeter", ["Alpha", "Bravo"], ["works"]), encoding="utf-8")
    # the Developer's turn spends and answers; the Acceptor's review then hangs: kill
    n_acc = len(fake_claude.entries("acceptor"))
    fake_claude.write_script({"acceptor": [{"auto": True}] * n_acc + [{"hang": True}]})
    runner = Runner(git_repo, fake_claude)
    deadline = time.monotonic() + 30
    while len(fake_claude.entries("acceptor")) <= n_acc:
        assert time.monotonic() < deadline, runner.stdout
        time.sleep(0.05)
    time.sleep(0.5)
    runner.kill()
    mid = record(git_repo, "m1")
    fake_claude.write_script({})
    Runner(git_repo, fake_claude).wait(60)
    rec = record(git_repo, "m1")
    turns = len(fake_claude.entries())
    assert rec.status is MilestoneStatus.AWAITING_REVIEW, (rec.status, rec.error)
    assert [f.status for f in rec.features] == [FeatureStatus.DONE] * 2
    # every answered turn spent $0.01; the hung, killed one nothing
    assert rec.cost_usd == pytest.approx(0.01 * (turns - 1)), (rec.cost_usd, turns,
                                                             mid.in_flight, rec.notes)
    assert sum(i.cost_usd for i in rec.iterations) <= rec.cost_usd


@pytest.mark.parametrize("committed", [True, False])
def test_a_file_name_that_is_not_utf8_is_recorded_and_the_milestone_completes(
        project: Path, fake_claude: FakeClaude, committed: bool) -> None:
    """Any byte string is a file name: one that is not UTF-8 (committed by the Developer, or
    left for Anima to commit) reached the record as is, which then could not be written (nor
    the `failed` that followed), and every start redid the round."""
    make = "printf x > \"$(printf 'bad\\377.txt')\""
    fake_claude.write_script({"developer": [
        {"shell": [f"{make} && git add -A && git commit -qm 'feat: odd'"], "auto": True}
        if committed else {"shell": [make], "text": report()}],
        "developer_default": {"auto": True}})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert "bad\\xff.txt" in rec.iterations[0].changed_files
    assert b"bad\xff.txt" in subprocess.run(["git", "ls-tree", "-z", "--name-only", "main"],
                                            cwd=project, capture_output=True).stdout
    anima_log = (project / ".anima" / "logs" / "anima.log").read_text(encoding="utf-8")
    assert "Error" not in anima_log, anima_log


def test_a_line_naming_a_file_that_is_not_utf8_is_logged(project: Path,
                                                         fake_claude: FakeClaude) -> None:
    """The rejection of a commit that changes `.anima/` names the file, in the record and the
    log: a name that is not UTF-8 failed the log file's write, and the line was lost."""
    fake_claude.write_script({"developer": [
        {"shell": ["printf x > \".anima/$(printf 'bad\\377.txt')\" && git add -f .anima && "
                   "git commit -qm 'feat: odd'"], "auto": True}],
        "developer_default": {"auto": True}})
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert ".anima/bad\\xff.txt" in (rec.iterations[0].reason or "")
    log = (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    assert "REJECTED: commits on milestone/m1 changed .anima/bad\\xff.txt" in log
