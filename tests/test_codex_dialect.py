"""The codex backend read from lines the real `codex app-server` (0.169.0) printed against
the Responses stub (tests/fixtures/cli_lines/codex-*): events, cost, and what each error means."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from anima.agents.codex.backend import CodexBackend
from anima.agents.dialect import FaultKind
from anima.config import Config, ModelPrice, load_config
from anima.events import (
    ACCEPTOR,
    DEVELOPER,
    Compacted,
    ContextUsage,
    Event,
    SpendSoFar,
    ToolResult,
    ToolUse,
    TurnResult,
)

LINES = Path(__file__).resolve().parent / "fixtures" / "cli_lines"
PRICE = ModelPrice(input=2.0, cached_input=0.5, output=8.0)


def replay(name: str, prices: dict[str, ModelPrice] | None = None,
           resume: bool = False) -> list[Event]:
    backend = CodexBackend({"gpt-stub": PRICE} if prices is None else prices)
    conversation = backend.conversation(DEVELOPER, session_id="t-1" if resume else "",
                                        resume=resume,
                                        system_prompt="x", role_config=Config().developer)
    events: list[Event] = []
    for line in (LINES / f"codex-{name}-0.169.0.jsonl").read_bytes().splitlines():
        events += conversation.parse(line)
    return events


def result_of(events: list[Event]) -> TurnResult:
    (result,) = [e for e in events if isinstance(e, TurnResult)]
    return result


def classify(name: str, now: float | None = None) -> tuple[FaultKind, str, float | None]:
    from anima.agents.codex import faults

    fault = faults.classify(result_of(replay(name)), now=now)
    assert fault is not None
    return fault.kind, fault.advice or fault.message, fault.resets_at


def test_a_turn_with_a_command_reads_as_tool_use_result_and_cost() -> None:
    events = replay("tool")
    (use,) = [e for e in events if isinstance(e, ToolUse)]
    (done,) = [e for e in events if isinstance(e, ToolResult)]
    assert (use.tool, use.input) == ("Bash", {"command": "echo hi"})
    assert done.content.splitlines()[-1] == "hi" and not done.is_error
    (context,) = [e for e in events if isinstance(e, ContextUsage)]
    assert context.window == 258400 and context.tokens > 0
    result = result_of(events)
    assert not result.is_error and result.text == "OK"
    usage = result.usage
    expected = (usage["input_tokens"] * PRICE.input + usage["cache_read_input_tokens"]
                * PRICE.cached_input + usage["output_tokens"] * PRICE.output) / 1e6
    assert result.turn_cost_usd == pytest.approx(expected) and expected > 0


def test_what_a_turn_spent_is_known_from_its_model_calls_before_it_ends() -> None:
    """Codex reports each model call's usage as it finishes (`thread/tokenUsage/updated`),
    before `turn/completed`: the turn's spend so far is published then (a kill of Anima
    before the result keeps it, `in_flight`), at the figure its result states."""
    events = replay("tool")
    so_far = [i for i, e in enumerate(events) if isinstance(e, SpendSoFar)]
    done = events.index(result_of(events))
    assert so_far and so_far[-1] < done
    last = events[so_far[-1]]
    assert isinstance(last, SpendSoFar) and not last.estimated
    assert (last.usage, last.cost_usd) == (result_of(events).usage,
                                           pytest.approx(result_of(events).turn_cost_usd))


def test_a_resumed_threads_repeat_of_its_last_turns_usage_is_not_counted_again() -> None:
    """On `thread/resume` codex sends the previous turn's usage again, which can arrive once
    the next turn was asked for: counted, it charged that turn for both."""
    lines = (LINES / "codex-tool-0.169.0.jsonl").read_bytes().splitlines()
    usage = next(json.loads(line) for line in lines if b"tokenUsage/updated" in line)
    usage["params"]["turnId"] = "the-turn-before-the-restart"
    usage["params"]["tokenUsage"]["last"]["inputTokens"] = 1_000_000
    started = next(i for i, line in enumerate(lines) if b'"turn/started"' in line)
    backend = CodexBackend({"gpt-stub": PRICE})
    conversation = backend.conversation(DEVELOPER, session_id="", resume=False,
                                        system_prompt="x", role_config=Config().developer)
    events: list[Event] = []
    for i, line in enumerate(lines):
        if i == started:  # the turn asked for, the repeat arrives, then codex starts it
            conversation.user_message("go")
            events += conversation.parse(json.dumps(usage).encode())
        events += conversation.parse(line)
    assert result_of(events).usage == result_of(replay("tool")).usage


def test_a_model_without_a_price_costs_nothing_and_says_so() -> None:
    events = replay("tool", prices={})
    assert result_of(events).turn_cost_usd == 0
    assert any("no price for model 'gpt-stub'" in str(getattr(e, "text", "")) for e in events)


def test_the_usage_limit_waits_until_the_time_codex_names() -> None:
    # Recorded at 20:12 UTC; Codex names the reset in local time ("try again at 11:12 PM").
    now = datetime(2026, 11, 25, 20, 12, 30).astimezone().timestamp()
    kind, message, resets_at = classify("usage", now)
    assert kind is FaultKind.USAGE_LIMIT and "hit your usage limit" in message
    assert resets_at == datetime(2026, 11, 25, 23, 12).astimezone().timestamp()


@pytest.mark.parametrize("name", ["401", "nokey"])
def test_a_refused_or_missing_key_is_a_login_problem(name: str) -> None:
    kind, advice, _ = classify(name)
    assert kind is FaultKind.AUTH and "run `codex login`" in advice


def test_a_5xx_past_the_retries_is_transient_and_an_interrupt_is_a_stop() -> None:
    assert classify("500")[0] is FaultKind.TRANSIENT
    assert classify("interrupt")[0] is FaultKind.STOPPED


def test_a_thread_that_is_gone_is_a_lost_session() -> None:
    result = result_of(replay("noconv", resume=True))
    assert CodexBackend({}).session_lost(result) and "no rollout found" in result.text


def test_each_role_picks_its_agent_and_an_old_config_still_loads(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text('{"schema_version": 1, "developer": {"model": "claude-opus-4-1"}}')
    config = load_config(old)
    assert (config.developer.agent, config.acceptor.agent) == ("claude", "claude")
    mixed = tmp_path / "mixed.json"
    mixed.write_text('{"developer": {"agent": "codex", "model": "gpt-5-codex"}, '
                     '"agent_prices": {"my-model": {"input": 1, "cached_input": 0.1, '
                     '"output": 4}}}')
    config = load_config(mixed)
    assert (config.developer.agent, config.developer.model) == ("codex", "gpt-5-codex")
    assert config.developer.allowed_tools  # the role's defaults stay
    assert set(config.agent_prices) >= {"my-model", "gpt-5-codex"}


def test_a_retry_codex_announces_shows_as_an_api_retry() -> None:
    from anima.events import ApiRetry

    conversation = CodexBackend({}).conversation(
        DEVELOPER, session_id="", resume=False, system_prompt="x",
        role_config=Config().developer)
    line = (b'{"method":"error","params":{"error":{"message":"Reconnecting... 2/5 (stream '
            b'disconnected before completion)","codexErrorInfo":{"responseStreamDisconnected":'
            b'{"httpStatusCode":502}}},"willRetry":true,"threadId":"t","turnId":"u"}}')
    (retry,) = conversation.parse(line)
    assert isinstance(retry, ApiRetry)
    # Codex does not say when it tries again: no made-up "next in 0 s"
    assert retry.describe() == ("API retry 2/5: 502 Reconnecting... 2/5 (stream disconnected "
                                "before completion)")
    line = line.replace(b"Reconnecting... 2/5 ", b"")
    (retry,) = conversation.parse(line)
    assert retry.describe() == "API retry: 502 (stream disconnected before completion)"


def test_a_plans_windows_show_in_the_pane_and_name_the_exact_reset() -> None:
    """Two turns: the first leaves the 5-hour window 91 % used, the second hits its limit."""
    from anima.agents.codex import faults
    from anima.events import RateLimitChanged

    events = replay("planlimit")
    warning, reached = [e for e in events if isinstance(e, RateLimitChanged)]
    assert warning.describe().startswith("5-hour limit 91 % used, resets ")
    assert (reached.status, reached.limit_type) == ("rejected", "five_hour")
    ok, failed = [e for e in events if isinstance(e, TurnResult)]
    assert not ok.is_error
    fault = faults.classify(failed, reached)
    assert fault is not None and fault.kind is FaultKind.USAGE_LIMIT
    assert fault.resets_at == reached.resets_at and fault.limit_type == "five_hour"


def test_a_request_codex_makes_of_anima_is_shown_not_lost() -> None:
    from anima.events import RawOutput

    conversation = CodexBackend({}).conversation(
        DEVELOPER, session_id="", resume=False, system_prompt="x",
        role_config=Config().developer)
    (shown,) = conversation.parse(b'{"id":0,"method":"item/commandExecution/requestApproval",'
                                  b'"params":{"threadId":"t","turnId":"u","itemId":"c"}}')
    assert isinstance(shown, RawOutput)
    assert "codex asked 'item/commandExecution/requestApproval'" in shown.text


def test_the_sandbox_keeps_a_clis_whole_npm_tree_visible(tmp_path: Path) -> None:
    """`@openai/codex` runs the binary of its sibling package `@openai/codex-linux-x64`: with
    only its own folder visible, a checkout under /tmp (the sandbox's private /tmp) broke
    every codex agent with "Missing optional dependency"."""
    from anima.agents.dialect import AgentBinary

    modules = tmp_path / ".codex-cli" / "node_modules"
    script = modules / "@openai" / "codex" / "bin" / "codex.js"
    script.parent.mkdir(parents=True)
    script.write_text("// the launcher\n")
    (modules / ".bin").mkdir()
    (modules / ".bin" / "codex").symlink_to("../@openai/codex/bin/codex.js")
    paths = AgentBinary([str(modules / ".bin" / "codex")], "0.1").install_paths()
    assert modules in paths and script.parent in paths


def test_an_interrupted_turn_without_a_finished_model_call_costs_nothing() -> None:
    """On interrupt codex (0.169 and 0.171) sends `thread/tokenUsage/updated` for the new turn
    with the thread's total unchanged and `last` the previous turn's last call: it used to be
    charged again to the interrupted turn."""
    conv = CodexBackend({"gpt-stub": PRICE}).conversation(
        DEVELOPER, session_id="", resume=False, system_prompt="x",
        role_config=Config().developer)
    results: list[TurnResult] = []
    for line in (LINES / "codex-interrupt-0.171.0.jsonl").read_bytes().splitlines():
        if json.loads(line).get("method") == "turn/started":
            conv.user_message("p")
        results += [e for e in conv.parse(line) if isinstance(e, TurnResult)]
    first, stopped = results
    assert first.subtype == "success" and first.usage["input_tokens"] > 0
    assert stopped.subtype == "interrupted"
    assert stopped.usage == {"input_tokens": 0, "cache_read_input_tokens": 0,
                             "output_tokens": 0}, stopped.usage
    assert stopped.turn_cost_usd == 0


def test_a_resume_asks_for_no_turn_history() -> None:
    """Without `excludeTurns` codex prints a `deprecationNotice` ("Full-history hydration is
    deprecated"); Anima reads only the thread's id and model from the answer."""
    conv = CodexBackend({}).conversation(DEVELOPER, session_id="t-1", resume=True,
                                         system_prompt="x", role_config=Config().developer)
    (resume,) = [m for m in map(json.loads, conv.opening().splitlines())
                 if m["method"] == "thread/resume"]
    assert resume["params"] == {"threadId": "t-1", "excludeTurns": True}


@pytest.mark.timeout(10)
def test_a_worktree_git_file_made_a_fifo_does_not_hang_the_acceptors_start(
        tmp_path: Path) -> None:
    """Unconfined, the Developer writes its worktree's `.git`: the Acceptor's untrusted
    projects are read from it, and a FIFO's open used to wait for a writer for ever."""
    os.mkfifo(tmp_path / ".git")
    profile = CodexBackend({}).profile(ACCEPTOR, Config(), tmp_path)
    assert f'{json.dumps(str(tmp_path))}={{trust_level="untrusted"}}' in " ".join(
        profile.config.extra_args)


def test_codex_compacting_its_context_by_itself_is_told_with_the_size_before() -> None:
    """Claude's compaction was logged and shown in the pane; Codex's (a `contextCompaction`
    item, no sizes in it) went unsaid. The size before is the context it last reported."""
    lines = (LINES / "codex-tool-0.169.0.jsonl").read_bytes().splitlines()
    conv = CodexBackend({"gpt-stub": PRICE}).conversation(
        DEVELOPER, session_id="", resume=False, system_prompt="x",
        role_config=Config().developer)
    events: list[Event] = []
    for line in lines:
        if json.loads(line).get("method") == "turn/started":
            conv.user_message("p")
        if json.loads(line).get("method") == "turn/completed":
            events += conv.parse(json.dumps({"method": "item/completed", "params": {
                "item": {"type": "contextCompaction", "id": "c1"}, "threadId": conv.thread_id,
                "turnId": "u"}}).encode())
        events += conv.parse(line)
    (context,) = [e for e in events if isinstance(e, ContextUsage)]
    (compacted,) = [e for e in events if isinstance(e, Compacted)]
    assert compacted.sizes() == f": {context.tokens} tokens"
