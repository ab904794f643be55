#!/usr/bin/env python3
"""Per-turn cost of a persistent agent process versus a fresh process per turn, for both
backends: `claude` (stream-json vs `claude -p` per turn) and `codex` (`codex app-server` vs
`codex exec --json resume <id>` per turn).

Why: Anima keeps one process per role alive for a whole milestone because start-up dominates a
turn (~0.03 s vs ~0.6 s for claude), and chose `codex app-server` over `codex exec` on the same
measure. This re-measures both on this machine with the real CLIs against the local API stubs
(Messages, Responses), so the model's own latency is ~0 and only the process overhead remains.
Run: `python bench/turn_overhead.py` (well under 2 minutes). Prints the medians, the Codex mode
Anima uses, and `BENCH turn_overhead_ratio=<x>` / `BENCH codex_turn_overhead_ratio=<x>`
(target >= 3 for codex, >= 10 for claude).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from anima.agents.claude.backend import CLAUDE  # noqa: E402
from anima.agents.claude.discovery import find_claude  # noqa: E402
from anima.agents.claude.profiles import profile_for  # noqa: E402
from anima.agents.claude.protocol import build_argv  # noqa: E402
from anima.agents.codex.backend import CodexBackend  # noqa: E402
from anima.agents.dialect import AgentBinary  # noqa: E402
from anima.agents.process import AgentProcess  # noqa: E402
from anima.config import Config  # noqa: E402
from anima.events import DEVELOPER, EventBus  # noqa: E402
from tests.conftest import (  # noqa: E402
    CODEX_INSTALL_HINT,
    REAL_INSTALL_HINT,
    find_real_claude,
    find_real_codex,
    real_claude_env,
    real_codex_env,
)
from tests.fakes.api_stub import ApiStub  # noqa: E402
from tests.fakes.responses_stub import ResponsesStub  # noqa: E402

PERSISTENT_TURNS = 20
FRESH_TURNS = 8
TARGET_RATIO = 10.0
CODEX_TARGET_RATIO = 3.0
REPLY = "ok"


def real_claude() -> AgentBinary:
    """The newest real CLI the tests use (never the fake)."""
    path = find_real_claude()
    if path is None:
        raise SystemExit(f"no real claude CLI found; install it with: {REAL_INSTALL_HINT}")
    return find_claude(path)


def timed_turns(agent: AgentProcess) -> list[float]:
    """Start `agent`, warm it up, and time each of PERSISTENT_TURNS turns on it."""
    agent.start()
    try:
        agent.send("warm up")  # a CLI initialises lazily on its first input
        times = []
        for i in range(PERSISTENT_TURNS):
            started = time.perf_counter()
            result = agent.send(f"turn {i}: reply ok")
            times.append(time.perf_counter() - started)
            assert result.text == REPLY, result
        return times
    finally:
        agent.stop()


def persistent_turns(binary: AgentBinary, cwd: Path, env: dict[str, str]) -> list[float]:
    """Wall time of each turn on one long-lived process (start-up paid once, before)."""
    agent = AgentProcess(DEVELOPER, binary, profile_for(DEVELOPER, Config()), cwd, EventBus(),
                         session_id=str(uuid.uuid4()), turn_timeout=60, idle_timeout=60,
                         env=env, dialect=CLAUDE)
    return timed_turns(agent)


def fresh_turns(binary: AgentBinary, cwd: Path, env: dict[str, str]) -> list[float]:
    """Wall time of `claude -p PROMPT` run to completion, one process per turn."""
    profile = profile_for(DEVELOPER, Config())
    child_env = {k: v for k, v in {**os.environ, **env}.items() if k != "CLAUDECODE"}
    times = []
    for i in range(FRESH_TURNS):
        argv = build_argv(binary.argv, profile.config, session_id=str(uuid.uuid4()),
                          resume=False, system_prompt=profile.system_prompt)
        argv.remove("--input-format")
        argv.remove("stream-json")  # the first one: input; the prompt goes on the command line
        # Right after -p: --allowedTools is variadic and would swallow a trailing prompt.
        argv.insert(argv.index("-p") + 1, f"turn {i}: reply ok")
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=child_env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60)
        times.append(time.perf_counter() - started)
        if proc.returncode != 0 or '"result":"ok"' not in proc.stdout:
            raise SystemExit(f"fresh turn failed ({proc.returncode}): {proc.stderr[-500:]}\n"
                             f"{shlex.join(argv)}")
    return times


def codex_persistent_turns(binary: AgentBinary, cwd: Path, env: dict[str, str]) -> list[float]:
    """Wall time of each turn on one `codex app-server` (start-up paid once, before)."""
    backend = CodexBackend({})
    agent = AgentProcess(DEVELOPER, binary, backend.profile(DEVELOPER, Config(), cwd), cwd,
                         EventBus(), session_id="", turn_timeout=60, idle_timeout=60, env=env,
                         dialect=backend)
    return timed_turns(agent)


def codex_exec_turns(binary: AgentBinary, cwd: Path, env: dict[str, str]) -> list[float]:
    """Wall time of `codex exec --json resume <thread> PROMPT`, one process per turn (the
    first turn starts the thread and is not counted)."""
    child_env = {**os.environ, **env}
    base = [*binary.argv, "exec", "--json", "--skip-git-repo-check"]

    def run(argv: list[str]) -> tuple[float, str]:
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=child_env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60)
        if proc.returncode != 0 or '"agent_message","text":"ok"' not in proc.stdout:
            raise SystemExit(f"codex exec failed ({proc.returncode}): {proc.stderr[-500:]}\n"
                             f"{shlex.join(argv)}")
        return time.perf_counter() - started, proc.stdout

    _, out = run([*base, "start: reply ok"])
    thread = json.loads(out.splitlines()[0])["thread_id"]
    return [run([*base, "resume", thread, f"turn {i}: reply ok"])[0]
            for i in range(FRESH_TURNS)]


def codex_report() -> list[str]:
    """The codex half: its medians and ratio, or why it was skipped."""
    path = find_real_codex()
    if path is None:
        return [f"codex: not installed ({CODEX_INSTALL_HINT}); skipped"]
    binary = CodexBackend({}).find(path)
    with ResponsesStub(default=REPLY) as stub, tempfile.TemporaryDirectory() as tmp, \
            tempfile.TemporaryDirectory(dir="/var/tmp") as home:
        cwd = Path(tmp, "project")
        cwd.mkdir()
        env = real_codex_env(stub, Path(home))
        persistent = codex_persistent_turns(binary, cwd, env)
        fresh = codex_exec_turns(binary, cwd, env)
    p_ms = statistics.median(persistent) * 1000
    f_ms = statistics.median(fresh) * 1000
    ratio = f_ms / p_ms
    return [f"codex: {shlex.join(binary.argv)} ({binary.version})",
            f"codex app-server:   median {p_ms:.1f} ms/turn over {len(persistent)} turns",
            f"codex exec resume:  median {f_ms:.1f} ms/turn over {len(fresh)} turns",
            "codex mode chosen: app-server (one persistent process per role); target ratio "
            f">= {CODEX_TARGET_RATIO:g} ({'met' if ratio >= CODEX_TARGET_RATIO else 'NOT met'})",
            f"BENCH codex_app_server_turn_ms={p_ms:.1f}",
            f"BENCH codex_exec_turn_ms={f_ms:.1f}",
            f"BENCH codex_turn_overhead_ratio={ratio:.1f}"]


def main() -> int:
    binary = real_claude()
    print(f"claude: {shlex.join(binary.argv)} ({binary.version})")
    with ApiStub(default=REPLY) as stub, tempfile.TemporaryDirectory() as tmp:
        home, cwd = Path(tmp, "home"), Path(tmp, "project")
        home.mkdir()
        cwd.mkdir()
        env = real_claude_env(stub, home)
        persistent = persistent_turns(binary, cwd, env)
        fresh = fresh_turns(binary, cwd, env)
    p_ms = statistics.median(persistent) * 1000
    f_ms = statistics.median(fresh) * 1000
    ratio = f_ms / p_ms
    print(f"persistent process: median {p_ms:.1f} ms/turn over {len(persistent)} turns "
          f"(min {min(persistent) * 1000:.1f}, max {max(persistent) * 1000:.1f})")
    print(f"fresh claude -p:    median {f_ms:.1f} ms/turn over {len(fresh)} turns "
          f"(min {min(fresh) * 1000:.1f}, max {max(fresh) * 1000:.1f})")
    print(f"reference: measured once at ~30 ms vs ~600 ms; target ratio >= {TARGET_RATIO:g} "
          f"({'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    print(f"BENCH persistent_turn_ms={p_ms:.1f}")
    print(f"BENCH fresh_turn_ms={f_ms:.1f}")
    print(f"BENCH turn_overhead_ratio={ratio:.1f}")
    for line in codex_report():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
