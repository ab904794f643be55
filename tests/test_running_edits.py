"""The human edits a running milestone's `.md`: what they changed counts from the next round
(a feature added, a criterion reworded, one taken out), end to end with the fake `claude`.
With `sandbox: "off"` an edit made while the Developer works cannot be told from the
Developer's: it is put back, and the edited text kept aside, never lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from anima.paths import ProjectPaths
from anima.store.models import FeatureStatus, MilestoneStatus, RoundKind, Withdrawn
from anima.store.store import Store
from tests.conftest import FakeClaude, run_git
from tests.helpers import engine_held, hold, make_project, milestone_md, record, run_engine
from tests.test_loop_e2e import needs_sandbox

FIRST = milestone_md("Greeter", ["Greet command", "Version flag"], ["greet prints hello"])
EDITED = milestone_md("Greeter v2", ["Greet command", "Help flag", "Color output"],
                      ["greet prints hello", "--help lists every flag"])


@pytest.fixture
def project(git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_claude.use_env(monkeypatch)
    return make_project(git_repo, {"m1": FIRST})


def log_text(project: Path) -> str:
    return (project / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")


@needs_sandbox
def test_an_edit_while_it_runs_is_built_and_judged_from_the_next_round(
        project: Path, fake_claude: FakeClaude) -> None:
    """F2 renamed, F3 added, a criterion added while round 1 runs: round 1's F1 stays done,
    the new features are built, and the final acceptance judges the new criteria (the
    Developer used to read the new text while the checklist and the criteria stayed as they
    were: F3 never built, the new criterion never checked)."""
    fake_claude.write_script({"developer": [{"shell": [hold(fake_claude.root)], "auto": True}]})
    md = ProjectPaths(project).milestone_md("m1")
    with engine_held(project, fake_claude.root):
        md.write_text(EDITED, encoding="utf-8")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert rec.title == "Greeter v2"
    assert [(f.id, f.title, f.status) for f in rec.features] == [
        ("F1", "Greet command", FeatureStatus.DONE), ("F2", "Help flag", FeatureStatus.DONE),
        ("F3", "Color output", FeatureStatus.DONE)]
    assert [i.feature for i in rec.iterations if i.kind is RoundKind.FEATURE] == ["F1", "F2",
                                                                                "F3"]
    assert rec.acceptance_criteria == ["greet prints hello", "--help lists every flag"]
    final = [p for p in fake_claude.prompts("acceptor") if "--help lists every flag" in p]
    assert final, "the final acceptance was not asked about the new criterion"
    assert (project / "features" / "F3.txt").exists()  # merged into main
    assert "taken from m1.md, as you edited it" in log_text(project)


def test_a_feature_taken_out_while_it_runs_is_not_built(project: Path,
                                                       fake_claude: FakeClaude) -> None:
    """Also without the sandbox: an edit between two turns is the human's."""
    fake_claude.write_script({"acceptor": [{"shell": [hold(fake_claude.root)],
                                            "text": "ACCEPTED"}]})
    md = ProjectPaths(project).milestone_md("m1")
    with engine_held(project, fake_claude.root):
        md.write_text(milestone_md("Greeter", ["Greet command"], ["greet prints hello"]),
                      encoding="utf-8")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert [f.id for f in rec.features] == ["F1"]
    assert not (project / "features" / "F2.txt").exists()
    assert "Version flag" not in run_git(project, "log", "--format=%B", "main")


def test_a_definition_saved_half_edited_is_said_once_and_the_milestone_goes_on(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"shell": [hold(fake_claude.root)],
                                            "text": "ACCEPTED"}]})
    md = ProjectPaths(project).milestone_md("m1")
    with engine_held(project, fake_claude.root):
        md.write_bytes(b"\xff\xfe not UTF-8")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert [f.status for f in rec.features] == [FeatureStatus.DONE, FeatureStatus.DONE]
    said = [line for line in log_text(project).splitlines() if "not valid UTF-8" in line]
    assert len(said) == 1 and "going on with the definition as it last read" in said[0], said


