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

#: The agents' own git sees the real objects as well: the Acceptor reviews what is merged.
AGENT_GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1"}
