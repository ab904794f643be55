"""How Anima runs git: the project's own git code never runs in Anima's name."""

from __future__ import annotations

#: Options for every git command Anima runs: none of the repository's hooks nor an fsmonitor
#: command runs. The Developer has a shell and could plant one (a `post-checkout` hook that
#: moves main when Anima switches there to merge, a `core.fsmonitor` command that runs on
#: every `git status`); the human's own hooks still run for the human's commands.
NO_AGENT_CODE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
