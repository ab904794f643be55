"""`anima status --json` from its cache: the same bytes as a full validation, and never a
stale one. Each check edits the project's files the way a person, an agent or a crash would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import milestone_md
from tests.test_cli import anima, reference_status

#: Prints the report and then, on stderr, whether pydantic was loaded.
PROBE = ("import sys; from anima.cli import main; code = main(['status', sys.argv[1], '--json']);"
         " print('pydantic' in sys.modules, file=sys.stderr); sys.exit(code)")


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def project(tmp_path: Path, cache_home: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert anima("init", "--git-init", str(repo)).returncode == 0
    for name, title in (("b-second", "Zweite — ü"), ("a-first", "First")):
        md = tmp_path / f"{name}.md"
        md.write_text(milestone_md(title, ["One", "Two"]), encoding="utf-8")
        assert anima("add", str(repo), str(md)).returncode == 0
    return repo


def status(repo: Path) -> tuple[str, str, bool]:
    """stdout, the problems on stderr, and whether pydantic was loaded."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(repo)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    *problems, loaded = done.stderr.splitlines()
    return done.stdout, "\n".join(problems), loaded == "True"


def entries(cache_home: Path) -> list[Path]:
    return sorted(p for p in cache_home.rglob("*") if p.is_file())


def edit_record(repo: Path, milestone_id: str, **fields: object) -> None:
    path = repo / ".anima" / "milestones" / f"{milestone_id}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**data, **fields}, indent=2, ensure_ascii=False),
                    encoding="utf-8")


def test_a_second_poll_prints_the_same_bytes_without_loading_pydantic(
        project: Path, cache_home: Path) -> None:
    first, _, loaded = status(project)
    assert loaded and first == reference_status(project)
    assert len(entries(cache_home)) == 4  # the state, two records and what they wait for,
    # outside the project
    second, _, loaded = status(project)
    assert second == first and not loaded
    assert [m["id"] for m in json.loads(second)["milestones"]] == ["b-second", "a-first"]


def test_a_record_changed_since_the_last_poll_is_read_again(project: Path,
                                                            cache_home: Path) -> None:
    status(project)
    edit_record(project, "a-first", status="paused", pause_reason="3 rejections: ünïcode")
    out, _, loaded = status(project)
    assert loaded and out == reference_status(project)
    assert json.loads(out)["milestones"][1]["pause_reason"] == "3 rejections: ünïcode"
    assert len(entries(cache_home)) == 4  # the old entries went


def test_a_record_broken_since_the_last_poll_is_a_problem_not_its_old_self(
        project: Path) -> None:
    status(project)
    edit_record(project, "a-first", status="on-fire")
    out, problems, _ = status(project)
    assert [m["id"] for m in json.loads(out)["milestones"]] == ["b-second"]
    assert "a-first.json" in problems and "status" in problems


def test_a_damaged_cache_entry_is_a_miss(project: Path, cache_home: Path) -> None:
    status(project)
    for entry in entries(cache_home):
        entry.write_bytes(entry.read_bytes()[:-7])  # what a crash before a flush leaves
    out, _, loaded = status(project)
    assert loaded and out == reference_status(project)


def test_a_definition_without_its_record_is_listed_as_pending(project: Path) -> None:
    status(project)
    (project / ".anima" / "milestones" / "c-new.md").write_text(milestone_md("New", ["X"]),
                                                               encoding="utf-8")
    out, _, _ = status(project)
    listed = {m["id"]: m["status"] for m in json.loads(out)["milestones"]}
    assert listed == {"a-first": "pending", "b-second": "pending", "c-new": "pending"}
    assert not (project / ".anima" / "milestones" / "c-new.json").exists()  # status only reads


def test_a_definition_without_its_record_is_the_same_on_every_poll_and_sorts_by_arrival(
        project: Path, tmp_path: Path) -> None:
    """Status writes nothing and reads the same files each time, yet a definition without a
    record was created "now" at every poll: each poll printed it differently, after a
    milestone added later."""
    (project / ".anima" / "milestones" / "c-dropped.md").write_text(
        milestone_md("Dropped", ["X"]), encoding="utf-8")
    time.sleep(0.05)
    later = tmp_path / "d-added.md"
    later.write_text(milestone_md("Added", ["Y"]), encoding="utf-8")
    assert anima("add", str(project), str(later)).returncode == 0
    first, _, _ = status(project)
    time.sleep(1.1)
    assert status(project)[0] == first
    assert [m["id"] for m in json.loads(first)["milestones"]][-2:] == ["c-dropped", "d-added"]


def test_a_cache_folder_that_cannot_be_written_only_costs_time(
        project: Path, cache_home: Path) -> None:
    cache_home.write_text("not a folder")
    assert status(project)[0] == reference_status(project)
    assert status(project)[0] == reference_status(project)


