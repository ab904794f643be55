"""`anima` through its real entry point, in a subprocess, as users' scripts call it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FakeClaude, run_git
from tests.helpers import make_project, milestone_md, record

ANIMA = shutil.which("anima") or ""


def anima(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def reference_status(project: Path) -> str:
    """What `anima status --json` must print through a pipe: pydantic's compact dump of the
    state and every readable record, in creation order, then whether agents started now
    would be confined (the config's `sandbox`, and the loop's own answer whether bubblewrap
    can run here), then what `depends_on` holds each pending milestone for, as the full scan
    of the plain `anima status` finds it."""
    from pydantic import BaseModel

    from anima.cli.status import dependency_report
    from anima.config import Config
    from anima.engine.merged import merged_by_you
    from anima.loop.confinement import sandbox_problem
    from anima.paths import ProjectPaths
    from anima.store.models import MilestoneRecord, State
    from anima.store.store import Store

    class Sandbox(BaseModel):
        mode: str
        confined: bool
        problem: str | None

    class Report(BaseModel):
        state: State
        milestones: list[MilestoneRecord]
        sandbox: Sandbox
        dependencies: dict[str, dict[str, Any]]

    paths = ProjectPaths(project)
    store = Store(paths)
    records = store.load_records()
    config = Config.model_validate(json.loads(paths.config.read_text(encoding="utf-8")))
    problem = None if config.sandbox == "off" else sandbox_problem("auto")
    scan = store.scan(max_iterations=config.max_iterations_per_milestone,
                      requires_human_review=config.requires_human_review, register=False,
                      in_main=merged_by_you(project))
    return Report(state=store.load_state(), milestones=sorted(
        records, key=lambda r: (r.created_at, r.id)), sandbox=Sandbox(
        mode=config.sandbox, confined=config.sandbox != "off" and problem is None,
        problem=problem), dependencies=dependency_report(
            paths, scan.records, scan.dependencies, scan.orphans)
    ).model_dump_json() + "\n"


@pytest.fixture
def fake_env(fake_claude: FakeClaude) -> dict[str, str]:
    return {"ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env}


def test_init_creates_the_example_and_never_overwrites(tmp_path: Path) -> None:
    result = anima("init", "--git-init", str(tmp_path))
    assert result.returncode == 0, result.stderr
    anima_dir = tmp_path / ".anima"
    for name in ("config.json", "soul.md", "state.json", ".gitignore", "memory/project.md"):
        assert (anima_dir / name).is_file(), name
    assert list((anima_dir / "milestones").glob("*.md")) == []  # never scheduled by itself
    from anima.store.models import STATE_SCHEMA_VERSION, State
    state = json.loads((anima_dir / "state.json").read_text(encoding="utf-8"))
    assert state == json.loads(State().model_dump_json())  # today's shape, as documented
    assert state["schema_version"] == STATE_SCHEMA_VERSION
    assert "anima add" in result.stdout and "hello-cli.md" in result.stdout
    soul = (anima_dir / "soul.md").read_bytes()
    (anima_dir / "soul.md").write_text("mine", encoding="utf-8")
    again = anima("init", "--git-init", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (anima_dir / "soul.md").read_text() == "mine" and soul != b"mine"


def test_init_refuses_a_folder_that_is_not_a_repository_before_writing(tmp_path: Path) -> None:
    """Anima drives only git repositories: the refusal comes before `.anima/` exists, names
    the folder and the commands; `--git-init` makes it one with a first commit."""
    plain = tmp_path / "plain"
    plain.mkdir()
    refused = anima("init", str(plain))
    assert refused.returncode == 2
    assert str(plain) in refused.stderr and "git init" in refused.stderr
    assert "--git-init" in refused.stderr
    assert list(plain.iterdir()) == []
    made = anima("init", "--git-init", str(plain))
    assert made.returncode == 0, made.stderr
    assert (plain / ".anima" / "config.json").is_file()
    assert run_git(plain, "rev-list", "--count", "HEAD").strip() == "1"


def test_git_init_works_on_a_machine_without_a_git_identity(tmp_path: Path) -> None:
    """A fresh machine has no user.name/email: `--git-init` still makes the first commit
    (Anima's fallback identity), where a bare `git commit` would refuse."""
    home = tmp_path / "home"
    home.mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GIT_AUTHOR", "GIT_COMMITTER")) and k != "EMAIL"}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1")
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    made = subprocess.run([*command, "init", "--git-init", str(plain)], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr
    assert run_git(plain, "log", "--format=%an <%ae>").strip() == "Anima <anima@localhost>"


def test_the_printed_example_milestone_is_added_only_on_purpose(git_repo: Path) -> None:
    """`init` prints the example's path outside the project; adding it schedules it."""
    result = anima("init", str(git_repo))
    assert result.returncode == 0, result.stderr
    example = next(w for w in result.stdout.split() if w.endswith("hello-cli.md`"))
    example = example.rstrip("`")
    assert not Path(example).resolve().is_relative_to(git_repo.resolve())
    assert json.loads(anima("status", str(git_repo), "--json").stdout)["milestones"] == []
    added = anima("add", str(git_repo), example)
    assert added.returncode == 0, added.stderr
    assert (git_repo / ".anima" / "milestones" / "hello-cli.md").is_file()


def test_add_registers_and_status_json_has_the_contract_shape(tmp_path: Path) -> None:
    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    md = tmp_path / "greeter.md"
    md.write_text(milestone_md("Greeter", ["Greet", "Version"]), encoding="utf-8")
    added = anima("add", str(tmp_path), str(md))
    assert added.returncode == 0, added.stderr
    status = anima("status", str(tmp_path), "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert set(data) == {"state", "milestones", "sandbox", "dependencies"}
    assert data["dependencies"] == {}  # nothing holds it
    assert set(data["sandbox"]) == {"mode", "confined", "problem"}
    assert data["sandbox"]["mode"] == "auto"  # the default
    assert data["state"]["status"] == "sleeping"
    greeter = next(m for m in data["milestones"] if m["id"] == "greeter")
    assert greeter["status"] == "pending"
    assert [f["id"] for f in greeter["features"]] == ["F1", "F2"]
    for key in ("schema_version", "created_at", "branch_name", "base_commit", "iteration_count",
                "consecutive_rejections", "max_iterations", "tokens_used", "cost_usd",
                "requires_human_review", "iterations", "acceptance_criteria", "sessions",
                "pause_reason", "human_notes"):
        assert key in greeter
    text = anima("status", str(tmp_path))
    assert "greeter" in text.stdout and "pending" in text.stdout


def test_add_refuses_a_bad_name_and_a_malformed_file(tmp_path: Path) -> None:
    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    bad = tmp_path / "Bad Name.md"
    bad.write_text(milestone_md("X", ["A"]), encoding="utf-8")
    result = anima("add", str(tmp_path), str(bad))
    assert result.returncode == 2 and "Bad Name.md" in result.stderr
    empty = tmp_path / "empty.md"
    empty.write_text("just words, no title\n", encoding="utf-8")
    result = anima("add", str(tmp_path), str(empty))
    assert result.returncode == 2 and "empty.md" in result.stderr
    assert not (tmp_path / ".anima" / "milestones" / "empty.md").exists()


def test_a_name_too_long_for_a_file_is_refused_and_the_others_run(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    long = "b" * 240  # fine for the pattern; `.<id>.json.<random>.tmp` is over 255 bytes
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    source = git_repo.parent / f"{long}.md"
    source.write_text(milestone_md("Long", ["A"]), encoding="utf-8")
    added = anima("add", str(git_repo), str(source))
    assert added.returncode == 2 and "at most 100" in added.stderr, added.stderr
    assert not (git_repo / ".anima" / "milestones" / source.name).exists()
    (git_repo / ".anima" / "milestones" / source.name).write_bytes(source.read_bytes())
    result = anima("run", str(git_repo), "--headless", env=fake_env)
    assert "at most 100" in result.stderr, result.stdout[-2000:] + result.stderr
    assert record(git_repo, "m1").status.value == "completed"
    assert (git_repo / ".anima" / "milestones" / source.name).is_file()  # left as it was


def test_adding_the_md_of_a_milestone_that_has_a_record_says_where_it_stands(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    assert anima("run", str(git_repo), "--headless", env=fake_env).returncode == 0
    md = git_repo / ".anima" / "milestones" / "m1.md"
    kept = git_repo.parent / "m1.md"
    md.rename(kept)
    added = anima("add", str(git_repo), str(kept))
    assert added.returncode == 0, added.stderr
    assert "m1 is completed" in added.stdout and "pending" not in added.stdout
    assert record(git_repo, "m1").status.value == "completed"


def test_adding_a_new_md_under_the_name_of_a_milestone_that_ended_is_refused(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """`anima add` of a different milestone under a completed one's name said "added m1.md
    back: milestone m1 is completed, as its record says" and exited 0; the file was copied in,
    never ran, and every `anima status` and run then reported it. Refused, as they say."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    assert anima("run", str(git_repo), "--headless", env=fake_env).returncode == 0
    md = git_repo / ".anima" / "milestones" / "m1.md"
    md.unlink()
    new = git_repo.parent / "m1.md"
    new.write_text(milestone_md("M again", ["B"]), encoding="utf-8")
    added = anima("add", str(git_repo), str(new))
    assert added.returncode == 2, added.stdout
    assert str(new) in added.stderr and "never runs twice" in added.stderr \
        and "save the new one under another name" in added.stderr, added.stderr
    assert not md.exists()
    assert anima("status", str(git_repo)).stderr == ""


def test_adding_a_md_already_in_the_milestones_folder_registers_it(git_repo: Path) -> None:
    """It used to be refused: "a milestone named 'm1' already exists; rename the file"."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    added = anima("add", str(git_repo), str(git_repo / ".anima" / "milestones" / "m1.md"))
    assert added.returncode == 0, added.stderr
    assert "added milestone m1 (pending)" in added.stdout
    assert record(git_repo, "m1").status.value == "pending"


def _add_at_once(project: Path, sources: list[Path]) -> dict[int, str]:
    """Each source added by a thread of its own, all at one instant, each with an engine of
    its own as each `anima add` process makes: what each said (its id, or why not)."""
    import threading

    from anima.engine.facade import Engine
    from anima.errors import MilestoneError

    engines = [Engine(project) for _ in sources]
    start = threading.Barrier(len(sources))
    said: dict[int, str] = {}

    def add(i: int) -> None:
        start.wait()
        try:
            said[i] = engines[i].add_milestone(sources[i])
        except MilestoneError as e:
            said[i] = str(e)
        except Exception as e:
            said[i] = repr(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(sources))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return said


def test_two_adds_of_one_name_at_once_add_one_and_refuse_the_other(git_repo: Path) -> None:
    """Two `anima add` of different files named m1.md at the same instant (two terminals, a
    script's loop): both said "added", one's file stood under the other's record (title,
    features), or one ended on an unexpected FileNotFoundError (they shared a temp file)."""
    make_project(git_repo)
    folder = git_repo / ".anima" / "milestones"
    sources = []
    for i in range(4):
        (git_repo.parent / f"from{i}").mkdir()
        sources.append(git_repo.parent / f"from{i}" / "m1.md")
        sources[-1].write_text(milestone_md(f"From {i}", [f"Feature {i}"]), encoding="utf-8")
    for _ in range(10):
        for leftover in folder.glob("m1.*"):
            leftover.unlink()
        said = _add_at_once(git_repo, sources)
        added = [i for i, what in said.items() if what == "m1"]
        assert len(added) == 1 and len(said) == len(sources), said
        assert all("a milestone named 'm1' already exists" in what
                   for i, what in said.items() if i not in added), said
        assert (folder / "m1.md").read_bytes() == sources[added[0]].read_bytes()
        assert record(git_repo, "m1").title == f"From {added[0]}"
        assert sorted(p.name for p in folder.iterdir()) == ["m1.json", "m1.md"]


def test_invalid_config_names_the_file_and_key(tmp_path: Path) -> None:
    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    config = tmp_path / ".anima" / "config.json"
    data = json.loads(config.read_text())
    data["max_iterations_per_milstone"] = 5
    config.write_text(json.dumps(data))
    result = anima("status", str(tmp_path))
    assert result.returncode == 2
    assert str(config) in result.stderr and "max_iterations_per_milstone" in result.stderr


def test_run_refuses_a_folder_that_is_not_a_git_repo(tmp_path: Path,
                                                    fake_env: dict[str, str]) -> None:
    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    shutil.rmtree(tmp_path / ".git")  # e.g. moved away after initialising
    (tmp_path / ".anima" / "milestones" / "m1.md").write_text(milestone_md("Greeter", ["Greet"]))
    result = anima("run", str(tmp_path), "--headless", env=fake_env)
    assert result.returncode == 2
    assert "not a git repository" in result.stderr


def test_run_leaves_the_humans_uncommitted_edit_alone(git_repo: Path,
                                                      fake_env: dict[str, str]) -> None:
    """An uncommitted edit in the human's checkout no longer stops a run (it used to exit 2):
    the milestone works in its own worktree, and the edit stays exactly as it was — not
    stashed, not committed, the checkout still on main — while main gets the merge."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    (git_repo / "README.md").write_text("edited, not committed\n", encoding="utf-8")
    result = anima("run", str(git_repo), "--headless", env=fake_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    rec = record(git_repo, "m1")
    assert rec.status.value == "completed" and rec.merge and rec.merge.merged
    assert (git_repo / "README.md").read_text() == "edited, not committed\n"
    assert run_git(git_repo, "branch", "--show-current") == "main"
    assert run_git(git_repo, "status", "--porcelain", "--", ".", ":!.anima") == "M README.md"
    assert run_git(git_repo, "stash", "list") == ""
    # The merge reached main and the checkout, and main's README is still the committed one.
    assert (git_repo / "features" / "F1.txt").is_file()
    assert run_git(git_repo, "show", "main:README.md") == "# test project"
    assert run_git(git_repo, "merge-base", "--is-ancestor", "milestone/m1", "main") == ""


def test_run_missing_claude_says_how_to_install(git_repo: Path) -> None:
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    result = anima("run", str(git_repo), "--headless",
                   env={"ANIMA_CLAUDE_COMMAND": str(git_repo / "no-such-claude"),
                        "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "npm install -g @anthropic-ai/claude-code" in result.stderr
    assert record(git_repo, "m1").status.value == "pending"


def test_a_missing_codex_names_the_role_that_asked_for_it(git_repo: Path,
                                                          fake_env: dict[str, str]) -> None:
    """Only the Developer runs codex: the error names its settings, not the Acceptor's (a
    claude role, found)."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])},
                 config={"developer": {"agent": "codex"}})
    result = anima("run", str(git_repo), "--headless",
                   env={**fake_env, "PATH": "/usr/bin:/bin", "ANIMA_CODEX_COMMAND": ""})
    assert result.returncode == 2
    assert "npm install -g @openai/codex" in result.stderr
    assert 'developer.agent "codex"' in result.stderr
    assert "set developer.command in .anima/config.json" in result.stderr
    assert "acceptor" not in result.stderr, result.stderr


def test_a_missing_claude_names_the_setting_that_named_it(git_repo: Path,
                                                          fake_env: dict[str, str]) -> None:
    """The Acceptor's own `command` names a claude that is not there (the Developer's is):
    the error names the Acceptor's settings, not `claude_command` alone."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])},
                 config={"acceptor": {"command": str(git_repo / "no-such-claude")}})
    result = anima("run", str(git_repo), "--headless", env=fake_env)
    assert result.returncode == 2
    missing = git_repo / "no-such-claude"
    assert f"config acceptor.command / claude_command '{missing}'" in result.stderr
    assert "developer" not in result.stderr


def test_headless_run_pause_resume_with_note_and_approve(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    no = {"text": "REJECTED: the greeting is rude"}
    fake_claude.write_script({"acceptor": [no, no, no]})
    text = "---\nrequires_human_review: true\n---\n" + milestone_md("M", ["Greet"])
    make_project(git_repo, {"m1": text})
    first = anima("run", str(git_repo), "--headless", env=fake_env)
    assert first.returncode == 3, first.stderr
    out = first.stdout
    assert "[developer]" in out and "[acceptor]" in out and "[anima]" in out
    assert "REJECTED: the greeting is rude" in out
    # The last line gives the command to run, the milestone's id in it (not a literal `ID`).
    assert out.strip().splitlines()[-1].endswith(
        f"review, then `anima resume {git_repo} m1 [--note TEXT]`")
    # The pause says what to do about it; `anima status` shows that.
    assert "paused: 3 consecutive rejections, resume, with a note for the Developer if it " \
           "helps, to give it 3 more tries; last: the greeting is rude" in anima(
               "status", str(git_repo)).stdout
    resumed = anima("resume", str(git_repo), "m1", "--note", "say hello politely")
    assert resumed.returncode == 0, resumed.stderr
    rec = record(git_repo, "m1")
    assert rec.status.value == "in_progress" and rec.consecutive_rejections == 0
    second = anima("run", str(git_repo), "--headless", env=fake_env)
    assert second.returncode == 0, second.stderr + second.stdout
    assert "say hello politely" in fake_claude.prompts("developer")[3]
    assert record(git_repo, "m1").status.value == "awaiting_review"
    assert second.stdout.strip().splitlines()[-1] == (
        f"[anima] awaiting your review: m1 — `anima approve {git_repo} m1`")
    approved = anima("approve", str(git_repo), "m1")
    assert approved.returncode == 0, approved.stderr
    rec = record(git_repo, "m1")
    assert rec.status.value == "completed" and rec.merge is not None and rec.merge.merged
    assert "feat: F1" in run_git(git_repo, "log", "--format=%s", "main")
    wrong = anima("approve", str(git_repo), "m1")
    assert wrong.returncode == 2 and "completed" in wrong.stderr


def test_a_headless_run_ends_saying_what_still_waits_for_you(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """b depends on a, which waits for your review: the run used to end with a alone named,
    b silently pending."""
    review = "---\nrequires_human_review: true\n---\n" + milestone_md("A", ["Alpha"])
    make_project(git_repo, {"a": review,
                            "b": "---\ndepends_on: [a]\n---\n" + milestone_md("B", ["Beta"])})
    done = anima("run", str(git_repo), "--headless", env=fake_env)
    assert done.returncode == 0, done.stderr
    assert "[anima] b waits for a (`anima status` says why)" in done.stdout, done.stdout
    assert "[anima] awaiting your review: a" in done.stdout


def test_a_run_that_ends_paused_still_names_what_awaits_review(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """One milestone paused, another awaiting review: the run exits 3 and its end names
    both (it used to stop at the paused line)."""
    no = {"text": "REJECTED: not yet"}
    fake_claude.write_script({"milestones": {"a": {"feature_dir": "fa", "acceptor": [no] * 3},
                                             "b": {"feature_dir": "fb"}}})
    make_project(git_repo, {"a": milestone_md("A", ["Alpha"]),
                            "b": "---\nrequires_human_review: true\n---\n"
                                 + milestone_md("B", ["Beta"])})
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr
    ending = done.stdout[done.stdout.index("[anima] paused for a human: a"):]
    assert "[anima] awaiting your review: b" in ending, ending


def test_one_at_a_time_a_pause_holds_the_next_milestone_and_both_ends_say_so(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """Run one at a time, nothing starts while a milestone waits for you after a pause
    (milestones build on each other). The run's end and `anima status` named only the
    paused one: the next sat pending with no word why."""
    no = {"text": "REJECTED: not yet"}
    fake_claude.write_script({"milestones": {"a": {"feature_dir": "fa", "acceptor": [no] * 3},
                                             "b": {"feature_dir": "fb"}}})
    make_project(git_repo, {"a": milestone_md("A", ["Alpha"]), "b": milestone_md("B", ["Beta"])},
                 config={"max_parallel_milestones": 1})
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr
    assert record(git_repo, "b").status.value == "pending"
    said = "b waits until a is resumed or aborted (milestones run one at a time)"
    assert f"[anima] {said}" in done.stdout, done.stdout[-1500:]
    shown = anima("status", str(git_repo)).stdout
    assert "waiting until a is resumed or aborted (milestones run one at a time)" in shown, \
        shown


def test_one_at_a_time_the_runs_end_names_no_held_milestone_whose_file_is_gone(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """b's `.md` deleted while a ran (its record stays), then a paused: the run's end said
    "b waits until a is resumed or aborted", though b never starts without its file."""
    fake_claude.write_script({"developer": [{"hang": True}]})
    make_project(git_repo, {"a": milestone_md("A", ["Alpha"]), "b": milestone_md("B", ["Beta"])},
                 config={"max_parallel_milestones": 1})
    run = subprocess.Popen([*([ANIMA] if ANIMA else [sys.executable, "-m", "anima"]), "run",
                            str(git_repo), "--headless"], env={**os.environ, **fake_env},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 30
        while not fake_claude.prompts("developer"):
            assert time.monotonic() < deadline and run.poll() is None, "a never started"
            time.sleep(0.05)
        assert record(git_repo, "b").status.value == "pending"  # registered: a record stays
        (git_repo / ".anima" / "milestones" / "b.md").unlink()
        stopped = anima("stop", str(git_repo), "a")
        assert stopped.returncode == 0, stopped.stderr
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 3, out[-2000:]
    assert "[anima] paused for a human: a" in out, out[-2000:]
    assert "b waits" not in out, out[-2000:]


def test_status_says_a_running_anima_retries_a_pending_merge_not_that_it_was_cut_short(
        git_repo: Path) -> None:
    """A merge that lost a race to main stays pending while the running Anima tries it
    again; `anima status` said "cut short; the next `anima run` … finishes it" all the same."""
    from anima.lock import ProjectLock
    from anima.paths import ProjectPaths
    from anima.store.models import MergeInfo, MergeState, MilestoneStatus
    from anima.store.store import Store

    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    assert anima("add", str(git_repo), str(git_repo / ".anima" / "milestones" / "m1.md")
                 ).returncode == 0
    paths = ProjectPaths(git_repo)
    rec = record(git_repo, "m1")
    rec.status = MilestoneStatus.COMPLETED
    rec.branch_name, rec.main_branch = "milestone/m1", "main"
    rec.merge = MergeInfo(state=MergeState.PENDING, detail="merging milestone/m1 into main")
    Store(paths).save_record(rec)
    assert "(cut short; the next `anima run`" in anima("status", str(git_repo)).stdout
    with ProjectLock(paths.lock):
        shown = anima("status", str(git_repo)).stdout
    assert "merge pending: merging milestone/m1 into main (the running Anima tries it again " \
           "shortly)" in shown, shown


def test_a_run_whose_merge_waits_for_your_file_ends_naming_it(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """An untracked file of yours where the milestone adds one: its merge into main waits
    for you. The run's end names the milestone and the file, and what finishes it; exit 0
    (the milestone is completed, as one awaiting review is: a step of yours outside the
    loop, not a pause that `anima resume` continues)."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"])})
    (git_repo / "features").mkdir()
    (git_repo / "features" / "F1.txt").write_text("mine\n", encoding="utf-8")
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    rec = record(git_repo, "m1")
    assert rec.merge is not None and rec.merge.state.value == "pending"
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("[anima] m1 is completed") and "features/F1.txt" in last, last
    assert f"anima run {git_repo} --headless" in last and "--watch" in last, last
    assert "nothing left to do" not in done.stdout


