#!/usr/bin/env python3
"""Crash soak: SIGKILL the headless runner at random moments, restart it, check everything.

Why: Anima must survive being killed at any instant — records valid, no round lost or counted
twice, counters equal to what the iterations say, no half-written file, no `claude` left
running — and still finish the milestone. This drives real `python -m anima run … --headless`
processes with the fake `claude` (scripted rejections, random turn delays) on a real temp git
repo, kills each one after a random delay (seeded), restarts, and checks the invariants after
every kill, after every restart and at the end. Milestones have 4 features; when one
completes the next is dropped in, so every kill lands on live work.

Kills are aimed, too: about half the trials wait for a final acceptance and kill within the
next moments (the final verdict, `completed`, the merge into main, the next milestone's start),
and a `git` on PATH that dawdles before each merge widens that window; a third of the kills
are power cuts (the runner's git and agents die with it). On top of the record invariants it
checks: a final acceptance is on record at most once; `completed` means merged into main or a
recorded reason (`pending` only right after a kill); `state.json` agrees with the records
after every run; a paused milestone means exit 3.

`--parallel N` runs N milestones at once (`max_parallel_milestones: N`, agents in the
sandbox), in batches of N of which two write the same files, so one of each pair resolves a
conflict in a merge round before main takes it. Kills are drawn at random moments, around
merges and inside conflict rounds (24 by default); after every kill and at the end it checks,
besides the records: no milestone merged into main twice, every merge commit on main brings
a tip an accepted final or merge round judged, no accepted commit lost from its branch, the
accepted commits of a branch form a chain (every commit up to the last accepted one was in a
reviewed round's range; a completed branch has nothing after it), and at the end no worktree
of a finished milestone and no agent process left (see `ParallelSoak`).

Run: `python bench/crash_soak.py [--trials N] [--seed S] [--parallel N] [--keep]` (default 8
trials, well under 2 minutes; `--parallel 3` about a minute and a half). Ends with
`BENCH crash_trials=<n>`, `BENCH crash_violations=<n>` (must be 0) and
`BENCH crash_orphans=<n>` (must be 0), and prints the phase each kill landed in.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anima import procfs  # noqa: E402
from anima.engine.project import init_project  # noqa: E402
from anima.errors import AnimaError  # noqa: E402
from anima.loop.state import expected_state  # noqa: E402
from anima.paths import ProjectPaths  # noqa: E402
from anima.store.models import MergeState, MilestoneRecord, MilestoneStatus, RoundKind, Verdict  # noqa: E402
from anima.store.store import Store  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "fake_claude.py"
FEATURES = ["Parse input", "Greet command", "Version flag", "Config file"]
SCRIPT_TURNS = 400


def git(repo: Path, *args: str, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=check,
                          env={**os.environ, **env} if env else None)


def with_developer_store(paths: ProjectPaths, milestone_id: str) -> dict[str, str]:
    """git's environment to read a milestone's branch as the next start will: after a kill
    the newest commit of a confined Developer may still be in its own object store, which
    the start takes in first."""
    return {"GIT_ALTERNATE_OBJECT_DIRECTORIES": str(paths.agent_objects(milestone_id))}


def milestone_md(title: str, features: list[str] = FEATURES) -> str:
    lines = [f"# {title}", "", "## Goal", "", f"Deliver {title}.", "", "## Features", ""]
    for i, feature in enumerate(features, 1):
        lines += [f"### {feature}", "", f"Implement {feature}.", "",
                  f"Acceptance: {feature} works; test {i} passes", ""]
    lines += ["## Acceptance Criteria", "", "- [ ] every feature works", ""]
    return "\n".join(lines)


def fake_script(rng: random.Random) -> dict[str, object]:
    """Random short delays (so kills land inside turns) and a rejection every few reviews;
    never three in a row in the script (kills may still line some up: then a human resumes)."""
    dev = [{"auto": True, "delay": round(rng.uniform(0.0, 0.35), 3)} for _ in range(SCRIPT_TURNS)]
    acc: list[dict[str, object]] = []
    for i in range(SCRIPT_TURNS):
        turn: dict[str, object] = {"delay": round(rng.uniform(0.0, 0.25), 3)}
        if i % 4 == 1 or (i % 7 == 3 and rng.random() < 0.5):
            turn["text"] = f"REJECTED: scripted rejection {i}: add a test for the edge case"
        else:
            turn["auto"] = True
        acc.append(turn)
    return {"developer": dev, "acceptor": acc}


def slow_git(folder: Path, rng: random.Random) -> Path:
    """A `git` first on PATH that waits a little (0–0.4 s) before each merge."""
    real = shutil.which("git")
    folder.mkdir()
    shim = folder / "git"
    delay = round(rng.uniform(0.05, 0.4), 3)
    shim.write_text(f'#!/bin/sh\ncase " $* " in *" merge "*) sleep {delay};; esac\n'
                    f'exec {real} "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    return folder


def descendants(root: int) -> list[int]:
    """Every live process below `root` (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_field(int(entry), "stat")
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def proc_field(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def our_fakes(marker: bytes) -> dict[int, int]:
    """Live fake `claude` processes of this soak: {pid: ppid}."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if marker not in proc_field(pid, "environ") or b"fake_claude.py" not in \
                proc_field(pid, "cmdline"):
            continue
        stat = proc_field(pid, "stat")
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] not in (b"Z", b"X"):
            found[pid] = int(fields[1])
    return found


#: What a redone round spent, as the record's notes say it (`Ledger.drop`, `settle_in_flight`).
_SPENT = re.compile(r"\$(\d+\.\d+) and (\d+) tokens")


@dataclass
class Soak:
    root: Path
    rng: random.Random
    violations: list[str] = field(default_factory=list)
    orphans: int = 0
    phases: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    restarts: int = 0
    pauses: int = 0
    completed_early: int = 0
    aimed: int = 0
    power_cuts: int = 0
    milestones: list[str] = field(default_factory=list)
    #: rounds already seen per milestone: (round, kind, feature, commit, verdict, reason)
    seen: dict[str, list[tuple[object, ...]]] = field(default_factory=dict)
    #: round count at the last human resume (consecutive_rejections restarts from there)
    resumed_at: dict[str, int] = field(default_factory=dict)
    #: a milestone that failed was resumed: the final run goes on (--parallel)
    run_again: bool = False

    def __post_init__(self) -> None:
        self.repo = self.root / "repo"
        self.fake_dir = self.root / "fake"
        self.paths = ProjectPaths(self.repo)
        self.marker = f"FAKE_CLAUDE_STATE={self.fake_dir / 'state'}".encode()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        self.env = {**env, "ANIMA_CLAUDE_COMMAND": f"{sys.executable} {FAKE}",
                    "FAKE_CLAUDE_SCRIPT": str(self.fake_dir / "script.json"),
                    "FAKE_CLAUDE_STATE": str(self.fake_dir / "state"),
                    "FAKE_CLAUDE_LOG": str(self.fake_dir / "prompts.jsonl"),
                    "PYTHONPATH": str(REPO)}
        self.run_env = {**self.env, "PATH": f"{self.root / 'slow-git'}{os.pathsep}"
                                            f"{os.environ.get('PATH', '')}"}

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        self.repo.mkdir(parents=True)
        self.fake_dir.mkdir()
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "config", "user.name", "Soak")
        git(self.repo, "config", "user.email", "soak@example.invalid")
        git(self.repo, "config", "commit.gpgsign", "false")
        (self.repo / "README.md").write_text("# soak\n", encoding="utf-8")
        git(self.repo, "add", "README.md")
        git(self.repo, "commit", "-q", "-m", "chore: initial commit")
        init_project(self.repo)
        config = json.loads(self.paths.config.read_text(encoding="utf-8"))
        config.update({"max_iterations_per_milestone": 60, "agent_timeout_seconds": 60})
        self.paths.config.write_text(json.dumps(config, indent=2), encoding="utf-8")
        (self.fake_dir / "script.json").write_text(json.dumps(fake_script(self.rng)))
        slow_git(self.root / "slow-git", self.rng)
        self.add_milestone()

    def add_milestone(self) -> None:
        milestone_id = f"soak-{len(self.milestones) + 1:02d}"
        self.milestones.append(milestone_id)
        self.paths.milestone_md(milestone_id).write_text(
            milestone_md(f"Soak {len(self.milestones)}"), encoding="utf-8")

    # ------------------------------------------------------------------ runs
    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        out = self.root / f"run-{self.restarts:03d}.out"
        self.restarts += 1
        with out.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "anima", "run", str(self.repo), "--headless"],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.run_env)
        return proc, out

    def wait_started(self, proc: subprocess.Popen[bytes], out: Path) -> None:
        """Until the runner drives (past its lock and recovery) or exits."""
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if b"[anima] using claude" in out.read_bytes():
                return
            time.sleep(0.01)

    def check_orphans(self, runner_pid: int | None, when: str) -> None:
        left = {p: pp for p, pp in our_fakes(self.marker).items() if pp != runner_pid}
        if left:
            self.orphans += len(left)
            self.violations.append(f"{when}: orphaned fake claude processes {sorted(left)}")
            for pid in left:  # do not let them disturb the next trial
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def resume(self, milestone_id: str) -> None:
        rec = self.load(milestone_id)
        self.pauses += 1
        self.resumed_at[milestone_id] = rec.rounds if rec else 0
        subprocess.run([sys.executable, "-m", "anima", "resume", str(self.repo), milestone_id],
                       env=self.env, capture_output=True, check=True)

    def settle(self, proc: subprocess.Popen[bytes], out: Path, when: str) -> None:
        """A runner that exited by itself: completed (next milestone), paused, or broken."""
        code = proc.returncode
        self.check_exit(code, when)
        if code == 0:
            if any(self.status(m) is not MilestoneStatus.COMPLETED for m in self.milestones):
                self.violations.append(f"{when}: exit 0 with unfinished milestones")
            return
        if code == 3:
            paused = [m for m in self.milestones if self.status(m) is MilestoneStatus.PAUSED]
            for m in paused:
                self.resume(m)
            if not paused:
                self.violations.append(f"{when}: exit 3 but nothing paused")
            return
        tail = out.read_text(errors="replace")[-1500:]
        self.violations.append(f"{when}: runner exited {code}:\n{tail}")

    def aim(self, proc: subprocess.Popen[bytes]) -> bool:
        """Wait (up to 60 s) until the milestone in progress is in its final acceptance, then
        a little more, so the kill lands around the verdict, `completed` and the merge."""
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            current = next((m for m in self.milestones if self.status(m)
                            is MilestoneStatus.IN_PROGRESS), None)
            rec = self.load(current) if current else None
            if rec is not None and rec.phase == "final_acceptance":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.rng.uniform(0.0, 0.7))
                return proc.poll() is None
            time.sleep(0.005)
        return proc.poll() is None

    def kill_phase(self) -> str:
        """Where the kill landed, from the records it left."""
        for m in self.milestones:
            rec = self.load(m)
            if rec is not None and rec.status is MilestoneStatus.COMPLETED and rec.merge \
                    and rec.merge.state is MergeState.PENDING:
                return "completed, merge pending"
        current = next((m for m in self.milestones
                        if self.status(m) is MilestoneStatus.IN_PROGRESS), None)
        rec = self.load(current) if current else None
        if rec is None:
            return "between milestones"
        if rec.phase == "starting" and rec.rounds == 0:
            return "starting"
        return rec.phase

    def kill(self, proc: subprocess.Popen[bytes]) -> bool:
        """SIGKILL Anima; a third of the time a power cut (its git and its agents die with
        it, frozen first). Returns whether it was one."""
        power_cut = self.rng.random() < 0.33
        frozen: set[int] = set()
        while power_cut and (new := {proc.pid, *descendants(proc.pid)} - frozen):
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= new
        proc.send_signal(signal.SIGKILL)
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        return power_cut

    def trial(self, n: int) -> None:
        proc, out = self.start()
        self.wait_started(proc, out)
        self.check_orphans(proc.pid, f"trial {n} after restart")
        aimed = self.rng.random() < 0.5
        if aimed:
            alive = self.aim(proc)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.rng.uniform(0.05, 2.5))
            alive = proc.poll() is None
        if alive:
            power_cut = self.kill(proc)
            self.kills += 1
            self.aimed += aimed
            self.power_cuts += power_cut
            self.check_files(f"trial {n} after SIGKILL", torn_tail_ok=True)
            self.phases[self.kill_phase()] += 1
            return
        self.completed_early += 1
        self.settle(proc, out, f"trial {n}")
        self.check_files(f"trial {n} after exit", torn_tail_ok=False)
        if all(self.status(m) is MilestoneStatus.COMPLETED for m in self.milestones):
            self.add_milestone()

    def finish(self) -> None:
        """Run without kills until everything is done (resuming pauses like a human)."""
        for attempt in range(10):
            proc, out = self.start()
            self.wait_started(proc, out)
            self.check_orphans(proc.pid, f"final run {attempt} after restart")
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.violations.append("final run did not finish in 300 s")
                return
            self.settle(proc, out, f"final run {attempt}")
            self.check_files(f"final run {attempt}", torn_tail_ok=False)
            if proc.returncode != 3 and not self.run_again:
                break
            self.run_again = False
        self.check_orphans(None, "the end")
        for m in self.milestones:
            rec = self.load(m)
            if rec is None or rec.status is not MilestoneStatus.COMPLETED:
                self.violations.append(f"the end: {m} is {rec.status if rec else 'missing'}")
                continue
            if not (rec.merge and rec.merge.merged
                    and rec.merge.state is MergeState.MERGED):
                self.violations.append(f"the end: {m} was not merged: {rec.merge}")
            elif git(self.repo, "merge-base", "--is-ancestor", rec.branch_name or "",
                     "main", check=False).returncode != 0:
                self.violations.append(f"the end: {m} says merged but main lacks its branch")
            if rec.in_flight.cost_usd:
                self.violations.append(f"the end: {m} has ${rec.in_flight.cost_usd:.4f} in "
                                       "flight, never settled")
            for f in rec.features:
                if not f.commits:
                    self.violations.append(f"the end: {m} {f.id} has no commit")
                for c in f.commits:
                    if git(self.repo, "merge-base", "--is-ancestor", c, "main",
                           check=False).returncode != 0:
                        self.violations.append(f"the end: {m} {f.id} commit {c[:7]} not on main")

    # ------------------------------------------------------------------ invariants
    def load(self, milestone_id: str | None) -> MilestoneRecord | None:
        if milestone_id is None or not self.paths.milestone_record(milestone_id).exists():
            return None
        return Store(self.paths).load_record(milestone_id)

    def status(self, milestone_id: str) -> MilestoneStatus | None:
        rec = self.load(milestone_id)
        return rec.status if rec else None

    def check_exit(self, code: int | None, when: str) -> None:
        """A run that ended by itself: its exit code and state.json tell the truth."""
        records = [r for m in self.milestones if (r := self.load(m)) is not None]
        if any(r.status is MilestoneStatus.PAUSED for r in records) and code != 3:
            self.violations.append(f"{when}: a milestone is paused but the run exited {code}")
        want = expected_state(records)
        got = Store(self.paths).load_state()
        if (got.status, got.current_milestone) != (want.status, want.current_milestone):
            self.violations.append(f"{when}: state.json says {got.status} "
                                   f"{got.current_milestone}, the records say {want.status} "
                                   f"{want.current_milestone}")
        for r in records:
            if r.merge is not None and r.merge.state is MergeState.PENDING:
                self.violations.append(f"{when}: {r.id}'s merge is still pending after a run")

    def check_files(self, when: str, *, torn_tail_ok: bool) -> None:
        store = Store(self.paths)
        try:
            store.load_state()
        except AnimaError as e:
            self.violations.append(f"{when}: state.json: {e}")
        agents = self.paths.anima / "agents.json"
        if agents.exists():
            try:
                json.loads(agents.read_text(encoding="utf-8"))
            except ValueError as e:
                self.violations.append(f"{when}: agents.json half-written: {e}")
        for m in self.milestones:
            try:
                rec = self.load(m)
            except AnimaError as e:
                self.violations.append(f"{when}: {e}")
                continue
            if rec is not None:
                self.check_record(rec, when)
        for jsonl in (self.paths.anima / "transcripts").glob("*/events.jsonl"):
            lines = jsonl.read_bytes().split(b"\n")
            body = lines[:-1]  # after the last newline: "" or a torn tail
            if lines[-1] and not torn_tail_ok:
                self.violations.append(f"{when}: {jsonl.name} ends in a torn line")
            for i, line in enumerate(body):
                try:
                    json.loads(line)
                except ValueError:
                    self.violations.append(f"{when}: {jsonl} line {i + 1} is half-written")
                    break

    def check_record(self, rec: MilestoneRecord, when: str) -> None:
        its = rec.iterations
        bad = []
        if [i.round for i in its] != list(range(1, len(its) + 1)):
            bad.append(f"rounds not 1..n: {[i.round for i in its]}")
        accepted = sum(1 for i in its if i.verdict is Verdict.ACCEPTED
                       and i.kind is not RoundKind.FINAL)
        if rec.iteration_count != accepted:
            bad.append(f"iteration_count {rec.iteration_count} != {accepted} accepted rounds")
        trailing = 0
        counted = [i for i in its[self.resumed_at.get(rec.id, 0):]
                   if i.kind is not RoundKind.FINAL]
        for it in reversed(counted):
            if it.verdict is Verdict.ACCEPTED:
                break
            trailing += 1
        if rec.consecutive_rejections != trailing:
            bad.append(f"consecutive_rejections {rec.consecutive_rejections} != {trailing}")
        # The totals: the rounds, and what rounds that were redone spent (said in the notes).
        redone = [m for n in rec.notes if (m := _SPENT.search(n))]
        tokens = sum(i.tokens for i in its) + sum(int(m[2]) for m in redone)
        cost = sum(i.cost_usd for i in its) + sum(float(m[1]) for m in redone)
        if rec.tokens_used != tokens:
            bad.append(f"tokens_used {rec.tokens_used} != {tokens}")
        if abs(rec.cost_usd - cost) > 1e-6:
            bad.append(f"cost_usd {rec.cost_usd} != {cost}")
        for f in rec.features:
            if f.rounds != sum(1 for i in its if i.feature == f.id):
                bad.append(f"{f.id}.rounds {f.rounds} disagrees with the iterations")
        finals = sum(1 for i in its if i.kind is RoundKind.FINAL
                     and i.verdict is Verdict.ACCEPTED)
        if finals > 1:
            bad.append(f"the final acceptance is on record {finals} times")
        if rec.status is MilestoneStatus.COMPLETED:
            if rec.merge is None:
                bad.append("completed with merge_on_complete on, but no merge on record")
            elif rec.merge.state is MergeState.FAILED and not rec.merge.detail:
                bad.append("not merged, and the record does not say why")
        now = [(i.round, i.kind, i.feature, i.commit, i.verdict, i.reason) for i in its]
        before = self.seen.get(rec.id, [])
        if now[:len(before)] != before:
            bad.append("a recorded round was lost or changed")
        self.seen[rec.id] = now
        store = with_developer_store(self.paths, rec.id)
        for i in its:
            if i.commit and i.kind is not RoundKind.FINAL and i.verdict is Verdict.ACCEPTED:
                branch = rec.branch_name or ""
                if git(self.repo, "merge-base", "--is-ancestor", i.commit, branch,
                       check=False, env=store).returncode != 0:
                    bad.append(f"round {i.round} commit {i.commit[:7]} not on {branch}")
        self.violations.extend(f"{when}: {rec.id}: {b}" for b in bad)


# ---------------------------------------------------------------------- --parallel N

PARALLEL_FEATURES = FEATURES[:3]
PARALLEL_SCRIPT_TURNS = 150
ORPHAN_GRACE_S = 5.0
#: Kinds of kill in --parallel mode and how often each is drawn.
AIMS = (("random", 0.4), ("merge", 0.3), ("conflict", 0.3))


def milestone_script(rng: random.Random, feature_dir: str) -> dict[str, object]:
    """One milestone's own script for the fake: its folder, random short delays, a rejection
    now and then (fewer than the serial soak's: three milestones share the kills)."""
    dev = [{"auto": True, "delay": round(rng.uniform(0.0, 0.35), 3)}
           for _ in range(PARALLEL_SCRIPT_TURNS)]
    acc: list[dict[str, object]] = []
    for i in range(PARALLEL_SCRIPT_TURNS):
        turn: dict[str, object] = {"delay": round(rng.uniform(0.0, 0.25), 3)}
        if i % 5 == 2 and rng.random() < 0.6:
            turn["text"] = f"REJECTED: scripted rejection {i}: add a test for the edge case"
        else:
            turn["auto"] = True
        acc.append(turn)
    return {"feature_dir": feature_dir, "developer": dev, "acceptor": acc}


def descends_from(pid: int, root: int) -> bool:
    """Whether `root` is among `pid`'s ancestors (an agent inside bubblewrap is a
    grandchild of the runner)."""
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        stat = proc_field(pid, "stat")
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2:
            return False
        pid = int(fields[1])
        if pid == root:
            return True
    return False


def describe(pid: int) -> str:
    """A process for a report: pid, state, parents, age, its agent marker and command."""
    chain, here = [], pid
    for _ in range(4):
        stat = proc_field(here, "stat")
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2:
            break
        chain.append(f"{here}{'' if here != pid else '(' + fields[0].decode() + ')'}")
        here = int(fields[1])
    ticks = os.sysconf("SC_CLK_TCK")
    stat = proc_field(pid, "stat")
    fields = stat[stat.rfind(b")") + 2:].split()
    age = ""
    with contextlib.suppress(IndexError, ValueError, OSError):
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = f", {uptime - int(fields[19]) / ticks:.1f} s old"
    command = proc_field(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")[:80]
    return (f"{' < '.join(chain)}{age}, {procfs.environ_value(pid, procfs.AGENT_VAR)}: "
            f"{command}")


def raw_record(path: Path) -> dict[str, object] | None:
    """A record as plain JSON (cheap, for aiming while the runner runs); None if unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def in_merge_round(rec: dict[str, object]) -> bool:
    """Finally accepted, in progress again, and a turn of its pair under way: a conflict
    round (main moved and the branch no longer merged cleanly)."""
    its = rec.get("iterations") or []
    final = any(i.get("kind") == "final" and i.get("verdict") == "accepted"
                for i in its if isinstance(i, dict))
    return bool(final and rec.get("status") == "in_progress"
                and rec.get("phase") in ("developer", "acceptor"))


def merging(rec: dict[str, object]) -> bool:
    """In the merge queue, or completed with the merge into main under way."""
    merge = rec.get("merge") or {}
    return rec.get("phase") in ("final_acceptance", "merging") or (
        rec.get("status") == "completed" and isinstance(merge, dict)
        and merge.get("state") == "pending")


class ParallelSoak(Soak):
    """`--parallel N`: N milestones at once (`max_parallel_milestones: N`), two of each batch
    writing the same files so that one of them must resolve a conflict in a merge round
    before main takes it. Kills are drawn at random moments, around merges (a final
    acceptance, the merge queue, `git merge` into main) and inside conflict rounds. On top
    of the serial soak's checks, after every kill and at the end: no milestone merged into
    main twice (merge commits per branch on main's first-parent history), main's every
    merge commit brings a tip an accepted final or merge round judged, no accepted commit
    lost from its branch, accepted commits form a chain (so every commit since the base up
    to the last accepted one is in a reviewed round's range, and a completed branch has
    nothing beyond it), and at the end no worktree of a finished milestone and no process
    of the agents left."""

    def __init__(self, root: Path, rng: random.Random, parallel: int) -> None:
        self.parallel = parallel
        self.aims: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()  # what the milestones in flight were doing
        self.conflict_rounds: dict[str, int] = {}  # merge rounds on record per milestone
        self.worktrees_left = 0
        self.script: dict[str, object] = {"milestones": {}}
        super().__init__(root, rng)
        # The fake's turn counters, log and script: writable inside the agents' sandbox.
        self.env["ANIMA_SANDBOX_WRITABLE"] = str(self.fake_dir)
        self.run_env["ANIMA_SANDBOX_WRITABLE"] = str(self.fake_dir)
        self.prefix = procfs.marker_prefix(self.repo)

    def setup(self) -> None:
        super().setup()
        config = json.loads(self.paths.config.read_text(encoding="utf-8"))
        config["max_parallel_milestones"] = self.parallel
        self.paths.config.write_text(json.dumps(config, indent=2), encoding="utf-8")

    def add_milestone(self) -> None:
        """A batch of `parallel`: the first two share `features/` (a conflict), the others
        write in a folder of their own."""
        batch = len(self.milestones) // self.parallel + 1
        scripts = self.script["milestones"]
        assert isinstance(scripts, dict)
        for k in range(self.parallel):
            milestone_id = f"p{batch:02d}-{k + 1}"
            scripts[milestone_id] = milestone_script(
                self.rng, "features" if k < 2 else f"features/{milestone_id}")
        (self.fake_dir / "script.json").write_text(json.dumps(self.script), encoding="utf-8")
        for k in range(self.parallel):
            milestone_id = f"p{batch:02d}-{k + 1}"
            self.milestones.append(milestone_id)
            self.paths.milestone_md(milestone_id).write_text(
                milestone_md(f"Parallel {batch}.{k + 1}", PARALLEL_FEATURES), encoding="utf-8")

    # ------------------------------------------------------------------ kills
    def raw(self) -> list[dict[str, object]]:
        return [r for m in self.milestones
                if (r := raw_record(self.paths.milestone_record(m))) is not None]

    def aim(self, proc: subprocess.Popen[bytes]) -> bool:  # type: ignore[override]
        """Draw a kind of kill and wait for its moment (up to 30 s, then kill anyway)."""
        kind = self.rng.choices([k for k, _ in AIMS], [w for _, w in AIMS])[0]
        self.last_aim = kind
        if kind == "random":
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.rng.uniform(0.05, 2.5))
            return proc.poll() is None
        wanted = merging if kind == "merge" else in_merge_round
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if any(wanted(r) for r in self.raw()):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.rng.uniform(0.0, 0.7 if kind == "merge" else 1.2))
                return proc.poll() is None
            time.sleep(0.02)
        return proc.poll() is None

    def kill_phase(self) -> str:
        """What the milestones in flight were doing (each counted), and one word for it."""
        doing = []
        for r in self.raw():
            if in_merge_round(r):
                doing.append(f"conflict round ({r.get('phase')})")
            elif merging(r):
                doing.append("merge" if r.get("status") != "completed"
                             else "merge into main")
            elif r.get("status") == "in_progress":
                doing.append(str(r.get("phase")))
        self.in_flight.update(doing)
        if any(d.startswith("conflict") for d in doing):
            return "in a conflict round"
        if any(d.startswith("merge") for d in doing):
            return "around a merge"
        return "in turns" if doing else "between milestones"

    def check_orphans(self, runner_pid: int | None, when: str) -> None:
        """A fake `claude` not below the live runner (through its bubblewrap), or at the end
        any process of the agents at all, still there after ORPHAN_GRACE_S: a killed run's
        sandbox takes its agents down with it, but a loaded machine may take a moment."""
        def strays() -> dict[int, str]:
            found = [p for p in our_fakes(self.marker)
                     if runner_pid is None or not descends_from(p, runner_pid)]
            if runner_pid is None:
                found += [p for p in procfs.marked(self.prefix) if p not in found]
            return {p: describe(p) for p in found}

        left = strays()
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = {p: d for p, d in strays().items() if p in left}
        if left:
            self.orphans += len(left)
            self.violations.append(f"{when}: orphaned agent processes, still there after "
                                   f"{ORPHAN_GRACE_S:g} s: " + "; ".join(left.values()))
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def trial(self, n: int) -> None:
        proc, out = self.start()
        self.wait_started(proc, out)
        self.check_orphans(proc.pid, f"trial {n} after restart")
        alive = self.aim(proc)
        if alive:
            power_cut = self.kill(proc)
            self.kills += 1
            self.aims[self.last_aim] += 1
            self.aimed += self.last_aim != "random"
            self.power_cuts += power_cut
            self.check_files(f"trial {n} after SIGKILL", torn_tail_ok=True)
            self.check_git(f"trial {n} after SIGKILL")
            self.phases[self.kill_phase()] += 1
            return
        self.completed_early += 1
        self.settle(proc, out, f"trial {n}")
        self.check_files(f"trial {n} after exit", torn_tail_ok=False)
        self.check_git(f"trial {n} after exit")
        if all(self.status(m) is MilestoneStatus.COMPLETED for m in self.milestones):
            self.add_milestone()

    def settle(self, proc: subprocess.Popen[bytes], out: Path, when: str) -> None:
        """As the serial soak's, but a milestone that failed (an unexpected error: a
        violation, said once with its error) is resumed like a human would, so the others'
        kills go on."""
        failed = [m for m in self.milestones if self.status(m) is MilestoneStatus.FAILED]
        if proc.returncode != 1 or not failed:
            super().settle(proc, out, when)
            return
        for m in failed:
            rec = self.load(m)
            self.violations.append(f"{when}: {m} failed: {rec.error if rec else '?'}")
            subprocess.run([sys.executable, "-m", "anima", "resume", str(self.repo), m],
                           env=self.env, capture_output=True, check=True)
        self.run_again = True

    def finish(self) -> None:
        super().finish()
        self.check_git("the end", final=True)
        listed = git(self.repo, "worktree", "list", "--porcelain").stdout
        trees = [line.split(" ", 1)[1] for line in listed.splitlines()
                 if line.startswith("worktree ")]
        done = {m for m in self.milestones if self.status(m) in (
            MilestoneStatus.COMPLETED, MilestoneStatus.CANCELLED)}
        leaked = [t for t in trees[1:] if Path(t).name in done or Path(t).name not in
                  self.milestones]
        if leaked:
            self.violations.append(f"the end: worktrees left behind: {leaked}")
        self.worktrees_left = len(trees) - 1

    # ------------------------------------------------------------------ invariants
    def check_git(self, when: str, final: bool = False) -> None:
        """main and the branches against the records (see the class)."""
        records = {m: rec for m in self.milestones if (rec := self.load(m)) is not None}
        log = git(self.repo, "log", "--first-parent", "--format=%H %P%x00%s", "main").stdout
        merged: Counter[str] = Counter()
        for line in log.splitlines():
            hashes, _, subject = line.partition("\0")
            sha, *parents = hashes.split()
            if len(parents) < 2:
                if parents and subject != "chore: initial commit":
                    self.violations.append(f"{when}: main got {sha[:7]} \"{subject}\", "
                                           "not a merge of a milestone")
                continue
            milestone = subject.removeprefix("Merge milestone/").split(":")[0]
            merged[milestone] += 1
            rec = records.get(milestone)
            judged = {i.commit for i in rec.iterations if i.verdict is Verdict.ACCEPTED
                      and i.kind in (RoundKind.FINAL, RoundKind.MERGE)} if rec else set()
            if parents[1] not in judged:
                self.violations.append(f"{when}: main's {sha[:7]} ({subject}) brought "
                                       f"{parents[1][:7]}, which no accepted final or merge "
                                       f"round of {milestone} judged")
        for milestone, count in merged.items():
            if count > 1:
                self.violations.append(f"{when}: {milestone} merged into main {count} times")
        for rec in records.values():
            if final and rec.merge is not None and rec.merge.merged \
                    and merged[rec.id] != 1:
                self.violations.append(f"{when}: {rec.id} says merged, main has "
                                       f"{merged[rec.id]} merges of it")
            self.check_branch(rec, when, merged[rec.id] > 0)

    def check_branch(self, rec: MilestoneRecord, when: str, on_main: bool) -> None:
        branch = rec.branch_name
        if not branch or not rec.base_commit:
            return
        tip = git(self.repo, "rev-parse", "-q", "--verify", f"refs/heads/{branch}",
                  check=False).stdout.strip()
        if not tip:
            self.violations.append(f"{when}: {rec.id}: {branch} is gone")
            return
        chain = [rec.base_commit] + [i.commit for i in rec.iterations
                                     if i.verdict is Verdict.ACCEPTED and i.commit]
        for older, newer in itertools.pairwise(chain):
            if git(self.repo, "merge-base", "--is-ancestor", older, newer,
                   check=False).returncode != 0:
                self.violations.append(f"{when}: {rec.id}: accepted {newer[:7]} does not "
                                       f"descend from {older[:7]}: a commit between escaped "
                                       "every review")
        store = with_developer_store(self.paths, rec.id)
        for commit in chain[1:]:
            if git(self.repo, "merge-base", "--is-ancestor", commit, tip,
                   check=False, env=store).returncode != 0:
                self.violations.append(f"{when}: {rec.id}: accepted {commit[:7]} is no "
                                       f"longer on {branch}")
        if on_main and rec.status is MilestoneStatus.COMPLETED:
            beyond = git(self.repo, "rev-list", f"{chain[-1]}..{tip}", env=store).stdout.split()
            if beyond:
                self.violations.append(f"{when}: {rec.id}: completed, with {len(beyond)} "
                                       f"commit(s) on {branch} after the last accepted one")
        self.conflict_rounds[rec.id] = sum(1 for i in rec.iterations
                                              if i.kind is RoundKind.MERGE)


def report_parallel(soak: ParallelSoak, seed: int, elapsed: float, kept: Path | None,
                    reaped: int) -> None:
    rounds = sum(len(soak.seen.get(m, [])) for m in soak.milestones)
    merge_rounds = sum(soak.conflict_rounds.values())
    print(f"crash soak --parallel {soak.parallel}: seed {seed}, {soak.kills} SIGKILLs over "
          f"{soak.restarts} runs in {elapsed:.1f} s" + (f" (kept in {kept})" if kept else ""))
    print(f"  milestones completed: {len(soak.milestones)} in batches of {soak.parallel} "
          f"(the first two of each write the same files) x {len(PARALLEL_FEATURES)} features, "
          f"{rounds} rounds recorded, {merge_rounds} of them conflict (merge) rounds in "
          f"{sum(1 for c in soak.conflict_rounds.values() if c)} milestones; runs that ended "
          f"on their own: {soak.completed_early}; pauses resumed: {soak.pauses}")
    print(f"  leftover agents stopped by the next run: {reaped}; worktrees left at the end: "
          f"{soak.worktrees_left} (of milestones not finished)")
    print("  kills drawn: " + ", ".join(f"{k} {soak.aims[k]}" for k, _ in AIMS)
          + f"; power cuts (git and agents killed too): {soak.power_cuts}")
    print("  each kill: " + ", ".join(f"{p} {c}" for p, c in soak.phases.most_common()))
    print("  what the milestones in flight were doing at the kills: " + ", ".join(
        f"{p} {c}" for p, c in soak.in_flight.most_common()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=None,
                        help="SIGKILLs to inflict (default 8; 24 with --parallel)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=None, metavar="N",
                        help="N milestones at once, two of each batch in conflict")
    parser.add_argument("--keep", action="store_true", help="keep the temp project")
    args = parser.parse_args(argv)
    if args.trials is None:
        args.trials = 24 if args.parallel else 8
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="anima-crash-soak-"))
    soak = ParallelSoak(root, rng, args.parallel) if args.parallel else Soak(root, rng)
    started = time.monotonic()
    try:
        soak.setup()
        for n in range(1, args.trials + 1):
            soak.trial(n)
            while soak.kills < n and len(soak.violations) < 50:  # it finished before the kill
                soak.trial(n)
        soak.finish()
    finally:
        # How many agents a killed run left behind that the next run had to stop.
        reaped = sum(out.read_text(errors="replace").count("stopped a leftover")
                     for out in root.glob("run-*.out"))
        leftovers = our_fakes(soak.marker)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    rounds = sum(len(soak.seen.get(m, [])) for m in soak.milestones)
    if isinstance(soak, ParallelSoak):
        report_parallel(soak, args.seed, elapsed, root if args.keep else None, reaped)
    else:
        print(f"crash soak: seed {args.seed}, {soak.kills} SIGKILLs over {soak.restarts} runs "
              f"in {elapsed:.1f} s" + (f" (kept in {root})" if args.keep else ""))
        print(f"  milestones completed: {len(soak.milestones)} x {len(FEATURES)} features, "
              f"{rounds} rounds recorded; runs that ended on their own: "
              f"{soak.completed_early}; pauses resumed: {soak.pauses}")
        print(f"  leftover agents stopped by the next run: {reaped}")
        print(f"  kills aimed at the completion window: {soak.aimed}; power cuts (git and "
              f"agents killed too): {soak.power_cuts}")
        print("  phase at the kill: " + ", ".join(f"{p} {c}"
                                                 for p, c in soak.phases.most_common()))
    for v in soak.violations[:20]:
        print(f"  VIOLATION {v}")
    print(f"BENCH crash_trials={soak.kills}")
    print(f"BENCH crash_violations={len(soak.violations)}")
    print(f"BENCH crash_orphans={soak.orphans}")
    print(f"BENCH crash_soak_seconds={elapsed:.1f}")
    return 0 if not soak.violations else 1


if __name__ == "__main__":
    raise SystemExit(main())
