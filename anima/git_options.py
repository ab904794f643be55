"""How Anima runs git: the project's own git code never runs in Anima's name."""

from __future__ import annotations

#: Options for every git command Anima runs: none of the repository's hooks nor an fsmonitor
#: command runs. The Developer has a shell and could plant one (a `post-checkout` hook that
#: moves main when Anima switches there to merge, a `core.fsmonitor` command that runs on
#: every `git status`); the human's own hooks still run for the human's commands.
#: Replacement objects (`git replace`) are ignored too: with one, a Developer could make an
#: accepted commit read as other content in every review, check and merge.
NO_AGENT_CODE = ("--no-replace-objects", "-c", "core.hooksPath=/dev/null",
                 "-c", "core.fsmonitor=false")

#: What an agent's git writes in a ref's reflog (commit, merge, reset, rebase, cherry-pick):
#: a commit on main from another worktree leaves no trace in the project tree's HEAD reflog,
#: but main's own reflog names the agent.
AGENT_REFLOG_MARK = "anima-agent"

#: The agents' own git sees the real objects as well (the Acceptor reviews what is merged),
#: and marks the ref moves it makes.
AGENT_GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1", "GIT_REFLOG_ACTION": AGENT_REFLOG_MARK}
