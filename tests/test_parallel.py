"""Several milestones at once: each in its own worktree with its own pair, a merge queue into
main, `depends_on`, one usage limit for the account, and `max_parallel_milestones: 1` as the
serial Anima it always was. End to end with the fake `claude`, inside the sandbox."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClaude, run_git
from helpers import make_project, milestone_md, record, run_engine
from test_recovery import (  # noqa: F401 (our_processes: a fixture)
    Runner,
    assert_consistent,
    our_processes_fixture,
    run_to_end,
    wait_until,
)

from anima import sandbox
from anima.engine.facade import Engine
from anima.errors import ActionError
from anima.events import Event, Notice, PhaseChanged, UsageLimitWait
from anima.paths import ProjectPaths
from anima.phases import Phase
from anima.store.models import MergeInfo, MergeState, MilestoneStatus, RoundKind, Verdict
from anima.store.store import Store

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None,
                                reason="several milestones at once need the sandbox here")

TWO = milestone_md("Two", ["Alpha", "Beta"])


def project(repo: Path, ids: list[str], config: dict[str, Any] | None = None,
            texts: dict[str, str] | None = None) -> Path:
    return make_project(repo, {i: (texts or {}).get(i, TWO) for i in ids},
                        config={"usage_limit_margin_seconds": 0, **(config or {})})


def own_dirs(fake: FakeClaude, ids: list[str], **extra: dict[str, Any]) -> None:
    """Each milestone's Developer writes its features in a folder of its own (no conflict)."""
    fake.write_script({"milestones": {i: {"feature_dir": f"features/{i}", **extra.get(i, {})}
                                      for i in ids}})


def spans(fake: FakeClaude) -> dict[str, tuple[float, float]]:
    """When each milestone's agents got their first and last prompt."""
    found: dict[str, list[float]] = {}
    for entry in fake.entries():
        found.setdefault(Path(entry["cwd"]).name, []).append(entry["time"])
    return {m: (min(t), max(t)) for m, t in found.items()}


def merged_order(repo: Path) -> list[str]:
    """The milestones main received, oldest first (its merge commits' subjects)."""
    subjects = run_git(repo, "log", "--first-parent", "--reverse", "--format=%s", "main")
    return [s.split("milestone/")[1].split(":")[0] for s in subjects.splitlines()
            if s.startswith("Merge milestone/")]


def test_three_milestones_run_at_once_and_each_merges_reviewed_work(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["fast", "slow", "mid"]
    project(git_repo, ids)
    own_dirs(fake_claude, ids, slow={"developer_default": {"auto": True, "delay": 0.8}},
             mid={"developer_default": {"auto": True, "delay": 0.3}})
    fake_claude.use_env(monkeypatch)
    engine = Engine(git_repo)
    running_seen: list[list[str]] = []
    done = threading.Event()

    def watch_state() -> None:
        path = git_repo / ".anima" / "state.json"
        while not done.is_set():
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            running_seen.append([r["id"] for r in state.get("running", [])])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_state)
    watcher.start()
    try:
        outcome = engine.run(watch=False, start_all=True)
    finally:
        done.set()
        watcher.join()
        engine.shutdown()
    assert outcome.paused == () and outcome.in_progress == ()
    for i in ids:
        rec = record(git_repo, i)
        assert rec.status is MilestoneStatus.COMPLETED, (i, rec.pause_reason, rec.error)
        assert rec.merge is not None and rec.merge.merged
        assert [it.verdict for it in rec.iterations] == [Verdict.ACCEPTED] * 3
        for feature in ("F1", "F2"):
            assert (git_repo / "features" / i / f"{feature}.txt").is_file()  # main has it
        assert not (git_repo / ".anima" / "worktrees" / i).exists()
    times = spans(fake_claude)
    # They overlapped: the slow one started before the fast one finished.
    assert times["slow"][0] < times["fast"][1]
    assert max(len(r) for r in running_seen) == 3, running_seen
    # main took them in the order their final acceptance came.
    finals = sorted(ids, key=lambda i: record(git_repo, i).iterations[-1].ended_at)
    assert merged_order(git_repo) == finals
    assert json.loads((git_repo / ".anima" / "state.json").read_text())["running"] == []