def test_the_state_file_changing_is_seen(project: Path) -> None:
    status(project)
    state = project / ".anima" / "state.json"
    data = json.loads(state.read_text(encoding="utf-8"))
    state.write_text(json.dumps({**data, "status": "paused", "current_milestone": "a-first"}),
                     encoding="utf-8")
    out, _, _ = status(project)
    assert json.loads(out)["state"]["current_milestone"] == "a-first"
    state.unlink()
    out, _, _ = status(project)
    assert out == reference_status(project)
    assert json.loads(out)["state"]["status"] == "sleeping"


def listed(out: str, milestone_id: str) -> dict[str, object]:
    return next(m for m in json.loads(out)["milestones"] if m["id"] == milestone_id)


def test_a_pending_milestone_is_listed_as_its_md_and_the_config_say_now(
        project: Path) -> None:
    """README: a pending milestone "is read again until it starts"; design.md: status lists
    one without a record "as a pending record read from its .md". The cached record as
    `anima add` wrote it kept the old title, features and review flag."""
    status(project)
    md = project / ".anima" / "milestones" / "a-first.md"
    md.write_text("---\nrequires_human_review: true\n---\n"
                  + milestone_md("Renamed", ["One", "Two", "Three"]), encoding="utf-8")
    out, _, _ = status(project)
    a = listed(out, "a-first")
    assert (a["title"], len(a["features"]), a["requires_human_review"]) == ("Renamed", 3, True)
    again, _, loaded = status(project)
    assert again == out and not loaded  # kept for the next poll
    config = project / ".anima" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text(encoding="utf-8")),
                                  "max_iterations_per_milestone": 7,
                                  "requires_human_review": True}), encoding="utf-8")
    out, _, _ = status(project)
    b = listed(out, "b-second")
    assert (b["max_iterations"], b["requires_human_review"]) == (7, True)
    # The full scan (a definition without its record makes status take it) agrees.
    (project / ".anima" / "milestones" / "c-new.md").write_text(milestone_md("New", ["X"]),
                                                               encoding="utf-8")
    scanned, _, _ = status(project)
    assert [listed(scanned, i) for i in ("a-first", "b-second")] == \
        [listed(out, i) for i in ("a-first", "b-second")]


def test_a_pending_md_broken_since_it_was_added_is_a_problem_on_every_poll(
        project: Path) -> None:
    """`anima status` names a definition that no longer reads; `--json` printed the record
    as if all were well, and said nothing on stderr."""
    status(project)
    md = project / ".anima" / "milestones" / "a-first.md"
    md.write_text("# First\n\nno features any more\n", encoding="utf-8")
    text = anima("status", str(project))
    assert str(md) in text.stderr
    for _ in range(2):
        out, problems, _ = status(project)
        assert str(md) in problems
        assert listed(out, "a-first")["title"] == "First"  # listed as its record says


def add(repo: Path, tmp_path: Path, name: str, depends_on: list[str]) -> None:
    md = tmp_path / f"{name}.md"
    md.write_text(f"---\ndepends_on: [{', '.join(depends_on)}]\n---\n"
                  + milestone_md(name.title(), ["One"]), encoding="utf-8")
    assert anima("add", str(repo), str(md)).returncode == 0


