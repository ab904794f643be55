"""`codex app-server` over stdio: JSON-RPC 2.0 lines (without the `jsonrpc` member) both ways.

Why the app-server and not `codex exec --json` + `codex exec resume <id>` per turn: measured
with codex-cli 0.169 against a local Responses stub answering at once, a turn on a running
app-server costs about 0.06 s of overhead, a fresh `codex exec resume` about 0.35 s (0.09 s
against 0.87 s on a loaded machine: it starts, loads its config, the session's rollout and its
tools again every time); `bench/turn_overhead.py` measures both. The app-server also fits how
Anima drives every agent (one process per role, a prompt per turn, an interrupt that leaves
the session usable) and reports token usage and the context window per model call.

The exchange: `initialize` → `initialized` → `thread/start` (or `thread/resume` with the
thread id) once; then per turn `turn/start` and notifications (`item/started`,
`item/completed`, `thread/tokenUsage/updated`, `error`) until `turn/completed`; an interrupt is
`turn/interrupt`. Codex names its threads itself: the thread id is the session id.

A sub-agent the model starts (`spawn_agent`, offered by default) is a thread of its own on the
same connection: its notifications carry its `threadId`. Its turns and errors are not the
agent's turn (its `turn/completed` does not end it, its text is not the answer); its tool
calls and text are shown as the agent's work, and what it spends is the agent's spend.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from anima.agents.dialect import clean_text, wire_count, wire_number
from anima.config import ModelPrice, RoleConfig
from anima.events import (
    ApiRetry,
    AssistantText,
    Compacted,
    ContextUsage,
    Event,
    RateLimitChanged,
    RawOutput,
    SandboxFailure,
    SessionStarted,
    SpendSoFar,
    Thinking,
    ToolResult,
    ToolUse,
    TurnResult,
)

#: Result subtypes this dialect gives (the loop reads faults, not these).
SESSION_LOST = "session_lost"
#: A new thread codex could not start (its config names no usable provider, model…).
NOT_STARTED = "thread_not_started"
INTERRUPTED = "interrupted"

#: A plan window's length in minutes -> its name in Anima's events.
_WINDOWS = {300: "five_hour", 10080: "seven_day"}
_RETRY_COUNT = re.compile(r"\b(\d+)/(\d+)\b")
_OPEN_ID = "anima-open"
_INIT_ID = "anima-init"
#: `true` run through the sandbox the turns get (`command/exec`): where Codex's own sandbox
#: cannot start a command, codex sends no item for any command the model runs, and only the
#: model reads the "bwrap: …" it got back.
_PROBE_ID = "anima-sandbox-probe"
_PROBE_ADVICE = ("every command this agent runs fails the same way, and only its model sees "
                 "why. Unconfined, Codex's sandbox needs CODEX_HOME outside /tmp; inside "
                 "Anima's sandbox, leave `sandbox_mode` out of the role's extra_args")


def build_argv(binary_argv: list[str], role_config: RoleConfig, *,
               session_model: str | None = None) -> list[str]:
    """`codex app-server` with the role's model and extra arguments (the profile puts the
    sandbox mode and the approval policy there, as `-c key=value` overrides)."""
    argv = [*binary_argv, "app-server"]
    model = role_config.model or session_model
    if model:
        argv += ["-c", f"model={json.dumps(model)}"]
    return [*argv, *role_config.extra_args]


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


@dataclass
class _Spend:
    """Tokens since the last result: the sum of the model calls' `last` usage, every
    thread's (a sub-agent's calls are paid too, and may come after its parent's turn)."""

    input: int = 0
    cached: int = 0
    output: int = 0

    def add(self, usage: dict[str, Any]) -> None:
        self.input += wire_count(usage.get("inputTokens"))
        self.cached += wire_count(usage.get("cachedInputTokens"))
        self.output += wire_count(usage.get("outputTokens"))

    def cost(self, price: ModelPrice) -> float:
        fresh = max(0, self.input - self.cached)
        return (fresh * price.input + self.cached * price.cached_input
                + self.output * price.output) / 1_000_000

    def as_usage(self) -> dict[str, int]:
        """In the Messages API's terms, which the ledger reads: input without the cached part."""
        return {"input_tokens": max(0, self.input - self.cached),
                "cache_read_input_tokens": self.cached, "output_tokens": self.output}