def test_a_run_that_leaves_milestones_on_a_depends_on_cycle_exits_2_naming_them(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """a needs b, b needs a: neither can ever start until you fix a file, a configuration
    error (exit 2) whose message names the file and the field; the run's end names both."""
    make_project(git_repo, {"a": "---\ndepends_on: [b]\n---\n" + milestone_md("A", ["Alpha"]),
                            "b": "---\ndepends_on: [a]\n---\n" + milestone_md("B", ["Beta"])})
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert fake_claude.entries() == []
    assert f"{git_repo / '.anima' / 'milestones' / 'a.md'}" in done.stderr
    ending = [line for line in done.stdout.splitlines() if line.startswith("[anima] ")][-2:]
    for milestone_id in ("a", "b"):
        assert any(line.startswith(f"[anima] {milestone_id} never starts")
                   and "depends_on makes a cycle" in line for line in ending), ending
    assert "nothing left to do" not in done.stdout


@pytest.mark.parametrize("deps", [
    {"a": ["a"], "b": []},  # a cycle of one
    {"a": ["b"], "b": ["a"]},
], ids=["itself", "pair"])
def test_a_milestone_on_a_depends_on_cycle_is_listed_and_named_with_its_file(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str],
        deps: dict[str, list[str]]) -> None:
    """design.md: `anima status` lists every definition. One that depended on itself was a
    malformed file, gone from `status` and `--json`; a cycle of two was listed as plain
    "pending", as if it only waited its turn. Each is listed, and `status`, the run and the
    milestone's log say it never starts, which cycle, and which file to fix."""
    make_project(git_repo, {m: (f"---\ndepends_on: [{', '.join(d)}]\n---\n" if d else "")
                            + milestone_md(m.upper(), ["Alpha"]) for m, d in deps.items()})
    on_cycle = [m for m, d in deps.items() if d]
    for _ in range(2):  # as you wrote it, then registered by the run
        listed = json.loads(anima("status", str(git_repo), "--json").stdout)["milestones"]
        assert [m["id"] for m in listed] == list(deps)
        shown = anima("status", str(git_repo)).stdout
        for m in on_cycle:
            md = git_repo / ".anima" / "milestones" / f"{m}.md"
            row = shown.split(f"  {m} ", 1)[1].splitlines()
            assert row[0].split()[0] == "pending", shown
            assert row[1].strip().startswith("never starts: depends_on makes a cycle: "
                                             f"{m} → ") and str(md) in row[1], shown
        done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr
        assert "nothing left to do" not in done.stdout
        for m in on_cycle:
            md = git_repo / ".anima" / "milestones" / f"{m}.md"
            assert any(line.startswith(f"[anima] {m} never starts") and str(md) in line
                       and "depends_on makes a cycle" in line
                       for line in done.stdout.splitlines()), done.stdout
            log = (git_repo / ".anima" / "logs" / f"{m}.log").read_text(encoding="utf-8")
            assert "depends_on makes a cycle" in log, log
    assert all(record(git_repo, m).status.value == "pending" for m in on_cycle)


