"""A running milestone's page on screen: does the window stay responsive while its agents stream?

The window, project and stand-in engine of bench/board.py (six milestones, three running,
each with both agents streaming from threads of their own), but with the page of a running
milestone ("greeter") as the current tab: its Iteration Monitor shows the Developer's and the
Acceptor's panes side by side, both following their output. Their transcripts are first filled
to just short of the scrollback cap, as a page left open for a while is, so the cap is reached
while measuring.

Measured at two rates per agent: 50 lines a second (a busy agent: prose, tool calls, their
results) and 1,000 (a flood, e.g. a tool that prints a log); each after a warm-up, over its own
window: the worst gap of a 1 ms timer on the GUI thread, the most CPU time the GUI thread spent
between two ticks (our own share of a stall), the GUI thread's CPU time per second, and how
often the 1 ms timer fired.

    python bench/monitor.py [--seconds 20] [--warm-up 5]

Target: worst stall < 100 ms at 50 lines/s per agent (the figure at 1,000 is reported).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from board import (
    Responsiveness,
    Streamer,
    agent_burst,
    close_window,
    make_project,
    open_window,
    start_running,
)

TARGET_STALL_MS = 100.0
RATES = (50, 1000)  # lines a second per agent
PAGE = "greeter"


def fill_panes(app: Any, page: Any, lines_short: int) -> None:
    """Both panes' transcripts `lines_short` lines short of their cap, laid out."""
    for role, pane in page.monitor.panes.items():
        n = 0
        while pane.pending_lines + pane.view.line_count < pane.view.max_lines - lines_short:
            n += 1
            pane.feed_many(agent_burst(PAGE, role, n))
        pane.flush()
    for _ in range(20):
        app.processEvents()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured, per rate")
    parser.add_argument("--warm-up", type=float, default=5.0, help="per rate")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from ui.app import styled_application

    app = styled_application()
    results: list[tuple[int, Responsiveness, int, int]] = []
    with tempfile.TemporaryDirectory(prefix="anima-monitor-") as tmp:
        repo = make_project(Path(tmp), 6)
        window = open_window(app, repo, (1600, 1000), 6)
        running = start_running(window, 6)
        page = window.open_page(PAGE)
        assert page is not None and window.tabs.currentWidget() is page
        # The slow rate crosses the cap mid-window: a page open for long does, every
        # `max_lines / 2` lines.
        fill_panes(app, page, RATES[0] * int(args.warm_up + args.seconds / 2))
        streamers = [Streamer(window.engine.bus, m, RATES[0]) for m in running]
        gc.collect()
        gc.freeze()
        for streamer in streamers:
            streamer.start()
        for rate in RATES:
            for streamer in streamers:
                streamer.lines_per_s = rate
            warm_until = time.monotonic() + args.warm_up
            while time.monotonic() < warm_until:
                app.processEvents()
                time.sleep(0.001)
            shown = sum(p.lines_rendered for p in page.monitor.panes.values())
            probe = Responsiveness()
            probe.run(app, args.seconds)
            laid_out = sum(p.lines_rendered for p in page.monitor.panes.values()) - shown
            following = sum(p.view.following for p in page.monitor.panes.values())
            results.append((rate, probe, laid_out, following))
        close_window(app, window, streamers)

    def mark(good: bool) -> str:
        return "ok" if good else "MISSED"

    print(f"page of {PAGE!r} on screen, {len(running)} milestones x 2 agents streaming; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for rate, probe, laid_out, following in results:
        target = f"target < {TARGET_STALL_MS:.0f}   {mark(probe.worst_ms < TARGET_STALL_MS)}" \
            if rate == RATES[0] else "(a flood: reported)"
        print(f"at {rate:,} lines/s per agent: {laid_out / probe.wall:,.0f} lines/s laid out "
              f"by the page's panes, {following}/2 following")
        print(f"  worst stall      {probe.worst_ms:>10.1f}  ms        {target}")
        print(f"    of it our own  {probe.worst_own_ms:>10.1f}  ms        (the most CPU time the "
              f"GUI thread spent between two ticks)")
        print(f"  GUI thread busy  {probe.cpu / probe.wall * 1000:>10.0f}  ms/s")
        print(f"  1 ms timer       {probe.ticks_per_s:>10.0f}  ticks/s")
    for rate, probe, _, _ in results:
        print(f"BENCH monitor_worst_stall_ms_at_{rate}={probe.worst_ms:.1f}")
        print(f"BENCH monitor_own_stall_ms_at_{rate}={probe.worst_own_ms:.1f}")
        print(f"BENCH monitor_busy_ms_per_s_at_{rate}={probe.cpu / probe.wall * 1000:.0f}")
        print(f"BENCH monitor_ticks_per_s_at_{rate}={probe.ticks_per_s:.0f}")
    return 0 if results[0][1].worst_ms < TARGET_STALL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
