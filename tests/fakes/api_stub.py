"""A local Anthropic Messages API stub, so the real `claude` CLI and the anthropic SDK run offline.

It speaks just enough of the API: `POST /v1/messages` (streaming SSE and plain JSON),
`POST /v1/messages/count_tokens`, and a harmless answer for anything else. Replies come from a
script (a queue plus a default). The real CLI also sends side requests (title generation, quota
probes, …) that carry no tools; those get a short canned answer and never consume the script, so
a test's scripted replies line up with the agent's real model calls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.stub_server import JsonHandler, ScriptedStub, chunks, sse


@dataclass
class Reply:
    """One scripted model answer: text and/or tool calls, optionally slowed down."""

    text: str = ""
    tool_uses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    delay: float = 0.0  # seconds before the first byte (message_start)
    chunk_delay: float = 0.0  # seconds between text deltas (stream mode)
    stop_reason: str | None = None  # default: tool_use if tool_uses else end_turn
    usage: dict[str, int] | None = None
    status: int = 200  # an HTTP error status answers an error body instead of a message
    error_type: str = "api_error"  # the error body's error.type (overloaded_error, …)
    error_message: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers


def message_text(message: dict[str, Any]) -> str:
    """All text of one request message (string content or text/tool_result blocks)."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            inner = block.get("content", "")
            if isinstance(inner, str):
                parts.append(inner)
            else:
                parts.extend(b.get("text", "") for b in inner if isinstance(b, dict))
    return "\n".join(parts)


def is_tool_result(message: dict[str, Any]) -> bool:
    """Whether a request message carries a tool's output (not a prompt)."""
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def user_prompts(request: dict[str, Any]) -> list[str]:
    """The prompts the client sent in this session, oldest first (not tool results)."""
    return [message_text(m) for m in request.get("messages", [])
            if m.get("role") == "user" and not is_tool_result(m)]


def system_text(request: dict[str, Any]) -> str:
    """The request's system prompt (string or list of blocks) as one string."""
    system = request.get("system", "")
    if isinstance(system, str):
        return system
    return "\n".join(b.get("text", "") for b in system if isinstance(b, dict))


def all_text(request: dict[str, Any]) -> str:
    """System prompt plus every message's text, whatever its role (incl. role "system")."""
    parts = [system_text(request)]
    parts.extend(message_text(m) for m in request.get("messages", []))
    return "\n".join(parts)


def is_agent_request(request: dict[str, Any]) -> bool:
    """A main-loop model call of the agent (it offers tools); side requests offer none."""
    return bool(request.get("tools"))


COMPACTION_ASK = "create a detailed summary of the conversation so far"


def is_compaction_request(request: dict[str, Any]) -> bool:
    """The CLI's own compaction: an ordinary call whose last message asks for a summary."""
    messages = request.get("messages") or [{}]
    return COMPACTION_ASK in message_text(messages[-1])


def compaction_answer(request: dict[str, Any]) -> Reply:
    """What a model answers a compaction with: a short `<summary>` (what the CLI keeps)."""
    return Reply(text="<summary>\nThe conversation so far: the agent worked through the "
                      "milestone's features one round at a time and committed each.\n</summary>")


def side_answer(request: dict[str, Any]) -> str:
    """A sensible answer to the CLI's side requests (session title, quota probe, …)."""
    if "title" in system_text(request).lower():
        return '{"title": "Anima test session"}'
    return "OK"


