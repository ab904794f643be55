"""`claude -p` as a `Backend`: the protocol's, the faults' and the profiles' pure functions
behind one object (see the README's agent section)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from anima import credentials, sandbox
from anima.agents.claude import faults, protocol
from anima.agents.claude.discovery import find_claude
from anima.agents.claude.profiles import profile_for
from anima.agents.dialect import AgentBinary, Fault, RoleProfile
from anima.atomic import write_text_atomic
from anima.config import Config, RoleConfig
from anima.events import Event, RateLimitChanged, TurnResult

#: Its own variables: `ANTHROPIC_API_KEY`, `ANTHROPIC_AUTH_TOKEN`, `CLAUDE_CODE_OAUTH_TOKEN`,
#: `ANTHROPIC_FOUNDRY_API_KEY`…
_OWN = ("ANTHROPIC_", "CLAUDE_CODE_")
#: Its switch to a cloud provider, and that cloud's credentials it then logs in with.
_CLOUDS = {"CLAUDE_CODE_USE_BEDROCK": ("AWS_",), "CLAUDE_CODE_USE_VERTEX": ("GOOGLE_",),
           "CLAUDE_CODE_USE_FOUNDRY": ("AZURE_",)}


class ClaudeConversation:
    """stream-json both ways: nothing to open, a line per prompt, a control line to stop."""

    def __init__(self, role: str) -> None:
        self._role = role
        self._meter = protocol.ContextMeter()
        self._calls = protocol.CallLedger()

    def opening(self) -> bytes:
        return b""

    def user_message(self, prompt: str) -> bytes:
        return protocol.user_message(prompt)

    def interrupt_request(self) -> bytes:
        return protocol.interrupt_request(f"anima_{uuid.uuid4().hex[:12]}")

    def parse(self, line: bytes) -> list[Event]:
        return protocol.parse_line(self._role, line, self._meter, self._calls)

    def replies(self) -> bytes:
        return b""  # no permission prompt tool: it asks nothing

    def unsettled(self) -> TurnResult | None:
        return self._calls.unsettled(self._role)


class ClaudeBackend:
    """Claude Code in print mode with stream-json on both sides."""

    name = "claude"
    api = "anthropic"
    home_config = tuple(f".claude/{name}" for name in (
        "CLAUDE.md", "settings.json", "settings.local.json", "commands/", "agents/", "skills/",
        "hooks/", "output-styles/", "plugins/", "rules/"))

    def argv(self, binary_argv: list[str], role_config: RoleConfig, *, session_id: str,
             resume: bool, system_prompt: str, session_model: str | None = None) -> list[str]:
        return protocol.build_argv(binary_argv, role_config, session_id=session_id,
                                   resume=resume, system_prompt=system_prompt,
                                   session_model=session_model)

    def conversation(self, role: str, *, session_id: str, resume: bool,
                     system_prompt: str, role_config: RoleConfig) -> ClaudeConversation:
        return ClaudeConversation(role)

    def session_lost(self, result: TurnResult) -> bool:
        """A failed --resume answers `error_during_execution` before any turn ran."""
        return result.subtype == protocol.ERROR_DURING_EXECUTION

    def classify(self, result: TurnResult, rate_limit: RateLimitChanged | None) -> Fault | None:
        return faults.classify(result, rate_limit)

    def find(self, configured: str | None, roles: tuple[str, ...] = ()) -> AgentBinary:
        return find_claude(configured, roles)

    def profile(self, role: str, config: Config, tree: Path, *,
                confined: bool = False) -> RoleProfile:
        return profile_for(role, config)  # `--setting-sources` keeps any tree out

    def owns_process(self, argv: list[str], session_id: str) -> bool:
        """A `claude -p` stream-json process on `session_id`: a human's own `claude --resume
        <id>` in a terminal (no `-p`, no stream-json) is never taken for an agent."""
        return session_id in argv and "-p" in argv and "stream-json" in argv

    def prepare_home(self, home: Path, real_home: Path) -> tuple[tuple[Path, Path], ...]:
        """Its state folder, a copy of `~/.claude.json` (so it skips its first-start flow),
        and a subscriber's `~/.claude/.credentials.json` bound over a placeholder."""
        state = sandbox.own_dir(home / ".claude")
        settings, real_settings = home / ".claude.json", real_home / ".claude.json"
        if not os.path.lexists(settings) and real_settings.is_file():
            write_text_atomic(settings, real_settings.read_text(encoding="utf-8"))
        return sandbox.carry_login(real_home / ".claude" / ".credentials.json",
                                   state / ".credentials.json")

    def environment(self, config: Config, home: Path | None) -> dict[str, str]:
        return {}  # its push rules are tool rules (`profile`)

    def credentials(self, environ: Mapping[str, str]) -> set[str]:
        """Its own (`_OWN`), and the cloud's it is switched to (Bedrock's `AWS_*`, Vertex's
        `GOOGLE_APPLICATION_CREDENTIALS`): a Claude agent that does not use AWS gets no AWS
        key."""
        clouds = [prefix for switch, prefixes in _CLOUDS.items()
                  if credentials.is_on(environ, switch) for prefix in prefixes]
        return credentials.with_prefix(environ, (*_OWN, *clouds))


CLAUDE = ClaudeBackend()
