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

Run: `python bench/crash_soak.py [--trials N] [--seed S] [--keep]` (default 8 trials, well
under 2 minutes). Ends with `BENCH crash_trials=<n>`, `BENCH crash_violations=<n>` (must be
0) and `BENCH crash_orphans=<n>` (must be 0), and prints the phase each kill landed in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
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

from anima.engine.project import init_project  # noqa: E402
from anima.errors import AnimaError  # noqa: E402
from anima.loop.state import expected_state  # noqa: E402
from anima.paths import ProjectPaths  # noqa: E402
from anima.store.models import MergeState, MilestoneRecord, MilestoneStatus, RoundKind, Verdict  # noqa: E402
from anima.store.store import Store  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "fake_claude.py"
FEATURES = ["Parse input", "Greet command", "Version flag", "Config file"]
SCRIPT_TURNS = 400


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=check)


def milestone_md(title: str) -> str:
    lines = [f"# {title}", "", "## Goal", "", f"Deliver {title}.", "", "## Features", ""]
    for i, feature in enumerate(FEATURES, 1):
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
            power_cut = self.rng.random() < 0.33
            frozen: set[int] = set()  # its git and its agents die with it, frozen first
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
            if proc.returncode != 3:
                break
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
        if rec.tokens_used != sum(i.tokens for i in its):
            bad.append(f"tokens_used {rec.tokens_used} != {sum(i.tokens for i in its)}")
        if abs(rec.cost_usd - sum(i.cost_usd for i in its)) > 1e-9:
            bad.append(f"cost_usd {rec.cost_usd} != {sum(i.cost_usd for i in its)}")
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
        for i in its:
            if i.commit and i.kind is not RoundKind.FINAL and i.verdict is Verdict.ACCEPTED:
                branch = rec.branch_name or ""
                if git(self.repo, "merge-base", "--is-ancestor", i.commit, branch,
                       check=False).returncode != 0:
                    bad.append(f"round {i.round} commit {i.commit[:7]} not on {branch}")
        self.violations.extend(f"{when}: {rec.id}: {b}" for b in bad)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="SIGKILLs to inflict")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp project")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="anima-crash-soak-"))
    soak = Soak(root, rng)
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
    print(f"crash soak: seed {args.seed}, {soak.kills} SIGKILLs over {soak.restarts} runs "
          f"in {elapsed:.1f} s" + (f" (kept in {root})" if args.keep else ""))
    print(f"  milestones completed: {len(soak.milestones)} x {len(FEATURES)} features, "
          f"{rounds} rounds recorded; runs that ended on their own: {soak.completed_early}; "
          f"pauses resumed: {soak.pauses}")
    print(f"  leftover agents stopped by the next run: {reaped}")
    print(f"  kills aimed at the completion window: {soak.aimed}; power cuts (git and agents "
          f"killed too): {soak.power_cuts}")
    print("  phase at the kill: " + ", ".join(f"{p} {c}" for p, c in soak.phases.most_common()))
    for v in soak.violations[:20]:
        print(f"  VIOLATION {v}")
    print(f"BENCH crash_trials={soak.kills}")
    print(f"BENCH crash_violations={len(soak.violations)}")
    print(f"BENCH crash_orphans={soak.orphans}")
    print(f"BENCH crash_soak_seconds={elapsed:.1f}")
    return 0 if not soak.violations else 1


if __name__ == "__main__":
    raise SystemExit(main())
