"""The `claude -p` stream-json protocol as pure functions: argv, input lines, framing, parsing.

Nothing here starts a process, so every rule of the wire format is unit-tested on its own
(the same split the official Python SDK makes between its transport and `_build_command`).
"""

from __future__ import annotations

import json
from typing import Any

from anima.agents.dialect import clean_text, wire_count, wire_flag, wire_number
from anima.agents.tools import describe_tool
from anima.config import RoleConfig
from anima.events import (
    ApiRetry,
    AssistantText,
    Compacted,
    ContextUsage,
    Event,
    RateLimitChanged,
    RawOutput,
    SessionStarted,
    SpendSoFar,
    Thinking,
    ToolResult,
    ToolUse,
    TurnResult,
)
from anima.store.models import Usage
from anima.text.redact import redact_data
from anima.text.summarizer import cost_usd

#: The window assumed when the CLI's result names none (every current Claude model's default).
DEFAULT_CONTEXT_WINDOW = 200_000

# Result subtype the CLI reports for an interrupted turn and for a resume that found no session.
ERROR_DURING_EXECUTION = "error_during_execution"


def build_argv(
    binary_argv: list[str],
    role_config: RoleConfig,
    *,
    session_id: str,
    resume: bool,
    system_prompt: str,
    session_model: str | None = None,
) -> list[str]:
    """The full command line of one persistent agent process (each flag pinned against the
    real CLI by tests/test_real_claude.py).

    A resume passes the model the session started with (`session_model`, from its
    system/init) unless the config names one: 2.1.197 otherwise resumes on a smaller
    context window.
    """
    argv = [
        *binary_argv,
        "-p",
        "--input-format", "stream-json",
        "--output-format", "stream-json",
        "--verbose",
        "--resume" if resume else "--session-id", session_id,
        "--append-system-prompt", system_prompt,
        "--permission-mode", role_config.permission_mode,
    ]
    if role_config.allowed_tools:
        argv += ["--allowedTools", " ".join(role_config.allowed_tools)]
    if role_config.disallowed_tools:
        argv += ["--disallowedTools", " ".join(role_config.disallowed_tools)]
    model = role_config.model or (session_model if resume else None)
    if model:
        argv += ["--model", model]
    argv += list(role_config.extra_args)
    return argv


def _line(obj: dict[str, Any]) -> bytes:
    # ensure_ascii keeps the line free of raw U+2028 and friends that some readers split on.
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def user_message(prompt: str) -> bytes:
    """One turn: a single JSON line on the CLI's stdin."""
    return _line({"type": "user", "message": {"role": "user", "content": prompt}})


def interrupt_request(request_id: str) -> bytes:
    """Ask the CLI to abort the running turn; it answers control_response, then the result."""
    return _line({"type": "control_request", "request_id": request_id,
                  "request": {"subtype": "interrupt"}})


def _block_text(content: Any) -> str:
    """Text of a tool_result's content: a string, or a list of blocks (text kept, rest named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
                elif "type" in block:
                    parts.append(f"[{block['type']}]")
            else:
                parts.append(str(block))
        return "\n".join(parts)
    return json.dumps(content)


def _message_content(obj: dict[str, Any]) -> list[Any]:
    message = obj.get("message")
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _spent_since_last_result(obj: dict[str, Any]) -> float | None:
    """The cost the CLI itself states for this result (2.1.330+: per model, since the
    process's previous result); None when the CLI does not say (2.1.197)."""
    by_model = obj.get("model_usage_since_last_result")
    if not isinstance(by_model, dict):
        return None
    return sum(wire_number(m.get("costUSD")) for m in by_model.values() if isinstance(m, dict))


def _turn_result(role: str, obj: dict[str, Any]) -> TurnResult:
    text = obj.get("result")
    if not isinstance(text, str):
        errors = obj.get("errors")
        text = "\n".join(str(e) for e in errors) if isinstance(errors, list) else ""
    usage = obj.get("usage")
    return TurnResult(
        role=role,
        text=text,
        is_error=wire_flag(obj.get("is_error")),
        session_id=str(obj.get("session_id", "")),
        subtype=str(obj.get("subtype", "success")),
        cost_usd=wire_number(obj.get("total_cost_usd")),
        usage=_token_counts(usage),
        duration_ms=wire_count(obj.get("duration_ms")),
        num_turns=wire_count(obj.get("num_turns")),
        turn_cost_usd=_spent_since_last_result(obj),
        permission_denials=_denials(obj),
        api_error_status=_int_or_none(obj.get("api_error_status")),
        api_error_type=str(obj.get("api_error_type") or ""),
        api_error=str(obj.get("api_error") or ""),
        terminal_reason=str(obj.get("terminal_reason") or ""),
    )


def _token_counts(usage: Any) -> dict[str, Any]:
    """The result's `usage`, its token counts read as numbers (`wire_count`)."""
    if not isinstance(usage, dict):
        return {}
    return {k: wire_count(v) if k.endswith("_tokens") else v for k, v in usage.items()}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: Any) -> float | None:
    """A figure the line may leave out (a reset time): None when absent, or not one
    `wire_number` takes as it is."""
    number = wire_number(value)
    return number if number == value else None


