"""Role profiles for `claude`: the shared role prompt, and the tool rules that deny pushes."""

from __future__ import annotations

from anima.agents.dialect import RoleProfile, load_system_prompt
from anima.config import Config
from anima.events import DEVELOPER

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
