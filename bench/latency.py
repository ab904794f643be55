#!/usr/bin/env python3
"""Latency a user feels: from dropping a milestone into a watched project to the Developer's
first prompt, and from restarting a killed Anima to the Developer working again.

Why: "drop a file in and it starts by itself" and "if it dies, it picks up where it stopped"
must feel immediate. This drives the real `python -m anima run … --headless` on a real temp
git repo with the fake `claude`, which logs when each prompt reached it and when its process
was created; the difference is the agent's own start-up (a Python process here, longer for
the real CLI, and not Anima's time), reported apart.

Targets: drop → first Developer prompt < 1 s excluding the agent's start-up (both figures
printed); restart → first Developer prompt < 3 s.

Run: `python bench/latency.py [--drops N] [--restarts N] [--keep]` (well under two minutes).
Ends with `BENCH drop_to_prompt_s=<x>`, `BENCH drop_to_prompt_excl_start_s=<x>` and
`BENCH restart_to_prompt_s=<x>` (medians over the trials).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from instant import new_project  # noqa: E402

from anima import procfs  # noqa: E402
from anima.errors import AnimaError  # noqa: E402
from anima.store.models import MilestoneStatus  # noqa: E402
from anima.store.store import Store  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "fake_claude.py"
DROP_TARGET_S = 1.0
RESTART_TARGET_S = 3.0


def milestone_md(title: str) -> str:
    return (f"# {title}\n\n## Goal\n\nMeasure {title}.\n\n## Features\n\n### Greet\n\n"
            "Print a greeting.\n\nAcceptance: it greets\n\n### Version\n\nPrint the version."
            "\n\nAcceptance: it prints it\n\n## Acceptance Criteria\n\n- [ ] it works\n")


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.005)
    raise SystemExit(f"timed out after {timeout:g}s waiting for {what}")


class Project:
    """A temp repo under `anima init`, the fake's script and prompt log, and runners."""

    def __init__(self, root: Path, script: dict[str, Any]) -> None:
        self.repo, self.fake = root / "repo", root / "fake"
        self.paths = new_project(self.repo)
        self.fake.mkdir()
        (self.fake / "script.json").write_text(json.dumps(script), encoding="utf-8")
        self.log = self.fake / "prompts.jsonl"
        self.marker = f"FAKE_CLAUDE_STATE={self.fake / 'state'}".encode()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        self.env = {**env, "ANIMA_CLAUDE_COMMAND": f"{sys.executable} {FAKE}",
                    "FAKE_CLAUDE_SCRIPT": str(self.fake / "script.json"),
                    "FAKE_CLAUDE_STATE": str(self.fake / "state"),
                    "FAKE_CLAUDE_LOG": str(self.log), "PYTHONPATH": str(REPO),
                    # The fake's script, state and log: writable inside the agents' sandbox
                    # (its private /tmp would hide them), as tests/conftest.py does.
                    "ANIMA_SANDBOX_WRITABLE": str(self.fake)}
        self.runs = 0

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.runs += 1
        with (self.fake / f"run-{self.runs}.out").open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "anima", "run", str(self.repo), "--headless", *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)

    def developer_prompts(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        entries = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [e for e in entries if e["role"] == "developer"]

    def completed(self, milestone_id: str) -> bool:
        """Completed and its completion (the merge) finished."""
        with contextlib.suppress(AnimaError):
            record = Store(self.paths).load_record(milestone_id)
            return record.status is MilestoneStatus.COMPLETED and record.completed_at is not None
        return False

    def fakes_alive(self) -> list[int]:
        """Live fake `claude` processes of this project (the runner shares their marker)."""
        found = []
        for pid in procfs.pids():
            with contextlib.suppress(OSError):
                if self.marker in Path(f"/proc/{pid}/environ").read_bytes() and \
                        str(FAKE) in procfs.cmdline(pid) and procfs.alive(pid):
                    found.append(pid)
        return found

    def kill_fakes(self) -> None:
        for pid in self.fakes_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure_drops(root: Path, count: int) -> tuple[list[float], list[float]]:
    """`--watch` on an idle project; drop a milestone (written in place, as `cp` does), wait
    for its first Developer prompt, let it complete, drop the next."""
    project = Project(root, {})  # every turn answers at once (auto)
    runner = project.start("--watch")
    totals, excluding = [], []
    try:
        wait_for(project.paths.lock.exists, "the runner to take the project")
        time.sleep(1.0)  # past its start-up: the watcher runs, the project is idle
        for i in range(1, count + 1):
            milestone_id = f"drop-{i:02d}"
            seen = len(project.developer_prompts())
            dropped = time.time()
            project.paths.milestone_md(milestone_id).write_text(
                milestone_md(f"Drop {i}"), encoding="utf-8")
            entry = wait_for(lambda n=seen: project.developer_prompts()[n:],
                             f"{milestone_id}'s first Developer prompt")[0]
            totals.append(entry["time"] - dropped)
            # The agent was spawned at `started`; from there to the prompt is its own start-up.
            excluding.append(min(entry["time"], max(entry["started"], dropped)) - dropped)
            # Idle again before the next drop: merged, agents gone.
            wait_for(lambda m=milestone_id: project.completed(m) and not project.fakes_alive(),
                     f"{milestone_id} completed")
    finally:
        stop(runner)
        project.kill_fakes()
    return totals, excluding


def measure_restarts(root: Path, count: int) -> list[float]:
    """A milestone whose Developer never answers; SIGKILL Anima during the turn, start it
    again, time until the new Developer has its (recovery) prompt. Repeated on the same
    project: each restart is killed in turn."""
    project = Project(root, {"developer_default": {"hang": True}})
    project.paths.milestone_md("m1").write_text(milestone_md("Restart"), encoding="utf-8")
    runner = project.start()
    wait_for(project.developer_prompts, "the first Developer prompt")
    figures = []
    try:
        for _ in range(count):
            runner.kill()
            runner.wait()
            wait_for(lambda: not project.fakes_alive(), "the killed run's agents to die")
            seen = len(project.developer_prompts())
            restarted = time.time()
            runner = project.start()
            entry = wait_for(lambda n=seen: project.developer_prompts()[n:],
                             "the restarted Developer's prompt")[0]
            figures.append(entry["time"] - restarted)
    finally:
        stop(runner)
        project.kill_fakes()
    return figures


def describe(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3f} s, min {min(values):.3f} s, "
            f"max {max(values):.3f} s over {len(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drops", type=int, default=6)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the temp projects")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="anima-latency-"))
    try:
        totals, excluding = measure_drops(root / "drops", args.drops)
        restarts = measure_restarts(root / "restarts", args.restarts)
    finally:
        if args.keep:
            print(f"projects kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    start_up = [t - e for t, e in zip(totals, excluding, strict=True)]
    drop, drop_excl = statistics.median(totals), statistics.median(excluding)
    restart = statistics.median(restarts)
    print(f"drop → first Developer prompt: {describe(totals)} drops "
          f"(agent start-up {statistics.median(start_up):.3f} s of it)")
    print(f"drop → first Developer prompt excluding the agent's start-up: {describe(excluding)}"
          f" drops (reference: < {DROP_TARGET_S:g} s)")
    print(f"restart after a kill → first Developer prompt: {describe(restarts)} restarts "
          f"(reference: < {RESTART_TARGET_S:g} s)")
    print(f"BENCH drop_to_prompt_s={drop:.3f}")
    print(f"BENCH drop_to_prompt_excl_start_s={drop_excl:.3f}")
    print(f"BENCH restart_to_prompt_s={restart:.3f}")


if __name__ == "__main__":
    main()