_RATE_STATUS_RANK = {"allowed": 0, "allowed_warning": 1, "rejected": 2}


def _rate_limit(role: str, obj: dict[str, Any]) -> RateLimitChanged:
    """2.1.197 puts everything at the top; 2.1.330 may say "allowed" there and keep the
    warning in `unifiedWindows[<type>]`: the worse of the two counts."""
    info = obj.get("rate_limit_info")
    info = info if isinstance(info, dict) else {}
    limit_type = str(info.get("rateLimitType") or "")
    windows = info.get("unifiedWindows")
    window = windows.get(limit_type) if isinstance(windows, dict) else None
    window = window if isinstance(window, dict) else {}
    status = str(info.get("status") or "allowed")
    if _RATE_STATUS_RANK.get(str(window.get("status")), -1) > _RATE_STATUS_RANK.get(status, 0):
        status = str(window["status"])
    utilization = _float_or_none(info.get("utilization"))
    return RateLimitChanged(
        role=role, status=status,
        resets_at=_float_or_none(info.get("resetsAt")) or _float_or_none(window.get("resetsAt")),
        limit_type=limit_type,
        utilization=utilization if utilization is not None
        else _float_or_none(window.get("utilization")),
    )


def _denials(obj: dict[str, Any]) -> tuple[str, ...]:
    """The result's `permission_denials` ({tool_name, tool_input, …} each), described.

    The input is redacted before it is described: the description keys off one value and cuts
    it to a line, which can drop what marks a secret (a `password` key, a URL's `@`)."""
    found = obj.get("permission_denials")
    if not isinstance(found, list):
        return ()
    return tuple(describe_tool(str(d.get("tool_name", "")), _redacted_input(d.get("tool_input")))
                 for d in found if isinstance(d, dict))


def _redacted_input(tool_input: Any) -> dict[str, Any]:
    cleaned = redact_data(tool_input) if isinstance(tool_input, dict) else {}
    return cleaned if isinstance(cleaned, dict) else {}


class ContextMeter:
    """Follows one process's context in use: the last main-loop API call's input + cache
    tokens (from its `assistant` lines) and the window the `result` line reports.

    The figure costs nothing: it rides on lines the CLI prints anyway (captured in
    tests/fixtures/cli_lines/). A sub-agent's lines (`parent_tool_use_id` set) are another
    context and are skipped.
    """

    def __init__(self) -> None:
        self.tokens: int | None = None
        self.model = ""

    def saw_assistant(self, obj: dict[str, Any]) -> None:
        message = obj.get("message")
        if obj.get("parent_tool_use_id") or not isinstance(message, dict):
            return
        usage = message.get("usage")
        if isinstance(usage, dict):
            self.tokens = (wire_count(usage.get("input_tokens"))
                           + wire_count(usage.get("cache_read_input_tokens"))
                           + wire_count(usage.get("cache_creation_input_tokens")))
            self.model = str(message.get("model") or "")

    def at_result(self, role: str, obj: dict[str, Any]) -> ContextUsage | None:
        """The figure after a turn, or None when no API call reported usage yet."""
        if self.tokens is None:
            return None
        by_model = obj.get("modelUsage")
        windows = {name: wire_count(u.get("contextWindow"))
                   for name, u in (by_model if isinstance(by_model, dict) else {}).items()
                   if isinstance(u, dict)}
        window = windows.get(self.model) or max(windows.values(), default=0) \
            or DEFAULT_CONTEXT_WINDOW
        return ContextUsage(role=role, session_id=str(obj.get("session_id", "")),
                            tokens=self.tokens, window=window)


