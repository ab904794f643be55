#!/usr/bin/env python3
"""How big the agents' context gets over a 20-round milestone, with and without rollover.

Why: every API call re-sends the whole conversation, so a Developer whose turns read ~20k
tokens of files each round fills a 200k window within a few rounds and pays for all of it on
every call. Anima ends a session between rounds once it passes `context_rollover_percent` and
starts a fresh one with the iteration history (seed 000). This runs the engine in-process with
the real CLI (`$ANIMA_REAL_CLAUDE`, else .claude-cli/) against the local Messages API stub,
whose `usage` reports the size of what it really received (chars / 4); each Developer turn
reads two generated files (~20k tokens with the Read tool's line numbers), commits, reports.
The two runs (default config; rollover off) go in parallel, one subprocess each.

Prints the largest request per round, then `BENCH max_context_tokens` (target ≤ 100000),
`BENCH total_context_tokens` (input + cache over every API call),
`BENCH total_context_tokens_no_rollover` and `BENCH context_ratio` (target ≤ 0.5).
Run: `python bench/context_growth.py` (under two minutes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anima.engine.facade import Engine  # noqa: E402
from anima.events import Compacted, Event, EventBus, PhaseChanged  # noqa: E402
from tests.conftest import find_real_claude, init_repo, real_claude_env  # noqa: E402
from tests.fakes.api_stub import (  # noqa: E402
    ApiStub,
    Reply,
    count_tokens,
    is_compaction_request,
    is_tool_result,
    message_text,
    system_text,
    user_prompts,
)
from tests.fakes.pair_model import HASH, UNCHECKED  # noqa: E402
from tests.helpers import make_project, milestone_md, record  # noqa: E402

ROUNDS = 20
FILES_PER_ROUND = 2
LINES_PER_FILE = 700
LINE = "0123456789 abcdefghij klmnopqrstuvwxyz"  # ~58 chars a line with Read's numbering
#: A model with a 200k window on every CLI version (the default model may have 1M).
MODEL = "claude-sonnet-4-5"
TARGET_MAX = 100_000
TARGET_RATIO = 0.5
ROUND = re.compile(r"This is round (\d+)")


class Model:
    """Both roles: the Developer reads this round's files, commits, reports; the Acceptor
    accepts at once (its context grows only by the review prompts)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def __call__(self, request: dict[str, Any]) -> Reply:
        if "You are the Acceptor agent" in system_text(request):
            return Reply(text="ACCEPTED")
        messages = request["messages"]
        prompt = user_prompts(request)[-1]
        found, round_no = UNCHECKED.search(prompt), ROUND.search(prompt)
        feature = found.group(2) if found else "F1"
        n = int(round_no.group(1)) if round_no else 1
        if not is_tool_result(messages[-1]):
            return Reply(tool_uses=[("Read", {"file_path": str(self.repo / data_file(n, k))})
                                    for k in range(FILES_PER_ROUND)])
        commits = HASH.findall(message_text(messages[-1]))
        if not commits:  # the files are read: commit
            command = (f"mkdir -p features && echo {feature} > features/{feature}.txt && "
                       f"git add -A && git commit -q -m 'feat: {feature}' && git rev-parse HEAD")
            return Reply(tool_uses=[("Bash", {"command": command, "description": "commit"})])
        return Reply(text=(f"## Implementation Report — Round {n}\n\n**Feature**: {feature}\n"
                           f"**Commit**: {commits[-1]}\n**Tests**: 1 passed, 0 failed\n"
                           "**Lint**: clean\n\n### Changes\n- features: the feature\n"))


def data_file(round_no: int, k: int) -> str:
    return f"data/round{round_no:02d}_{k}.txt"


def make_repo(base: Path) -> Path:
    repo = init_repo(base / "repo", {
        data_file(n, k): "".join(f"r{n:02d}f{k} {i:05d} {LINE}\n" for i in range(LINES_PER_FILE))
        for n in range(1, ROUNDS + 2) for k in range(FILES_PER_ROUND)})
    features = [f"Part {i}" for i in range(1, ROUNDS + 1)]
    return make_project(repo, {"growth": milestone_md("Growth", features)})


