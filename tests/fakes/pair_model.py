"""A scripted Developer and Acceptor that either vendor's stub can play: the same decisions
whether the role runs on `claude` (the Messages stub) or `codex` (the Responses stub), so a
test can mix the two in one milestone.

The Developer commits one file per feature with a shell command, then reports the commit it
read back; the Acceptor rejects its first review when asked to, then accepts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes import api_stub, responses_stub

UNCHECKED = re.compile(r"^\s*-\s*\[( |/|!)\]\s+(F\d+)\b", re.MULTILINE)
HASH = re.compile(r"\b[0-9a-f]{40}\b")
ACCEPTOR_MARK = "You are the Acceptor agent"
#: The Developer's answer once no feature is left.
ALL_DONE = "## ALL_FEATURES_COMPLETE\n\n### Commits\n\n### Summary\nDone."


def report(feature: str, commit: str) -> str:
    """The Developer's report of a round in the format Anima asks for."""
    return (f"## Implementation Report — Round 1\n\n**Feature**: {feature}\n"
            f"**Commit**: {commit}\n**Tests**: 1 passed, 0 failed\n"
            "**Lint**: clean\n\n### Changes\n- features: the feature\n")


@dataclass(frozen=True)
class Turn:
    """One model call as the script sees it, whatever the vendor."""

    acceptor: bool
    prompts: list[str]  # the user prompts Anima sent in this session, oldest first
    tool_output: str | None  # what the last command printed, when the call follows one


@dataclass(frozen=True)
class Act:
    text: str = ""
    command: str = ""


class PairModel:
    """Plays both roles; `reject_first`: the first review is a rejection."""

    def __init__(self, reject_first: bool = False) -> None:
        self.reject_first = reject_first

    def __call__(self, turn: Turn) -> Act:
        return self.acceptor(turn) if turn.acceptor else self.developer(turn)

    def developer(self, turn: Turn) -> Act:
        prompt = turn.prompts[-1]
        found = UNCHECKED.search(prompt)
        if turn.tool_output is not None:
            commit = HASH.findall(turn.tool_output)[-1]
            feature = found.group(2) if found else "F1"
            return Act(text=report(feature, commit))
        if found is None:
            return Act(text=ALL_DONE)
        feature = found.group(2)
        fix = "REJECTED" in prompt
        name = f"features/{feature}{'-test' if fix else ''}.txt"
        return Act(command=(f"mkdir -p features && echo {feature} > {name} && git add -A && "
                            f"git commit -q -m 'feat: {feature}{' tests' if fix else ''}' && "
                            "git rev-parse HEAD"))

    def acceptor(self, turn: Turn) -> Act:
        reviews = [p for p in turn.prompts if "Review round" in p]
        if (self.reject_first and "final acceptance" not in turn.prompts[-1]
                and len(reviews) == 1):
            return Act(text="REJECTED: F1 has no test file")
        return Act(text="ACCEPTED")


def for_claude(model: Callable[[Turn], Act]) -> Callable[[dict[str, Any]], api_stub.Reply]:
    """`model` answering the Messages stub."""

    def reply(request: dict[str, Any]) -> api_stub.Reply:
        last = request["messages"][-1]
        act = model(Turn(acceptor=ACCEPTOR_MARK in api_stub.system_text(request),
                         prompts=api_stub.user_prompts(request),
                         tool_output=api_stub.message_text(last)
                         if api_stub.is_tool_result(last) else None))
        if act.command:
            return api_stub.Reply(tool_uses=[("Bash", {"command": act.command,
                                                        "description": "run"})])
        return api_stub.Reply(text=act.text)

    return reply


def codex_prompts(request: dict[str, Any]) -> list[str]:
    """The user prompts of a Responses request (Codex's own context items start with `<`)."""
    texts = [responses_stub.item_text(i) for i in request.get("input", [])
             if isinstance(i, dict) and i.get("type") == "message" and i.get("role") == "user"]
    return [t for t in texts if not t.lstrip().startswith("<")]


def for_codex(model: Callable[[Turn], Act]) -> Callable[[dict[str, Any]], responses_stub.Reply]:
    """`model` answering the Responses stub."""

    def reply(request: dict[str, Any]) -> responses_stub.Reply:
        items = request.get("input") or [{}]
        last = items[-1]
        output = responses_stub.item_text(last) \
            if last.get("type") == "function_call_output" else None
        act = model(Turn(acceptor=ACCEPTOR_MARK in responses_stub.all_text(request),
                         prompts=codex_prompts(request), tool_output=output))
        if act.command:
            return responses_stub.Reply(commands=[act.command])
        return responses_stub.Reply(text=act.text)

    return reply
