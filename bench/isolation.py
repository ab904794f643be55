#!/usr/bin/env python3
"""What isolating each milestone costs: making its worktree, confining its agents, and the
drop-to-prompt latency a user feels with both in place.

Why: every milestone now starts by making `.anima/worktrees/<id>` (a `git worktree add` plus
the files `.worktreeinclude` lists), and every agent process (the whole real `claude`) starts
inside bubblewrap. Neither may make a milestone feel slow to start.

- `worktree_create_ms`: `GitRepo.add_worktree` + `copy_included` on a repository of 10,000
  tracked files, with ignored files of which `.worktreeinclude` picks a few (`.env`,
  `config/local/*.json`) and a large ignored `build/` it does not; median of a few runs, the
  worktree and its branch removed between runs (each run is a new milestone's start). The
  `git worktree add` it runs is timed apart: git's checkout is most of it. On an ext4 without
  a journal, creating files soon after many were deleted is slow in the kernel (inode
  allocation skips `recently_deleted` ones, looking each up), and the checkout grows
  several-fold: compare Anima's share, not the total, with another machine's.
- `sandbox_start_overhead_ms`: the real CLI (`.claude-cli/`, the newest the tests use)
  against the local Messages API stub, from the process start (the sandbox's preparation
  included) to its first turn's `result`, confined by `MilestoneSandbox(...).confine(
  "developer")` minus unconfined: the median of paired differences, the order alternated,
  after one warm-up each (the time to `system/init` is printed too, and bubblewrap's own cost
  on `true`). Skipped with a message when the CLI or bubblewrap is missing.
- `drop_to_prompt_excl_start_s`: `bench/latency.py` run again, now that each milestone gets a
  worktree and confined agents (with the fake `claude`); `--compare-latency` runs it once more
  with bubblewrap made unavailable.

Targets (set here; none existed): worktree < 1 s, sandbox overhead < 100 ms, drop < 1 s.

Run: `python bench/isolation.py [--runs N] [--agent-runs N] [--no-latency]
[--compare-latency]` (about a minute on an idle machine, under two on a busy one).
Ends with `BENCH worktree_create_ms=<x>`, `BENCH sandbox_start_overhead_ms=<x>` (left out
when skipped) and `BENCH drop_to_prompt_excl_start_s=<x>`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anima import sandbox  # noqa: E402
from anima.agents.claude.backend import CLAUDE  # noqa: E402
from anima.agents.claude.discovery import find_claude  # noqa: E402
from anima.agents.claude.profiles import profile_for  # noqa: E402
from anima.agents.dialect import AgentBinary  # noqa: E402
from anima.agents.process import AgentProcess  # noqa: E402
from anima.config import Config  # noqa: E402
from anima.events import (  # noqa: E402
    DEVELOPER,
    Event,
    EventBus,
    SessionStarted,
    TurnResult,
)
from anima.git import GitRepo  # noqa: E402
from anima.git.locks import git_command  # noqa: E402
from anima.git.worktree_include import copy_included, included_paths  # noqa: E402
from anima.loop.checks import Confine  # noqa: E402
from anima.loop.confinement import MilestoneSandbox  # noqa: E402
from anima.paths import ProjectPaths  # noqa: E402
from tests.conftest import REAL_INSTALL_HINT, find_real_claude, real_claude_env  # noqa: E402
from tests.fakes.api_stub import ApiStub  # noqa: E402

TRACKED_FILES = 10_000
FILES_PER_FOLDER = 100
IGNORED_BUILD_FILES = 2_000
#: Targets of this bench (none was set before it): a milestone's start may spend this on its
#: worktree, and confinement may add this to an agent's start.
WORKTREE_TARGET_MS = 1000.0
SANDBOX_TARGET_MS = 100.0
DROP_TARGET_S = 1.0
REPLY = "ok"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def ms(values: list[float]) -> str:
    return (f"median {statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, "
            f"max {max(values) * 1000:.1f}) over {len(values)}")


# --- worktree_create_ms -------------------------------------------------------------------


def big_project(root: Path) -> Path:
    """A repository of TRACKED_FILES tracked files on main, `.worktreeinclude` and ignored
    files: four it lists, and a `build/` and a `config/local/notes.txt` it does not."""
    repo = root / "big"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Bench")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    for i in range(TRACKED_FILES):
        folder = repo / "src" / f"pkg{i // FILES_PER_FOLDER:03d}"
        if i % FILES_PER_FOLDER == 0:
            folder.mkdir(parents=True)
        (folder / f"mod{i % FILES_PER_FOLDER:03d}.py").write_text(
            f'"""Module {i}."""\n\nVALUE = {i}\n\n\ndef f{i}(x):\n    return x + VALUE\n')
    (repo / ".gitignore").write_text(".env\nconfig/local/\nbuild/\n.anima/worktrees/\n")
    (repo / ".worktreeinclude").write_text(".env\nconfig/local/*.json\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "chore: a big tree")
    (repo / ".env").write_text("SECRET=not-really\n")
    (repo / "config" / "local").mkdir(parents=True)
    for name in ("db", "cache", "feature-flags"):
        (repo / "config" / "local" / f"{name}.json").write_text(f'{{"name": "{name}"}}\n')
    (repo / "config" / "local" / "notes.txt").write_text("not listed\n")
    for i in range(IGNORED_BUILD_FILES):
        folder = repo / "build" / f"out{i // FILES_PER_FOLDER:02d}"
        if i % FILES_PER_FOLDER == 0:
            folder.mkdir(parents=True)
        (folder / f"obj{i % FILES_PER_FOLDER:03d}.o").write_bytes(b"\0" * 64)
    return repo


def measure_worktrees(root: Path, runs: int) -> tuple[list[float], list[float], list[str]]:
    """(add_worktree + copy_included, the `git worktree add` inside it) times, and what was
    copied: the git command is timed where `add_worktree` runs it, so what remains is
    Anima's own share (its other git calls, `.worktreeinclude`)."""
    repo = big_project(root)
    project = GitRepo.open(repo)
    path = ProjectPaths(repo).worktree("bench")
    checkouts: list[float] = []
    run_git = project._run

    def timed(args: Sequence[str], **kwargs: Any) -> tuple[int, bytes, str]:
        started = time.perf_counter()
        try:
            return run_git(args, **kwargs)
        finally:
            if git_command(["git", *args]) == "worktree" and "add" in args:
                checkouts.append(time.perf_counter() - started)

    project._run = timed  # type: ignore[method-assign]
    totals: list[float] = []
    copied: list[str] = []
    for _ in range(runs):
        started = time.perf_counter()
        project.add_worktree(path, "milestone/bench", "main")
        copied = copy_included(repo, path, included_paths(repo))
        totals.append(time.perf_counter() - started)
        project.remove_worktree(path)
        git(repo, "branch", "-q", "-D", "milestone/bench")
    return totals, checkouts, copied


