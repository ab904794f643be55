"""Role profiles: who an agent is (its appended system prompt) and how it is started."""

from __future__ import annotations

from dataclasses import dataclass

from anima.config import Config, RoleConfig
from anima.events import ACCEPTOR, DEVELOPER, ROLES  # noqa: F401 - the roles' one home
from anima.paths import resource


@dataclass(frozen=True)
class RoleProfile:
    """One role: its name, the system prompt appended to Claude Code's, and its CLI flags."""

    role: str
    system_prompt: str
    config: RoleConfig


def load_system_prompt(role: str) -> str:
    """The role's prompt from `resources/prompts/<role>_system.md` (works from a wheel too)."""
    if role not in ROLES:
        raise ValueError(f"unknown agent role {role!r}; expected one of {ROLES}")
    return resource("prompts", f"{role}_system.md").read_text(encoding="utf-8").strip()


#: `--disallowedTools` rules that keep agents from pushing unless `allow_push` is set. The CLI
#: applies a Bash rule to every part of a compound command (`cd x && git push`).
PUSH_RULES = ("Bash(git push:*)",)


def profile_for(role: str, config: Config) -> RoleProfile:
    """Build the profile of `role` from the project's config.

    Unattended agents never push behind the human's back: the push rules are added to
    whatever tool rules the config gives, unless `allow_push` is set.
    """
    role_config = config.developer if role == DEVELOPER else config.acceptor
    if not config.allow_push:
        extra = [r for r in PUSH_RULES if r not in role_config.disallowed_tools]
        role_config = role_config.model_copy(
            update={"disallowed_tools": [*role_config.disallowed_tools, *extra]})
    return RoleProfile(role=role, system_prompt=load_system_prompt(role), config=role_config)