class CallLedger:
    """The model calls a process reported (`assistant` lines, a sub-agent's too: each is
    paid) since its last `result`. Only the result states a cost: until it comes (and when
    the process ends before it, killed after a timeout), these are what the turn spent,
    priced at the model's list price (`PRICES_PER_MTOK`; an unknown model's tokens count,
    at $0)."""

    def __init__(self) -> None:
        #: message id -> (model, usage): the CLI prints one line per content block, each
        #: with its message's usage so far
        self._calls: dict[str, tuple[str, Usage]] = {}

    def saw_assistant(self, obj: dict[str, Any]) -> bool:
        """Count the line's call; whether that changed what was spent (the next block of
        a message often repeats its usage)."""
        message = obj.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("usage"), dict):
            return False
        key = str(message.get("id") or f"call-{len(self._calls)}")
        call = (str(message.get("model") or ""), Usage.from_api(_token_counts(message["usage"])))
        if self._calls.get(key) == call:
            return False
        self._calls[key] = call
        return True

    def settled(self) -> None:
        """A result came: it states what they cost."""
        self._calls.clear()

    def _spent(self) -> tuple[Usage, float]:
        return (sum((u for _, u in self._calls.values()), Usage()),
                sum(cost_usd(model, u) for model, u in self._calls.values()))

    def so_far(self, role: str) -> SpendSoFar:
        usage, spent = self._spent()
        return SpendSoFar(role=role, usage=usage.model_dump(), cost_usd=spent, estimated=True)

    def unsettled(self, role: str) -> TurnResult | None:
        if not self._calls:
            return None
        usage, spent = self._spent()
        return TurnResult(role=role, text="the process ended before its turn did",
                          is_error=True, session_id="", subtype="error_during_execution",
                          usage=usage.model_dump(), turn_cost_usd=spent, estimated=True)


def _compacted(role: str, obj: dict[str, Any]) -> Compacted:
    meta = obj.get("compact_metadata")
    meta = meta if isinstance(meta, dict) else {}
    post = meta.get("post_tokens")
    return Compacted(role=role, trigger=str(meta.get("trigger") or "auto"),
                     pre_tokens=wire_count(meta.get("pre_tokens")),
                     post_tokens=wire_count(post) if post is not None else None)


def parse_line(role: str, line: bytes | str, meter: ContextMeter | None = None,
               calls: CallLedger | None = None) -> list[Event]:
    """Map one stdout line to typed events; unknown JSON types (control_response…) map to none.

    With a `meter`, a turn's `result` is preceded by its ContextUsage (so whoever waits for the
    result already knows the context), and `assistant` lines feed the meter; with `calls`,
    they are counted until a result settles them (a line that adds to the spend is preceded
    by a SpendSoFar).

    A line that is not a JSON object is returned as RawOutput (cleaned of ANSI/CR), because a
    crash trace or a warning must be shown, never lost. Blank lines produce nothing.
    """
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    stripped = text.strip()
    if not stripped:
        return []
    obj: Any = None
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError:
            obj = None
    if not isinstance(obj, dict):
        cleaned = clean_text(text).rstrip()
        return [RawOutput(role=role, text=cleaned)] if cleaned.strip() else []

    kind = obj.get("type")
    if kind == "system" and obj.get("subtype") == "init":
        tools = obj.get("tools")
        return [SessionStarted(
            role=role,
            session_id=str(obj.get("session_id", "")),
            model=str(obj.get("model", "")),
            tools=tuple(str(t) for t in tools) if isinstance(tools, list) else (),
        )]
    if kind == "system" and obj.get("subtype") == "compact_boundary":
        return [_compacted(role, obj)]
    if kind == "system" and obj.get("subtype") == "api_retry":
        return [ApiRetry(
            role=role,
            attempt=wire_count(obj.get("attempt")),
            max_retries=wire_count(obj.get("max_retries")),
            delay_ms=wire_number(obj.get("retry_delay_ms")),
            error_status=_int_or_none(obj.get("error_status")),
            error=str(obj.get("error") or ""),
        )]
    if kind == "rate_limit_event":
        return [_rate_limit(role, obj)]
    if kind == "assistant":
        if meter is not None:
            meter.saw_assistant(obj)
        events: list[Event] = []
        if calls is not None and calls.saw_assistant(obj):
            events.append(calls.so_far(role))
        for block in _message_content(obj):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text":
                events.append(AssistantText(role=role, text=str(block.get("text", ""))))
            elif btype == "thinking":
                events.append(Thinking(role=role, text=str(block.get("thinking", ""))))
            elif btype == "tool_use":
                inp = block.get("input")
                events.append(ToolUse(
                    role=role,
                    tool=str(block.get("name", "")),
                    tool_use_id=str(block.get("id", "")),
                    input=inp if isinstance(inp, dict) else {},
                ))
        return events
    if kind == "user":
        return [
            ToolResult(
                role=role,
                tool_use_id=str(block.get("tool_use_id", "")),
                content=_block_text(block.get("content")),
                is_error=wire_flag(block.get("is_error")),
            )
            for block in _message_content(obj)
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
    if kind == "result":
        if calls is not None:
            calls.settled()
        usage = meter.at_result(role, obj) if meter is not None else None
        return [usage, _turn_result(role, obj)] if usage else [_turn_result(role, obj)]
    return []