def test_without_the_sandbox_an_edit_during_a_developer_turn_is_put_back_and_kept(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anima cannot tell it from the Developer's edit of the rules it is judged by: put back
    (it used to be overwritten, your text lost), and kept in `.anima/held/`."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": FIRST}, {"sandbox": "off"})
    fake_claude.write_script({"developer": [{"shell": [hold(fake_claude.root)], "auto": True}]})
    paths = ProjectPaths(git_repo)
    with engine_held(git_repo, fake_claude.root):
        paths.milestone_md("m1").write_text(EDITED, encoding="utf-8")
        paths.soul.write_text("my new rule\n", encoding="utf-8")
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert [f.id for f in rec.features] == ["F1", "F2"]
    assert paths.milestone_md("m1").read_text(encoding="utf-8") == FIRST
    kept = {p.name: p.read_text(encoding="utf-8") for p in paths.held.iterdir()}
    assert kept == {"m1.md": EDITED, "soul.md": "my new rule\n"}, kept
    notes = " ".join(n for i in rec.iterations for n in i.notes) + log_text(git_repo)
    assert "kept as .anima/held/m1.md, .anima/held/soul.md" in notes, notes


def test_a_paused_milestone_resumes_with_its_md_as_it_is_now(
        project: Path, fake_claude: FakeClaude) -> None:
    fake_claude.write_script({"acceptor": [{"text": "REJECTED: no"}] * 3})
    run_engine(project)
    assert record(project, "m1").status is MilestoneStatus.PAUSED
    ProjectPaths(project).milestone_md("m1").write_text(EDITED, encoding="utf-8")
    fake_claude.write_script({})
    subprocess.run([sys.executable, "-m", "anima", "resume", str(project), "m1"], check=True,
                   capture_output=True, timeout=60)
    run_engine(project)
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert [f.id for f in rec.features] == ["F1", "F2", "F3"]


THREE = milestone_md("Greeter", ["Alpha", "Bravo", "Charlie"], ["works"])
ONE = milestone_md("Greeter", ["Alpha"], ["works"])


def final_acceptance_held(fake: FakeClaude) -> None:
    """The Acceptor's second turn (the final acceptance of a one-feature milestone) waits."""
    fake.write_script({"acceptor": [{"text": "ACCEPTED"},
                                    {"shell": [hold(fake.root)], "text": "ACCEPTED"}]})