@dataclass
class Rounds:
    """Where each round starts in the stub's request list (the bus is synchronous)."""

    stub: ApiStub
    starts: dict[int, int] = field(default_factory=dict)
    compacted: list[tuple[int, int | None]] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        if isinstance(event, Compacted):
            self.compacted.append((event.pre_tokens, event.post_tokens))
        if isinstance(event, PhaseChanged) and event.phase == "developer":
            found = re.match(r"round (\d+)", event.reason)
            if found:
                self.starts.setdefault(int(found.group(1)), len(self.stub.requests))


def run_one(rollover: bool) -> dict[str, Any]:
    claude = find_real_claude()
    if claude is None:
        raise SystemExit("no real claude CLI: set $ANIMA_REAL_CLAUDE or install .claude-cli/")
    with tempfile.TemporaryDirectory(prefix="anima-ctx-") as tmp, ApiStub() as stub:
        repo = make_repo(Path(tmp))
        stub.default = Model(repo)
        os.environ.update(real_claude_env(stub, Path(tmp) / "home"))
        os.environ.pop("CLAUDECODE", None)
        overrides: dict[str, Any] = {
            "claude_command": claude, "max_iterations_per_milestone": ROUNDS,
            "summarizer": {"enabled": False}, "exact_token_count": False,
            "agent_timeout_seconds": 120,
            "developer": {"model": MODEL}, "acceptor": {"model": MODEL}}
        if not rollover:
            overrides["context_rollover_percent"] = None
        bus = EventBus()
        rounds = Rounds(stub)
        bus.subscribe(rounds)
        engine = Engine(repo, bus=bus, config_overrides=overrides)
        try:
            engine.run(watch=False, start_all=True)
        finally:
            engine.shutdown()
        rec = record(repo, "growth")
        sizes = [count_tokens(r) for r in stub.requests]
        bounds = [rounds.starts[n] for n in sorted(rounds.starts)] + [len(sizes)]
        per_round = [max(sizes[a:b], default=0) for a, b in pairwise(bounds)]
        return {"per_round": per_round, "max": max(sizes), "total": sum(sizes),
                "calls": len(sizes), "rounds": rec.rounds,
                "rollovers": [(r.round, r.role) for r in rec.rollovers],
                "compaction_calls": sum(1 for r in stub.requests if is_compaction_request(r)),
                "compacted": rounds.compacted}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2] == "on")))
        return
    procs = {mode: subprocess.Popen([sys.executable, __file__, "--one", mode],
                                    stdout=subprocess.PIPE, text=True) for mode in ("on", "off")}
    results = {}
    for mode, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"the {mode} run failed (exit {proc.returncode})")
        results[mode] = json.loads(out.strip().splitlines()[-1])
    on, off = results["on"], results["off"]
    print("round  largest request (tokens): rollover   no rollover")
    for i, (a, b) in enumerate(zip(on["per_round"], off["per_round"], strict=False), 1):
        print(f"{i:5d}  {a:36d}   {b:11d}")
    print(f"rounds {on['rounds']} / {off['rounds']}; API calls {on['calls']} / {off['calls']}; "
          f"rollovers {on['rollovers']}\nthe CLI compacted by itself: {on['compacted']} / "
          f"{off['compacted']} (summary calls {on['compaction_calls']} / "
          f"{off['compaction_calls']})")
    ratio = on["total"] / off["total"]
    print(f"BENCH max_context_tokens={on['max']}")
    print(f"BENCH total_context_tokens={on['total']}")
    print(f"BENCH total_context_tokens_no_rollover={off['total']}")
    print(f"BENCH context_ratio={ratio:.2f}")
    print(f"targets: max ≤ {TARGET_MAX}: {'ok' if on['max'] <= TARGET_MAX else 'MISSED'}; "
          f"ratio ≤ {TARGET_RATIO}: {'ok' if ratio <= TARGET_RATIO else 'MISSED'}")


if __name__ == "__main__":
    main()
