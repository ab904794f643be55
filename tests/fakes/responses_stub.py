"""A local OpenAI Responses API stub, so the real `codex` CLI runs offline (as `api_stub` is for
`claude` and the Messages API).

It answers `POST /v1/responses` with a streamed (SSE) response built from a script: text, tool
calls (`exec_command`, Codex's shell tool, or any other by name), an HTTP error with an error
body, or a slow stream. Any other path gets an empty answer. `codex_home` writes the
`config.toml` that points Codex at it.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.stub_server import JsonHandler, ScriptedStub, chunks, sse

#: The model the stub says it is (Codex warns, harmlessly, that it has no metadata for it).
STUB_MODEL = "gpt-stub"
#: The environment variable Codex reads the stub's key from (see `codex_home`).
KEY_VAR = "ANIMA_STUB_OPENAI_KEY"


@dataclass
class Reply:
    """One scripted model answer: text and/or shell commands, an error, or a slow stream."""

    text: str = ""
    #: Messages before `text` in the same response, each an item of its own (a model that
    #: writes its answer in parts).
    parts: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # each an exec_command tool call
    #: Other tool calls: ("namespace.name", arguments), e.g. ("multi_agent_v1.spawn_agent", …).
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    delay: float = 0.0  # seconds before the first byte
    chunk_delay: float = 0.0  # seconds between text deltas
    usage: dict[str, Any] | None = None
    status: int = 200  # an HTTP error status answers `error` instead of a stream
    error: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def item_text(item: dict[str, Any]) -> str:
    """The text of one input item: a message's text parts, or a tool call's output."""
    if item.get("type") == "function_call_output":
        output = item.get("output")
        return output if isinstance(output, str) else json.dumps(output)
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return ""


def all_text(request: dict[str, Any]) -> str:
    """Instructions plus every input item's text, whatever its role."""
    parts = [str(request.get("instructions") or "")]
    parts += [item_text(i) for i in request.get("input", []) if isinstance(i, dict)]
    return "\n".join(parts)


def last_user_text(request: dict[str, Any]) -> str:
    """The latest user message (the turn's prompt)."""
    users = [i for i in request.get("input", []) if isinstance(i, dict)
             and i.get("type") == "message" and i.get("role") == "user"]
    return item_text(users[-1]) if users else ""


def tool_outputs(request: dict[str, Any]) -> list[str]:
    """What the CLI ran for the model, in order (each tool call's output)."""
    return [item_text(i) for i in request.get("input", [])
            if isinstance(i, dict) and i.get("type") == "function_call_output"]


def plan_headers(used_percent: int, resets_at: float, window_minutes: int = 300
                 ) -> dict[str, str]:
    """The `x-codex-primary-*` headers a ChatGPT plan's responses carry (Codex reports them as
    `account/rateLimits/updated`)."""
    return {"x-codex-primary-used-percent": str(used_percent),
            "x-codex-primary-window-minutes": str(window_minutes),
            "x-codex-primary-reset-at": str(int(resets_at))}


def usage_limit(resets_at: float, headers: bool = True) -> Reply:
    """A ChatGPT plan's 429 once its usage limit is used up (Codex does not retry it); with
    the plan's headers unless `headers` is off (then only the text names the reset)."""
    return Reply(status=429, error={
        "type": "usage_limit_reached", "message": "The usage limit has been reached",
        "plan_type": "plus", "resets_at": int(resets_at),
        "resets_in_seconds": max(1, int(resets_at - time.time()))},
        headers=plan_headers(100, resets_at) if headers else {})


def unauthorized() -> Reply:
    """A 401 for a bad or revoked key."""
    return Reply(status=401, error={"type": "invalid_request_error", "code": "invalid_api_key",
                                    "message": "Incorrect API key provided: sk-bad."})


def quota_exceeded() -> Reply:
    """An API key's account out of credit (Codex reports it as `usageLimitExceeded` too)."""
    return Reply(status=429, error={
        "type": "insufficient_quota", "code": "insufficient_quota",
        "message": "You exceeded your current quota, please check your plan and billing "
                   "details."})


def plan_without_codex() -> Reply:
    """A ChatGPT plan that does not include Codex (`usageLimitExceeded` as well)."""
    return Reply(status=429, error={"type": "usage_not_included",
                                    "message": "Codex is not included in your plan"})


