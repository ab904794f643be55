"""The agent factory: finds the agent CLI (probed on a helper thread while the engine
prepares), starts one process per role in the project with the role's profile, and keeps each
on record in `.anima/agents.json` until it is stopped."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path

from anima import procfs
from anima.agents.claude.dialect import CLAUDE
from anima.agents.claude.discovery import ClaudeBinary, find_claude
from anima.agents.claude.profiles import profile_for
from anima.agents.claude.protocol import describe_tool
from anima.agents.process import AgentProcess
from anima.config import Config
from anima.events import EventBus, MilestonePublisher
from anima.loop.checks import Confine
from anima.loop.recovery import AgentRegistry, TrackedAgent
from anima.loop.seats import Agent
from anima.paths import ProjectPaths
from anima.store.models import MilestoneRecord

#: The agent CLI every agent speaks (the one `Dialect` so far).
DIALECT = CLAUDE


class AgentFactory:
    """Starts the agents of the engine's runs; `config` is the engine's once it is loaded."""

    def __init__(self, root: Path, bus: EventBus, registry: AgentRegistry,
                 log_line: Callable[[str], None]) -> None:
        self.root = root
        self.bus = bus
        self.config = Config()
        self._registry = registry
        self._log = log_line
        self._binary: ClaudeBinary | None = None
        self._claude_probe: Future[ClaudeBinary] | None = None

    def claude(self) -> ClaudeBinary:
        """The CLI (from the probe `prepare` started, else found now). A failed probe is not
        kept: the next call looks again (the user may install it while Anima watches)."""
        if self._binary is None:
            probe, self._claude_probe = self._claude_probe, None
            self._binary = probe.result() if probe is not None \
                else find_claude(self.config.claude_command)
            self._log(f"using claude {self._binary.version} ({' '.join(self._binary.argv)})")
        return self._binary

    def start_probe(self) -> None:
        """Run `claude --version` on a helper thread while recovery and the first scan run:
        it is a process start of its own (about a second for some CLI versions) on the way
        to the first prompt."""
        if self._binary is not None or self._claude_probe is not None:
            return
        probe: Future[ClaudeBinary] = Future()
        command = self.config.claude_command

        def find() -> None:
            try:
                probe.set_result(find_claude(command))
            except Exception as e:  # handed to claude(), which raises it where it used to
                probe.set_exception(e)

        threading.Thread(target=find, name="anima-claude-probe", daemon=True).start()
        self._claude_probe = probe

    def use_config(self, config: Config) -> None:
        """A reloaded config: another `claude_command` is looked up again at the next start."""
        if config.claude_command != self.config.claude_command:
            self.wait_for_probe(10)  # its process ends before it is dropped
            self._binary, self._claude_probe = None, None
        self.config = config

    def wait_for_probe(self, timeout: float) -> None:
        """Its `claude --version` must not outlive Anima (nothing would reap it)."""
        if (probe := self._claude_probe) is not None:
            with contextlib.suppress(TimeoutError, CancelledError):
                probe.exception(timeout)

    def make(self, record: MilestoneRecord | None, role: str, session_id: str,
             resume: bool, confine: Confine | None = None) -> Agent:
        """A started agent, on record in `.anima/agents.json` until it is stopped (so the
        next run stops it if this one is killed)."""
        milestone_id = record.id if record else None
        model = getattr(record.sessions, f"{role}_model", None) if record else None
        # Each milestone's agents work in its worktree, never in the human's checkout.
        cwd = ProjectPaths(self.root).worktree(record.id) if record else self.root
        publisher = MilestonePublisher(
            self.bus, milestone_id, lambda e: describe_tool(e.tool, e.input, cwd))
        agent = AgentProcess(role, self.claude(), profile_for(role, self.config), cwd,
                             publisher,
                             session_id=session_id, resume=resume, session_model=model,
                             turn_timeout=self.config.agent_timeout_seconds,
                             idle_timeout=self.config.agent_idle_timeout_seconds,
                             marker=procfs.agent_marker(self.root, milestone_id, role),
                             confine=confine)
        agent.start()
        return TrackedAgent(agent, self._registry, milestone_id)