def test_each_line_about_a_milestone_while_another_runs_names_it(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """README: while several milestones run, lines are "[<id>] [developer] …". The second
    one's "phase idle → starting" line came out bare, as if about the first (the run logs
    it before it announces the phase the output counts by), and so did the merge of the
    first while only the second still ran."""
    ids = ["a", "b"]
    project(git_repo, ids)
    own_dirs(fake_claude, ids, a={"developer": [{"auto": True, "delay": 1.5}]},
             b={"developer_default": {"auto": True, "delay": 1.5}})
    done = subprocess.run([sys.executable, "-m", "anima", "run", str(git_repo), "--headless"],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          env={**os.environ, "ANIMA_CLAUDE_COMMAND": fake_claude.command,
                               **fake_claude.env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    starts = [line for line in done.stdout.splitlines()
              if "phase idle → starting: creating milestone/" in line]
    assert len(starts) == 2, starts
    second = starts[1].split("creating milestone/")[1].split()[0]
    assert starts[1].startswith(f"[{second}] [anima] "), starts
    merged = next(line for line in done.stdout.splitlines() if "merged milestone/a " in line)
    assert merged.startswith("[a] [anima] "), merged


def test_once_two_ran_at_once_each_line_about_one_names_it_after_they_stop_overlapping(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """a pauses (its Acceptor rejects, one rejection is the limit) while b, slower, goes on
    to complete and merge. Every line of b's from a's pause on came out bare ("[anima] round
    1 (feature F1) ACCEPTED", "[anima] merged: …"): nothing else ran, and a reader of the
    two interleaved could not tell which milestone they were about."""
    ids = ["a", "b"]
    project(git_repo, ids, {"max_consecutive_rejections": 1})
    rejected = fake_claude.root / "a-rejected"
    own_dirs(fake_claude, ids,
             a={"acceptor_default": {"shell": [f"touch {rejected}"], "text": "REJECTED: no"}},
             b={"developer_default": {"shell": [f"while [ ! -e {rejected} ]; do sleep 0.05; "
                                                "done"], "auto": True}})
    done = subprocess.run([sys.executable, "-m", "anima", "run", str(git_repo), "--headless"],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          env={**os.environ, "ANIMA_CLAUDE_COMMAND": fake_claude.command,
                               **fake_claude.env})
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr
    lines = done.stdout.splitlines()
    # From the second one's start (the first one's lines before it are alone, and bare).
    first = [i for i, line in enumerate(lines) if "creating milestone/" in line][1]
    last = next(i for i, line in enumerate(lines) if "merged milestone/b into main" in line)
    paused = next(i for i, line in enumerate(lines) if "→ paused" in line)
    assert first < paused < last, lines
    bare = [line for line in lines[first:last + 1]
            if not line.startswith(("[a] [", "[b] ["))]
    assert bare == [], "\n".join(lines)
    assert lines[last].startswith("[b] [anima] "), lines[last]


def test_one_at_a_time_is_the_serial_anima(git_repo: Path, fake_claude: FakeClaude,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["a", "b", "c"]
    project(git_repo, ids, {"max_parallel_milestones": 1})
    own_dirs(fake_claude, ids)
    fake_claude.use_env(monkeypatch)
    run_engine(git_repo)
    times = spans(fake_claude)
    assert times["a"][1] < times["b"][0] and times["b"][1] < times["c"][0]
    assert merged_order(git_repo) == ids
    # Each one branched from main after the one before it was merged.
    for before, after in (("a", "b"), ("b", "c")):
        assert run_git(git_repo, "merge-base", "--is-ancestor", f"milestone/{before}",
                       record(git_repo, after).base_commit or "") == ""


def test_a_paused_milestone_does_not_stop_the_others(git_repo: Path, fake_claude: FakeClaude,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["bad", "good1", "good2"]
    project(git_repo, ids)
    own_dirs(fake_claude, ids, bad={"acceptor_default": {"text": "REJECTED: not good enough"}})
    fake_claude.use_env(monkeypatch)
    _, outcome = run_engine(git_repo)
    assert outcome.paused == ("bad",)
    assert record(git_repo, "bad").status is MilestoneStatus.PAUSED
    assert (git_repo / ".anima" / "worktrees" / "bad").is_dir()  # it keeps its worktree
    for i in ("good1", "good2"):
        assert record(git_repo, i).status is MilestoneStatus.COMPLETED
    done = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                          capture_output=True, text=True, timeout=60)
    assert "paused" in done.stdout


def with_deps(deps: dict[str, list[str]]) -> dict[str, str]:
    out = {}
    for i, needs in deps.items():
        front = f"---\ndepends_on: [{', '.join(needs)}]\n---\n" if needs else ""
        out[i] = front + milestone_md(f"Milestone {i}", ["Only"])
    return out


def test_the_merge_queue_takes_them_in_the_order_their_final_acceptance_came(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """y is finally accepted, then x (its Acceptor answers once y's was recorded). y's run
    took its place in the queue only when its loop got there, a few steps later: x, faster
    through them (here a slow subscriber of y's phase change; on a busy machine, the
    scheduler), merged first, and would have been the one to owe a merge round."""
    ids = ["x", "y"]
    project(git_repo, ids)
    y_accepted = fake_claude.root / "y-accepted"
    after_y = f"while [ ! -e {y_accepted} ]; do sleep 0.05; done"
    own_dirs(fake_claude, ids, x={"acceptor": [{"auto": True}, {"auto": True},
                                               {"shell": [after_y], "auto": True}]})
    fake_claude.use_env(monkeypatch)
    engine = Engine(git_repo)
    x_accepted = threading.Event()

    def slow_after_y_is_accepted(event: Event) -> None:
        if not isinstance(event, PhaseChanged) or event.phase is not Phase.MERGING:
            return
        if event.milestone_id == "x":
            x_accepted.set()
        elif not y_accepted.exists():
            y_accepted.touch()
            x_accepted.wait(30)
            time.sleep(1.0)
    engine.bus.subscribe(slow_after_y_is_accepted)
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    assert x_accepted.is_set()
    finals = sorted(ids, key=lambda i: record(git_repo, i).iterations[-1].ended_at)
    assert finals == ["y", "x"]
    assert merged_order(git_repo) == finals


@pytest.mark.parametrize("deps", [
    {"a": [], "b": ["a"], "c": ["b"]},  # a chain
    {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]},  # a diamond
], ids=["chain", "diamond"])
def test_a_milestone_starts_after_what_it_depends_on_is_merged(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        deps: dict[str, list[str]]) -> None:
    ids = list(deps)
    project(git_repo, ids, texts=with_deps(deps))
    own_dirs(fake_claude, ids)
    fake_claude.use_env(monkeypatch)
    run_engine(git_repo)
    times = spans(fake_claude)
    for i, needs in deps.items():
        rec = record(git_repo, i)
        assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
        for need in needs:
            assert times[need][1] < times[i][0]  # started only once `need` was done…
            # … and branched from main after it was merged
            assert run_git(git_repo, "merge-base", "--is-ancestor", f"milestone/{need}",
                           rec.base_commit or "") == ""
    if "d" in deps:  # b and c, which both wait only for a, ran side by side
        assert times["b"][0] < times["c"][1] and times["c"][0] < times["b"][1]


def test_a_depends_on_you_add_to_a_pending_milestone_while_another_runs_is_followed(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """One at a time: a runs, b and c wait their turn; you give b `depends_on: [c]` while a
    runs. c must come first, and b start only once c is merged into main."""
    ids = ["a", "b", "c"]
    project(git_repo, ids, config={"max_parallel_milestones": 1})
    own_dirs(fake_claude, ids)
    fake_claude.use_env(monkeypatch)
    edited = threading.Event()

    def edit_b_as_a_starts(event: Event) -> None:
        if isinstance(event, PhaseChanged) and event.milestone_id == "a" and \
                event.phase is Phase.DEVELOPER and not edited.is_set():
            md = git_repo / ".anima" / "milestones" / "b.md"
            md.write_text("---\ndepends_on: [c]\n---\n" + md.read_text(encoding="utf-8"),
                          encoding="utf-8")
            edited.set()
    engine = Engine(git_repo)
    engine.bus.subscribe(edit_b_as_a_starts)
    try:
        outcome = engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    assert edited.is_set()
    assert outcome.paused == () and outcome.in_progress == (), outcome
    assert record(git_repo, "b").depends_on == ["c"]
    times = spans(fake_claude)
    assert times["a"][1] < times["c"][0] and times["c"][1] < times["b"][0], times
    assert merged_order(git_repo) == ["a", "c", "b"]


def test_a_merge_that_lost_a_race_to_your_commit_is_done_before_the_run_ends(
        git_repo: Path, fake_claude: FakeClaude, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """You commit a file of yours on main in the instant before the merge of `a` moves main
    (a `git` first on PATH does it then, once): main moved, so the merge is only to be tried
    again. `anima run` must not end "nothing left to do" with it owed and `b`, which depends
    on `a`, never started."""
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": ["a"]}))
    own_dirs(fake_claude, ["a", "b"])
    fake_claude.use_env(monkeypatch)
    (git_repo / "mine.txt").write_text("mine\n", encoding="utf-8")
    real, folder, mark = shutil.which("git"), tmp_path / "racing-git", tmp_path / "raced"
    folder.mkdir()
    human = f"env -u GIT_DIR -u GIT_WORK_TREE -u GIT_INDEX_FILE {real} -C {git_repo}"
    (folder / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *" update-ref -m anima: Merge "*)\n'
        f'  [ -e {mark} ] || {{ touch {mark}; {human} add mine.txt && '
        f'{human} commit -qm "human: mine" -- mine.txt; }};; esac\nexec {real} "$@"\n',
        encoding="utf-8")
    (folder / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    _, outcome = run_engine(git_repo)
    assert mark.exists()
    a, b = record(git_repo, "a"), record(git_repo, "b")
    assert a.merge is not None and a.merge.merged, a.merge
    assert b.status is MilestoneStatus.COMPLETED, (b.status, outcome)
    assert "human: mine" in run_git(git_repo, "log", "--format=%s", "main")


@pytest.mark.parametrize(("deps", "says"), [
    ({"a": ["ghost"]}, "depends_on names ghost, which is not a milestone"),
    ({"a": ["b"], "b": ["a"]}, "depends_on makes a cycle"),
], ids=["unknown", "cycle"])
def test_a_dependency_that_cannot_be_met_is_reported_and_never_started(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        deps: dict[str, list[str]], says: str) -> None:
    project(git_repo, list(deps), texts=with_deps(deps))
    fake_claude.use_env(monkeypatch)
    _, outcome = run_engine(git_repo)
    for i in deps:
        rec = record(git_repo, i)
        assert rec.status is MilestoneStatus.PENDING and rec.branch_name is None
    assert fake_claude.entries() == []
    md = git_repo / ".anima" / "milestones" / "a.md"
    assert any(str(md) in p and says in p for p in outcome.problems), outcome.problems
    done = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                          capture_output=True, text=True, timeout=60)
    assert says in done.stderr and str(md) in done.stderr


def test_a_dependency_on_a_cancelled_milestone_is_reported_not_waited_for(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancelled milestone never merges: the one built on it would wait for ever."""
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": ["a"]}))
    anima = [sys.executable, "-m", "anima"]
    done = subprocess.run([*anima, "abort", str(git_repo), "a"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fake_claude.use_env(monkeypatch)
    b_never_starts(git_repo, fake_claude, "depends_on names a, which was cancelled")


def b_never_starts(repo: Path, fake: FakeClaude, says: str) -> None:
    """b, built on a, is reported (the run's problems, `anima status`), never started."""
    _, outcome = run_engine(repo)
    assert record(repo, "b").status is MilestoneStatus.PENDING
    assert fake.entries() == []
    assert any(says in p for p in outcome.problems), outcome.problems
    done = subprocess.run([sys.executable, "-m", "anima", "status", str(repo)],
                          capture_output=True, text=True, timeout=60)
    assert says in done.stderr and "waiting for a" not in done.stdout


def test_with_merge_on_complete_off_a_dependency_counts_once_you_merged_it(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anima merges nothing: b used to start as soon as a completed, from a main without a's
    work. It waits, `anima status` says for what, and starts once you merged a."""
    project(git_repo, ["a", "b"], {"merge_on_complete": False},
            texts=with_deps({"a": [], "b": ["a"]}))
    own_dirs(fake_claude, ["a", "b"])
    fake_claude.use_env(monkeypatch)
    run_engine(git_repo)
    assert record(git_repo, "a").status is MilestoneStatus.COMPLETED
    assert record(git_repo, "b").status is MilestoneStatus.PENDING
    status = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                            capture_output=True, text=True, timeout=60)
    assert "waiting for a (completed; merge_on_complete is off: merge it into main yourself)" \
        in status.stdout, status.stdout
    (git_repo / ".anima" / "memory" / "project.md").unlink()  # the branch has it (git says)
    run_git(git_repo, "merge", "-q", "--no-edit", "milestone/a")  # you merge it
    run_engine(git_repo)
    b = record(git_repo, "b")
    assert b.status is MilestoneStatus.COMPLETED
    assert run_git(git_repo, "merge-base", "--is-ancestor", "milestone/a",
                   b.base_commit or "") == ""


def register(repo: Path) -> None:
    """What a run's first scan does: every definition gets its pending record."""
    Store(ProjectPaths(repo)).scan(max_iterations=20, requires_human_review=False)


def test_a_pending_milestone_is_what_its_md_says_now(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered, then edited before it starts: b now depends on a (it waits for a's merge,
    it used to start beside a), and c's dependency on a milestone that does not exist is
    fixed (it used to stay pending for ever)."""
    project(git_repo, ["a", "b", "c"], texts=with_deps({"a": [], "b": [], "c": ["ghost"]}))
    register(git_repo)
    milestones = git_repo / ".anima" / "milestones"
    (milestones / "b.md").write_text(with_deps({"b": ["a"]})["b"], encoding="utf-8")
    (milestones / "c.md").write_text(with_deps({"c": []})["c"], encoding="utf-8")
    status = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                            capture_output=True, text=True, timeout=60)
    assert "waiting for a\n" in status.stdout and "ghost" not in status.stderr, status
    own_dirs(fake_claude, ["a", "b", "c"], a={"developer_default": {"auto": True, "delay": 1}})
    fake_claude.use_env(monkeypatch)
    _, outcome = run_engine(git_repo)
    assert not outcome.problems
    times = spans(fake_claude)
    assert times["a"][1] < times["b"][0]
    b = record(git_repo, "b")
    assert b.depends_on == ["a"] and b.status is MilestoneStatus.COMPLETED
    assert run_git(git_repo, "merge-base", "--is-ancestor", "milestone/a",
                   b.base_commit or "") == ""
    assert record(git_repo, "c").status is MilestoneStatus.COMPLETED


def test_a_pending_milestone_whose_md_no_longer_reads_is_reported_and_waits_for_the_fix(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to be started anyway, and failed as an unexpected error."""
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": []}))
    register(git_repo)
    md = git_repo / ".anima" / "milestones" / "b.md"
    md.write_bytes(b"\xff\xfe not UTF-8")
    status = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                            capture_output=True, text=True, timeout=60)
    assert f"{md}: not valid UTF-8" in status.stderr, status
    own_dirs(fake_claude, ["a", "b"])
    fake_claude.use_env(monkeypatch)
    _, outcome = run_engine(git_repo)
    assert any(str(md) in p and "UTF-8" in p for p in outcome.problems), outcome.problems
    b = record(git_repo, "b")
    assert b.status is MilestoneStatus.PENDING and b.branch_name is None and b.error is None
    assert record(git_repo, "a").status is MilestoneStatus.COMPLETED
    md.write_text(with_deps({"b": []})["b"], encoding="utf-8")  # the human fixes it
    _, outcome = run_engine(git_repo)
    assert not outcome.problems and record(git_repo, "b").status is MilestoneStatus.COMPLETED


def test_a_dependency_whose_merge_failed_is_reported_not_waited_for(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Completed, never merged (its branch moved past what its final acceptance judged): the
    one built on it used to wait for ever, `anima status` saying "not merged yet"."""
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": ["a"]}))
    register(git_repo)
    store = Store(ProjectPaths(git_repo))
    a = store.load_record("a")
    a.status = MilestoneStatus.COMPLETED
    a.merge = MergeInfo(state=MergeState.FAILED, merged=False,
                        detail="no final acceptance is on record; main is unchanged")
    store.save_record(a)
    fake_claude.use_env(monkeypatch)
    b_never_starts(git_repo, fake_claude, "depends_on names a, completed but never merged")


def test_a_dependency_whose_md_you_took_away_is_reported_not_waited_for(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """a's `.md` taken away before it started: a never starts without it, and b, built on
    it, waited for ever; `anima run` said "b waits for a", then "nothing left to do", and
    exited 0."""
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": ["a"]}))
    register(git_repo)
    (git_repo / ".anima" / "milestones" / "a.md").unlink()
    fake_claude.use_env(monkeypatch)
    done = subprocess.run([sys.executable, "-m", "anima", "run", str(git_repo), "--headless"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert "nothing left to do" not in done.stdout
    assert "[anima] b never starts as its file is written: depends_on names a, whose .md " \
        "file is gone" in done.stdout, done.stdout
    b_never_starts(git_repo, fake_claude, "depends_on names a, whose .md file is gone")
    status = subprocess.run([sys.executable, "-m", "anima", "status", str(git_repo)],
                            capture_output=True, text=True, timeout=60)
    assert f"never starts: {git_repo / '.anima' / 'milestones' / 'a.md'} is missing" \
        in status.stdout, status.stdout


def test_waiting_for_a_dependency_is_shown(git_repo: Path) -> None:
    project(git_repo, ["a", "b"], texts=with_deps({"a": [], "b": ["a"]}))
    anima = [sys.executable, "-m", "anima", "status", str(git_repo)]
    done = subprocess.run(anima, capture_output=True, text=True, timeout=60)
    assert "waiting for a\n" in done.stdout
    store = Store(ProjectPaths(git_repo))
    store.scan(max_iterations=20, requires_human_review=False)  # registered, as a run would
    rec = store.load_record("a")
    rec.status = MilestoneStatus.PAUSED
    store.save_record(rec)
    done = subprocess.run(anima, capture_output=True, text=True, timeout=60)
    assert "waiting for a (paused)" in done.stdout  # it waits for you, not for time


def test_two_milestones_that_edit_the_same_lines_resolve_through_a_reviewed_merge_round(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both write features/F1.txt: the second to be finally accepted no longer merges into
    main; its Developer merges main in, the checks and its Acceptor review that as a `merge`
    round, and then main takes it. main never holds content no Acceptor reviewed."""
    ids = ["one", "two"]
    project(git_repo, ids, {"check_command": "test -f features/F1.txt"})
    fake_claude.write_script({"milestones": {
        "one": {"feature_dir": "features"},
        "two": {"feature_dir": "features", "developer_default": {"auto": True, "delay": 1.0}}}})
    fake_claude.use_env(monkeypatch)
    _, outcome = run_engine(git_repo)
    assert outcome.paused == ()
    first, second = record(git_repo, "one"), record(git_repo, "two")
    assert first.status is second.status is MilestoneStatus.COMPLETED
    assert [it.kind for it in first.iterations].count(RoundKind.MERGE) == 0
    merge_rounds = [it for it in second.iterations if it.kind is RoundKind.MERGE]
    assert len(merge_rounds) == 1 and merge_rounds[0].verdict is Verdict.ACCEPTED
    assert merge_rounds[0].check is not None and merge_rounds[0].check.passed
    assert second.merge is not None and second.merge.state is MergeState.MERGED
    # The reviewed resolution is exactly what main received from `two`.
    assert run_git(git_repo, "rev-parse", "main^2") == merge_rounds[0].commit
    assert any("Merge review" in p for p in fake_claude.prompts("acceptor"))
    text = (git_repo / "features" / "F1.txt").read_text()
    assert "<<<<<<<" not in text and "by one" in text and "by two" in text  # both kept
    assert merged_order(git_repo) == ["one", "two"]


def test_a_usage_limit_met_by_one_pair_holds_every_pair_and_is_said_once(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["hit", "other"]
    project(git_repo, ids)
    own_dirs(fake_claude, ids,
             hit={"developer": [{"replay": "usage-2.1.330", "resets_in": 3}]},
             other={"developer_default": {"auto": True, "delay": 0.5}})
    fake_claude.use_env(monkeypatch)
    engine = Engine(git_repo)
    events: list[Event] = []
    held_at: list[float] = []
    engine.bus.subscribe(events.append)
    engine.bus.subscribe(lambda e: held_at.append(time.time())
                         if isinstance(e, UsageLimitWait) and e.until else None)
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    (wait,) = [e for e in events if isinstance(e, UsageLimitWait) and e.until is not None]
    assert len([e for e in events if isinstance(e, Notice) and e.kind == "waiting"]) == 1
    assert wait.until is not None
    # No prompt of either pair went out between the limit and its reset (a prompt on its way
    # when the limit was met may still arrive just after).
    held = [e for e in fake_claude.entries() if held_at[0] + 0.5 < e["time"] < wait.until - 0.2]
    assert held == [], [(Path(e["cwd"]).name, e["role"]) for e in held]
    for i in ids:
        assert record(git_repo, i).status is MilestoneStatus.COMPLETED


def test_a_kill_with_three_in_flight_resumes_each_in_its_worktree_and_merges_each_once(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """Headless, three milestones mid-turn (one of them resolving a conflict by then or
    after), Anima killed: the restart resumes each where it stopped, main gets each
    milestone exactly once, nothing is left behind; the output says which milestone each
    line is about while several run."""
    ids = ["p1", "p2", "p3"]
    project(git_repo, ids)
    fake_claude.write_script({"milestones": {
        "p1": {"feature_dir": "features", "developer_default": {"auto": True, "delay": 0.4}},
        "p2": {"feature_dir": "features", "developer_default": {"auto": True, "delay": 0.7}},
        "p3": {"feature_dir": "features/p3",
               "developer_default": {"auto": True, "delay": 0.5}}}})
    first = Runner(git_repo, fake_claude)
    wait_until(lambda: sum(1 for i in ids if rounds(git_repo, i) >= 1) >= 2,
               what="two milestones with an accepted round", timeout=60)
    first.kill()
    assert {Path(e["cwd"]).name for e in fake_claude.entries()} == set(ids)
    assert "[p1] [developer]" in first.stdout or "[p2] [developer]" in first.stdout
    second = run_to_end(git_repo, fake_claude, timeout=120)
    assert second.proc.returncode == 0, second.stdout[-3000:] + second.stderr
    subjects = run_git(git_repo, "log", "--first-parent", "--format=%s", "main").splitlines()
    for i in ids:
        rec = record(git_repo, i)
        assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged, i
        assert_consistent(rec)
        assert sum(1 for s in subjects if s.startswith(f"Merge milestone/{i}:")) == 1
        # what main received from it is what its last accepted round judged
        merge = run_git(git_repo, "log", "--first-parent", "--format=%H %s", "main")
        sha = next(line.split()[0] for line in merge.splitlines()
                   if f"Merge milestone/{i}:" in line)
        accepted = [it for it in rec.iterations if it.verdict is Verdict.ACCEPTED]
        assert run_git(git_repo, "rev-parse", f"{sha}^2") == accepted[-1].commit
        assert accepted[-1].kind in (RoundKind.FINAL, RoundKind.MERGE)
    assert run_git(git_repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert our_processes() == []


def rounds(repo: Path, milestone_id: str) -> int:
    try:
        return record(repo, milestone_id).iteration_count
    except Exception:  # not written yet, or being replaced
        return 0


def test_a_running_milestone_stopped_then_aborted_is_cancelled_while_another_goes_on(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """`anima abort` takes what waits for you, not a running milestone (README, CLI): stop
    it first."""
    ids = ["doomed", "kept"]
    project(git_repo, ids)
    own_dirs(fake_claude, ids, doomed={"developer": [{"hang": True}]},
             kept={"developer_default": {"auto": True, "delay": 0.5}})
    fake_claude.use_env(monkeypatch)
    engine = Engine(git_repo)
    worker = threading.Thread(target=engine.run, kwargs={"watch": False, "start_all": True})
    worker.start()
    try:
        wait_until(lambda: any(Path(e["cwd"]).name == "doomed"
                               for e in fake_claude.entries("developer")), what="doomed's turn")
        with pytest.raises(ActionError, match="anima stop"):
            engine.control("abort", "doomed")
        engine.control("stop", "doomed")
        wait_until(lambda: record(git_repo, "doomed").status is MilestoneStatus.PAUSED,
                   what="doomed paused")
        said = engine.control("abort", "doomed")
        assert "cancelled" in said
        assert record(git_repo, "doomed").status is MilestoneStatus.CANCELLED
        assert not (git_repo / ".anima" / "worktrees" / "doomed").exists()
        assert record(git_repo, "kept").status is MilestoneStatus.IN_PROGRESS
    finally:
        worker.join(120)
        engine.shutdown()
    assert record(git_repo, "kept").status is MilestoneStatus.COMPLETED


def test_an_approval_that_no_longer_merges_goes_through_a_merge_round(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both wait for your review and both wrote features/F1.txt: the first you approve
    merges; the second's approval sends it through a reviewed merge round, then it merges."""
    review = "---\nrequires_human_review: true\n---\n"
    ids = ["one", "two"]
    project(git_repo, ids, texts={i: review + TWO for i in ids})
    fake_claude.write_script({"milestones": {i: {"feature_dir": "features"} for i in ids}})
    fake_claude.use_env(monkeypatch)
    run_engine(git_repo)
    assert all(record(git_repo, i).status is MilestoneStatus.AWAITING_REVIEW for i in ids)
    env = {"ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env}
    first = subprocess.run([sys.executable, "-m", "anima", "approve", str(git_repo), "one"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert first.returncode == 0 and "completed" in first.stdout, first.stderr
    second = subprocess.run([sys.executable, "-m", "anima", "approve", str(git_repo), "two"],
                            capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert second.returncode == 0 and "merge round" in second.stdout, second.stdout
    assert record(git_repo, "two").status is MilestoneStatus.IN_PROGRESS
    assert run_git(git_repo, "log", "-1", "--format=%s", "main").startswith("Merge milestone/one")
    run_engine(git_repo)
    rec = record(git_repo, "two")
    assert rec.status is MilestoneStatus.COMPLETED and rec.merge and rec.merge.merged
    (merge_round,) = [it for it in rec.iterations if it.kind is RoundKind.MERGE]
    assert merge_round.verdict is Verdict.ACCEPTED
    assert run_git(git_repo, "rev-parse", "main^2") == merge_round.commit


def test_one_milestones_developer_cannot_move_a_branch_made_after_it_started(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """a's Developer starts before b exists; once b's branch is made, a's Developer is
    restarted on its session before its next turn, so the sandbox protects milestone/b from
    it too: its `git update-ref` of b's branch fails, and b holds nothing of a's."""
    tamper = ("for i in $(seq 100); do git rev-parse -q --verify refs/heads/milestone/b "
              ">/dev/null && break; sleep 0.1; done; "
              "git update-ref refs/heads/milestone/b HEAD || true")
    project(git_repo, ["a"])
    fake_claude.write_script({"milestones": {
        "a": {"feature_dir": "features/a",
              "developer": [{"auto": True, "delay": 2.0}, {"shell": [tamper], "auto": True}]},
        "b": {"feature_dir": "features/b", "developer_default": {"auto": True, "delay": 0.5}}}})
    fake_claude.use_env(monkeypatch)
    engine = Engine(git_repo)
    worker = threading.Thread(target=engine.run, kwargs={"watch": True, "start_all": True})
    worker.start()
    milestones = git_repo / ".anima" / "milestones"
    try:
        wait_until(lambda: fake_claude.entries("developer"), what="a's first turn")
        (milestones / "b.md").write_text(TWO, encoding="utf-8")
        wait_until(lambda: (milestones / "b.json").exists() and all(
            record(git_repo, i).status is MilestoneStatus.COMPLETED for i in ("a", "b")),
            timeout=120, what="both completed")
    finally:
        engine.shutdown()
        worker.join(30)
    a_first = record(git_repo, "a").iterations[0].commit
    assert a_first is not None
    assert subprocess.run(["git", "merge-base", "--is-ancestor", a_first, "milestone/b"],
                          cwd=git_repo).returncode == 1
    assert "restarted on its session" in (git_repo / ".anima" / "logs" / "a.log").read_text()


def test_one_milestones_agent_events_stay_out_of_anothers_round(
        git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bus carries every running milestone's agent events. A milestone's seats took all
    of them: another's Developer's context rolled this one's session over, and its tool calls
    and context were counted in this one's rounds."""
    features = [f"Part {i}" for i in range(1, 7)]
    make_project(git_repo, {i: milestone_md(i.capitalize(), features) for i in ("big", "small")},
                 config={"usage_limit_margin_seconds": 0, "context_rollover_percent": 50})
    own_dirs(fake_claude, ["big", "small"],
             big={"developer_default": {"auto": True, "delay": 0.3, "context_tokens": 180_000}},
             small={"developer_default": {"auto": True, "delay": 0.3, "context_tokens": 1_000}})
    fake_claude.use_env(monkeypatch)
    run_engine(git_repo)
    small = record(git_repo, "small")
    assert small.status is MilestoneStatus.COMPLETED, small.pause_reason
    assert {it.context["developer"].tokens for it in small.iterations
            if "developer" in it.context} == {1_000}
    assert small.rollovers == []
    assert record(git_repo, "big").rollovers  # its own context does roll it over


def anima_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`anima ARGS…` from another terminal."""
    return subprocess.run([sys.executable, "-m", "anima", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_resumed_milestone_waiting_for_a_slot_can_be_stopped_and_aborted(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """Two slots, three milestones: x stopped, the third takes its slot, x resumed waits for
    one. `anima stop` said "x is not running" and `anima abort` "x is in_progress, not paused
    or …": no way to take the resume back until a slot freed and x ran again. Now a stop
    pauses it, and an abort cancels it, before it starts."""
    ids = ["a", "b", "c"]
    project(git_repo, ids, {"max_parallel_milestones": 2})
    own_dirs(fake_claude, ids, **{i: {"developer_default": {"hang": True}} for i in ids})
    runner = Runner(git_repo, fake_claude)
    try:
        def running() -> list[str]:
            try:
                return [r["id"] for r in json.loads(
                    (git_repo / ".anima" / "state.json").read_text())["running"]]
            except (OSError, ValueError, KeyError):
                return []

        def prompted() -> set[str]:
            return {Path(e["cwd"]).name for e in fake_claude.entries("developer")}

        first = wait_until(lambda: len(prompted()) == 2 and prompted(), what="two at work",
                           timeout=60)
        x = sorted(first)[0]
        assert anima_cli("stop", str(git_repo), x).returncode == 0
        wait_until(lambda: prompted() == set(ids), what="the third in x's slot", timeout=60)
        done = anima_cli("resume", str(git_repo), x)
        assert done.returncode == 0, done.stderr
        assert record(git_repo, x).status is MilestoneStatus.IN_PROGRESS
        assert x not in running()  # it waits for a slot, and `anima status` says so
        lines = anima_cli("status", str(git_repo)).stdout.splitlines()
        row = next(n for n, line in enumerate(lines) if line.startswith(f"  {x} "))
        details = itertools.takewhile(lambda line: line.startswith("      "), lines[row + 1:])
        assert "      waiting for a free slot (2 of 2 running)" in details, lines
        stopped = anima_cli("stop", str(git_repo), x)
        assert stopped.returncode == 0, stopped.stderr
        assert "paused (stopped by you)" in stopped.stdout, stopped.stdout
        assert record(git_repo, x).status is MilestoneStatus.PAUSED
        assert anima_cli("resume", str(git_repo), x).returncode == 0
        aborted = anima_cli("abort", str(git_repo), x)  # no run drives it: no stop needed
        assert aborted.returncode == 0, aborted.stderr
        assert record(git_repo, x).status is MilestoneStatus.CANCELLED
        others = [i for i in ids if i != x]
        assert sorted(running()) == others  # they went on meanwhile
        for i in others:
            assert anima_cli("stop", str(git_repo), i).returncode == 0
        assert runner.wait(60) == 3
    finally:
        if runner.proc.poll() is None:
            runner.kill()
    assert [Path(e["cwd"]).name for e in fake_claude.entries("developer")].count(x) == 1
    assert our_processes() == []


def test_a_pending_milestone_behind_full_slots_says_it_waits_for_one(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """Two slots, three milestones: `anima status` listed the third as a bare "pending",
    alike whether it waits for a slot or the running Anima will not start it."""
    ids = ["a", "b", "c"]
    project(git_repo, ids, {"max_parallel_milestones": 2})
    own_dirs(fake_claude, ids, **{i: {"developer_default": {"hang": True}} for i in ids})
    runner = Runner(git_repo, fake_claude)
    try:
        wait_until(lambda: len({Path(e["cwd"]).name for e in fake_claude.entries()}) == 2,
                   what="two at work", timeout=60)
        lines = anima_cli("status", str(git_repo)).stdout.splitlines()
        row = next(n for n, line in enumerate(lines) if line.startswith("  c "))
        assert lines[row].split()[1] == "pending", lines
        assert lines[row + 1] == "      waiting for a free slot (2 of 2 running)", lines
    finally:
        runner.signal(signal.SIGTERM)
        assert runner.wait(60) == 128 + signal.SIGTERM
    assert our_processes() == []


def test_an_approval_through_the_running_anima_says_what_became_of_it(
        git_repo: Path, fake_claude: FakeClaude,
        our_processes: Callable[[], list[int]]) -> None:
    """With no Anima running `anima approve` says "completed; merged …" or why a merge round
    comes first; through a running one it said only "approve: two is in_progress", as if
    the approval had not taken."""
    review = "---\nrequires_human_review: true\n---\n"
    ids = ["one", "two"]
    project(git_repo, ids, texts={i: review + TWO for i in ids})
    fake_claude.write_script({"milestones": {i: {"feature_dir": "features"} for i in ids}})
    run_to_end(git_repo, fake_claude, timeout=120)
    assert all(record(git_repo, i).status is MilestoneStatus.AWAITING_REVIEW for i in ids)
    runner = Runner(git_repo, fake_claude, "--watch")
    try:
        wait_until(lambda: "nothing to stop" not in anima_cli("stop", str(git_repo),
                                                              "one").stderr,
                   what="the run to answer", timeout=60)
        first = anima_cli("approve", str(git_repo), "one")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("approved one: completed; merged milestone/one"), \
            first.stdout
        second = anima_cli("approve", str(git_repo), "two")
        assert second.returncode == 0, second.stderr
        assert second.stdout.startswith("approved two: ") and "merge round" in second.stdout, \
            second.stdout
        wait_until(lambda: record(git_repo, "two").status is MilestoneStatus.COMPLETED,
                   what="two merged after its merge round", timeout=60)
        runner.signal(signal.SIGINT)
        assert runner.wait(60) == 0
    finally:
        if runner.proc.poll() is None:
            runner.kill()
    assert our_processes() == []
