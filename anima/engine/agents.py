"""The agent factory: the one place that knows the backends (`anima.agents.claude`,
`anima.agents.codex`; an import-linter contract keeps it so). It picks each role's backend from
config (`<role>.agent`), finds its CLI (probed on a helper thread while the engine prepares),
starts one process per role with the role's profile, and keeps each on record in
`.anima/agents.json` until it is stopped."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path

from anima import procfs
from anima.agents.claude.backend import CLAUDE
from anima.agents.codex.backend import CodexBackend
from anima.agents.dialect import AgentBinary, Backend
from anima.agents.process import AgentProcess
from anima.agents.tools import describe_tool
from anima.config import Config
from anima.credentials import describe_kept
from anima.events import ROLES, EventBus, MilestonePublisher
from anima.loop.confinement import MilestoneSandbox
from anima.loop.recovery import AgentRegistry, TrackedAgent
from anima.loop.seats import Agent
from anima.paths import ProjectPaths
from anima.store.models import AgentRun, MilestoneRecord

#: (backend name, configured command): the CLI it names.
CliKey = tuple[str, str | None]  # (agent, command)


def backend_for(name: str, config: Config) -> Backend:
    """The backend a role's `agent` names."""
    return CodexBackend(config.agent_prices) if name == "codex" else CLAUDE


def find_cli(name: str, command: str | None) -> AgentBinary:
    """The CLI of backend `name` (the About box shows its version)."""
    return backend_for(name, Config()).find(command)


def cli_of(role: str, config: Config) -> CliKey:
    """The agent CLI a role runs, and the command that names it (None: found on PATH)."""
    settings = getattr(config, role)
    command = settings.command or (config.claude_command if settings.agent == "claude" else None)
    return settings.agent, command


def owns_process(argv: list[str], session_id: str) -> bool:
    """Whether a command line is an agent of any backend on `session_id` (leftovers)."""
    return any(b.owns_process(argv, session_id) for b in (CLAUDE, CodexBackend({})))


class AgentFactory:
    """Starts the agents of the engine's runs; `config` is the engine's once it is loaded."""

    def __init__(self, root: Path, bus: EventBus, registry: AgentRegistry,
                 log_line: Callable[[str], None]) -> None:
        self.root = root
        self.bus = bus
        self.config = Config()
        self._registry = registry
        self._log = log_line
        self._binaries: dict[CliKey, AgentBinary] = {}
        self._probes: dict[CliKey, Future[AgentBinary]] = {}
        self._told_lock = threading.Lock()
        self._told: str | None = None  # the credentials kept out, as last said

    def backend(self, role: str) -> Backend:
        return backend_for(getattr(self.config, role).agent, self.config)

    def binary(self, role: str) -> AgentBinary:
        """The role's CLI (from the probe `prepare` started, else found now). A failed probe
        is not kept: the next call looks again (the user may install it while Anima
        watches)."""
        key = cli_of(role, self.config)
        if key not in self._binaries:
            probe = self._probes.pop(key, None)
            found = probe.result() if probe is not None else self.backend(role).find(
                key[1], self._roles_of(key))
            self._binaries[key] = found
            self._log(f"using {key[0]} {found.version} ({' '.join(found.argv)})")
        return self._binaries[key]

    def _roles_of(self, key: CliKey) -> tuple[str, ...]:
        """The roles that run the CLI `key` names (one lookup serves them all)."""
        return tuple(role for role in ROLES if cli_of(role, self.config) == key)

    def runs(self) -> dict[str, AgentRun]:
        """What each role runs on: backend, model, CLI version (raises when a CLI is
        missing, before anything changes)."""
        return {role: AgentRun(agent=self.backend(role).name,
                               model=getattr(self.config, role).model,
                               version=self.binary(role).version) for role in ROLES}

    def tell_kept_credentials(self) -> None:
        """Name the credentials of Anima's environment kept out of the agents and checks
        (`anima.credentials`), once, and again only when a config change changes them."""
        own = {self.backend(role).name: self.backend(role).credentials(os.environ)
               for role in ROLES}
        text = describe_kept(os.environ, self.config.pass_env, own)
        with self._told_lock:
            if text is None or text == self._told:
                return
            self._told = text
        self._log(text)

    def apis(self) -> set[str]:
        """The model APIs the roles' backends speak."""
        return {self.backend(role).api for role in ROLES}

    def install_paths(self) -> tuple[Path, ...]:
        """What the sandbox keeps visible: every role's CLI."""
        found = (p for role in ROLES for p in self.binary(role).install_paths())
        return tuple(dict.fromkeys(found))

    def start_probe(self) -> None:
        """Run each CLI's `--version` on a helper thread while recovery and the first scan
        run: it is a process start of its own (about a second for some CLI versions) on the
        way to the first prompt."""
        for role in ROLES:
            key = cli_of(role, self.config)
            if key in self._binaries or key in self._probes:
                continue
            probe: Future[AgentBinary] = Future()
            backend = self.backend(role)

            def find(probe: Future[AgentBinary] = probe, backend: Backend = backend,
                     command: str | None = key[1], roles: tuple[str, ...] = self._roles_of(key)
                     ) -> None:
                try:
                    probe.set_result(backend.find(command, roles))
                except Exception as e:  # handed to binary(), which raises it where it used to
                    probe.set_exception(e)

            threading.Thread(target=find, name=f"anima-{key[0]}-probe", daemon=True).start()
            self._probes[key] = probe

    def use_config(self, config: Config) -> None:
        """A reloaded config: another agent or command is looked up again at the next start."""
        if any(cli_of(role, config) != cli_of(role, self.config) for role in ROLES):
            self.wait_for_probe(10)  # their processes end before they are dropped
            self._binaries, self._probes = {}, {}
        self.config = config

    def wait_for_probe(self, timeout: float) -> None:
        """Their `--version` processes must not outlive Anima (nothing would reap them)."""
        for probe in list(self._probes.values()):
            with contextlib.suppress(TimeoutError, CancelledError, Exception):
                probe.exception(timeout)

    def make(self, record: MilestoneRecord | None, role: str, session_id: str,
             resume: bool, sandbox: MilestoneSandbox | None = None) -> Agent:
        """A started agent, on record in `.anima/agents.json` until it is stopped (so the
        next run stops it if this one is killed)."""
        milestone_id = record.id if record else None
        model = getattr(record.sessions, f"{role}_model", None) if record else None
        # Each milestone's agents work in its worktree, never in the human's checkout.
        cwd = ProjectPaths(self.root).worktree(record.id) if record else self.root
        publisher = MilestonePublisher(
            self.bus, milestone_id, lambda e: describe_tool(e.tool, e.input, cwd))
        backend = self.backend(role)
        confine = (sandbox.confine(role, backend.prepare_home, backend.home_config)
                   if sandbox else None)
        home = sandbox.home(role) if sandbox is not None and confine is not None else None
        profile = backend.profile(role, self.config, cwd, confined=confine is not None)
        agent = AgentProcess(role, self.binary(role), profile, cwd, publisher, dialect=backend,
                             session_id=session_id, resume=resume, session_model=model,
                             turn_timeout=self.config.agent_timeout_seconds,
                             idle_timeout=self.config.agent_idle_timeout_seconds,
                             env=backend.environment(self.config, home),
                             keep={*backend.credentials(os.environ), *self.config.pass_env},
                             marker=procfs.agent_marker(self.root, milestone_id, role),
                             confine=confine)
        agent.start()
        return TrackedAgent(agent, self._registry, milestone_id)