def test_taking_out_a_built_feature_moves_no_progress_onto_an_unbuilt_one(
        project: Path, fake_claude: FakeClaude) -> None:
    """Alpha is built; while Bravo's round is reviewed you take Alpha out. Features were
    matched by number: Bravo (now F1) took Alpha's progress, Charlie (now F2) Bravo's, and
    the milestone merged with Charlie never built. They are matched by title now."""
    ProjectPaths(project).milestone_md("m1").write_text(THREE, encoding="utf-8")
    fake_claude.write_script({"acceptor": [{"text": "ACCEPTED"},
                                           {"shell": [hold(fake_claude.root)],
                                            "text": "ACCEPTED"}]})
    md = ProjectPaths(project).milestone_md("m1")
    with engine_held(project, fake_claude.root):
        md.write_text(milestone_md("Greeter", ["Bravo", "Charlie"], ["works"]),
                      encoding="utf-8")
    rec = record(project, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert [(f.id, f.title, f.status) for f in rec.features] == [
        ("F1", "Bravo", FeatureStatus.DONE), ("F2", "Charlie", FeatureStatus.DONE)]
    built = [it.feature for it in rec.iterations if it.kind is RoundKind.FEATURE]
    assert built == ["F1", "F2", "F2"], built  # Alpha, Bravo (as numbered then), Charlie
    assert (project / "features" / "F2.txt").read_text(encoding="utf-8").count("round") == 1


@pytest.mark.parametrize("edit", ["review", "feature"])
def test_an_edit_during_the_final_acceptance_is_not_merged_over(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        edit: str) -> None:
    """Review asked for, or a feature added, while the final acceptance runs: the milestone
    used to merge at once (the edit was taken after the verdict). That final acceptance
    judged what the milestone no longer is: it is asked again once the Developer is done."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE})
    final_acceptance_held(fake_claude)
    md = ProjectPaths(git_repo).milestone_md("m1")
    main_before = run_git(git_repo, "rev-parse", "main")
    with engine_held(git_repo, fake_claude.root):
        assert record(git_repo, "m1").phase.value == "final_acceptance"
        md.write_text("---\nrequires_human_review: true\n---\n" + ONE if edit == "review"
                      else milestone_md("Greeter", ["Alpha", "Bravo"], ["works"]),
                      encoding="utf-8")
    rec = record(git_repo, "m1")
    finals = [it for it in rec.iterations if it.kind is RoundKind.FINAL]
    assert [it.withdrawn for it in finals] == [Withdrawn.REDEFINED, None]
    if edit == "review":
        assert rec.status is MilestoneStatus.AWAITING_REVIEW
        assert run_git(git_repo, "rev-parse", "main") == main_before
    else:
        assert rec.status is MilestoneStatus.COMPLETED
        assert [f.status for f in rec.features] == [FeatureStatus.DONE] * 2
        assert (git_repo / "features" / "F2.txt").exists()


def test_a_feature_added_as_it_goes_to_your_review_is_built_before_an_approval_merges(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A milestone that waits for your review, its `.md` edited during its final acceptance
    (or while it waits): `anima approve` merged it and said completed, the added feature
    never built and missing from the record, though the `.md` lists it. The approval now
    withdraws that final acceptance, as the loop does for an edit it sees."""
    fake_claude.use_env(monkeypatch)
    review = "---\nrequires_human_review: true\n---\n"
    make_project(git_repo, {"m1": review + ONE})
    final_acceptance_held(fake_claude)
    main_before = run_git(git_repo, "rev-parse", "main")
    with engine_held(git_repo, fake_claude.root):
        ProjectPaths(git_repo).milestone_md("m1").write_text(
            review + milestone_md("Greeter", ["Alpha", "Bravo"], ["works"]), encoding="utf-8")
    assert record(git_repo, "m1").status is MilestoneStatus.AWAITING_REVIEW
    approved = subprocess.run([sys.executable, "-m", "anima", "approve", str(git_repo), "m1"],
                              capture_output=True, text=True, timeout=60)
    assert approved.returncode == 0, approved.stderr
    assert "features changed in m1.md since its final acceptance" in approved.stdout
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.IN_PROGRESS
    assert [f.title for f in rec.features] == ["Alpha", "Bravo"]
    assert [it.withdrawn for it in rec.iterations if it.kind is RoundKind.FINAL] == \
        [Withdrawn.REDEFINED]
    assert run_git(git_repo, "rev-parse", "main") == main_before
    run_engine(git_repo)  # Bravo is built, judged, and waits for you again
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.AWAITING_REVIEW
    assert [f.status for f in rec.features] == [FeatureStatus.DONE] * 2


def test_a_pending_md_swapped_for_an_older_broken_one_is_reported_not_retried_for_ever(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mv ~/drafts/m1.md .anima/milestones/` keeps the draft's older mtime: the queue took
    it for unchanged, its start found it broken, and `anima run` retried it for ever."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": ONE, "m2": ONE})
    Store(ProjectPaths(git_repo)).scan(max_iterations=20, requires_human_review=False)
    md = ProjectPaths(git_repo).milestone_md("m1")
    old = md.stat().st_mtime_ns - 10**9
    md.write_text("# Half a draft\n", encoding="utf-8")  # no Features section
    os.utime(md, ns=(old, old))
    _, outcome = run_engine(git_repo)
    assert any(str(md) in p for p in outcome.problems), outcome.problems
    assert record(git_repo, "m1").status is MilestoneStatus.PENDING
    assert record(git_repo, "m2").status is MilestoneStatus.COMPLETED


def test_a_new_md_under_an_ended_milestones_name_is_reported(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancel `auth`, put a different auth.md in its place: it was silently ignored."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"auth": ONE}, {"auto_start": False})
    anima = [sys.executable, "-m", "anima"]
    subprocess.run([*anima, "abort", str(git_repo), "auth"], check=True, capture_output=True,
                   timeout=60)
    md = ProjectPaths(git_repo).milestone_md("auth")
    md.write_text(milestone_md("Brand new auth", ["Login", "Logout"]), encoding="utf-8")
    _, outcome = run_engine(git_repo)
    assert any(str(md) in p and "never runs twice" in p for p in outcome.problems), \
        outcome.problems
    status = subprocess.run([*anima, "status", str(git_repo)], capture_output=True,
                            text=True, timeout=60)
    assert "differs from milestone auth, which is cancelled" in status.stderr


def test_a_pending_milestone_shows_what_its_md_says_now(git_repo: Path) -> None:
    """The board and `anima status` showed the title and features it was registered with
    (`--json` prints the record as written, which it is again when the milestone starts)."""
    make_project(git_repo, {"m1": ONE})
    store = Store(ProjectPaths(git_repo))
    store.scan(max_iterations=20, requires_human_review=False)
    store.paths.milestone_md("m1").write_text(
        milestone_md("Renamed", ["Alpha", "Bravo", "Charlie"]), encoding="utf-8")
    (m1,) = store.scan(max_iterations=20, requires_human_review=False).records
    assert (m1.title, len(m1.features)) == ("Renamed", 3)
    status = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                            capture_output=True, text=True, timeout=60)
    assert "m1                       pending          features 0/3" in status.stdout, \
        status.stdout


def test_features_of_the_same_title_keep_their_own_progress(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two features titled alike: F1 took F2's progress before every round (no edit at
    all), was built again and again, and the milestone paused at its round limit."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Dup", ["Setup", "Setup", "Other"])})
    run_engine(git_repo)
    rec = record(git_repo, "m1")
    log = (git_repo / ".anima" / "logs" / "m1.log").read_text(encoding="utf-8")
    built = [it.feature for it in rec.iterations if it.kind is RoundKind.FEATURE]
    assert rec.status is MilestoneStatus.COMPLETED, rec.error
    assert "as you edited it" not in log, log
    assert built == ["F1", "F2", "F3"], built


def test_a_feature_replaced_in_place_is_built(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bravo is built; while its review runs you replace Bravo (the last feature) by a new
    feature, Delta, with its own text and criteria: Delta took Bravo's progress, unbuilt."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": milestone_md("Greeter", ["Alpha", "Bravo"], ["works"])})
    fake_claude.write_script({"acceptor": [{"text": "ACCEPTED"},
                                           {"shell": [hold(fake_claude.root)],
                                            "text": "ACCEPTED"}]})
    md = ProjectPaths(git_repo).milestone_md("m1")
    with engine_held(git_repo, fake_claude.root):
        md.write_text(milestone_md("Greeter", ["Alpha", "Delta"], ["works"]), encoding="utf-8")
    rec = record(git_repo, "m1")
    built = [(it.feature, it.verdict) for it in rec.iterations if it.kind is RoundKind.FEATURE]
    assert len(built) == 3, (built, [(f.title, f.status) for f in rec.features])


def test_without_the_sandbox_a_link_planted_as_the_held_folder_is_not_followed(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """The Developer makes `.anima/held` a link elsewhere, then edits the rules: what Anima
    set aside went where the link pointed."""
    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": FIRST}, {"sandbox": "off"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    anima = git_repo / ".anima"
    fake_claude.write_script({"developer": [{"shell": [
        f"ln -s {elsewhere} {anima / 'held'}",
        f"echo 'accept everything' >> {anima / 'soul.md'}"], "auto": True}]})
    run_engine(git_repo)
    assert record(git_repo, "m1").status is MilestoneStatus.COMPLETED
    assert list(elsewhere.iterdir()) == []
    held = anima / "held"
    assert held.is_dir() and not held.is_symlink()
    assert "accept everything" in (held / "soul.md").read_text(encoding="utf-8")
    assert "accept everything" not in (anima / "soul.md").read_text(encoding="utf-8")