def report_worktrees(root: Path, runs: int) -> float:
    """Print the worktree figures; the median add + copy in ms."""
    totals, checkouts, copied = measure_worktrees(root, runs)
    total = statistics.median(totals) * 1000
    own = [t - c for t, c in zip(totals, checkouts, strict=True)]
    print(f"worktree of {TRACKED_FILES:,} tracked files (+{IGNORED_BUILD_FILES:,} ignored, not "
          f"listed), made and removed {runs} times: add_worktree + copy_included {ms(totals)}; "
          f"copied {', '.join(copied)}")
    print(f"  of which `git worktree add` itself {ms(checkouts)}, Anima's own share {ms(own)}")
    print(f"  (target: < {WORKTREE_TARGET_MS:g} ms, "
          f"{'met' if total < WORKTREE_TARGET_MS else 'NOT met'})")
    return total


# --- sandbox_start_overhead_ms ------------------------------------------------------------


@contextmanager
def user_home(home: Path) -> Iterator[None]:
    """HOME for this process while the sandbox prepares its private homes: they copy the
    user's `~/.claude.json` and bind the CLI's login, and the bench must not touch those."""
    home.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = before


def small_project(root: Path) -> tuple[ProjectPaths, Path]:
    repo = root / "small"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Bench")
    git(repo, "config", "user.email", "bench@example.invalid")
    (repo / "README.md").write_text("# bench\n")
    (repo / ".gitignore").write_text(".anima/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "chore: start")
    paths = ProjectPaths(repo)
    GitRepo.open(repo).add_worktree(paths.worktree("m1"), "milestone/m1", "main")
    return paths, paths.worktree("m1")


def first_turn(binary: AgentBinary, cwd: Path, env: dict[str, str],
               sandbox_of: MilestoneSandbox | None) -> tuple[float, float]:
    """Seconds from the start (the sandbox made, when confined) to `system/init` and to the
    first turn's `result`."""
    seen: dict[type, float] = {}

    def on_event(event: Event) -> None:
        if isinstance(event, SessionStarted | TurnResult):
            seen.setdefault(type(event), time.perf_counter())

    bus = EventBus()
    bus.subscribe(on_event)
    started = time.perf_counter()
    confine: Confine | None = sandbox_of.confine(DEVELOPER, CLAUDE.prepare_home) \
        if sandbox_of else None
    agent = AgentProcess(DEVELOPER, binary, profile_for(DEVELOPER, Config()), cwd, bus,
                         session_id=str(uuid.uuid4()), turn_timeout=60, idle_timeout=60,
                         env=env, confine=confine, dialect=CLAUDE)
    agent.start()
    try:
        result = agent.send("reply ok")  # the CLI initialises on its first input
    finally:
        agent.stop(grace=3.0)
    if result.text != REPLY or result.is_error:
        raise SystemExit(f"the {'confined' if confine else 'unconfined'} turn failed: {result}"
                         f"\n{agent.stderr_tail}")
    return seen[SessionStarted] - started, seen[TurnResult] - started


def bare_bwrap(c: sandbox.Confinement, runs: int = 20) -> tuple[list[float], list[float]]:
    """`true` wrapped the same way, and unwrapped: what bubblewrap alone costs."""
    wrapped: list[float] = []
    plain: list[float] = []
    for _ in range(runs):
        for argv, into in ((sandbox.wrap(["true"], c), wrapped), (["true"], plain)):
            started = time.perf_counter()
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
            into.append(time.perf_counter() - started)
    return wrapped, plain


def measure_sandbox(root: Path, runs: int) -> float | None:
    """Print the confined and unconfined starts; the overhead in ms, None when skipped."""
    path = find_real_claude()
    if path is None:
        print(f"sandbox start overhead: SKIPPED, no real claude CLI ({REAL_INSTALL_HINT})")
        return None
    if (problem := sandbox.unavailable()) is not None:
        print(f"sandbox start overhead: SKIPPED, {problem}")
        return None
    binary = find_claude(path)
    print(f"claude: {binary.argv[0]} ({binary.version})")
    with user_home(root / "user-home"), ApiStub(default=REPLY) as stub:
        paths, worktree = small_project(root)
        env = real_claude_env(stub, root / "cli-home")
        confined_sandbox = MilestoneSandbox(paths, "m1", active=True,
                                            common_dir=paths.root / ".git",
                                            visible=binary.install_paths())
        inside: list[tuple[float, float]] = []
        outside: list[tuple[float, float]] = []
        for i in range(runs + 1):  # the first of each is a warm-up (first start in a HOME)
            order = [(None, outside), (confined_sandbox, inside)]
            for sandbox_of, into in order[::-1] if i % 2 else order:  # alternate the first
                figure = first_turn(binary, worktree, env, sandbox_of)
                if i:
                    into.append(figure)
        c = sandbox.Confinement(cwd=worktree, home=root / "bare-home", tmp=root / "bare-tmp",
                                writable=(worktree,), visible=(paths.root,))
        wrapped, plain = bare_bwrap(c)
    # Each confined start is paired with the unconfined one next to it: the machine's load
    # varies more between pairs than within one.
    res_in, res_out = [f[1] for f in inside], [f[1] for f in outside]
    init_in, init_out = [f[0] for f in inside], [f[0] for f in outside]
    overhead = statistics.median(a - b for a, b in zip(res_in, res_out, strict=True)) * 1000
    init_overhead = statistics.median(
        a - b for a, b in zip(init_in, init_out, strict=True)) * 1000
    print(f"start → first result, unconfined: {ms(res_out)}")
    print(f"start → first result, confined:   {ms(res_in)}")
    print(f"start → system/init,  unconfined: {ms(init_out)}")
    print(f"start → system/init,  confined:   {ms(init_in)}")
    print(f"  (reference: bubblewrap alone, `true` wrapped {ms(wrapped)} vs plain {ms(plain)})")
    print(f"sandbox start overhead (median of {runs} paired differences): {overhead:.1f} ms to "
          f"the first result, {init_overhead:.1f} ms to system/init; difference of the "
          f"fastest starts {(min(res_in) - min(res_out)) * 1000:.1f} ms "
          f"(target: < {SANDBOX_TARGET_MS:g} ms, "
          f"{'met' if overhead < SANDBOX_TARGET_MS else 'NOT met'})")
    return overhead


# --- drop_to_prompt_excl_start_s ----------------------------------------------------------

LATENCY_FIGURE = re.compile(r"^BENCH drop_to_prompt_excl_start_s=([0-9.]+)$", re.MULTILINE)


def run_latency(unconfined: bool) -> float:
    """`bench/latency.py`'s drop figure; `unconfined` points ANIMA_BWRAP at a missing binary
    (`sandbox: "auto"` then runs the agents unconfined)."""
    env = dict(os.environ)
    if unconfined:
        env[sandbox.BWRAP_VAR] = "/nonexistent/bwrap"
    # Its restart figure is not this bench's: one restart, the least it takes.
    argv = [sys.executable, str(REPO / "bench" / "latency.py"), "--restarts", "1"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)
    found = LATENCY_FIGURE.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench/latency.py failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="worktrees made (default 3)")
    parser.add_argument("--agent-runs", type=int, default=5,
                        help="agent starts each way, after a warm-up (default 5)")
    parser.add_argument("--no-latency", action="store_true", help="skip bench/latency.py")
    parser.add_argument("--compare-latency", action="store_true",
                        help="also run bench/latency.py with bubblewrap unavailable")
    args = parser.parse_args()
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="anima-isolation-"))
    try:
        worktree_ms = report_worktrees(root / "worktrees", args.runs)
        overhead = measure_sandbox(root / "sandbox", args.agent_runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    drop = None
    if not args.no_latency:
        drop = run_latency(unconfined=False)
        free = f", {run_latency(unconfined=True):.3f} s with bubblewrap unavailable" \
            if args.compare_latency else ""
        print(f"drop → first Developer prompt excluding the agent's start-up (bench/latency.py, "
              f"fake claude, confined): {drop:.3f} s{free} (target: < {DROP_TARGET_S:g} s, "
              f"{'met' if drop < DROP_TARGET_S else 'NOT met'})")
    print(f"(took {time.monotonic() - began:.0f} s)")
    print(f"BENCH worktree_create_ms={worktree_ms:.1f}")
    if overhead is not None:
        print(f"BENCH sandbox_start_overhead_ms={overhead:.1f}")
    if drop is not None:
        print(f"BENCH drop_to_prompt_excl_start_s={drop:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
