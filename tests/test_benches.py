"""The benchmarks are run by hand, not by the suite: at least they must still import after
the code they measure moves (a moved module broke two of them once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_every_bench_imports() -> None:
    names = sorted(p.stem for p in BENCH.glob("*.py"))
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            "[importlib.import_module(n) for n in sys.argv[2:]]")
    done = subprocess.run([sys.executable, "-c", code, str(BENCH), *names], capture_output=True,
                          text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_loop_driven_without_the_engine_facade_accepts_honest_rounds() -> None:
    """`bench/instant.py` drives `MilestoneRun` itself, as any front end may: Anima's own
    writes of the record during a turn must not read as an agent's (the round_overhead bench
    once measured a rejection per milestone for it)."""
    sys.path.insert(0, str(BENCH))
    try:
        import instant
    finally:
        sys.path.remove(str(BENCH))
    run, _, _ = instant.run_milestone(3)
    run.run()
    assert [i.verdict.value for i in run.record.iterations] == ["accepted"] * 4, \
        [i.reason for i in run.record.iterations]


def test_the_round_overhead_bench_runs_a_short_milestone() -> None:
    """Its wrapper around the instant agents' `send` once fell behind `send`'s signature:
    the bench failed at its first turn, unnoticed until it was run by hand."""
    done = subprocess.run([sys.executable, str(BENCH / "round_overhead.py"), "--features", "3"],
                          capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BENCH round_overhead_ms=" in done.stdout, done.stdout[-2000:]
