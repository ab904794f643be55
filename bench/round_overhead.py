"""Anima's own cost per round (git checks, prompt building, persistence, events), with instant
in-process agents so the agents' time is excluded, and whether it grows with the round number.

Why: a round's own cost once grew with the milestone's history (the history check asked git
about every accepted commit, every round: quadratic over a long milestone). No per-round check
may grow with the history, and a round's git work is a handful of processes.

- `round_overhead_ms`: median over the rounds of (wall time − the agents' own time).
  Target ≤ 40 ms on an idle machine (the load average is printed: compare like with like).
- `git_processes_per_round`: median number of `git` processes Anima starts per round (all of
  them: its git layer, the push guard, the config reads; the instant agents' own git commands
  are not counted), with the most frequent commands.
- `round_overhead_growth`: median overhead of rounds 96–105 over that of rounds 6–15.
  Target ≤ 1.2.
- `round_overhead_cpu_ms`: the same as CPU time (Anima's process and the git processes it
  waited for, less the agents' turns), which a busy machine inflates far less than the wall
  time; the growth is printed for it too. Close to the idle wall time, less the fsyncs.

After round 1 (which makes the worktree, and with it writes `.git/config`) the bench waits
out git_options' racy window (a config file changed less than 2 s ago is read again at each
use, a `git config --list` each time), outside the measured time: real rounds take minutes,
the bench's a few dozen milliseconds, and its first 2 seconds would otherwise weigh on the
early rounds only.

Run: `python bench/round_overhead.py [--features N]` (about half a minute for 105 features).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import threading
import time

import instant
from instant import run_milestone

from anima.events import Event, VerdictReached
from anima.git_options import _RACY_NS

FEATURES = 105
TARGET_MS = 40.0
TARGET_GROWTH = 1.2
EARLY, LATE = (6, 15), (96, 105)  # rounds compared for the growth (medians of each window)


def cpu_seconds() -> float:
    """CPU time of this process and of the child processes it waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class GitCounter:
    """Counts the `git` processes started outside the instant agents' turns, by command, and
    the CPU time spent in those turns."""

    def __init__(self) -> None:
        self.total = 0
        self.agent_cpu = 0.0
        self.commands: collections.Counter[str] = collections.Counter()
        self._in_agent = threading.local()
        self._popen_init = subprocess.Popen.__init__

    def install(self) -> None:
        counter, original = self, self._popen_init

        def init(popen: subprocess.Popen[bytes], args: object, *rest: object,
                 **kwargs: object) -> None:
            argv = [str(a) for a in args] if isinstance(args, list | tuple) else [str(args)]
            if argv and os.path.basename(argv[0]) == "git" and \
                    not getattr(counter._in_agent, "on", False):
                counter.total += 1
                counter.commands[_command(argv)] += 1
            original(popen, args, *rest, **kwargs)  # type: ignore[arg-type]

        subprocess.Popen.__init__ = init  # type: ignore[method-assign]
        send = instant.InstantAgent.send

        def agent_send(agent: instant.InstantAgent, prompt: str,
                       waiting: object = None) -> object:
            counter._in_agent.on = True
            started = cpu_seconds()
            try:
                return send(agent, prompt, waiting)
            finally:
                counter.agent_cpu += cpu_seconds() - started
                counter._in_agent.on = False

        instant.InstantAgent.send = agent_send  # type: ignore[assignment]


def _command(argv: list[str]) -> str:
    """The git subcommand, past the global options (`-c k=v`, `--config-env=…`, …)."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in ("-c", "-C") else 1
    return " ".join(argv[i:i + 2]) if i < len(argv) else "?"


def window(values: list[float], rounds: tuple[int, int]) -> float:
    first, last = rounds
    return statistics.median(values[first - 1:last])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=FEATURES)
    args = parser.parse_args()
    counter = GitCounter()
    counter.install()
    # (wall time, agent time, git processes, CPU time, agent CPU time) at each verdict
    marks: list[tuple[float, float, int, float, float]] = []
    clock_ref = {}
    waited = [0.0]  # the wait after round 1, counted with the agents' time (not measured)

    def on_event(event: Event) -> None:
        if isinstance(event, VerdictReached):
            marks.append((time.perf_counter(), clock_ref["clock"].agent_seconds + waited[0],
                          counter.total, cpu_seconds(), counter.agent_cpu))
            if len(marks) == 1:
                started = time.perf_counter()
                time.sleep(_RACY_NS / 1e9 + 0.2)
                waited[0] += time.perf_counter() - started

    run, clock, _ = run_milestone(args.features, on_event=on_event)
    clock_ref["clock"] = clock
    load = os.getloadavg()[0]
    start_count, start_cpu = counter.total, cpu_seconds()
    start = time.perf_counter()
    phase = run.run()
    total = time.perf_counter() - start
    previous = (start, 0.0, start_count, start_cpu, 0.0)
    per_round, processes, cpu = [], [], []
    for mark in marks:
        wall, agent, count, used, agent_used = mark
        per_round.append(((wall - previous[0]) - (agent - previous[1])) * 1000)
        processes.append(count - previous[2])
        cpu.append(((used - previous[3]) - (agent_used - previous[4])) * 1000)
        previous = mark
    rounds = len(per_round)
    median = statistics.median(per_round)
    print(f"milestone of {args.features} features ended {phase} in {total:.2f} s, {rounds} "
          f"rounds; agents' own time {clock.agent_seconds:.2f} s; load average {load:.2f} at "
          f"the start on {os.cpu_count()} CPUs")
    print(f"Anima's time per round: median {median:.1f} ms, p90 "
          f"{statistics.quantiles(per_round, n=10)[-1]:.1f} ms, max {max(per_round):.1f} ms "
          f"(target: median ≤ {TARGET_MS:.0f} ms idle)")
    feature_rounds = processes[1:-1] or processes  # the first makes the worktree, the last merges
    print(f"git processes per round: median {statistics.median(feature_rounds):g} (round 1: "
          f"{processes[0]}, round 10: {processes[min(9, rounds - 1)]}, last feature round: "
          f"{processes[-2] if rounds > 1 else processes[0]}, final: {processes[-1]}); over "
          f"the run, per round: " + ", ".join(
              f"{name} {n / rounds:.1f}" for name, n in counter.commands.most_common(12)))
    print(f"Anima's CPU time per round: median {statistics.median(cpu):.1f} ms")
    print(f"BENCH round_overhead_ms={median:.1f}")
    print(f"BENCH round_overhead_cpu_ms={statistics.median(cpu):.1f}")
    print(f"BENCH git_processes_per_round={statistics.median(feature_rounds):g}")
    if rounds >= LATE[1]:
        early, late = window(per_round, EARLY), window(per_round, LATE)
        print(f"rounds {EARLY[0]}–{EARLY[1]}: median {early:.1f} ms; rounds {LATE[0]}–{LATE[1]}: "
              f"median {late:.1f} ms (target: growth ≤ {TARGET_GROWTH}); CPU time "
              f"{window(cpu, EARLY):.1f} ms → {window(cpu, LATE):.1f} ms (growth "
              f"{window(cpu, LATE) / window(cpu, EARLY):.2f})")
        print(f"BENCH round_overhead_growth={late / early:.2f}")
    else:
        print(f"(fewer than {LATE[1]} rounds: no growth figure; run with --features "
              f"{LATE[1]} or more)")


if __name__ == "__main__":
    main()