def count_tokens(request: dict[str, Any]) -> int:
    """A character-based estimate (4 chars a token) of everything the request carries, so the
    `usage` of a reply reports the size of what the stub really received; deterministic."""
    size = len(json.dumps(request.get("messages", []))) + len(system_text(request))
    size += len(json.dumps(request.get("tools", [])))
    return max(1, size // 4)


def overloaded() -> Reply:
    """A 529, as the API answers when it is overloaded (the CLI retries it)."""
    return Reply(status=529, error_type="overloaded_error", error_message="Overloaded")


def unauthorized() -> Reply:
    """A 401 for a bad or expired key."""
    return Reply(status=401, error_type="authentication_error",
                 error_message="invalid x-api-key")


def usage_headers(status: str, resets_at: float, utilization: float = 1.0,
                  claim: str = "five_hour") -> dict[str, str]:
    """The `anthropic-ratelimit-unified-*` headers a subscriber's responses carry."""
    reset = str(int(resets_at))
    window = "5h" if claim == "five_hour" else "7d"
    return {
        "anthropic-ratelimit-unified-status": status,
        "anthropic-ratelimit-unified-reset": reset,
        "anthropic-ratelimit-unified-representative-claim": claim,
        f"anthropic-ratelimit-unified-{window}-status": status,
        f"anthropic-ratelimit-unified-{window}-reset": reset,
        f"anthropic-ratelimit-unified-{window}-utilization": str(utilization),
        f"anthropic-ratelimit-unified-{window}-surpassed-threshold": str(
            1.0 if status == "rejected" else 0.9 if utilization >= 0.9 else 0.0),
    }


def usage_limit_reached(resets_at: float) -> Reply:
    """A subscriber's 429 once the usage limit is used up (the CLI does not retry it)."""
    return Reply(status=429, error_type="rate_limit_error",
                 error_message="This request would exceed your account's rate limit.",
                 headers={**usage_headers("rejected", resets_at),
                          "retry-after": str(max(1, int(resets_at - time.time())))})


class ApiStub(ScriptedStub):
    """Threaded HTTP server on 127.0.0.1:<random port>; use as a context manager.

    `replies` is consumed by agent requests (see `is_agent_request`) in order; when empty,
    `default` answers. `side_reply` answers side requests. `requests` records every request
    body to /v1/messages (both kinds) with a `_path` key added. `latency` (seconds) is added
    before every agent request's reply, on top of its own `delay`: a fixed time per model
    call, standing for a real model's (benches); side requests are answered at once.
    """

    thread_name = "api-stub"
    reply_type = Reply

    def __init__(
        self,
        default: Any = "OK",
        side_reply: Any = side_answer,
        is_main: Callable[[dict[str, Any]], bool] = is_agent_request,
        latency: float = 0.0,
    ) -> None:
        super().__init__(default)
        self.side_reply = side_reply
        self.is_main = is_main
        self.latency = latency
        self.other_paths: list[str] = []
        self.counted: list[dict[str, Any]] = []  # count_tokens request bodies

    def clear(self) -> None:
        with self._lock:
            self._replies.clear()
            self.requests.clear()

    def agent_requests(self) -> list[dict[str, Any]]:
        """Recorded main-loop requests (side requests filtered out)."""
        with self._lock:
            return [r for r in self.requests if self.is_main(r)]

    def _next_reply(self, request: dict[str, Any]) -> Reply:
        if is_compaction_request(request):
            return compaction_answer(request)
        reply: Reply = self.coerce(self.side_reply if not self.is_main(request)
                                   else self._queued(), request)
        return reply

    def from_dict(self, spec: dict[str, Any]) -> Reply:
        """`{"text": …, "tool_use": {"name", "input"}, "tool_uses": […], "status": …}`."""
        tool_uses: list[tuple[str, dict[str, Any]]] = []
        if "tool_use" in spec:
            tu = spec["tool_use"]
            tool_uses.append((tu["name"], dict(tu.get("input", {}))))
        for tu in spec.get("tool_uses", []):
            tool_uses.append((tu["name"], dict(tu.get("input", {}))))
        return Reply(
            text=spec.get("text", ""),
            tool_uses=tool_uses,
            delay=float(spec.get("delay", 0.0)),
            chunk_delay=float(spec.get("chunk_delay", 0.0)),
            stop_reason=spec.get("stop_reason"),
            usage=spec.get("usage"),
            status=int(spec.get("status", 200)),
            error_type=spec.get("error_type", "api_error"),
            error_message=spec.get("error_message", ""),
            headers=dict(spec.get("headers", {})),
        )


class _Handler(JsonHandler):
    owner: ApiStub

    def _send_json(self, status: int, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:
        super()._send_json(status, body,
                           {**(headers or {}), "request-id": f"req_{uuid.uuid4().hex[:16]}"})

    def do_GET(self) -> None:
        self.owner.other_paths.append(self.path)
        self._send_json(200, {})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        if path == "/v1/messages/count_tokens":
            self.owner.counted.append(body)
            self._send_json(200, {"input_tokens": count_tokens(body)})
            return
        if path != "/v1/messages":
            self.owner.other_paths.append(path)
            self._send_json(200, {})
            return
        body["_path"] = path
        with self.owner._lock:
            self.owner.requests.append(body)
        reply = self.owner._next_reply(body)
        delay = reply.delay + (self.owner.latency if self.owner.is_main(body) else 0.0)
        if delay and self.owner._closing.wait(delay):
            return  # the stub is shutting down
        try:
            if reply.status != 200:
                self._send_json(reply.status, {"type": "error", "error": {
                    "type": reply.error_type, "message": reply.error_message or reply.error_type}},
                    reply.headers)
            elif body.get("stream"):
                self._stream(body, reply)
            else:
                self._send_json(200, self._message(body, reply), reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up (an interrupt): nothing to do

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for name, inp in reply.tool_uses:
            blocks.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}",
                           "name": name, "input": inp})
        if not blocks:
            blocks.append({"type": "text", "text": ""})
        return blocks

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        usage = {"input_tokens": count_tokens(body), "output_tokens": max(1, len(reply.text) // 4),
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if reply.usage:
            usage.update(reply.usage)
        return usage

    def _message(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-stub"),
            "content": self._blocks(reply),
            "stop_reason": reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn"),
            "stop_sequence": None,
            "usage": self._usage(body, reply),
        }

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", f"req_{uuid.uuid4().hex[:16]}")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        msg = self._message(body, reply)
        usage = msg["usage"]
        start = dict(msg, content=[], stop_reason=None,
                     usage=dict(usage, output_tokens=1))
        out = self.wfile
        out.write(sse("message_start", {"type": "message_start", "message": start}))
        out.flush()
        for index, block in enumerate(msg["content"]):
            if block["type"] == "text":
                out.write(sse("content_block_start", {"type": "content_block_start",
                               "index": index, "content_block": {"type": "text", "text": ""}}))
                for piece in chunks(block["text"]) if block["text"] else []:
                    if reply.chunk_delay:
                        out.flush()
                        if self.owner._closing.wait(reply.chunk_delay):
                            return
                    out.write(sse("content_block_delta", {"type": "content_block_delta",
                              "index": index, "delta": {"type": "text_delta", "text": piece}}))
            else:
                out.write(sse("content_block_start", {"type": "content_block_start",
                               "index": index, "content_block": dict(block, input={})}))
                out.write(sse("content_block_delta", {"type": "content_block_delta",
                          "index": index, "delta": {"type": "input_json_delta",
                                                    "partial_json": json.dumps(block["input"])}}))
            out.write(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        out.write(sse("message_delta", {"type": "message_delta",
                       "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                       "usage": {"output_tokens": usage["output_tokens"]}}))
        out.write(sse("message_stop", {"type": "message_stop"}))
        out.flush()


ApiStub.handler = _Handler