def test_what_each_pending_milestone_waits_for_is_in_the_json_on_every_path(
        project: Path, tmp_path: Path) -> None:
    """`anima status` says which pending milestone never starts (a cycle, one on itself, an
    unknown id, a cancelled dependency or one whose `.md` is gone) and what each waits for;
    `--json` said none of it, and its cached path not even the problem on stderr the full
    scan prints. Both say it now, as the plain command words it, and see it change."""
    milestones = project / ".anima" / "milestones"
    for name, depends_on in (("c-self", ["c-self"]), ("d-cancelled", ["b-second", "a-first"]),
                             ("e-unknown", ["nope"]), ("f-gone", ["h-deleted"]),
                             ("g-waits", ["a-first"]), ("h-deleted", [])):
        add(project, tmp_path, name, depends_on)
    (milestones / "h-deleted.md").unlink()
    assert anima("abort", str(project), "b-second").returncode == 0

    def said(out: str, problems: str) -> dict[str, Any]:
        held = json.loads(out)["dependencies"]
        text = anima("status", str(project)).stdout
        for milestone_id, why in held.items():
            assert f"  {milestone_id} " in text and f"\n      {why['line']}\n" in text, text
            if why["never_starts"] is not None and milestone_id != "h-deleted":
                assert f"{milestones / milestone_id}.md: {why['never_starts']}" in problems
        assert text.count("never starts: depends_on") + text.count("waiting for ") \
            + text.count(".md is missing") == len(held), text
        return held

    first, problems, _ = status(project)
    again, problems_again, loaded = status(project)
    assert again == first and problems_again == problems and not loaded
    held = said(first, problems)
    assert sorted(held) == ["c-self", "d-cancelled", "e-unknown", "f-gone", "g-waits",
                            "h-deleted"]
    assert held["c-self"]["never_starts"] == "depends_on makes a cycle: c-self → c-self " \
                                             "(c-self names itself)"
    assert held["c-self"]["line"] == f"never starts: {held['c-self']['never_starts']} — fix " \
                                     f"depends_on in {milestones / 'c-self.md'}"
    assert held["d-cancelled"]["never_starts"].startswith(
        "depends_on names b-second, which was cancelled")
    assert "nope, which is not a milestone" in held["e-unknown"]["never_starts"]
    assert "h-deleted, whose .md file is gone" in held["f-gone"]["never_starts"]
    assert held["g-waits"] == {"waiting_for": ["a-first"], "never_starts": None,
                               "line": "waiting for a-first"}
    edit_record(project, "a-first", status="paused", pause_reason="3 rejections")
    out, problems, _ = status(project)
    held = said(out, problems)
    assert held["g-waits"]["line"] == "waiting for a-first (paused)"
    assert out == reference_status(project)
    # The full scan (a definition without its record) says the same.
    (milestones / "i-new.md").write_text(milestone_md("New", ["X"]), encoding="utf-8")
    scanned, scanned_problems, _ = status(project)
    assert json.loads(scanned)["dependencies"] == held
    assert said(scanned, scanned_problems) == held


def test_a_pending_milestone_whose_md_is_gone_never_starts_in_the_json_on_every_path(
        project: Path, tmp_path: Path) -> None:
    """`anima status` says a pending record without its `.md` never starts; `--json`
    listed it among the pending as if it would start, in "dependencies" or anywhere. It is
    no problem of the files (the plain command prints none), whatever its record's
    `depends_on` says: it never starts for want of its file, not waits."""
    milestones = project / ".anima" / "milestones"
    add(project, tmp_path, "c-waits", ["a-first"])
    add(project, tmp_path, "d-cycle", ["d-cycle"])
    for name in ("b-second", "c-waits", "d-cycle"):
        (milestones / f"{name}.md").unlink()
    text = anima("status", str(project))
    for name in ("b-second", "c-waits", "d-cycle"):
        why = f"{milestones / name}.md is missing (put it back to run it)"
        assert f"  {name} " in text.stdout and f"\n      never starts: {why}\n" in text.stdout
    assert "waiting for" not in text.stdout and text.stderr == ""
    first, problems, _ = status(project)
    again, problems_again, loaded = status(project)
    assert (again, problems_again, loaded) == (first, problems, False)
    assert problems == ""
    held = json.loads(first)["dependencies"]
    assert held == {name: {"waiting_for": [], "never_starts": why,
                           "line": f"never starts: {why}"}
                    for name in ("b-second", "c-waits", "d-cycle")
                    for why in [f"{milestones / name}.md is missing (put it back to run it)"]}
    assert first == reference_status(project)
    # The full scan (a definition without its record) says the same.
    (milestones / "e-new.md").write_text(milestone_md("New", ["X"]), encoding="utf-8")
    scanned, scanned_problems, _ = status(project)
    assert json.loads(scanned)["dependencies"] == held and scanned_problems == ""


def test_an_ended_milestone_whose_md_defines_another_is_a_problem_on_every_path(
        project: Path) -> None:
    """The full scan reports a completed or cancelled milestone's `.md` changed since into
    another milestone ("a milestone never runs twice"); the cached `--json` said nothing."""
    md = project / ".anima" / "milestones" / "a-first.md"
    edit_record(project, "a-first", status="completed", completed_at="2020-01-02T03:04:05Z")
    assert anima("abort", str(project), "b-second").returncode == 0
    status(project)
    md.write_text(milestone_md("Something else", ["New"]), encoding="utf-8")
    (project / ".anima" / "milestones" / "b-second.md").touch()  # the same one: no problem
    said = f"{md}: differs from milestone a-first, which is completed: a milestone never runs twice"
    assert said in anima("status", str(project)).stderr
    out, problems, _ = status(project)
    assert problems.startswith(f"problem: {said}") and problems.count("problem:") == 1
    assert out == reference_status(project)
    assert status(project) == (out, problems, False)  # kept for the next poll
    (project / ".anima" / "milestones" / "c-new.md").write_text(milestone_md("New", ["X"]),
                                                               encoding="utf-8")
    assert status(project)[1] == problems  # the full scan
    md.write_text(milestone_md("First", ["One", "Two"]), encoding="utf-8")  # put back
    assert status(project)[1] == ""