@pytest.mark.parametrize("text", [
    "no title here\n",
    "---\ndepends_on: [bad]\n---\n" + milestone_md("Bad", ["B"]),  # a cycle of one
], ids=["no-title", "depends-on-itself"])
def test_a_run_that_leaves_a_malformed_milestone_file_exits_2_naming_it(
        git_repo: Path, fake_env: dict[str, str], text: str) -> None:
    """README, exit codes: 0 is "all completed, cancelled or awaiting review"; a milestone
    that can never start as its file is written is exit 2's kind. A `.md` without a title,
    or one that depends on itself, never starts: the run used to end "nothing left to do"
    and exit 0, a line on stderr only. The good one still runs first."""
    make_project(git_repo, {"good": milestone_md("Good", ["A"])})
    bad = git_repo / ".anima" / "milestones" / "bad.md"
    bad.write_text(text, encoding="utf-8")
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert record(git_repo, "good").status.value == "completed"
    assert str(bad) in done.stderr
    assert "nothing left to do" not in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("[anima] bad never starts") and str(bad) in last, last
    assert bad.read_text(encoding="utf-8") == text  # never rewritten


def test_a_run_with_a_milestone_in_progress_but_its_md_gone_does_not_end_nothing_to_do(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """Its `.md` taken away while it ran, the milestone pauses ("put the file back, then
    resume it"); resumed before the file is back, it is in progress and never goes on. The
    next run used to end "nothing left to do" with exit 0, the milestone left in progress:
    it now names it and the file, exit 2's kind (a milestone that cannot go on as its files
    are)."""
    fake_claude.write_script({"developer": [{"auto": True, "delay": 1.0}]})
    make_project(git_repo, {"m1": milestone_md("M", ["Greet"])})
    md = git_repo / ".anima" / "milestones" / "m1.md"
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    with subprocess.Popen([*command, "run", str(git_repo), "--headless"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          stdin=subprocess.DEVNULL, env={**os.environ, **fake_env}) as first:
        deadline = time.monotonic() + 30
        while not fake_claude.entries("developer") and time.monotonic() < deadline:
            time.sleep(0.05)
        md.unlink()
        assert first.wait(60) == 3
    assert anima("resume", str(git_repo), "m1").returncode == 0
    done = anima("run", str(git_repo), "--headless", env=fake_env)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert "nothing left to do" not in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("[anima] m1 does not go on") and ".anima/milestones/m1.md" in last \
        and f"anima abort {git_repo} m1" in last, last
    assert record(git_repo, "m1").status.value == "in_progress"
    # The way out it names works: the abort used to be refused ("m1 is in_progress, not
    # paused or …"), and so was `anima stop` ("nothing to stop").
    aborted = anima("abort", str(git_repo), "m1")
    assert aborted.returncode == 0, aborted.stderr
    assert record(git_repo, "m1").status.value == "cancelled"
    assert not (git_repo / ".anima" / "worktrees" / "m1").exists()
    assert "milestone/m1" in run_git(git_repo, "branch", "--list", "milestone/m1")


def test_a_milestone_that_depends_on_an_unreadable_file_waits_for_it_to_be_fixed(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """`depends_on` naming a milestone whose `.md` is there but malformed said "which is not a
    milestone of this project" (fix your own file): it waits for that file to be fixed."""
    make_project(git_repo, {"after": "---\ndepends_on: [bad]\n---\n"
                                     + milestone_md("After", ["A"])})
    (git_repo / ".anima" / "milestones" / "bad.md").write_text("no title\n", encoding="utf-8")
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert "[anima] after waits for bad" in done.stdout
    assert "not a milestone" not in done.stdout + done.stderr
    shown = anima("status", str(git_repo)).stdout
    assert "waiting for bad (its file cannot be read" in shown, shown
    assert record(git_repo, "after").status.value == "pending"


def test_a_run_that_meets_a_record_of_a_newer_anima_exits_2_naming_it(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """README: a record of a newer schema is refused and left as it is; its milestone cannot
    run here, which the run's end says (exit 2, the file named), not "nothing left to do"."""
    make_project(git_repo, {"new": milestone_md("New", ["A"]),
                            "good": milestone_md("Good", ["B"])})
    assert anima("add", str(git_repo), str(git_repo / ".anima" / "milestones" / "new.md")
                 ).returncode == 0
    path = git_repo / ".anima" / "milestones" / "new.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["schema_version"] = 99
    path.write_text(json.dumps(data), encoding="utf-8")
    written = path.read_bytes()
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert record(git_repo, "good").status.value == "completed"
    assert str(path) in done.stderr and "newer Anima" in done.stderr
    assert "nothing left to do" not in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("[anima] new ") and str(path) in last, last
    assert path.read_bytes() == written


def test_a_run_that_meets_a_state_of_a_newer_anima_writes_nothing_and_exits_2(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """state.json of a newer Anima: the run is refused before it registers a milestone (the
    newer Anima's files are left exactly as they were), naming the file."""
    make_project(git_repo, {"one": milestone_md("One", ["A"])})
    state = git_repo / ".anima" / "state.json"
    state.write_text(json.dumps({"schema_version": 99, "status": "sleeping"}), encoding="utf-8")
    before = sorted(p.name for p in (git_repo / ".anima" / "milestones").iterdir())
    done = anima("run", str(git_repo), "--headless", env=fake_env, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    assert str(state) in done.stderr and "newer Anima" in done.stderr
    assert sorted(p.name for p in (git_repo / ".anima" / "milestones").iterdir()) == before


def anima_to_a_reader_gone(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`anima ARGS | head -1` with `head` long gone: stdout is a pipe nobody reads."""
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    reader, writer = os.pipe()
    os.close(reader)
    with subprocess.Popen([*command, *args], stdout=writer, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True,
                          env={**os.environ, **(env or {})}) as proc:
        os.close(writer)
        _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_output_to_a_reader_that_went_away_does_not_change_the_outcome(
        git_repo: Path, fake_env: dict[str, str]) -> None:
    """`anima status | head -1` is a success that writes nothing; `anima run --headless |
    head` runs to its end and exits with the run's code (the headless lines are dropped)."""
    make_project(git_repo, {"m1": milestone_md("M", ["A"]),
                            "m2": "---\nrequires_human_review: true\n---\n"
                                  + milestone_md("N", ["B"])})
    for args in (["status", str(git_repo)], ["status", str(git_repo), "--json"]):
        code, err = anima_to_a_reader_gone(*args)
        assert (code, err) == (0, ""), args
    assert not (git_repo / ".anima" / "logs" / "anima.log").exists()  # status writes nothing
    code, err = anima_to_a_reader_gone("run", str(git_repo), "--headless", env=fake_env)
    assert code == 0, err
    assert "Broken pipe" not in err and "unexpected" not in err, err
    assert record(git_repo, "m1").status.value == "completed"
    assert record(git_repo, "m2").status.value == "awaiting_review"


def test_each_headless_turn_line_says_what_that_turn_cost(
        git_repo: Path, fake_claude: FakeClaude, fake_env: dict[str, str]) -> None:
    """The CLI reports a running total per process; the line is about one turn."""
    fake_claude.write_script({"developer_default": {"auto": True, "cost_usd": 0.01},
                              "acceptor_default": {"auto": True, "cost_usd": 0.01}})
    make_project(git_repo, {"m1": milestone_md("M", ["A", "B"])})
    result = anima("run", str(git_repo), "--headless", env=fake_env)
    assert result.returncode == 0, result.stderr
    developer = [line for line in result.stdout.splitlines()
                 if line.startswith("[developer] — turn done")]
    assert len(developer) == 3  # F1, F2, then all features complete
    assert all(line.endswith(", $0.0100") for line in developer), developer


def test_usage_errors_exit_2() -> None:
    assert anima("run").returncode == 2
    assert anima("resume", "/nonexistent", "x").returncode == 2


def test_the_example_gitignore_hides_every_runtime_file() -> None:
    from anima.engine.project import example_dir
    from anima.paths import RUNTIME_IGNORES

    lines = (example_dir() / ".gitignore").read_text().splitlines()
    assert [p for p in RUNTIME_IGNORES if p not in lines] == []


def test_commands_that_write_runtime_files_keep_them_ignored_by_git(
        git_repo: Path, tmp_path: Path) -> None:
    """design.md: the runtime files are ignored through `.anima/.gitignore`, which Anima adds
    when missing. `anima add`, `resume` and `abort` wrote a record and a log without it, so
    `git status` offered them for your next `git add -A`."""
    make_project(git_repo, {"m1": milestone_md("One", ["A"])})
    (git_repo / ".anima" / ".gitignore").unlink()
    source = tmp_path / "m2.md"
    source.write_text(milestone_md("Two", ["B"]), encoding="utf-8")
    run_git(git_repo, "add", ".anima")
    run_git(git_repo, "commit", "-qm", "chore: milestones")
    for command in (("add", str(git_repo), str(source)), ("resume", str(git_repo), "m2"),
                    ("abort", str(git_repo), "m1")):
        anima(*command)
        shown = run_git(git_repo, "status", "--porcelain", "--untracked-files=all")
        assert [line for line in shown.splitlines()
                if not line.endswith((".gitignore", "m2.md"))] == [], (command, shown)
    assert record(git_repo, "m1").status.value == "cancelled"


def test_status_json_is_the_records_dump_and_loads_only_what_it_needs(tmp_path: Path) -> None:
    """Scripts poll `anima status`: the output is the pydantic dump of the state and every
    record (non-ASCII intact), and a project whose milestones all have records parses no
    definition (markdown-it costs a tenth of the command), nor imports the event types, the
    redaction patterns, the agents, git or the engine (together a third of it)."""
    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    md = tmp_path / "greetings.md"
    md.write_text(milestone_md("Grüße — ünïcode", ["Grüßen", "Version"]), encoding="utf-8")
    assert anima("add", str(tmp_path), str(md)).returncode == 0
    status = subprocess.run(
        [sys.executable, "-c", "import sys; from anima.cli import main; "
         "code = main(['status', sys.argv[1], '--json']); "
         "print(sorted(m for m in sys.modules if m.split('.')[0] == 'markdown_it' or m in "
         "('anima.events', 'anima.text.redact', 'anima.agents', 'anima.git', 'git', "
         "'anima.engine', 'anima.loop')), file=sys.stderr); sys.exit(code)",
         str(tmp_path)], capture_output=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert status.stderr.decode().strip() == "[]"
    assert status.stdout.decode("utf-8") == reference_status(tmp_path)  # compact in a pipe
    assert any(m["title"] == "Grüße — ünïcode" for m in json.loads(status.stdout)["milestones"])


def test_status_json_is_indented_for_a_human_at_a_terminal(tmp_path: Path) -> None:
    """Through a pipe the JSON is compact (scripts poll it); at a terminal it is indented."""
    import pexpect

    assert anima("init", "--git-init", str(tmp_path)).returncode == 0
    command = [ANIMA] if ANIMA else [sys.executable, "-m", "anima"]
    child = pexpect.spawn(command[0], [*command[1:], "status", str(tmp_path), "--json"],
                          encoding="utf-8", timeout=60)
    shown = child.read().replace("\r\n", "\n")
    child.close()
    assert child.exitstatus == 0, shown
    assert shown.startswith('{\n  "state": {\n    "schema_version"')
    piped = anima("status", str(tmp_path), "--json").stdout
    assert "\n" not in piped.rstrip("\n") and json.loads(piped) == json.loads(shown)


def test_an_action_on_a_milestone_that_does_not_exist_says_so(git_repo: Path) -> None:
    project = make_project(git_repo, {"m1": milestone_md("One", ["A"])})
    for action in ("abort", "resume", "approve"):
        done = anima(action, str(project), "nosuch")
        assert done.returncode == 2
        assert "there is no milestone 'nosuch'" in done.stderr, done.stderr
        assert not (project / ".anima" / "milestones" / "nosuch.json").exists()
    done = anima("resume", str(project), "m1")  # added, never run: there is nothing to resume
    assert done.returncode == 2 and "is pending, not paused" in done.stderr, done.stderr