def model_not_found(model: str) -> Reply:
    """The API's 404 for a model that does not exist or the key may not use."""
    return Reply(status=404, error={
        "type": "invalid_request_error", "code": "model_not_found",
        "message": f"The model `{model}` does not exist or you do not have access to it."})


def server_error() -> Reply:
    """A 500 (Codex retries it `request_max_retries` times)."""
    return Reply(status=500, error={"type": "server_error", "message": "The server had an error"})


class ResponsesStub(ScriptedStub):
    """Model calls take the pushed replies in order, then `default`; `requests` records
    every body."""

    thread_name = "responses-stub"
    reply_type = Reply

    def _next_reply(self, request: dict[str, Any]) -> Reply:
        reply: Reply = self.coerce(self._queued(), request)
        return reply

    def codex_home(self, folder: Path, retries: int = 0) -> Path:
        """A CODEX_HOME whose config.toml makes Codex use this stub (key from KEY_VAR)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(
            f'model = "{STUB_MODEL}"\nmodel_provider = "stub"\n'
            '[model_providers.stub]\nname = "stub"\n'
            f'base_url = "{self.url}/v1"\nwire_api = "responses"\nenv_key = "{KEY_VAR}"\n'
            f"request_max_retries = {retries}\nstream_max_retries = {retries}\n",
            encoding="utf-8")
        return folder


def _event(data: dict[str, Any]) -> bytes:
    """A Responses API stream event: its name is its `type`."""
    return sse(data["type"], data)


class _Handler(JsonHandler):
    owner: ResponsesStub

    def do_GET(self) -> None:
        self._send_json(200, {"data": [], "models": []}, {})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        if not self.path.split("?", 1)[0].endswith("/responses"):
            self._send_json(200, {}, {})
            return
        with self.owner._lock:
            self.owner.requests.append(body)
        reply = self.owner._next_reply(body)
        if reply.delay and self.owner._closing.wait(reply.delay):
            return
        try:
            if reply.status != 200:
                self._send_json(reply.status, {"error": reply.error}, reply.headers)
            else:
                self._stream(body, reply)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up (an interrupt, a kill)

    def _message(self, index: int, text: str, chunk_delay: float) -> bool:
        """One assistant message item, streamed in deltas; False if the stub closed
        meanwhile."""
        out, mid = self.wfile, f"msg_{uuid.uuid4().hex[:16]}"
        out.write(_event({"type": "response.output_item.added", "output_index": index, "item": {
            "type": "message", "role": "assistant", "id": mid, "content": []}}))
        for piece in chunks(text):
            out.write(_event({"type": "response.output_text.delta", "item_id": mid,
                              "output_index": index, "content_index": 0, "delta": piece}))
            if chunk_delay:
                out.flush()
                if self.owner._closing.wait(chunk_delay):
                    return False
        out.write(_event({"type": "response.output_item.done", "output_index": index, "item": {
            "type": "message", "role": "assistant", "id": mid,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}}))
        return True

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        out = self.wfile
        rid = f"resp_{uuid.uuid4().hex[:16]}"
        out.write(_event({"type": "response.created", "response": {"id": rid}}))
        out.flush()
        for index, text in enumerate(t for t in [*reply.parts, reply.text] if t):
            if not self._message(index, text, reply.chunk_delay):
                return
        for name, arguments in [*(("exec_command", {"cmd": c}) for c in reply.commands),
                                *reply.calls]:
            call = uuid.uuid4().hex[:16]
            namespace, _, name = name.rpartition(".")
            item = {"type": "function_call", "id": f"fc_{call}", "call_id": f"call_{call}",
                    "name": name, "arguments": json.dumps(arguments)}
            out.write(_event({"type": "response.output_item.done",
                              "item": {**item, "namespace": namespace} if namespace else item}))
        size = len(json.dumps(body.get("input", []))) // 4
        text = "".join([*reply.parts, reply.text])
        usage = {"input_tokens": size, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": max(1, len(text) // 4),
                 "output_tokens_details": {"reasoning_tokens": 0}}
        usage.update(reply.usage or {})
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        out.write(_event({"type": "response.completed", "response": {"id": rid, "usage": usage}}))
        out.flush()


ResponsesStub.handler = _Handler