def shell_script(command: str) -> str:
    """What the model asked to run: Codex reports `/bin/bash -lc '<script>'`."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 3 and words[1] in ("-lc", "-c") and words[0].endswith("sh"):
        return words[2]
    return command


def error_status(info: Any) -> int | None:
    """The HTTP status inside a `codexErrorInfo` ({"httpConnectionFailed": {"httpStatusCode":
    401}}, …), if it names one."""
    if isinstance(info, dict):
        for value in info.values():
            if isinstance(value, dict) and isinstance(value.get("httpStatusCode"), int):
                return int(value["httpStatusCode"])
    return None


def error_kind(info: Any) -> str:
    """`codexErrorInfo` as one word: "usageLimitExceeded", or the key of its object form."""
    if isinstance(info, str):
        return info
    if isinstance(info, dict) and info:
        return str(next(iter(info)))
    return ""


#: The items an answer is made of: any other (a command, a file edit, a sub-agent spawned,
#: a plan updated…) is work, and a message before it is no answer yet.
_ANSWER_ITEMS = frozenset({"agentMessage", "reasoning"})


class CodexConversation:
    """One app-server process's wire state: its thread, the turn in flight, what it spent."""

    def __init__(self, role: str, *, thread_id: str | None, system_prompt: str,
                 prices: dict[str, ModelPrice], model: str | None = None) -> None:
        self.role = role
        #: The role's configured model: a resumed thread keeps its last one without it.
        self._model = model
        self.thread_id = thread_id or ""
        self._resume = thread_id is not None
        self._system_prompt = system_prompt
        self._prices = prices
        self._next_id = 0
        self._turn_id = ""
        self._turn_text = ""
        #: `_turn_text` is the model call's still streaming: a message joins it (a model may
        #: write its answer in several), one from the next call replaces it.
        self._in_call = False
        self._spend = _Spend()
        self._cost_total = 0.0
        self._context: ContextUsage | None = None
        #: Each thread's `total.totalTokens` last counted.
        self._seen_total: dict[str, int] = {}
        self.model = ""
        self._unpriced_said = False
        self._replies = b""  # answers to its requests, not written yet

    # --- what Anima writes ----------------------------------------------------------------

    def opening(self) -> bytes:
        start: dict[str, Any]
        if self._resume:
            # Only the id and model are read back: no turn history (asked for, codex says
            # "Full-history hydration is deprecated").
            params: dict[str, Any] = {"threadId": self.thread_id, "excludeTurns": True}
            if self._model:
                params["model"] = self._model
            start = {"method": "thread/resume", "id": _OPEN_ID, "params": params}
        else:
            start = {"method": "thread/start", "id": _OPEN_ID,
                     "params": {"developerInstructions": self._system_prompt}}
        return (_line({"method": "initialize", "id": _INIT_ID, "params": {
                    "clientInfo": {"name": "anima", "title": "Anima", "version": "1"}}})
                + _line({"method": "initialized"}) + _line(start)
                + _line({"method": "command/exec", "id": _PROBE_ID,
                         "params": {"command": ["true"]}}))

    def user_message(self, prompt: str) -> bytes:
        self._next_id += 1
        self._turn_text = ""
        self._turn_id = ""  # until codex names the new one (`turn/started`)
        return _line({"method": "turn/start", "id": f"anima-turn-{self._next_id}", "params": {
            "threadId": self.thread_id, "input": [{"type": "text", "text": prompt}]}})

    def interrupt_request(self) -> bytes:
        self._next_id += 1
        return _line({"method": "turn/interrupt", "id": f"anima-stop-{self._next_id}",
                      "params": {"threadId": self.thread_id, "turnId": self._turn_id}})

    def replies(self) -> bytes:
        replies, self._replies = self._replies, b""
        return replies

    def unsettled(self) -> TurnResult | None:
        """The model calls codex reported since the last result: paid, whatever became of
        the turn."""
        if not (self._spend.input or self._spend.output):
            return None
        return self._result(False, "error", "the process ended before its turn did", None)

    # --- what it prints -------------------------------------------------------------------

    def parse(self, line: bytes) -> list[Event]:
        text = line.decode("utf-8", errors="replace")
        obj: Any = None
        if text.strip().startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                obj = None
        if not isinstance(obj, dict):
            cleaned = clean_text(text).rstrip()
            return [RawOutput(role=self.role, text=cleaned)] if cleaned.strip() else []
        if "method" not in obj:
            return self._response(obj)
        if "id" in obj:  # a request to Anima (an approval the role's extra_args turned on)
            self._replies += _line({"id": obj["id"], "error": {
                "code": -32000, "message": "refused: Anima runs unattended, nobody answers"}})
            return [RawOutput(role=self.role, text=f"codex asked {obj['method']!r}, which "
                              "nobody answers in an unattended run: refused")]
        params = obj.get("params")
        return self._notification(str(obj["method"]), params if isinstance(params, dict) else {})

    def _response(self, obj: dict[str, Any]) -> list[Event]:
        error = obj.get("error")
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
        if obj.get("id") == _OPEN_ID:
            if error is not None:
                return [TurnResult(role=self.role, text=message or "the thread was not found",
                                   is_error=True, session_id=self.thread_id,
                                   subtype=SESSION_LOST if self._resume else NOT_STARTED)]
            result = obj.get("result")
            thread = result.get("thread") if isinstance(result, dict) else None
            if isinstance(thread, dict):
                self.thread_id = str(thread.get("id") or self.thread_id)
                self.model = str((result or {}).get("model") or thread.get("model") or "")
            return [SessionStarted(role=self.role, session_id=self.thread_id, model=self.model)]
        if obj.get("id") == _PROBE_ID:
            return self._probed(obj.get("result"))
        if error is not None and str(obj.get("id", "")).startswith("anima-turn-"):
            return [self._result(False, "error", message, None)]  # the turn never started
        return []

    def _probed(self, result: Any) -> list[Event]:
        """The sandbox probe's answer (none from a codex without `command/exec`)."""
        if not isinstance(result, dict) or _int(result.get("exitCode")) == 0:
            return []
        why = clean_text(str(result.get("stderr") or "")).strip() or \
            f"exit code {_int(result.get('exitCode'))}"
        return [SandboxFailure(role=self.role, message=(
            f"Codex's own sandbox cannot start a command (`true` failed: {why}): "
            + _PROBE_ADVICE))]

    def _notification(self, method: str, params: dict[str, Any]) -> list[Event]:
        item = params.get("item")
        item = item if isinstance(item, dict) else {}
        thread = str(params.get("threadId") or self.thread_id)
        if self.thread_id and thread != self.thread_id:  # (none opened: no sub-agent yet)
            return self._sub_agent(method, thread, item, params)
        if method == "turn/started":
            turn = params.get("turn")
            self._turn_id = str(turn.get("id", "")) if isinstance(turn, dict) else ""
        elif method == "item/started":
            if item.get("type") not in _ANSWER_ITEMS:  # its answer is what it says after
                self._turn_text = ""
            return self._tool_use(item)
        elif method == "item/completed":
            return self._item_done(item)
        elif method == "thread/tokenUsage/updated" and params.get("turnId") in (
                None, "", self._turn_id):  # a resumed thread repeats its last turn's first
            self._in_call = False  # a model call ended
            return self._own_usage(params.get("tokenUsage"))
        elif method == "error" and params.get("willRetry"):
            error = params.get("error")
            error = error if isinstance(error, dict) else {}
            message = str(error.get("message", ""))
            count = _RETRY_COUNT.search(message)  # "Reconnecting... 2/5"
            return [ApiRetry(role=self.role, attempt=int(count[1]) if count else 0,
                             max_retries=int(count[2]) if count else 0, delay_ms=None,
                             error_status=error_status(error.get("codexErrorInfo")),
                             error=message)]
        elif method == "account/rateLimits/updated":
            limits = params.get("rateLimits")
            return [event] if (event := self._rate_limit(limits)) is not None else []
        elif method == "warning":
            return [RawOutput(role=self.role, text=f"codex: {params.get('message', '')}")]
        elif method == "turn/completed":
            turn = params.get("turn")
            return self._turn_completed(turn if isinstance(turn, dict) else {})
        return []

    def _sub_agent(self, method: str, thread: str, item: dict[str, Any],
                   params: dict[str, Any]) -> list[Event]:
        """A sub-agent's notification: its work is shown, its spend counted; its turn's
        start, end and errors are its own."""
        if method == "item/started":
            return self._tool_use(item)
        if method == "item/completed":
            return self._item_done(item, own=False)
        if method == "thread/tokenUsage/updated" and \
                self._usage(thread, params.get("tokenUsage")) is not None:
            return [self._so_far()]
        return []

    def _rate_limit(self, limits: Any) -> RateLimitChanged | None:
        """The fuller of the plan's windows (from the `x-codex-*` headers of each response):
        used up, it is the usage limit the next failed turn hits, with its exact reset."""
        if not isinstance(limits, dict):
            return None
        windows = [w for w in (limits.get("primary"), limits.get("secondary"))
                   if isinstance(w, dict)]
        if not windows:
            return None
        window = max(windows, key=lambda w: wire_number(w.get("usedPercent")))
        used = wire_count(window.get("usedPercent"))
        status = "rejected" if used >= 100 or limits.get("rateLimitReachedType") else \
            "allowed_warning" if used >= 90 else "allowed"
        resets_at = window.get("resetsAt")
        return RateLimitChanged(
            role=self.role, status=status, utilization=used / 100,
            resets_at=wire_number(resets_at) or None,
            limit_type=_WINDOWS.get(wire_count(window.get("windowDurationMins")), ""))

    def _tool_use(self, item: dict[str, Any]) -> list[Event]:
        kind, item_id = item.get("type"), str(item.get("id", ""))
        if kind == "commandExecution":
            return [ToolUse(role=self.role, tool="Bash", tool_use_id=item_id,
                            input={"command": shell_script(str(item.get("command", "")))})]
        if kind == "fileChange":
            changes = item.get("changes")
            paths = [str(c.get("path", "")) for c in changes if isinstance(c, dict)] \
                if isinstance(changes, list) else []
            return [ToolUse(role=self.role, tool="Edit", tool_use_id=item_id,
                            input={"file_path": ", ".join(paths)})]
        return []

    def _item_done(self, item: dict[str, Any], own: bool = True) -> list[Event]:
        """`own`: the agent's thread, whose last message is the turn's answer."""
        kind, item_id = item.get("type"), str(item.get("id", ""))
        if kind == "agentMessage":
            text = str(item.get("text", ""))
            if own and text.strip():
                self._turn_text = f"{self._turn_text}\n\n{text}" \
                    if self._in_call and self._turn_text else text
                self._in_call = True
            return [AssistantText(role=self.role, text=text)]
        if kind == "reasoning":
            summary = item.get("summary")
            parts = summary if isinstance(summary, list) else []
            text = "\n".join(str(p) for p in parts)
            return [Thinking(role=self.role, text=text)] if text else []
        if kind == "commandExecution":
            failed = item.get("status") != "completed" or _int(item.get("exitCode")) != 0
            return [ToolResult(role=self.role, tool_use_id=item_id,
                               content=str(item.get("aggregatedOutput") or ""), is_error=failed)]
        if kind == "contextCompaction" and own:
            before = None if self._context is None else self._context.tokens
            return [Compacted(role=self.role, trigger="auto", pre_tokens=before)]
        if kind == "fileChange":
            return [ToolResult(role=self.role, tool_use_id=item_id, content="",
                               is_error=item.get("status") != "completed")]
        return []

    def _own_usage(self, usage: Any) -> list[Event]:
        """The agent's own call: counted, and its context (a sub-agent's is another)."""
        last = self._usage(self.thread_id, usage)
        if last is None:
            return []
        if window := wire_count(usage.get("modelContextWindow")):
            self._context = ContextUsage(
                role=self.role, session_id=self.thread_id,
                tokens=wire_count(last.get("inputTokens")) + wire_count(last.get("outputTokens")),
                window=window)
        return [self._so_far()]

    def _so_far(self) -> SpendSoFar:
        """Its calls are priced as its result will be: the figure is the turn's own."""
        return SpendSoFar(role=self.role, usage=self._spend.as_usage(),
                          cost_usd=self._cost(self._spend))

    def _usage(self, thread: str, usage: Any) -> dict[str, Any] | None:
        """Count `thread`'s last model call once; returns that call's usage if counted."""
        if not isinstance(usage, dict):
            return None
        total = usage.get("total")
        if isinstance(total, dict):
            seen = wire_count(total.get("totalTokens"))
            if self._seen_total.get(thread) == seen:
                return None  # an interrupt repeats the last call's usage: the total stands
            self._seen_total[thread] = seen
        last = usage.get("last")
        if not isinstance(last, dict):
            return None
        self._spend.add(last)
        return last

    def _turn_completed(self, turn: dict[str, Any]) -> list[Event]:
        status = str(turn.get("status", ""))
        error = turn.get("error")
        error = error if isinstance(error, dict) else None
        message = str(error.get("message", "")) if error else ""
        took = wire_count(turn.get("durationMs"))
        if status == "completed" and error is None:
            result = self._result(True, "success", self._turn_text, None, took)
        elif status == INTERRUPTED:
            result = self._result(False, INTERRUPTED, message or "interrupted", None, took)
        else:
            result = self._result(False, "error", message or status, error, took)
        events: list[Event] = []
        if self._context is not None:
            events.append(self._context)
        if (note := self._unpriced()) is not None:
            events.append(note)
        return [*events, result]

    def _price(self) -> ModelPrice | None:
        return self._prices.get(self.model)

    def _cost(self, spend: _Spend) -> float:
        price = self._price()
        return spend.cost(price) if price is not None else 0.0

    def _unpriced(self) -> RawOutput | None:
        """Said once per process: with no price for its model, Codex's turns cost 0 here."""
        if self._price() is not None or self._unpriced_said or not self.model:
            return None
        self._unpriced_said = True
        return RawOutput(role=self.role, text=f"anima: no price for model {self.model!r} in "
                         "config agent_prices: its turns count as $0 toward max_budget_usd")

    def _result(self, ok: bool, subtype: str, text: str, error: dict[str, Any] | None,
                duration_ms: int = 0) -> TurnResult:
        spend, self._spend = self._spend, _Spend()
        spent = self._cost(spend)
        self._cost_total += spent
        info = error.get("codexErrorInfo") if error else None
        return TurnResult(
            role=self.role, text=text, is_error=not ok, session_id=self.thread_id,
            subtype=subtype, cost_usd=self._cost_total, usage=spend.as_usage(),
            duration_ms=duration_ms, turn_cost_usd=spent, api_error_status=error_status(info),
            api_error=error_kind(info),
            terminal_reason=INTERRUPTED if subtype == INTERRUPTED else "")
