"""Anima's own time per round (git checks, prompt building, persistence, events), with
instant in-process agents so the agents' time is excluded. Target: median ≤ 150 ms."""

from __future__ import annotations

import statistics
import time

from instant import run_milestone

from anima.events import Event, VerdictReached

FEATURES = 30
TARGET_MS = 150.0


def main() -> None:
    marks: list[tuple[float, float]] = []  # (wall time, agent time) at each verdict
    clock_ref = {}

    def on_event(event: Event) -> None:
        if isinstance(event, VerdictReached):
            marks.append((time.perf_counter(), clock_ref["clock"].agent_seconds))

    run, clock, _ = run_milestone(FEATURES, on_event=on_event)
    clock_ref["clock"] = clock
    start = time.perf_counter()
    phase = run.run()
    total = time.perf_counter() - start
    previous = (start, 0.0)
    per_round = []
    for wall, agent in marks:
        per_round.append(((wall - previous[0]) - (agent - previous[1])) * 1000)
        previous = (wall, agent)
    median = statistics.median(per_round)
    print(f"milestone of {FEATURES} features ended {phase} in {total:.2f} s, "
          f"{len(per_round)} rounds; agents' own time {clock.agent_seconds:.2f} s")
    print(f"Anima's time per round: median {median:.1f} ms, p90 "
          f"{statistics.quantiles(per_round, n=10)[-1]:.1f} ms, max {max(per_round):.1f} ms "
          f"(reference: median ≤ {TARGET_MS:.0f} ms)")
    print(f"BENCH round_overhead_ms={median:.1f}")


if __name__ == "__main__":
    main()
