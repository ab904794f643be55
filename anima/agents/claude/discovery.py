"""Find a working `claude` binary: config, then $ANIMA_CLAUDE_COMMAND, then PATH."""

from __future__ import annotations

from anima.agents.dialect import AgentBinary
from anima.agents.discovery import find_binary, role_keys

INSTALL_HINT = "npm install -g @anthropic-ai/claude-code"
ENV_VAR = "ANIMA_CLAUDE_COMMAND"


def find_claude(configured: str | None, roles: tuple[str, ...] = ()) -> AgentBinary:
    """`roles`: those that run it (a role's own `command` comes before `claude_command`)."""
    config_key = " / ".join(filter(None, (role_keys(roles, "command"), "claude_command")))
    return find_binary("claude", configured, config_key=config_key, env_var=ENV_VAR,
                       install_hint=INSTALL_HINT, roles=roles)
