"""Role profiles for `claude`: the shared role prompt, and the tool rules that deny pushes."""

from __future__ import annotations

from anima.agents.dialect import RoleProfile, load_system_prompt
from anima.config import Config
from anima.events import DEVELOPER

#: `--disallowedTools` rules that keep agents from pushing unless `allow_push` is set. The CLI
#: applies a Bash rule to every part of a compound command (`cd x && git push`).
PUSH_RULES = ("Bash(git push:*)",)
#: The reviewer loads settings from its private home only: the tree it reviews is the
#: Developer's, and the CLI would take its `.claude/settings.json` (hooks, which run commands
#: in the reviewer's process and add to its prompt), its `CLAUDE.md` (instructions) and its
#: `.mcp.json` (a server the Developer chose, as the reviewer's tool). Nor from what its
#: private home holds that the Developer's code it runs can write (`anima.loop.confinement`
#: protects only its instructions and settings there): no auto memory
#: (`~/.claude/projects/<project>/memory/MEMORY.md`, read into every new session's prompt)
#: and no tool server but those named on its command line (`~/.claude.json`'s `mcpServers`,
#: whose instructions join its prompt).
REVIEWER_SETTINGS = ("--setting-sources", "user", "--settings", '{"autoMemoryEnabled": false}',
                     "--strict-mcp-config")


def profile_for(role: str, config: Config) -> RoleProfile:
    """Build the profile of `role` from the project's config.

    Unattended agents never push behind the human's back: the push rules are added to
    whatever tool rules the config gives, unless `allow_push` is set. The Acceptor gets
    `REVIEWER_SETTINGS` before the config's own extra arguments (which may override them).
    """
    role_config = config.developer if role == DEVELOPER else config.acceptor
    if role != DEVELOPER:
        role_config = role_config.model_copy(
            update={"extra_args": [*REVIEWER_SETTINGS, *role_config.extra_args]})
    if not config.allow_push:
        extra = [r for r in PUSH_RULES if r not in role_config.disallowed_tools]
        role_config = role_config.model_copy(
            update={"disallowed_tools": [*role_config.disallowed_tools, *extra]})
    return RoleProfile(role=role, system_prompt=load_system_prompt(role), config=role_config)
